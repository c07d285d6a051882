// tokenizer.json loading with a fuzzed file (and type-confused variants of it, fuzz_util.h),
// then encode/decode of fuzzed text with the result. Input: the tokenizer.json text, a NUL
// byte, the text to encode. The seeds are small hand-made tokenizers; the real 7.8 MB one is
// fuzz_tokenizer_deepseek's job.
//
// Whatever a loadable tokenizer does with the text, the ids it returns must be valid, decode
// must give valid UTF-8, the stream decoder must agree with decode, and encoding the same
// text again (now through the word cache) must give the same ids.
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "tokenizer_checks.h"
#include "io/json.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

void check(const nlohmann::json& j, std::string_view text) {
  const dsa::Tokenizer tok = dsa::Tokenizer::from_json(j);  // dsa::Error: refused
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(text);
  } catch (const dsa::Error&) {
    FUZZ_CHECK(!dsa::utf8::valid(text), "encode refused valid UTF-8");
    return;
  }
  FUZZ_CHECK(dsa::utf8::valid(text), "encode accepted invalid UTF-8");
  for (int32_t id : ids) FUZZ_CHECK(tok.is_valid_id(id), "encode returned unknown id " + std::to_string(id));
  FUZZ_CHECK(tok.encode(text) == ids, "encoding the same text twice differs");
  dsa::fuzz::check_decode(tok, ids);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = dsa::fuzz::split_at_nul(dsa::fuzz::as_view(data, size));
  const std::string_view json_text = parts.first, text = parts.second;
  nlohmann::json j;
  try {
    j = dsa::parse_json_bounded(json_text);  // what Tokenizer::from_file does with the file
  } catch (const nlohmann::json::exception&) {
    return 0;  // not JSON: from_file turns this into a dsa::Error before the tokenizer sees it
  }
  // Each variant compiles its regexes again: a few per input keep the rate up.
  dsa::fuzz::run_with_variants(j, dsa::fuzz::as_view(data, size), 6, [&](const nlohmann::json& d) { check(d, text); });
  return 0;
}
