#pragma once
// What every decoded id sequence must satisfy, for both tokenizer targets.
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace dsa::fuzz {

// decode gives valid UTF-8 and the stream decoder, fed one id at a time, agrees with it.
inline void check_decode(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  const std::string decoded = tok.decode(ids);
  FUZZ_CHECK(utf8::valid(decoded), "decode gave invalid UTF-8");
  StreamDecoder sd(tok);
  std::string streamed;
  for (int32_t id : ids) streamed += sd.push(id);
  streamed += sd.flush();
  FUZZ_CHECK(streamed == decoded, "stream decoder disagrees with decode");
}

}  // namespace dsa::fuzz
