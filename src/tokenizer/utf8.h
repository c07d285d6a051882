#pragma once
// UTF-8 helpers shared by the tokenizer, the streaming decoder and the chat renderers.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsa::utf8 {

enum class Seq { Ok, Invalid, Truncated };

struct SeqInfo {
  Seq status;
  size_t len;  // Ok: bytes of the character; Invalid: bytes of the maximal invalid subpart
               // (>= 1); Truncated: bytes of the valid prefix that runs into the end.
};

// Classifies the sequence starting at s[i] following Unicode Table 3-7 (well-formed UTF-8:
// no overlongs, no surrogates, nothing above U+10FFFF).
SeqInfo scan(std::string_view s, size_t i);

// True when every byte of s belongs to a well-formed character.
bool valid(std::string_view s);

// Replaces each maximal invalid subpart (and a truncated tail) with U+FFFD, the same policy
// as Rust's String::from_utf8_lossy that the Hugging Face decoder uses.
std::string sanitize(std::string_view s);

// Decodes the (valid) character at s[i]; returns its code point and advances i.
uint32_t next_cp(std::string_view s, size_t& i);

void append_cp(std::string& out, uint32_t cp);

// Rust char::is_whitespace (the Unicode White_Space property), what the tokenizers crate
// strips with (added-token lstrip/rstrip, the Strip normalizer).
bool is_white_space(uint32_t cp);

// Python's str.isspace() (what str.strip() with no argument removes).
bool py_isspace(uint32_t cp);

// Python str.strip() / lstrip() / rstrip() without arguments, on valid UTF-8.
std::string_view py_strip(std::string_view s);
std::string_view py_lstrip(std::string_view s);
std::string_view py_rstrip(std::string_view s);

}  // namespace dsa::utf8
