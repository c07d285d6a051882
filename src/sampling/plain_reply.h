#pragma once
// The GrammarMode interface (runtime/json_mode.h) of a recognizer whose grammar spells the
// reply out byte by byte (a choice, a regex match): no string or raw text to take without a
// feed, no markup to keep out, whitespace only where the grammar itself takes it.
#include <cstdint>

namespace dsa {

struct PlainReply {
  static constexpr bool kGuardsMarkup = false;
  bool in_string() const { return false; }
  bool in_raw() const { return false; }
  bool between_tokens() const { return false; }
  bool bounded_blanks() const { return false; }
  uint32_t string_room() const { return UINT32_MAX; }
};

}  // namespace dsa
