// The regex compiler and recognizer (sampling/regex.h: JSON Schema's pattern, vLLM's
// guided_regex) on fuzzed patterns. The input is a byte of options (which match rule, and
// whether length bounds come from the next two bytes), the pattern, a NUL, then the text a
// model might write. A pattern compiles or throws dsa::Error; the recognizer then takes the
// text byte by byte, and after every byte it takes some byte still goes on or the text is a
// match (no dead end for a masked sampler); a text taken as a match is valid UTF-8 with a
// character count within the bounds. The text's pieces between 0x01 bytes are also a
// vocabulary: after the first piece, the pattern's vocabulary (sampling/pattern_vocab.h)
// allows exactly the pieces the recognizer takes.
#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "sampling/pattern_vocab.h"
#include "sampling/regex.h"
#include "tokenizer/utf8.h"

namespace {

size_t chars(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

void check_vocab(const dsa::Regex& re, std::string_view text) {
  std::vector<std::string_view> pieces;
  for (size_t at = 0; at <= text.size() && pieces.size() < 65;) {
    const size_t end = std::min(text.find('\x01', at), text.size());
    pieces.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  dsa::RegexPrefix p(re);
  dsa::Regex::Set s;
  uint32_t count = 0;
  if (pieces.size() < 2 || !p.feed(pieces[0]) || !p.pattern_at(s, count)) return;
  const std::vector<std::string_view> tokens(pieces.begin() + 1, pieces.end());
  dsa::PatternVocab vocab(re, tokens.size(), [](size_t) { return true; }, [&](size_t i) { return tokens[i]; });
  std::vector<uint8_t> allowed(tokens.size(), 0);
  vocab.allow(s, count, allowed.data());
  for (size_t i = 0; i < tokens.size(); ++i) {
    dsa::RegexPrefix q = p;
    const bool want = !tokens[i].empty() && q.feed(tokens[i]);
    FUZZ_CHECK(bool(allowed[i]) == want, "the pattern's vocabulary " + std::string(want ? "refuses '" : "allows '") + std::string(tokens[i]) + "'");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const uint8_t options = data[0];
  const auto match = options & 1 ? dsa::Regex::Match::Whole : dsa::Regex::Match::Search;
  const uint32_t min_len = options & 2 ? data[1] % 64 : 0, max_len = options & 4 ? data[2] % 64 : UINT32_MAX;
  const auto [pattern, text] = dsa::fuzz::split_at_nul(dsa::fuzz::as_view(data + 3, size - 3));
  try {
    const dsa::Regex re(pattern, match, min_len, max_len);
    check_vocab(re, text);
    dsa::RegexPrefix p(re);
    FUZZ_CHECK(dsa::fuzz::goes_on(p), "a fresh recognizer takes no byte");
    size_t taken = 0;
    for (; taken < text.size() && taken < 512; ++taken) {
      if (!p.feed(static_cast<unsigned char>(text[taken]))) return 0;
      FUZZ_CHECK(dsa::fuzz::goes_on(p), "dead end after " + std::string(text.substr(0, taken + 1)));
    }
    if (!p.complete()) return 0;
    const std::string_view whole = text.substr(0, taken);
    FUZZ_CHECK(dsa::utf8::valid(whole), "a match that is not valid UTF-8");
    FUZZ_CHECK(chars(whole) >= min_len && chars(whole) <= max_len, "a match outside the length bounds");
  } catch (const dsa::Error&) {
  }
  return 0;
}
