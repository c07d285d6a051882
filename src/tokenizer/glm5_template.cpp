#include "tokenizer/glm5_template.h"

#include <string_view>

#include "core/error.h"
#include "io/json.h"
#include "tokenizer/pyjson.h"
#include "tokenizer/utf8.h"

namespace dsa::chat::glm5 {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kToolsHead =
    "<|system|>\n"
    "# Tools\n"
    "\n"
    "You may call one or more functions to assist with the user query.\n"
    "\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n";
constexpr std::string_view kToolsTail =
    "</tools>\n"
    "\n"
    "For each function call, output the function name and arguments within the following XML format:\n"
    "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
    "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>";

// How `{{ x }}` prints a value: strings raw, null/undefined as nothing (@huggingface/jinja).
std::string print(const ojson& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  return py_json_dumps(v);
}

// The template's visible_text macro.
std::string visible_text(const ojson& content) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {
    std::string out;
    for (const auto& item : content) {
      if (item.is_object() && item.contains("type") && item["type"] == "text") out += print(item.value("text", ojson()));
      else if (item.is_string()) out += item.get<std::string>();
    }
    return out;
  }
  return print(content);
}

const ojson& get(const ojson& m, const char* key) {
  static const ojson null_value;
  auto it = m.find(key);
  return it == m.end() ? null_value : *it;
}

std::string role_of(const ojson& m) {
  const ojson& r = get(m, "role");
  return r.is_string() ? r.get<std::string>() : "";
}

// Python str.split(sep): all pieces.
std::vector<std::string_view> split(std::string_view s, std::string_view sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t p; (p = s.find(sep, start)) != std::string_view::npos; start = p + sep.size())
    out.push_back(s.substr(start, p - start));
  out.push_back(s.substr(start));
  return out;
}

std::string_view rstrip_nl(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}
std::string_view lstrip_nl(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}

void render_tool_calls(const ojson& calls, std::string& out) {
  for (const auto& call : calls) {
    const ojson& tc = call.is_object() && call.contains("function") ? call["function"] : call;
    out += "<tool_call>" + print(get(tc, "name"));
    ojson args = get(tc, "arguments");
    if (args.is_string()) {
      // OpenAI requests carry arguments as a JSON string; the template iterates .items().
      try {
        args = parse_json_bounded<ojson>(args.get<std::string>());
      } catch (const nlohmann::json::exception& e) {
        throw Error("tool call arguments are not valid JSON: " + std::string(e.what()));
      }
    }
    if (args.is_null()) args = ojson::object();
    if (!args.is_object()) throw Error("tool call arguments must be a JSON object");
    for (auto it = args.begin(); it != args.end(); ++it) {
      out += "<arg_key>" + it.key() + "</arg_key><arg_value>";
      out += it.value().is_string() ? it.value().get<std::string>() : py_json_dumps(it.value());
      out += "</arg_value>";
    }
    out += "</tool_call>";
  }
}

}  // namespace

std::string render(const ojson& messages, const ojson& tools, const RenderOptions& opts) {
  if (!messages.is_array()) throw Error("messages must be a JSON array");
  std::string out = "[gMASK]<sop>";
  if (tools.is_array() && !tools.empty()) {
    out += kToolsHead;
    for (const auto& t : tools) out += py_json_dumps(t) + "\n";
    out += kToolsTail;
  }
  int last_user = -1;
  for (size_t i = 0; i < messages.size(); ++i)
    if (role_of(messages[i]) == "user") last_user = static_cast<int>(i);
  const bool keep_all_reasoning = opts.clear_thinking.has_value() && !*opts.clear_thinking;

  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    if (!m.is_object()) throw Error("every message must be a JSON object");
    const std::string role = role_of(m);
    if (role == "user") {
      out += "<|user|>" + visible_text(get(m, "content"));
    } else if (role == "assistant") {
      out += "<|assistant|>";
      std::string content = visible_text(get(m, "content"));
      std::string reasoning;
      const ojson& rc = get(m, "reasoning_content");
      if (rc.is_string()) {
        reasoning = rc.get<std::string>();
      } else if (content.find("</think>") != std::string::npos) {
        // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
        const auto parts = split(content, "</think>");
        reasoning = std::string(lstrip_nl(split(rstrip_nl(parts.front()), "<think>").back()));
        content = std::string(lstrip_nl(parts.back()));
      }
      if ((keep_all_reasoning || static_cast<int>(i) > last_user) && !reasoning.empty())
        out += "<think>" + std::string(utf8::py_strip(reasoning)) + "</think>";
      else
        out += "</think>";
      out += utf8::py_strip(content);
      const ojson& calls = get(m, "tool_calls");
      if (calls.is_array() && !calls.empty()) render_tool_calls(calls, out);
    } else if (role == "tool") {
      const ojson& c = get(m, "content");
      if (c.is_string()) {
        // Consecutive string tool results share one <|observation|>.
        if (i == 0 || role_of(messages[i - 1]) != "tool") out += "<|observation|>";
        out += "<tool_response>" + c.get<std::string>() + "</tool_response>";
      } else {
        out += "<|observation|>";
        if (c.is_array())
          for (const auto& tr : c)
            out += "<tool_response>" + print(tr.is_object() && tr.contains("output") ? tr["output"] : tr) +
                   "</tool_response>";
      }
    } else if (role == "system") {
      out += "<|system|>" + visible_text(get(m, "content"));
    }
  }
  if (opts.add_generation_prompt)
    out += opts.enable_thinking.has_value() && !*opts.enable_thinking ? "<|assistant|></think>" : "<|assistant|><think>";
  return out;
}

}  // namespace dsa::chat::glm5
