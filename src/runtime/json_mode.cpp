#include "runtime/json_mode.h"

namespace dsa {

JsonMode::JsonMode(const Tokenizer& tok, int vocab, std::span<const uint8_t> is_eos, bool eos_ends)
    : eos_ends_(eos_ends), end_(size_t(vocab)), kind_(size_t(vocab), kNever), lead_(size_t(vocab), 0), allowed_(size_t(vocab)) {
  for (int32_t id = 0; id < vocab; ++id) {
    if (is_eos[size_t(id)]) {
      kind_[size_t(id)] = kEos;
    } else if (tok.is_valid_id(id) && !tok.is_special(id) && !tok.token_bytes(id).empty()) {
      // Special tokens are markup, never reply text.
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

const uint8_t* JsonMode::allowed() {
  const bool whole = state_.complete(), closed = state_.closed() && eos_ends_, in_string = state_.in_string();
  const bool between = state_.between_tokens();
  // The first bytes the recognizer takes from here.
  uint8_t first[256];
  for (int c = 0; c < 256; ++c) {
    JsonPrefix next = state_;
    first[c] = next.feed(static_cast<unsigned char>(c));
  }
  const size_t V = kind_.size();
  for (size_t id = 0; id < V; ++id) {
    uint8_t ok = 0;
    switch (kind_[id]) {
      case kNever: break;
      case kEos: ok = whole && eos_ends_; break;
      case kStringSafe:
        if (in_string) {
          ok = 1;
          break;
        }
        [[fallthrough]];
      case kOther: {
        const std::string_view b = token(int32_t(id));
        const size_t at = between && lead_[id] != 255 ? lead_[id] : 0;  // all whitespace: its first byte
        if (closed || !first[static_cast<unsigned char>(b[at])]) break;
        JsonPrefix next = state_;
        ok = next.feed(b);
        break;
      }
    }
    allowed_[id] = ok;
  }
  return allowed_.data();
}

void JsonMode::accept(int32_t id) {
  if (kind_[size_t(id)] == kStringSafe || kind_[size_t(id)] == kOther) state_.feed(token(id));
}

}  // namespace dsa
