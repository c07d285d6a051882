// The real DeepSeek-V3.2 tokenizer, loaded once from $DSA_TOKENIZER_DIR (tokenizer.json and
// tokenizer_config.json), on fuzzed text. For valid UTF-8, decode(encode(x)) == x: the file
// has a byte-level alphabet, no normalizer and no stripping added tokens, so nothing may be
// lost. Invalid UTF-8 must be refused with dsa::Error. The input's bytes are also read as
// token ids (3 bytes each) and decoded, whole and through the stream decoder.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "tokenizer_checks.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {
std::optional<dsa::Tokenizer> g_tok;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("DSA_TOKENIZER_DIR");
  if (!dir || !*dir) {
    std::fprintf(stderr, "fuzz_tokenizer_deepseek: set DSA_TOKENIZER_DIR to the folder with the DeepSeek-V3.2 tokenizer.json\n");
    std::exit(2);
  }
  try {
    g_tok.emplace(dsa::Tokenizer::from_dir(dir));
  } catch (const dsa::Error& e) {
    std::fprintf(stderr, "fuzz_tokenizer_deepseek: cannot load the tokenizer from DSA_TOKENIZER_DIR=%s: %s\n", dir, e.what());
    std::exit(2);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const dsa::Tokenizer& tok = *g_tok;
  const std::string_view text = dsa::fuzz::as_view(data, size);
  const bool valid = dsa::utf8::valid(text);
  try {
    const std::vector<int32_t> ids = tok.encode(text);
    FUZZ_CHECK(valid, "encode accepted invalid UTF-8");
    for (int32_t id : ids) FUZZ_CHECK(tok.is_valid_id(id), "unknown id " + std::to_string(id));
    FUZZ_CHECK(tok.decode_bytes(ids) == text, "decode_bytes(encode(x)) != x");
    FUZZ_CHECK(tok.decode(ids) == text, "decode(encode(x)) != x");
  } catch (const dsa::Error&) {
    FUZZ_CHECK(!valid, "encode refused valid UTF-8");
  }

  std::vector<int32_t> ids;
  for (size_t i = 0; i + 3 <= size; i += 3) {
    const int32_t id = int32_t((uint32_t(data[i]) << 16 | uint32_t(data[i + 1]) << 8 | data[i + 2]) % uint32_t(tok.vocab_size()));
    if (tok.is_valid_id(id)) ids.push_back(id);
  }
  dsa::fuzz::check_decode(tok, ids);
  return 0;
}
