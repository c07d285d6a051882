#pragma once
// JSON mode's per-request state (GenerateOptions::json): the recognizer over the reply so
// far, and before each draw the mask of the tokens whose bytes keep the reply the start of
// one JSON object. The vocabulary's bytes are copied flat once per request, with each
// token's class, so that a mask is one pass: inside a string most tokens need no feed (no
// quote, backslash or control byte); elsewhere a token whose first byte the recognizer
// refuses needs none either (between tokens of the text, its first byte past leading
// whitespace, which changes nothing there); only the rest are fed to a copy of the state.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sampling/json_prefix.h"
#include "tokenizer/tokenizer.h"

namespace dsa {

class JsonMode {
public:
  // vocab: the model's; is_eos [vocab]; eos_ends: an end-of-sequence token ends the reply
  // (else it is never allowed: it would land in the text).
  JsonMode(const Tokenizer& tok, int vocab, std::span<const uint8_t> is_eos, bool eos_ends);
  // The tokens allowed at the next draw ([vocab], valid until the next call): those the
  // recognizer takes from here; an end-of-sequence token once the object is whole, and
  // nothing else once it is closed (spaces, when an end-of-sequence token would not end it).
  const uint8_t* allowed();
  void accept(int32_t id);  // an emitted token's bytes (not an end-of-sequence token's)

private:
  enum Kind : uint8_t { kNever, kStringSafe, kOther, kEos };
  JsonPrefix state_{/*object=*/true};
  bool eos_ends_;
  std::string bytes_;           // every token's bytes, back to back
  std::vector<uint32_t> end_;   // token id's bytes end at end_[id] (start: end_[id - 1])
  std::vector<uint8_t> kind_;   // [vocab]
  std::vector<uint8_t> lead_;   // [vocab] leading whitespace bytes (at most 255; all: 255)
  std::vector<uint8_t> allowed_;
  std::string_view token(int32_t id) const {
    const uint32_t b = id > 0 ? end_[size_t(id) - 1] : 0;
    return std::string_view(bytes_).substr(b, end_[size_t(id)] - b);
  }
};

}  // namespace dsa
