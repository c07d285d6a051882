// GLM-5 prompt rendering against glm5_chat_examples.jsonl (rendered by the Jinja template).
#include <gtest/gtest.h>

#include "fixtures.h"
#include "jsonl.h"
#include "tokenizer/glm5_template.h"

namespace {

namespace glm5 = dsa::chat::glm5;

TEST(Glm5Template, EveryExampleIsByteExact) {
  std::vector<nlohmann::ordered_json> lines;
  ASSERT_TRUE(dsa::test::listed_jsonl("glm5_chat_examples.jsonl", &lines));
  for (const auto& l : lines) {
    glm5::RenderOptions o;
    o.add_generation_prompt = l["add_generation_prompt"].get<bool>();
    if (l["enable_thinking"].is_boolean()) o.enable_thinking = l["enable_thinking"].get<bool>();
    const auto& kw = l["template_kwargs"];
    if (kw.contains("clear_thinking")) o.clear_thinking = kw["clear_thinking"].get<bool>();
    for (auto it = kw.begin(); it != kw.end(); ++it)
      ASSERT_EQ(it.key(), "clear_thinking") << "unexpected template kwarg in " << l["name"];
    EXPECT_EQ(glm5::render(l["messages"], l["tools"], o), l["prompt"].get<std::string>()) << l["name"];
  }
}

TEST(Glm5Template, ArgumentsGivenAsJsonStringAreParsed) {
  using J = nlohmann::ordered_json;
  const auto as_obj = J::parse(R"([{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"f","arguments":{"a":1,"b":"x"}}}]}])");
  const auto as_str = J::parse(R"([{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{\"a\":1,\"b\":\"x\"}"}}]}])");
  glm5::RenderOptions o;
  o.add_generation_prompt = false;
  EXPECT_EQ(glm5::render(as_obj, nullptr, o), glm5::render(as_str, nullptr, o));
  EXPECT_EQ(glm5::render(as_obj, nullptr, o),
            "[gMASK]<sop><|assistant|></think><tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value>"
            "<arg_key>b</arg_key><arg_value>x</arg_value></tool_call>");
}

}  // namespace
