#include "runtime/json_mode.h"

#include <algorithm>

namespace dsa {

JsonVocab::JsonVocab(const Tokenizer& tok, int vocab) : end_(size_t(vocab)), flags_(size_t(vocab), 0), lead_(size_t(vocab), 0) {
  for (int32_t id = 0; id < vocab; ++id) {
    if (tok.is_valid_id(id) && !tok.is_special(id) && !tok.token_bytes(id).empty()) {
      const std::string& b = tok.token_bytes(id);
      bytes_ += b;
      bool safe = true, plain = true;
      for (unsigned char c : b) {
        safe &= c >= 0x20 && c != '"' && c != '\\';
        plain &= c != '<' && c != 0xEF;
      }
      flags_[size_t(id)] = uint8_t(kText | (safe ? kStringSafe : 0) | (plain ? kNoMarkup : 0));
      const size_t lead = b.find_first_not_of(" \t\n\r");
      lead_[size_t(id)] = uint8_t(lead == std::string::npos || lead > 254 ? 255 : lead);
    }
    end_[size_t(id)] = uint32_t(bytes_.size());
  }
}

template <class Prefix>
bool GrammarMode<Prefix>::is_eos(int32_t id) const { return std::find(eos_.begin(), eos_.end(), id) != eos_.end(); }

template <class Prefix>
bool GrammarMode<Prefix>::blank_ok(size_t id) const {
  const std::string_view b = vocab_.token(id);
  const size_t n = vocab_.lead(id) == 255 ? b.size() : vocab_.lead(id);
  return blank_ + n <= kMaxBlank && breaks_ + size_t(std::count(b.begin(), b.begin() + ptrdiff_t(n), '\n')) <= kMaxBreaks;
}

template <class Prefix>
const uint8_t* GrammarMode<Prefix>::allowed() {
  const bool whole = state_.complete(), closed = state_.closed() && eos_ends_;
  const bool between = state_.between_tokens(), limit_blanks = !state_.closed() && state_.bounded_blanks();
  // Tokens taken whole without a feed: inside a string those of string-safe bytes (in a tool
  // call, also free of markup bytes), in raw text those free of markup bytes.
  constexpr uint8_t kMarkup = Prefix::kGuardsMarkup ? JsonVocab::kNoMarkup : 0;
  const uint8_t safe = state_.in_string() ? uint8_t(JsonVocab::kStringSafe | kMarkup) : state_.in_raw() ? JsonVocab::kNoMarkup : 0;
  // The first bytes the recognizer takes from here.
  uint8_t first[256];
  for (int c = 0; c < 256; ++c) {
    Prefix next = state_;
    first[c] = next.feed(static_cast<unsigned char>(c));
  }
  const size_t V = vocab_.size();
  for (size_t id = 0; id < V; ++id) {
    uint8_t ok = 0;
    if (vocab_.lead(id) != 0 && limit_blanks && !blank_ok(id)) {
      allowed_[id] = 0;
      continue;
    }
    const uint8_t f = vocab_.flags(id);
    if (!(f & JsonVocab::kText) || closed) {
      allowed_[id] = 0;
      continue;
    }
    if (safe && (f & safe) == safe) {
      ok = 1;
    } else {
      const std::string_view b = vocab_.token(id);
      const size_t at = between && vocab_.lead(id) != 255 ? vocab_.lead(id) : 0;  // all whitespace: its first byte
      if (first[static_cast<unsigned char>(b[at])]) {
        Prefix next = state_;
        ok = next.feed(b);
      }
    }
    allowed_[id] = ok;
  }
  for (int32_t id : eos_) allowed_[size_t(id)] = whole && eos_ends_;
  return allowed_.data();
}

template <class Prefix>
void GrammarMode<Prefix>::accept(int32_t id) {
  if (!(vocab_.flags(size_t(id)) & JsonVocab::kText) || is_eos(id)) return;
  const std::string_view b = vocab_.token(size_t(id));
  state_.feed(b);
  const size_t body = b.find_last_not_of(" \t\n\r");
  if (body != std::string_view::npos) blank_ = breaks_ = 0;  // the run starts after the token's last other byte
  const std::string_view tail = body == std::string_view::npos ? b : b.substr(body + 1);
  blank_ += tail.size();
  breaks_ += size_t(std::count(tail.begin(), tail.end(), '\n'));
}

template class GrammarMode<JsonSchemaPrefix>;
template class GrammarMode<ToolCallPrefix>;

}  // namespace dsa
