#pragma once
// The byte-level alphabet for hand-made tokenizer.json files in tests.
#include <cstdint>
#include <string>

#include "tokenizer/utf8.h"

namespace dsa::test {

// GPT-2 bytes_to_unicode, written independently of the library for the test.
inline std::string byte_char(int b) {
  int extra = 0;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
    if (x == b) {
      std::string s;
      dsa::utf8::append_cp(s, printable ? static_cast<uint32_t>(x) : static_cast<uint32_t>(256 + extra));
      return s;
    }
    if (!printable) ++extra;
  }
  return {};
}

}  // namespace dsa::test
