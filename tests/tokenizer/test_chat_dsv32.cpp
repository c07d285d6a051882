// DeepSeek-V3.2 prompt encoding against chat_examples.jsonl: the exact prompt string from
// the messages, and the prompt's token ids.
#include <gtest/gtest.h>

#include "core/error.h"
#include "fixtures.h"
#include "jsonl.h"
#include "tokenizer/dsv32_encoding.h"
#include "tokenizer/tokenizer.h"

namespace {

using dsa::chat::ThinkingMode;
namespace dsv32 = dsa::chat::dsv32;

dsv32::EncodeOptions options_of(const nlohmann::ordered_json& line) {
  const auto& a = line["encode_args"];
  dsv32::EncodeOptions o;
  o.thinking_mode = dsa::chat::parse_thinking_mode(a["thinking_mode"].get<std::string>());
  o.drop_thinking = a.value("drop_thinking", true);
  o.add_default_bos_token = a.value("add_default_bos_token", true);
  return o;
}

TEST(ChatDsv32, EveryExamplePromptIsByteExact) {
  std::vector<nlohmann::ordered_json> lines;
  ASSERT_TRUE(dsa::test::listed_jsonl("chat_examples.jsonl", &lines));
  for (const auto& l : lines) {
    const std::string got = dsv32::encode_messages(l["messages"], options_of(l));
    EXPECT_EQ(got, l["prompt"].get<std::string>()) << l["name"];
  }
}

TEST(ChatDsv32, EveryExamplePromptTokenizesToItsIds) {
  std::vector<nlohmann::ordered_json> lines;
  ASSERT_TRUE(dsa::test::listed_jsonl("chat_examples.jsonl", &lines));
  const auto tok = dsa::Tokenizer::from_dir(dsa::test::tokenizer_dir());
  for (const auto& l : lines) {
    const auto want = l["prompt_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(l["prompt"].get<std::string>(), /*add_bos=*/false), want) << l["name"];
    EXPECT_EQ(tok.encode(dsv32::encode_messages(l["messages"], options_of(l))), want) << l["name"];
  }
}

TEST(ChatDsv32, ContextRendersOnlyTheNewMessagesWithoutBos) {
  std::vector<nlohmann::ordered_json> lines;
  ASSERT_TRUE(dsa::test::listed_jsonl("chat_examples.jsonl", &lines));
  // Append-only encoding: encode(rest, context=first k) renders the same messages of the
  // same full list, so it is exactly the tail of the full prompt, with no BOS.
  for (const auto& l : lines) {
    const auto& msgs = l["messages"];
    const auto opts = options_of(l);
    const std::string full = dsv32::encode_messages(msgs, opts);
    for (size_t k = 1; k < msgs.size(); ++k) {
      nlohmann::ordered_json head = nlohmann::ordered_json::array(), tail = nlohmann::ordered_json::array();
      for (size_t i = 0; i < msgs.size(); ++i) (i < k ? head : tail).push_back(msgs[i]);
      const std::string tail_only = dsv32::encode_messages(tail, opts, head);
      ASSERT_LE(tail_only.size(), full.size());
      EXPECT_EQ(full.substr(full.size() - tail_only.size()), tail_only) << l["name"] << " split at " << k;
      EXPECT_NE(tail_only.rfind(std::string(dsv32::kBos), 0), 0u) << l["name"];
    }
  }
}

TEST(ChatDsv32, RejectsWhatTheReferenceRejects) {
  using J = nlohmann::ordered_json;
  dsv32::EncodeOptions think;
  think.thinking_mode = ThinkingMode::Thinking;
  EXPECT_THROW(dsa::chat::parse_thinking_mode("fast"), dsa::Error);
  EXPECT_THROW(dsv32::encode_messages(J::parse(R"([{"role":"wizard","content":"x"}])"), think), dsa::Error);
  EXPECT_THROW(dsv32::encode_messages(J::parse(R"([{"role":"developer","content":""}])"), think), dsa::Error);
  EXPECT_THROW(dsv32::encode_messages(J::parse(R"([{"role":"user","content":"x"},{"role":"tool","content":"r"}])"), think),
               dsa::Error);
  // An assistant turn after the last user message needs reasoning or tool calls in thinking mode.
  EXPECT_THROW(dsv32::encode_messages(J::parse(R"([{"role":"user","content":"x"},{"role":"assistant","content":"y"}])"), think),
               dsa::Error);
  EXPECT_THROW(dsv32::encode_messages(J::parse(
                   R"([{"role":"user","content":"x"},{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"f","arguments":"[1]"}}]}])"),
                   dsv32::EncodeOptions{}),
               dsa::Error);
}

TEST(ChatDsv32, EmptyArgumentsAndRawStrings) {
  using J = nlohmann::ordered_json;
  const auto msgs = J::parse(R"([{"role":"user","content":"go"},
    {"role":"assistant","content":"","tool_calls":[
      {"type":"function","function":{"name":"f","arguments":"{}"}},
      {"type":"function","function":{"name":"g","arguments":{"q":"a \"b\" <c>\n","n":2.5}}}]}])");
  const std::string p = dsv32::encode_messages(msgs, {});
  EXPECT_NE(p.find("<｜DSML｜invoke name=\"f\">\n\n</｜DSML｜invoke>"), std::string::npos);
  EXPECT_NE(p.find("string=\"true\">a \"b\" <c>\n</｜DSML｜parameter>"), std::string::npos);
  EXPECT_NE(p.find("string=\"false\">2.5</｜DSML｜parameter>"), std::string::npos);
}

}  // namespace

namespace {

// Regression tests for requests found by fuzz/fuzz_dsv32_encoding, reproduced literally:
// fields of the wrong JSON type escaped as nlohmann::json::type_error (operator[] with an
// index on an object or a number, get<std::string>() on a number) instead of a dsa::Error.
TEST(ChatDsv32, FieldsOfTheWrongTypeAreErrors) {
  using J = nlohmann::ordered_json;
  auto expect_error = [](const char* messages, const char* needle) {
    try {
      dsv32::encode_messages(J::parse(messages), {});
      ADD_FAILURE() << "should have been refused: " << messages;
    } catch (const dsa::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(R"([{"role":"system","content":"s","tools":2147483647}])", "tools must be a list");
  expect_error(R"([{"role":"system","content":"s","tools":{"type":"function"}}])", "tools must be a list");
  expect_error(R"([{"role":"developer","content":"d","tools":"x"}])", "tools must be a list");
  expect_error(R"([{"role":"user","content":"u"},{"role":"assistant","content":"","tool_calls":{"type":"function"}}])",
               "tool_calls must be a list");
  expect_error(R"([{"role":"user","content":"u"},{"role":"assistant","content":"","tool_calls":"x"},{"role":"tool","content":"r"}])",
               "tool_calls must be a list");
  expect_error(R"([{"role":"user","content":[{"type":"text","text":5}]}])", "unsupported content part");
  expect_error(R"([{"role":"user","content":[{"type":7,"text":"t"}]}])", "unsupported content part");
  EXPECT_THROW(dsv32::render_tools(J::parse(R"({"name":"f"})")), dsa::Error);
  // An empty string is falsy, as in Python: reasoning_content "" does not satisfy the
  // thinking-mode requirement (nlohmann's empty() is false for every string).
  dsv32::EncodeOptions think;
  think.thinking_mode = ThinkingMode::Thinking;
  EXPECT_THROW(dsv32::encode_messages(J::parse(R"([{"role":"user","content":"u"},{"role":"assistant","content":"a","reasoning_content":""}])"), think),
               dsa::Error);
  // Falsy values still mean "none", as in the reference's `if tool_calls:` / `if tools:`.
  EXPECT_NO_THROW(dsv32::encode_messages(J::parse(R"([{"role":"system","content":"s","tools":{}},{"role":"user","content":"u"},
                                                      {"role":"assistant","content":"a","tool_calls":""}])"), {}));
}

}  // namespace
