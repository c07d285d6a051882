// The GLM-5 prompt renderer (glm5::render) on fuzzed request JSON and on type-confused
// variants of it (fuzz_util.h). The input is one JSON document, shaped like a line of
// glm5_chat_examples.jsonl:
//   {"messages": [...], "tools": [...], "add_generation_prompt": true,
//    "enable_thinking": false, "template_kwargs": {"clear_thinking": false}}
// (all but messages optional), or a bare messages array. The renderer must render or throw
// dsa::Error; the prompt is valid UTF-8, starts with [gMASK]<sop> and ends with the
// generation prompt when one is asked for.
#include <optional>
#include <string>

#include "core/error.h"
#include "fuzz_util.h"
#include "io/json.h"
#include "tokenizer/glm5_template.h"
#include "tokenizer/utf8.h"

using ojson = nlohmann::ordered_json;
namespace glm5 = dsa::chat::glm5;

namespace {

std::optional<bool> opt_bool(const ojson& o, const char* key) {
  if (o.is_object() && o.contains(key) && o[key].is_boolean()) return o[key].get<bool>();
  return std::nullopt;
}

void check(const ojson& j) {
  const bool wrapped = j.is_object() && j.contains("messages");
  const ojson& messages = wrapped ? j["messages"] : j;
  const ojson tools = wrapped && j.contains("tools") ? j["tools"] : ojson();
  glm5::RenderOptions o;
  if (wrapped) {
    o.add_generation_prompt = opt_bool(j, "add_generation_prompt").value_or(true);
    o.enable_thinking = opt_bool(j, "enable_thinking");
    if (j.contains("template_kwargs")) o.clear_thinking = opt_bool(j["template_kwargs"], "clear_thinking");
  }
  const std::string prompt = glm5::render(messages, tools, o);
  FUZZ_CHECK(dsa::utf8::valid(prompt), "prompt is not valid UTF-8");
  FUZZ_CHECK(prompt.starts_with("[gMASK]<sop>"), "prompt prefix");
  if (o.add_generation_prompt)
    FUZZ_CHECK(prompt.ends_with("<|assistant|><think>") || prompt.ends_with("<|assistant|></think>"), "generation prompt");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = dsa::fuzz::as_view(data, size);
  ojson j;
  try {
    j = dsa::parse_json_bounded<ojson>(input);
  } catch (const nlohmann::json::exception&) {
    return 0;
  }
  dsa::fuzz::run_with_variants(j, input, 32, check);
  return 0;
}
