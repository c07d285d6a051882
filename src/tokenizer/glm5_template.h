#pragma once
// GLM-5 prompt rendering: the logic of zai-org/GLM-5's chat_template.jinja
// (shared/tokenizer/glm5_chat_template.jinja) written out in C++, byte-exact to the template
// as rendered by transformers (Jinja2, trim_blocks + lstrip_blocks) and @huggingface/jinja.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace dsa::chat::glm5 {

struct RenderOptions {
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;  // unset: the template's default (thinking on)
  std::optional<bool> clear_thinking;   // unset: reasoning before the last user turn is dropped
};

// messages: OpenAI-shaped, as ordered_json so tool schemas keep their key order.
// tools: null/empty for none, else the list exactly as the request gave it (each item is
// written whole with tojson). Tool-call arguments may be an object or a JSON string (parsed
// first; the template needs an object). Where Jinja2 would print a Python repr (None content,
// non-string tool outputs), this writes "" for null and JSON otherwise.
std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                   const RenderOptions& opts);

}  // namespace dsa::chat::glm5
