#include "runtime/json_mode.h"

#include <algorithm>

namespace dsa {

JsonVocab::JsonVocab(const Tokenizer& tok, int vocab) : end_(size_t(vocab)), kind_(size_t(vocab), kNever), lead_(size_t(vocab), 0) {
  for (int32_t id = 0; id < vocab; ++id) {
    if (tok.is_valid_id(id) && !tok.is_special(id) && !tok.token_bytes(id).empty()) {
      const std::string& b = tok.token_bytes(id);
      bytes_ += b;
      bool safe = true;
      for (unsigned char c : b) safe &= c >= 0x20 && c != '"' && c != '\\';
      kind_[size_t(id)] = safe ? kStringSafe : kOther;
      const size_t lead = b.find_first_not_of(" \t\n\r");
      lead_[size_t(id)] = uint8_t(lead == std::string::npos || lead > 254 ? 255 : lead);
    }
    end_[size_t(id)] = uint32_t(bytes_.size());
  }
}

JsonMode::JsonMode(const JsonVocab& vocab, const JsonSchema& schema, std::span<const uint8_t> is_eos, bool eos_ends)
    : vocab_(vocab), eos_ends_(eos_ends), state_(schema), allowed_(vocab.size()) {
  for (size_t id = 0; id < is_eos.size(); ++id)
    if (is_eos[id]) eos_.push_back(int32_t(id));
}

bool JsonMode::is_eos(int32_t id) const { return std::find(eos_.begin(), eos_.end(), id) != eos_.end(); }

bool JsonMode::blank_ok(size_t id) const {
  const std::string_view b = vocab_.token(id);
  const size_t n = vocab_.lead(id) == 255 ? b.size() : vocab_.lead(id);
  return blank_ + n <= kMaxBlank && breaks_ + size_t(std::count(b.begin(), b.begin() + ptrdiff_t(n), '\n')) <= kMaxBreaks;
}

const uint8_t* JsonMode::allowed() {
  const bool whole = state_.complete(), closed = state_.closed() && eos_ends_, in_string = state_.in_string();
  const bool between = state_.between_tokens(), limit_blanks = !state_.closed();
  // The first bytes the recognizer takes from here.
  uint8_t first[256];
  for (int c = 0; c < 256; ++c) {
    JsonSchemaPrefix next = state_;
    first[c] = next.feed(static_cast<unsigned char>(c));
  }
  const size_t V = vocab_.size();
  for (size_t id = 0; id < V; ++id) {
    uint8_t ok = 0;
    if (vocab_.lead(id) != 0 && limit_blanks && !blank_ok(id)) {
      allowed_[id] = 0;
      continue;
    }
    switch (vocab_.kind(id)) {
      case JsonVocab::kNever: break;
      case JsonVocab::kStringSafe:
        if (in_string) {
          ok = 1;
          break;
        }
        [[fallthrough]];
      case JsonVocab::kOther: {
        const std::string_view b = vocab_.token(id);
        const size_t at = between && vocab_.lead(id) != 255 ? vocab_.lead(id) : 0;  // all whitespace: its first byte
        if (closed || !first[static_cast<unsigned char>(b[at])]) break;
        JsonSchemaPrefix next = state_;
        ok = next.feed(b);
        break;
      }
    }
    allowed_[id] = ok;
  }
  for (int32_t id : eos_) allowed_[size_t(id)] = whole && eos_ends_;
  return allowed_.data();
}

void JsonMode::accept(int32_t id) {
  if (vocab_.kind(size_t(id)) == JsonVocab::kNever || is_eos(id)) return;
  const std::string_view b = vocab_.token(size_t(id));
  state_.feed(b);
  const size_t body = b.find_last_not_of(" \t\n\r");
  if (body != std::string_view::npos) blank_ = breaks_ = 0;  // the run starts after the token's last other byte
  const std::string_view tail = body == std::string_view::npos ? b : b.substr(body + 1);
  blank_ += tail.size();
  breaks_ += size_t(std::count(tail.begin(), tail.end(), '\n'));
}

}  // namespace dsa
