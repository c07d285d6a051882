// Forced tool calls: ToolCallPrefix takes the call blocks the DeepSeek-V3.2 encoder writes
// for the offered tools, refuses what breaks the tools' schemas or the block's format, and a
// walk over the bytes it allows never gets stuck and ends in a block the reference parser
// turns into calls whose arguments follow the schemas.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <iterator>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "core/error.h"
#include "sampling/tool_call_grammar.h"
#include "tokenizer/dsv32_encoding.h"
#include "tokenizer/dsv32_parser.h"

using namespace dsa;
using ojson = nlohmann::ordered_json;

namespace {

const ojson& weather_tools() {
  static const ojson t = ojson::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]},
      "fields": {"type": "array", "items": {"enum": ["temp", "wind"]}, "maxItems": 2}, "note": {"type": ["string", "null"]}},
      "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "get", "parameters": {"type": "object", "properties": {"ok": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "now"}}])");
  return t;
}

// The block the encoder writes for an assistant message making these calls.
std::string rendered_block(const ojson& calls) {
  ojson msgs = ojson::array();
  msgs.push_back({{"role", "system"}, {"content", ""}, {"tools", weather_tools()}});
  msgs.push_back({{"role", "user"}, {"content", "weather?"}});
  ojson tc = ojson::array();
  for (const auto& c : calls) tc.push_back({{"type", "function"}, {"function", {{"name", c[0]}, {"arguments", c[1].dump()}}}});
  msgs.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", tc}});
  const std::string text = chat::dsv32::encode_messages(msgs, {});
  const size_t b = text.rfind("\n\n<｜DSML｜function_calls>"), e = text.rfind(chat::dsv32::kEos);
  EXPECT_NE(b, std::string::npos) << text;
  return text.substr(b, e - b);
}

bool takes(const ToolCallGrammar& g, const std::string& text, bool* whole = nullptr) {
  ToolCallPrefix p(g);
  const bool ok = p.feed(text);
  if (whole) *whole = ok && p.complete();
  return ok;
}

TEST(ToolCalls, TheEncodersBlocksAreTaken) {
  const ToolCallGrammar several(weather_tools(), true), one(weather_tools(), false);
  const std::vector<ojson> cases = {
      ojson::parse(R"([["get_weather", {"city": "Paris", "unit": "c"}]])"),
      ojson::parse(R"([["get_weather", {"city": "東京 <b>", "days": 3, "unit": "f", "fields": ["temp", "wind"], "note": null}]])"),
      ojson::parse(R"([["get", {}]])"), ojson::parse(R"([["now", {}]])"), ojson::parse(R"([["get", {"ok": true}]])"),
      ojson::parse(R"([["get_weather", {"city": "a", "unit": "c"}], ["now", {}]])")};
  for (const ojson& c : cases) {
    const std::string block = rendered_block(c);
    SCOPED_TRACE(block);
    bool whole = false;
    EXPECT_TRUE(takes(several, block, &whole));
    EXPECT_TRUE(whole);
    EXPECT_EQ(takes(one, block, &whole) && whole, c.size() == 1);
  }
}

TEST(ToolCalls, WhatBreaksTheSchemaOrTheFormatIsRefused) {
  const ToolCallGrammar g(weather_tools(), true);
  const std::string open = "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"";
  const std::string w = open + "get_weather\">\n<｜DSML｜parameter name=\"";
  const std::string city = w + "city\" string=\"true\">P</｜DSML｜parameter>\n";
  EXPECT_TRUE(takes(g, city + "<｜DSML｜parameter name=\"unit\" string=\"false\">\"c\"</｜DSML｜parameter>\n</｜DSML｜invoke>"));
  EXPECT_FALSE(takes(g, "Sure.\n\n<｜DSML｜function_calls>")) << "content before the block";
  EXPECT_FALSE(takes(g, open + "get_w\"")) << "an unknown tool";
  EXPECT_FALSE(takes(g, open + "delete\"")) << "an unknown tool";
  EXPECT_FALSE(takes(g, w + "town\"")) << "an undeclared parameter";
  EXPECT_FALSE(takes(g, w + "days\"")) << "the required city skipped";
  EXPECT_FALSE(takes(g, city + "<｜DSML｜parameter name=\"city\"")) << "a parameter twice";
  EXPECT_FALSE(takes(g, city + "</｜DSML｜invoke>")) << "the required unit missing";
  EXPECT_FALSE(takes(g, city + "<｜DSML｜parameter name=\"days\" string=\"true\"")) << "raw text for an integer";
  EXPECT_FALSE(takes(g, city + "<｜DSML｜parameter name=\"days\" string=\"false\">3.5")) << "a fraction for an integer";
  EXPECT_FALSE(takes(g, city + "<｜DSML｜parameter name=\"unit\" string=\"false\">\"k")) << "outside the enum";
  EXPECT_FALSE(takes(g, w + "city\" string=\"true\">a｜DSML｜")) << "markup inside a value";
  EXPECT_FALSE(takes(g, w + "city\" string=\"true\">a</｜DSML｜invoke>")) << "an invoke closed inside a value";
  EXPECT_FALSE(takes(g, w + "city\" string=\"false\">\"｜DSML｜")) << "markup inside a JSON string";
  EXPECT_FALSE(takes(g, w + "city\" string=\"true\">a<｜")) << "markup opened inside a value";
  EXPECT_FALSE(takes(g, w + "city\" string=\"false\">\"<｜")) << "markup opened inside a JSON string";
  EXPECT_FALSE(takes(g, w + "city\" string=\"true\">a ｜DSML\xEF\xBD" + "\x9C")) << "markup completed by a lone byte";
  EXPECT_FALSE(takes(g, w + "city\" string=\"true\">a</｜DSML｜x")) << "a close tag begun and left";
  EXPECT_TRUE(takes(g, w + "city\" string=\"true\">a < b ｜ DSML | </ c\n\n\"\\</｜DSML｜parameter>"));
  const std::string done = open + "now\">\n\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";
  bool whole = false;
  EXPECT_TRUE(takes(g, done, &whole));
  EXPECT_TRUE(whole);
  EXPECT_FALSE(takes(g, done + " ")) << "text after the block";
}

// Thinking mode: reasoning (free text, markup-like bytes included) up to "</think>", then the
// block at once.
TEST(ToolCalls, ThinkingReasonsFirst) {
  const ToolCallGrammar g(weather_tools(), true, true);
  const std::string block = rendered_block(ojson::parse(R"([["now", {}]])"));
  bool whole = false;
  EXPECT_TRUE(takes(g, "Check <b>now</b>: a < b, ｜ DS\n\n</think>" + block, &whole));
  EXPECT_TRUE(whole);
  EXPECT_TRUE(takes(g, "</think>" + block, &whole));
  EXPECT_TRUE(whole);
  EXPECT_FALSE(takes(g, block)) << "no reasoning end";
  EXPECT_FALSE(takes(g, "a<think>")) << "a second think tag";
  EXPECT_FALSE(takes(g, "a｜DSML｜")) << "markup in reasoning";
  EXPECT_FALSE(takes(g, "a<｜end▁of▁sentence｜>")) << "an end-of-sequence text in reasoning";
  EXPECT_FALSE(takes(g, "a</think>Sure." + block)) << "content before the block";
  chat::dsv32::ParsedMessage m;
  ASSERT_NO_THROW(m = chat::dsv32::parse_completion("Check.</think>" + block, chat::ThinkingMode::Thinking));
  EXPECT_EQ(m.reasoning_content, "Check.");
  ASSERT_EQ(m.tool_calls.size(), 1u);
}

TEST(ToolCalls, ToolsThatCannotBeWrittenOrEnforcedAreErrors) {
  auto tool = [](const std::string& name, const ojson& params) {
    return ojson::array({{{"type", "function"}, {"function", {{"name", name}, {"parameters", params}}}}});
  };
  const ojson obj = {{"type", "object"}, {"properties", {{"a", {{"type", "string"}}}}}};
  EXPECT_NO_THROW(ToolCallGrammar(tool("f", obj), true));
  EXPECT_THROW(ToolCallGrammar(ojson::array(), true), Error);
  EXPECT_THROW(ToolCallGrammar(tool("a\"b", obj), true), Error);
  EXPECT_THROW(ToolCallGrammar(tool("", obj), true), Error);
  EXPECT_THROW(ToolCallGrammar(tool("f", {{"type", "object"}, {"properties", {{"a\nb", {{"type", "string"}}}}}}), true), Error);
  // Without "strict" a schema outside the subset is kept as far as it can be; with it, refused.
  const ojson pattern = {{"type", "object"}, {"properties", {{"a", {{"type", "string"}, {"pattern", "(x)\\1"}}}}}};  // a backreference
  for (const ojson& params : {pattern, ojson{{"type", "string"}}}) {
    EXPECT_NO_THROW(ToolCallGrammar(tool("f", params), true)) << params.dump();
    ojson strict = tool("f", params);
    strict[0]["function"]["strict"] = true;
    EXPECT_THROW(ToolCallGrammar(strict, true), Error) << params.dump();
  }
  ojson counted = tool("f", {{"type", "object"}, {"properties", {{"a", {{"type", "string"}}}}}, {"minProperties", 1}});
  EXPECT_NO_THROW(ToolCallGrammar(counted, true));
  counted[0]["function"]["strict"] = true;
  EXPECT_THROW(ToolCallGrammar(counted, true), Error) << "key counts are not kept on DSML parameters";
  const ToolCallGrammar loose(tool("f", pattern), true);
  bool whole = false;
  EXPECT_TRUE(takes(loose, "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">y</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>", &whole));
  EXPECT_TRUE(whole);
  EXPECT_TRUE(ToolCallGrammar(tool("f", ojson::object()), true).tools()[0].keys.empty()) << "parameters {} take none";
  ojson twice = tool("f", obj);
  twice.push_back(twice[0]);
  EXPECT_THROW(ToolCallGrammar(twice, true), Error);
}

// The bytes ToolCallPrefix takes after `p`.
std::vector<unsigned char> next_bytes(const ToolCallPrefix& p) {
  std::vector<unsigned char> out;
  for (int c = 0; c < 256; ++c) {
    ToolCallPrefix q = p;
    if (q.feed(static_cast<unsigned char>(c))) out.push_back(static_cast<unsigned char>(c));
  }
  return out;
}

// Random walks over the bytes ToolCallPrefix takes, each up to a whole block or `limit` bytes:
// ASCII where it may be (markup needs the bytes of "｜"; the arguments are rebuilt as JSON,
// which takes valid UTF-8 only, as a tokenizer's text is), each byte of `prefer` taken with
// chance 1 / odds where it is allowed. A dead end fails the test; every whole block is parsed
// by the reference parser and given to `check`. Returns how many walks finished.
int walk_blocks(const ToolCallGrammar& g, uint32_t seed, int walks, std::string_view prefer, unsigned odds, size_t limit,
                const std::function<void(const chat::dsv32::ParsedMessage&)>& check) {
  std::mt19937 rng(seed);
  int finished = 0;
  for (int walk = 0; walk < walks; ++walk) {
    ToolCallPrefix p(g);
    std::string text;
    while (!p.complete() && text.size() < limit) {
      std::vector<unsigned char> next = next_bytes(p);
      if (next.empty()) {
        ADD_FAILURE() << "stuck after: " << text;
        return finished;
      }
      std::vector<unsigned char> ascii;
      std::copy_if(next.begin(), next.end(), std::back_inserter(ascii), [](unsigned char b) { return b < 0x80; });
      if (!ascii.empty()) next = ascii;
      unsigned char c = next[rng() % next.size()];
      for (unsigned char pref : prefer)
        if (rng() % odds == 0 && std::find(next.begin(), next.end(), pref) != next.end()) c = pref;
      p.feed(c);
      text += char(c);
    }
    if (!p.complete()) continue;
    ++finished;
    SCOPED_TRACE(text);
    chat::dsv32::ParsedMessage m;
    EXPECT_NO_THROW(m = chat::dsv32::parse_completion(text, chat::ThinkingMode::Chat));
    check(m);
  }
  return finished;
}

// Random walks, leaning towards bytes that end things ('<', quotes, brackets) so that most
// walks finish: none gets stuck, and every finished one parses into calls that follow the
// schemas.
TEST(ToolCalls, RandomWalksEndInCallsTheParserTakes) {
  for (const bool several : {true, false}) {
    const ToolCallGrammar g(weather_tools(), several);
    const int finished = walk_blocks(g, several ? 7 : 8, 300, "<\"]}>\n", 3, 4000, [&](const chat::dsv32::ParsedMessage& m) {
      ASSERT_FALSE(m.tool_calls.empty());
      EXPECT_TRUE(several || m.tool_calls.size() == 1);
      for (const auto& call : m.tool_calls) {
        const ojson args = ojson::parse(call.arguments, nullptr, false);
        ASSERT_TRUE(args.is_object()) << call.arguments;
        if (call.name == "get_weather") {
          EXPECT_TRUE(args.contains("city") && args["city"].is_string());
          EXPECT_TRUE(args.contains("unit") && (args["unit"] == "c" || args["unit"] == "f"));
          EXPECT_TRUE(!args.contains("days") || args["days"].is_number_integer());
          EXPECT_TRUE(!args.contains("fields") || (args["fields"].is_array() && args["fields"].size() <= 2));
          EXPECT_TRUE(!args.contains("note") || args["note"].is_string() || args["note"].is_null());
        } else if (call.name == "get") {
          EXPECT_TRUE(!args.contains("ok") || args["ok"].is_boolean());
        } else {
          EXPECT_EQ(call.name, "now");
          EXPECT_TRUE(args.empty());
        }
      }
    });
    EXPECT_GT(finished, 100);
  }
}

// Length bounds on a string parameter hold whether its value is written as raw text or as
// JSON, and integer bounds on a JSON value; walks leaning on '<' (whose close-tag prefixes
// may turn out to be text) never get stuck, even where a length is exact.
TEST(ToolCalls, BoundsHoldInRawAndJsonValues) {
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "set", "strict": true, "parameters": {
      "type": "object", "properties": {"code": {"type": "string", "minLength": 2, "maxLength": 5},
      "pin": {"type": "string", "minLength": 3, "maxLength": 3}, "n": {"type": "integer", "minimum": 1, "maximum": 9}},
      "required": ["code", "pin"], "additionalProperties": false}}}])");
  const ToolCallGrammar g(tools, false);
  auto block = [](const std::string& code, const std::string& pin, bool raw = true) {
    std::string b = "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"set\">\n<｜DSML｜parameter name=\"code\" string=\"";
    b += raw ? "true\">" : "false\">";
    b += code;
    b += "</｜DSML｜parameter>\n<｜DSML｜parameter name=\"pin\" string=\"true\">";
    b += pin;
    b += "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";
    return b;
  };
  for (const char* code : {"ab", "a<b", "中文字", "abcde", "</x", "</｜D"}) {
    bool whole = false;
    EXPECT_TRUE(takes(g, block(code, "123"), &whole) && whole) << code;
  }
  for (const char* code : {"a", "abcdef", "<", "中文字中文字", "</｜DSM"}) EXPECT_FALSE(takes(g, block(code, "123"))) << code;
  for (const char* pin : {"12", "1234", "<<<<"}) EXPECT_FALSE(takes(g, block("ab", pin))) << pin;
  bool whole = false;
  EXPECT_TRUE(takes(g, block("\"a\\nb\"", "xyz", false), &whole) && whole);
  EXPECT_FALSE(takes(g, block("\"a\"", "xyz", false)));
  auto chars = [](const std::string& t) { return std::count_if(t.begin(), t.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }); };
  const int finished = walk_blocks(g, 5, 400, "<\"<>/", 2, 2000, [&](const chat::dsv32::ParsedMessage& m) {
    ASSERT_EQ(m.tool_calls.size(), 1u);
    const ojson args = ojson::parse(m.tool_calls[0].arguments, nullptr, false);
    ASSERT_TRUE(args.is_object()) << m.tool_calls[0].arguments;
    ASSERT_TRUE(args.contains("code") && args["code"].is_string() && args.contains("pin") && args["pin"].is_string());
    EXPECT_GE(chars(args["code"]), 2);
    EXPECT_LE(chars(args["code"]), 5);
    EXPECT_EQ(chars(args["pin"]), 3);
    EXPECT_TRUE(!args.contains("n") || (args["n"].is_number_integer() && args["n"] >= 1 && args["n"] <= 9));
  });
  EXPECT_GT(finished, 100);
}

// A string parameter with a pattern is written as a JSON string (string="false"), where the
// pattern holds; raw text is not offered for it. Its neighbours keep raw text.
TEST(ToolCalls, PatternedStringsAreWrittenAsJson) {
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "set", "parameters": {
      "type": "object", "properties": {"zip": {"type": "string", "pattern": "^\\d{5}$"}, "city": {"type": "string"}},
      "required": ["zip", "city"]}}}])");
  const ToolCallGrammar g(tools, false);
  auto block = [](const std::string& zip_attr, const std::string& zip) {
    return "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"set\">\n<｜DSML｜parameter name=\"zip\" string=\"" + zip_attr + "\">" + zip +
           "</｜DSML｜parameter>\n<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";
  };
  bool whole = false;
  EXPECT_TRUE(takes(g, block("false", "\"75001\""), &whole) && whole);
  EXPECT_FALSE(takes(g, block("true", "75001")));
  EXPECT_FALSE(takes(g, block("false", "\"7500\"")));
  EXPECT_FALSE(takes(g, block("false", "\"75001x\"")));
  const int finished = walk_blocks(g, 5, 60, "0123456789\"", 2, 2000, [&](const chat::dsv32::ParsedMessage& m) {
    ASSERT_EQ(m.tool_calls.size(), 1u);
    const ojson args = ojson::parse(m.tool_calls[0].arguments, nullptr, false);
    ASSERT_TRUE(args.is_object() && args.contains("zip") && args["zip"].is_string()) << m.tool_calls[0].arguments;
    EXPECT_TRUE(std::regex_match(args["zip"].get<std::string>(), std::regex("\\d{5}"))) << m.tool_calls[0].arguments;
  });
  EXPECT_GT(finished, 15);
}

}  // namespace
