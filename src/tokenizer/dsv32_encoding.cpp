#include "tokenizer/dsv32_encoding.h"

#include "core/error.h"
#include "io/json.h"
#include "tokenizer/pyjson.h"

namespace dsa::chat {

ThinkingMode parse_thinking_mode(std::string_view s) {
  if (s == "chat") return ThinkingMode::Chat;
  if (s == "thinking") return ThinkingMode::Thinking;
  throw Error("thinking_mode must be \"chat\" or \"thinking\", got \"" + std::string(s) + "\"");
}

namespace dsv32 {
namespace {

using ojson = nlohmann::ordered_json;

// TOOLS_SYSTEM_TEMPLATE as in the official fixture (with the blank lines that the vLLM and
// SGLang copies lost); {schemas} goes between the two parts.
constexpr std::string_view kToolsHead =
    "## Tools\n"
    "\n"
    "You have access to a set of tools you can use to answer the user's question.\n"
    "You can invoke functions by writing a \"<｜DSML｜function_calls>\" block like the following as part of your reply to the user:\n"
    "<｜DSML｜function_calls>\n"
    "<｜DSML｜invoke name=\"$FUNCTION_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$FUNCTION_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜function_calls>\n"
    "\n"
    "String and scalar parameters should be specified as is without any escaping or quotes, while lists and objects should use JSON format. The \"string\" attribute should be set to \"true\" for string type parameters and \"false\" for other types (numbers, booleans, arrays, objects).\n"
    "\n"
    "If the thinking_mode is enabled, then after function results you should strongly consider outputting a thinking block. Here is an example:\n"
    "\n"
    "<｜DSML｜function_calls>\n"
    "...\n"
    "</｜DSML｜function_calls>\n"
    "\n"
    "<function_results>\n"
    "...\n"
    "</function_results>\n"
    "\n"
    "<think>...thinking about results</think>\n"
    "\n"
    "Here are the functions available in JSONSchema format:\n"
    "<functions>\n";
constexpr std::string_view kToolsTail = "\n</functions>\n";

constexpr std::string_view kResponseFormatHead =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

const ojson& field(const ojson& m, const char* key) {
  static const ojson null_value;
  if (!m.is_object()) throw Error("every message must be a JSON object");
  auto it = m.find(key);
  return it == m.end() ? null_value : *it;
}

// Python truthiness of the optional fields the reference tests with `if x:`.
bool truthy(const ojson& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  // nlohmann's empty() is false for every string (a primitive), so "" needs its own test.
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  if (v.is_array() || v.is_object()) return !v.empty();
  if (v.is_number_float()) return v.get<double>() != 0;
  if (v.is_number()) return v.get<int64_t>() != 0;
  return true;
}

// `content or ""`: strings as they are; OpenAI text parts joined; null -> "".
std::string text_of(const ojson& content) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {
    std::string out;
    for (const auto& part : content) {
      if (part.is_string()) out += part.get<std::string>();
      else if (part.is_object() && part.contains("type") && part["type"] == "text" && part.contains("text") && part["text"].is_string())
        out += part["text"].get<std::string>();
      else throw Error("unsupported content part (expected a string or {\"type\": \"text\", \"text\": <string>}): " + part.dump());
    }
    return out;
  }
  throw Error("message content must be a string, a list of text parts or null");
}

std::string role_of(const ojson& m) {
  const ojson& r = field(m, "role");
  if (!r.is_string()) throw Error("message without a string \"role\"");
  return r.get<std::string>();
}

int last_user_index(const ojson& msgs) {
  int idx = -1;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string r = role_of(msgs[i]);
    if (r == "user" || r == "developer") idx = static_cast<int>(i);
  }
  return idx;
}

// tool_calls of an assistant message: a falsy value (absent, null, [], {}, "") means none, as
// in the reference's `if tool_calls:`; anything else but a list is an error (its entries are
// indexed and counted against the tool results).
const ojson& tool_calls_of(const ojson& msg, size_t index) {
  static const ojson none = ojson::array();
  const ojson& calls = field(msg, "tool_calls");
  if (!truthy(calls)) return none;
  if (!calls.is_array()) throw Error("message " + std::to_string(index) + ": tool_calls must be a list, got " + calls.dump());
  return calls;
}

std::string response_format_block(const ojson& rf) {
  return std::string(kResponseFormatHead) + py_json_dumps(rf);
}

// encode_arguments_to_dsml + tool_call_template for one OpenAI tool call.
std::string render_invoke(const ojson& call) {
  const ojson& fn = call.contains("function") ? call["function"] : call;
  if (!fn.contains("name") || !fn["name"].is_string()) throw Error("tool call without a function name");
  ojson args;
  const ojson& a = fn.contains("arguments") ? fn["arguments"] : ojson();
  if (a.is_string()) {
    try {
      args = parse_json_bounded<ojson>(a.get<std::string>());
    } catch (const nlohmann::json::exception& e) {
      throw Error("tool call arguments are not valid JSON: " + std::string(e.what()));
    }
  } else {
    args = a;
  }
  if (!args.is_object()) throw Error("tool call arguments must be a JSON object");
  std::string out = "<｜DSML｜invoke name=\"" + fn["name"].get<std::string>() + "\">\n";
  bool first = true;
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (!first) out += '\n';
    first = false;
    const bool is_str = it.value().is_string();
    out += "<｜DSML｜parameter name=\"" + it.key() + "\" string=\"" + (is_str ? "true" : "false") + "\">";
    out += is_str ? it.value().get<std::string>() : py_json_dumps(it.value());  // strings raw, unescaped
    out += "</｜DSML｜parameter>";
  }
  out += "\n</｜DSML｜invoke>";
  return out;
}

std::string render_message(size_t index, const ojson& msgs, int last_user, ThinkingMode mode) {
  const ojson& msg = msgs[index];
  const bool thinking = mode == ThinkingMode::Thinking;
  const auto i = static_cast<int>(index);
  const std::string role = role_of(msg);
  const ojson& tools = field(msg, "tools");
  const ojson& response_format = field(msg, "response_format");
  std::string p;

  if (role == "system") {
    p += text_of(field(msg, "content"));
    if (truthy(tools)) p += "\n\n" + render_tools(tools);
    if (truthy(response_format)) p += "\n\n" + response_format_block(response_format);
  } else if (role == "developer") {
    const std::string content = text_of(field(msg, "content"));
    if (content.empty()) throw Error("developer message with empty content");
    std::string dev;
    if (truthy(tools)) dev += "\n\n" + render_tools(tools);
    if (truthy(response_format)) dev += "\n\n" + response_format_block(response_format);
    dev += "\n\n# The user's message is: " + content;
    p += std::string(kUser) + dev + std::string(kAssistant);
    p += (i == last_user && thinking) ? kThinkStart : kThinkEnd;
  } else if (role == "user") {
    p += std::string(kUser) + text_of(field(msg, "content")) + std::string(kAssistant);
    p += (i == last_user && thinking) ? kThinkStart : kThinkEnd;
  } else if (role == "tool") {
    // Results are matched to calls by position: the nearest preceding non-tool message must
    // be an assistant with at least `order` tool calls.
    int prev = i - 1;
    while (prev >= 0 && role_of(msgs[static_cast<size_t>(prev)]) == "tool") --prev;
    if (prev < 0 || role_of(msgs[static_cast<size_t>(prev)]) != "assistant")
      throw Error("tool message " + std::to_string(i) + " does not follow an assistant message");
    const ojson& calls = tool_calls_of(msgs[static_cast<size_t>(prev)], static_cast<size_t>(prev));
    const int order = i - prev;
    if (static_cast<int>(calls.size()) < order)
      throw Error("tool message " + std::to_string(i) + " has no matching tool call");
    if (order == 1) p += "\n\n<function_results>";
    p += "\n<result>" + text_of(field(msg, "content")) + "</result>";
    if (order == static_cast<int>(calls.size())) {
      p += "\n</function_results>\n\n";
      p += (i >= last_user && thinking) ? kThinkStart : kThinkEnd;
    }
  } else if (role == "assistant") {
    const ojson& calls = tool_calls_of(msg, index);
    const ojson& reasoning = field(msg, "reasoning_content");
    std::string tool_part;
    if (!calls.empty()) {
      tool_part = "\n\n<｜DSML｜function_calls>\n";
      for (size_t k = 0; k < calls.size(); ++k) {
        if (k) tool_part += '\n';
        tool_part += render_invoke(calls[k]);
      }
      tool_part += "\n</｜DSML｜function_calls>";
    }
    std::string thinking_part;
    if (thinking && i > last_user) {
      // The current agentic turn: its reasoning is kept. `<think>` was already opened by
      // the preceding user/tool rendering.
      if (!truthy(reasoning) && !truthy(calls))
        throw Error("assistant message " + std::to_string(i) +
                    " after the last user message needs reasoning_content or tool_calls in thinking mode");
      thinking_part = (reasoning.is_string() ? reasoning.get<std::string>() : "") + std::string(kThinkEnd);
    }
    p += thinking_part + text_of(field(msg, "content")) + tool_part + std::string(kEos);
  } else {
    throw Error("unknown message role '" + role + "'");
  }
  return p;
}

}  // namespace

std::string render_tools(const ojson& tools) {
  if (!tools.is_array()) throw Error("tools must be a list of tools, got " + tools.dump());
  std::string schemas;
  for (size_t k = 0; k < tools.size(); ++k) {
    if (k) schemas += '\n';
    const ojson& t = tools[k];
    schemas += py_json_dumps(t.is_object() && t.contains("function") ? t["function"] : t);
  }
  return std::string(kToolsHead) + schemas + std::string(kToolsTail);
}

std::string encode_messages(const ojson& messages, const EncodeOptions& opts, const ojson& context) {
  if (!messages.is_array()) throw Error("messages must be a JSON array");
  if (!context.is_null() && !context.is_array()) throw Error("context must be a JSON array");
  ojson full = context.is_array() ? context : ojson::array();
  for (const auto& m : messages) full.push_back(m);
  // drop_thinking only strips reasoning the renderer never prints (assistant turns before
  // the last user message), so it needs no work here.
  std::string prompt;
  const size_t offset = context.is_array() ? context.size() : 0;
  if (opts.add_default_bos_token && offset == 0) prompt += kBos;
  const int last_user = last_user_index(full);
  for (size_t k = 0; k < messages.size(); ++k)
    prompt += render_message(k + offset, full, last_user, opts.thinking_mode);
  return prompt;
}

}  // namespace dsv32
}  // namespace dsa::chat
