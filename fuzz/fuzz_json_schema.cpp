// The JSON Schema compiler and recognizer (sampling/json_schema.h) on fuzzed schemas, and
// type-confused variants of them (fuzz_util.h), fed fuzzed text. The input is a schema
// document, a NUL, then the text a model might write. A schema compiles or throws
// dsa::Error (leniently it compiles); the recognizer then takes the text byte by byte, and after every byte it takes
// some byte still goes on or the text is whole (no dead end, which is what keeps a masked
// sampler from being stuck); a whole text is JSON (nlohmann accepts it, where it reads the
// numbers, escapes and bytes: it refuses exponents that overflow a double, lone surrogates
// and invalid UTF-8, which the recognizer leaves to the tokenizer's decoder).
#include <regex>
#include <string>

#include "core/error.h"
#include "fuzz_util.h"
#include "sampling/json_schema.h"
#include "tokenizer/utf8.h"

using ojson = nlohmann::ordered_json;

namespace {

void check(const ojson& schema, std::string_view text, dsa::JsonSchema::Lenient lenient) {
  const dsa::JsonSchema s(schema, lenient);
  dsa::JsonSchemaPrefix p(s);
  FUZZ_CHECK(dsa::fuzz::goes_on(p), "a fresh recognizer takes no byte");
  size_t taken = 0;
  for (; taken < text.size() && taken < 512; ++taken) {
    if (!p.feed(static_cast<unsigned char>(text[taken]))) return;
    FUZZ_CHECK(dsa::fuzz::goes_on(p), "dead end after " + std::string(text.substr(0, taken + 1)));
  }
  if (!p.complete()) return;
  const std::string whole(text.substr(0, taken));
  static const std::regex unread(R"(\\u|[0-9][eE])");
  if (dsa::utf8::valid(whole) && !std::regex_search(whole, unread)) FUZZ_CHECK(ojson::accept(whole), "taken whole but not JSON: " + whole);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dsa::fuzz::run_document_and_text(data, size, 32, [](const ojson& d, std::string_view text) {
    check(d, text, dsa::JsonSchema::Lenient::Yes);
    check(d, text, dsa::JsonSchema::Lenient::No);
  });
  return 0;
}
