// Forced tool calls (sampling/tool_call_grammar.h) on fuzzed tool lists, and type-confused
// variants of them (fuzz_util.h), fed fuzzed text. The input is a tools document (OpenAI's
// list), a NUL, then the text a model might write, run with several calls in chat mode and
// with one after reasoning in thinking mode. The tools compile or throw dsa::Error; the
// recognizer then takes the text byte by byte, and after every byte it takes some byte still
// goes on or the block is whole (no dead end for a masked sampler); a whole block in valid
// UTF-8 parses (the reference parser's rules) into calls of the offered tools whose
// arguments are JSON objects.
#include <regex>
#include <set>
#include <string>

#include "core/error.h"
#include "fuzz_util.h"
#include "sampling/tool_call_grammar.h"
#include "tokenizer/dsv32_parser.h"
#include "tokenizer/utf8.h"

using ojson = nlohmann::ordered_json;

namespace {

void check(const ojson& tools, std::string_view text, bool several, bool thinking) {
  const dsa::ToolCallGrammar g(tools, several, thinking);
  dsa::ToolCallPrefix p(g);
  FUZZ_CHECK(dsa::fuzz::goes_on(p), "a fresh recognizer takes no byte");
  size_t taken = 0;
  for (; taken < text.size() && taken < 1024; ++taken) {
    if (!p.feed(static_cast<unsigned char>(text[taken]))) return;
    FUZZ_CHECK(dsa::fuzz::goes_on(p), "dead end after " + std::string(text.substr(0, taken + 1)));
  }
  if (!p.complete()) return;
  const std::string whole(text.substr(0, taken));
  if (!dsa::utf8::valid(whole)) return;  // the tokenizer's decoder replaces invalid bytes
  std::set<std::string> names;
  for (const auto& t : g.tools()) names.insert(t.name);
  dsa::chat::dsv32::ParsedMessage m;
  try {
    m = dsa::chat::dsv32::parse_completion(whole, thinking ? dsa::chat::ThinkingMode::Thinking : dsa::chat::ThinkingMode::Chat);
  } catch (const dsa::Error& e) {
    FUZZ_CHECK(false, std::string("taken whole but not parsed (") + e.what() + "): " + whole);
  }
  FUZZ_CHECK(!m.tool_calls.empty() && (several || m.tool_calls.size() == 1), "taken whole with the wrong number of calls: " + whole);
  // nlohmann reads numbers and escapes where the recognizer leaves them to the text.
  static const std::regex unread(R"(\\u|[0-9][eE])");
  for (const auto& c : m.tool_calls) {
    FUZZ_CHECK(names.count(c.name), "a call of a tool not offered: " + whole);
    if (!std::regex_search(c.arguments, unread)) {
      const ojson args = ojson::parse(c.arguments, nullptr, false);
      FUZZ_CHECK(args.is_object(), "arguments that are not a JSON object: " + c.arguments);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dsa::fuzz::run_document_and_text(data, size, 32, [](const ojson& d, std::string_view text) {
    check(d, text, true, false);
    check(d, text, false, true);
  });
  return 0;
}
