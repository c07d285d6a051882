// Parsing DeepSeek-V3.2 completions: one-shot, streaming (split at every byte), round trip
// through the encoder, and errors on malformed DSML.
#include <gtest/gtest.h>

#include "core/error.h"
#include "fixtures.h"
#include "jsonl.h"
#include "tokenizer/dsv32_parser.h"
#include "tokenizer/pyjson.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using dsa::chat::ThinkingMode;
namespace dsv32 = dsa::chat::dsv32;
using J = nlohmann::ordered_json;

// The parse examples of CHAT_ENCODING.md ("What the model emits, and parsing it back").
const std::string kWeather =
    "I should call the weather tool.</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"fields\" string=\"false\">[\"temp\", \"wind\"]</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n</｜DSML｜function_calls><｜end▁of▁sentence｜>";
const std::string kSearch =
    "Let me look that up.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"search\">\n"
    "<｜DSML｜parameter name=\"query\" string=\"true\">2022 \"World Cup\" winner</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"search\">\n"
    "<｜DSML｜parameter name=\"query\" string=\"true\">世界杯 2022</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"topn\" string=\"false\">5</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n</｜DSML｜function_calls><｜end▁of▁sentence｜>";
const std::string kParis =
    "The capital of France is Paris; answer directly.</think>The capital of France is **Paris**.<｜end▁of▁sentence｜>";

TEST(Dsv32Parser, DocumentedExamples) {
  const auto a = dsv32::parse_completion(kParis, ThinkingMode::Thinking);
  EXPECT_EQ(a.to_json().dump(),
            R"({"role":"assistant","content":"The capital of France is **Paris**.","reasoning_content":"The capital of France is Paris; answer directly.","tool_calls":[]})");
  const auto b = dsv32::parse_completion(kWeather, ThinkingMode::Thinking);
  EXPECT_EQ(b.to_json().dump(),
            R"({"role":"assistant","content":"","reasoning_content":"I should call the weather tool.","tool_calls":[{"type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\", \"days\": 3, \"fields\": [\"temp\", \"wind\"]}"}}]})");
  const auto c = dsv32::parse_completion(kSearch, ThinkingMode::Chat);
  EXPECT_EQ(c.to_json().dump(-1, ' ', false),
            R"({"role":"assistant","content":"Let me look that up.","reasoning_content":"","tool_calls":[{"type":"function","function":{"name":"search","arguments":"{\"query\": \"2022 \\\"World Cup\\\" winner\"}"}},{"type":"function","function":{"name":"search","arguments":"{\"query\": \"世界杯 2022\", \"topn\": 5}"}}]})");
}

// Malformed completions (each must throw in both modes of parsing).
const std::vector<std::pair<std::string, ThinkingMode>>& malformed() {
  static const std::vector<std::pair<std::string, ThinkingMode>> v = {
      {"no end tag<｜end▁of▁sentence｜>", ThinkingMode::Thinking},
      {"x\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>trailing<｜end▁of▁sentence｜>",
       ThinkingMode::Chat},
      {"no eos", ThinkingMode::Chat},
      {"a<｜end▁of▁sentence｜>b", ThinkingMode::Chat},
      {"a</think>b<｜end▁of▁sentence｜>", ThinkingMode::Chat},
      {"r</think>c has ｜DSML｜ inside<｜end▁of▁sentence｜>", ThinkingMode::Thinking},
      {"\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke nam=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>", ThinkingMode::Chat},
      {"\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"maybe\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
       ThinkingMode::Chat},
      {"\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">1</｜DSML｜parameter>\n"
       "<｜DSML｜parameter name=\"a\" string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
       ThinkingMode::Chat},
      {"\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>", ThinkingMode::Chat},  // never closed
      {"\n\n<｜DSML｜function_calls>junk<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>", ThinkingMode::Chat},
  };
  return v;
}

TEST(Dsv32Parser, MalformedIsAnError) {
  for (const auto& [text, mode] : malformed()) {
    EXPECT_THROW(dsv32::parse_completion(text, mode), dsa::Error) << text;
    dsv32::StreamingParser sp(mode);
    EXPECT_THROW({
      for (char ch : text) sp.feed(std::string_view(&ch, 1));
      sp.finish();
    }, dsa::Error) << text;
  }
}

// Feeds `parts` and assembles the events; checks the events agree with message().
dsv32::ParsedMessage stream(const std::vector<std::string_view>& parts, ThinkingMode mode) {
  dsv32::StreamingParser sp(mode);
  dsv32::ParsedMessage got;
  auto take = [&](const std::vector<dsv32::StreamEvent>& ev) {
    for (const auto& e : ev) {
      switch (e.kind) {
        case dsv32::StreamEvent::Kind::Reasoning: got.reasoning_content += e.text; break;
        case dsv32::StreamEvent::Kind::Content: got.content += e.text; break;
        case dsv32::StreamEvent::Kind::ToolCall: got.tool_calls.push_back(e.call); break;
      }
    }
  };
  for (auto p : parts) take(sp.feed(p));
  take(sp.finish());
  EXPECT_EQ(got, sp.message());
  return got;
}

void check_every_split(const std::string& text, ThinkingMode mode) {
  const auto want = dsv32::parse_completion(text, mode);
  for (size_t k = 0; k <= text.size(); ++k) {
    const std::string_view t(text);
    EXPECT_EQ(stream({t.substr(0, k), t.substr(k)}, mode), want) << "split at byte " << k;
  }
  std::vector<std::string_view> bytes;
  for (size_t k = 0; k < text.size(); ++k) bytes.push_back(std::string_view(text).substr(k, 1));
  EXPECT_EQ(stream(bytes, mode), want) << "byte by byte";
}

TEST(Dsv32Parser, StreamingEqualsOneShotAtEverySplit) {
  check_every_split(kParis, ThinkingMode::Thinking);
  check_every_split(kWeather, ThinkingMode::Thinking);
  check_every_split(kSearch, ThinkingMode::Chat);
  // Tool calls without the final EOS are accepted, and near-miss markers stay text.
  check_every_split(kSearch.substr(0, kSearch.size() - std::string("<｜end▁of▁sentence｜>").size()), ThinkingMode::Chat);
  check_every_split("a <｜end▁of▁senten b\n\n<｜DSM x </thin<｜end▁of▁sentence｜>", ThinkingMode::Chat);
}

TEST(Dsv32Parser, StreamingEmitsEarlyAndHoldsBackMarkerPrefixes) {
  dsv32::StreamingParser sp(ThinkingMode::Thinking);
  auto ev = sp.feed("Let me think</th");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, dsv32::StreamEvent::Kind::Reasoning);
  EXPECT_EQ(ev[0].text, "Let me think");
  ev = sp.feed("ink>Answer\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n");
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].text, "Answer");
  EXPECT_EQ(ev[1].kind, dsv32::StreamEvent::Kind::ToolCall);
  EXPECT_EQ(ev[1].call.name, "f");
  EXPECT_EQ(ev[1].call.arguments, "{}");
  EXPECT_TRUE(sp.feed("</｜DSML｜function_calls><｜end▁of▁sentence｜>").empty());
  EXPECT_TRUE(sp.saw_eos());
  EXPECT_TRUE(sp.finish().empty());
}

TEST(Dsv32Parser, RoundTripsEveryAssistantMessageOfTheExamples) {
  std::vector<nlohmann::ordered_json> lines;
  ASSERT_TRUE(dsa::test::listed_jsonl("chat_examples.jsonl", &lines));
  const auto tok = dsa::Tokenizer::from_dir(dsa::test::tokenizer_dir());
  int checked = 0;
  for (const auto& l : lines) {
    dsv32::EncodeOptions o;
    o.thinking_mode = dsa::chat::parse_thinking_mode(l["encode_args"]["thinking_mode"].get<std::string>());
    const auto& msgs = l["messages"];
    for (size_t i = 0; i < msgs.size(); ++i) {
      const auto& m = msgs[i];
      if (m["role"] != "assistant") continue;
      J ctx = J::array();
      for (size_t k = 0; k < i; ++k) ctx.push_back(msgs[k]);
      const std::string completion = dsv32::encode_messages(J::array({m}), o, ctx);
      const auto got = dsv32::parse_completion(completion, o.thinking_mode);
      const bool has_calls = m.contains("tool_calls") && !m["tool_calls"].empty();
      if (o.thinking_mode == ThinkingMode::Thinking) {
        EXPECT_EQ(got.reasoning_content, m.value("reasoning_content", std::string())) << l["name"];
      }
      if (!has_calls) {
        EXPECT_EQ(got.content, m.value("content", std::string())) << l["name"];
        EXPECT_TRUE(got.tool_calls.empty());
      } else {
        ASSERT_EQ(got.tool_calls.size(), m["tool_calls"].size()) << l["name"];
        for (size_t k = 0; k < got.tool_calls.size(); ++k) {
          const auto& fn = m["tool_calls"][k]["function"];
          EXPECT_EQ(got.tool_calls[k].name, fn["name"].get<std::string>());
          EXPECT_EQ(got.tool_calls[k].arguments, dsa::py_json_dumps(J::parse(fn["arguments"].get<std::string>())));
        }
      }
      check_every_split(completion, o.thinking_mode);
      // As a server sees it: token ids through the stream decoder into the streaming parser.
      dsa::StreamDecoder sd(tok);
      std::vector<std::string> deltas;
      for (int32_t id : tok.encode(completion)) deltas.push_back(sd.push(id));
      deltas.push_back(sd.flush());
      std::vector<std::string_view> views(deltas.begin(), deltas.end());
      EXPECT_EQ(stream(views, o.thinking_mode), got) << l["name"];
      ++checked;
    }
  }
  EXPECT_GT(checked, 5);
}

}  // namespace

// Regression tests for inputs found by fuzz/fuzz_dsv32_parser, reproduced literally.
namespace {

// A character split across two deltas ("×" is C3 97) was emitted half in each, though
// deltas are promised to be cut at character boundaries only: its first byte now waits.
TEST(Dsv32Parser, CharacterSplitAcrossDeltasIsHeldBack) {
  dsv32::StreamingParser sp(ThinkingMode::Thinking);
  auto ev = sp.feed("17 \xC3");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].text, "17 ");
  ev = sp.feed("\x97 23</think>ok<｜end▁of▁sentence｜>");
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].text, "\xC3\x97 23");
  EXPECT_EQ(ev[1].text, "ok");
  EXPECT_TRUE(sp.finish().empty());
  // Also in 7-byte chunks of the fuzzer's input, and for 3- and 4-byte characters.
  const std::string text = "17 * 23 = 17 * 20 + 17 * 3 = 340 + 51 = 391.</think>17 × 23 = **391**.<｜end▁of▁sentence｜>";
  std::vector<std::string_view> parts;
  for (size_t k = 0; k < text.size(); k += 7) parts.push_back(std::string_view(text).substr(k, 7));
  dsv32::StreamingParser chunked(ThinkingMode::Thinking);
  for (auto p : parts)
    for (const auto& e : chunked.feed(p)) EXPECT_TRUE(dsa::utf8::valid(e.text)) << e.text;
  EXPECT_EQ(chunked.message(), dsv32::parse_completion(text, ThinkingMode::Thinking));
  dsv32::StreamingParser wide(ThinkingMode::Chat);
  EXPECT_EQ(wide.feed("a\xE4\xB8").at(0).text, "a");
  EXPECT_EQ(wide.feed("\x96\xF0\x9F").at(0).text, "\xE4\xB8\x96");
  EXPECT_EQ(wide.feed("\x98\x80<｜end▁of▁sentence｜>").at(0).text, "\xF0\x9F\x98\x80");
}

}  // namespace

// Fed byte by byte, the call in progress always shows a prefix of the arguments the call
// closes with, growing, and reaching all of it but the closing brace before the call ends:
// what a server streams as argument deltas adds up to the final arguments.
TEST(Dsv32Parser, PartialCallArgumentsArePrefixesOfTheFinalOnes) {
  for (const auto& [text, mode] : {std::pair{kWeather, ThinkingMode::Thinking}, std::pair{kSearch, ThinkingMode::Chat}}) {
    const auto want = dsv32::parse_completion(text, mode);
    dsv32::StreamingParser sp(mode);
    size_t call = 0;
    std::string shown;
    size_t longest = 0;
    for (char ch : text) {
      for (const auto& e : sp.feed(std::string_view(&ch, 1)))
        if (e.kind == dsv32::StreamEvent::Kind::ToolCall) {
          EXPECT_EQ(e.call.arguments.substr(0, shown.size()), shown);
          EXPECT_EQ(longest, e.call.arguments.size() - 1) << "all but '}' shown before the call closed";
          ++call;
          shown.clear();
          longest = 0;
        }
      if (const auto p = sp.partial_call()) {
        ASSERT_LT(call, want.tool_calls.size());
        EXPECT_EQ(p->name, want.tool_calls[call].name);
        const std::string& final_args = want.tool_calls[call].arguments;
        ASSERT_LE(p->arguments.size(), final_args.size()) << p->arguments;
        EXPECT_EQ(final_args.substr(0, p->arguments.size()), p->arguments);
        EXPECT_GE(p->arguments.size(), shown.size());
        shown = p->arguments;
        longest = std::max(longest, shown.size());
      }
    }
    sp.finish();
    EXPECT_EQ(call, want.tool_calls.size());
  }
}
