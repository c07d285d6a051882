#include "server/protocol.h"

#include <algorithm>
#include <random>

#include "core/error.h"
#include "tokenizer/dsv32_encoding.h"
#include "tokenizer/glm5_template.h"

namespace dsa::server {

// Request bodies keep their keys' order: tools' and response formats' schemas are rendered and
// generated in the order the client wrote them.
using json = nlohmann::ordered_json;

ApiError::ApiError(int s, std::string message, std::string p, std::string t, std::string c)
    : std::runtime_error(std::move(message)), status(s), type(std::move(t)), param(std::move(p)), code(std::move(c)) {
  if (type.empty()) {
    switch (status) {
      case 401: type = "authentication_error"; break;
      case 404: type = "not_found_error"; break;
      case 413: type = "invalid_request_error"; break;
      case 429: type = "rate_limit_error"; break;
      case 503: type = "service_unavailable_error"; break;
      default: type = status >= 500 ? "server_error" : "invalid_request_error";
    }
  }
}

nlohmann::json ApiError::body() const {
  using json = nlohmann::json;
  return {{"error",
           {{"message", what()}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

const char* finish_reason(StopReason r) {
  switch (r) {
    case StopReason::Eos:
    case StopReason::StopString: return "stop";
    case StopReason::MaxTokens:
    case StopReason::ContextFull: return "length";
    case StopReason::Callback: return "abort";
  }
  return "stop";
}

ApiError model_not_found(const std::string& asked, const ModelInfo& m) {
  return ApiError(404, "The model '" + asked + "' does not exist; this server serves '" + m.name + "'", "model", "", "model_not_found");
}

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& what) { throw ApiError(400, "'" + param + "': " + what, param); }

// A field's value, or null when absent (null counts as absent, as the OpenAI API has it).
const json& field(const json& o, const char* key) {
  static const json null;
  const auto it = o.find(key);
  return it == o.end() ? null : *it;
}

std::optional<double> number(const json& o, const char* key, double lo, double hi) {
  const json& v = field(o, key);
  if (v.is_null()) return std::nullopt;
  if (!v.is_number()) bad(key, "expected a number");
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) bad(key, "expected a number in [" + json(lo).dump() + ", " + json(hi).dump() + "], got " + v.dump());
  return x;
}

std::optional<int64_t> integer(const json& o, const char* key, int64_t lo, int64_t hi) {
  const json& v = field(o, key);
  if (v.is_null()) return std::nullopt;
  if (!v.is_number_integer()) bad(key, "expected an integer");
  const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v.get<int64_t>();
  if (x < lo || x > hi) bad(key, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
  return x;
}

std::optional<bool> boolean(const json& o, const char* key) {
  const json& v = field(o, key);
  if (v.is_null()) return std::nullopt;
  if (!v.is_boolean()) bad(key, "expected true or false");
  return v.get<bool>();
}

void check_model(const json& body, const ModelInfo& m) {
  const json& v = field(body, "model");
  if (v.is_null()) return;
  if (!v.is_string()) bad("model", "expected a string");
  if (v.get<std::string>() != m.name) throw model_not_found(v.get<std::string>(), m);
}

// A list of token ids of the model's vocabulary.
std::vector<int32_t> token_ids(const json& a, const ModelInfo& m, const std::string& where) {
  std::vector<int32_t> ids;
  for (const json& x : a) {
    if (!x.is_number_integer()) bad(where, "expected token ids (integers)");
    const int64_t v = x.get<int64_t>();
    if (v < 0 || v >= m.vocab_size) bad(where, "token id " + std::to_string(v) + " out of range [0, " + std::to_string(m.vocab_size) + ")");
    ids.push_back(int32_t(v));
  }
  return ids;
}

// Sampling, stops, n, streaming and max_tokens (once the prompt length is known).
void parse_common(const json& b, const ModelInfo& m, const ServeLimits& lim, Job& j) {
  SamplerParams& s = j.gen.sampling;
  s.temperature = float(number(b, "temperature", 0, 2).value_or(1.0));
  s.top_p = float(number(b, "top_p", 0, 1).value_or(1.0));
  if (s.top_p <= 0) bad("top_p", "expected a number in (0, 1]");
  s.top_k = int(integer(b, "top_k", -1, INT32_MAX).value_or(0));
  if (s.top_k < 0) s.top_k = 0;
  s.min_p = float(number(b, "min_p", 0, 1).value_or(0));
  s.presence_penalty = float(number(b, "presence_penalty", -2, 2).value_or(0));
  s.frequency_penalty = float(number(b, "frequency_penalty", -2, 2).value_or(0));
  s.repeat_penalty = float(number(b, "repetition_penalty", 1e-6, 1e6).value_or(1));
  s.penalty_last_n = -1;
  if (const auto seed = integer(b, "seed", INT64_MIN, INT64_MAX)) {
    s.seed = uint64_t(*seed);
    j.seed_given = true;
  } else {
    std::random_device rd;
    s.seed = (uint64_t(rd()) << 32) ^ rd();
  }
  const json& stop = field(b, "stop");
  if (stop.is_string()) {
    j.gen.stop.push_back(stop.get<std::string>());
  } else if (stop.is_array()) {
    for (const json& x : stop) {
      if (!x.is_string()) bad("stop", "expected a string or a list of strings");
      j.gen.stop.push_back(x.get<std::string>());
    }
  } else if (!stop.is_null()) {
    bad("stop", "expected a string or a list of strings");
  }
  for (const std::string& x : j.gen.stop)
    if (x.empty()) bad("stop", "stop strings must not be empty");
  j.gen.include_stop_str = boolean(b, "include_stop_str_in_output").value_or(false);
  j.n = int(integer(b, "n", 1, lim.max_n).value_or(1));
  j.stream = boolean(b, "stream").value_or(false);
  const json& so = field(b, "stream_options");
  if (!so.is_null()) {
    if (!so.is_object()) bad("stream_options", "expected an object");
    j.include_usage = boolean(so, "include_usage").value_or(false);
  }
  const json& ids = field(b, "stop_token_ids");
  if (!ids.is_null() && !ids.is_array()) bad("stop_token_ids", "expected a list of token ids");
  if (ids.is_array()) j.gen.stop_ids = token_ids(ids, m, "stop_token_ids");
  j.return_token_ids = boolean(b, "return_token_ids").value_or(false);
  if (const auto ign = boolean(b, "ignore_eos")) j.gen.stop_on_eos = !*ign;
}

constexpr int64_t kCompletionsDefaultMaxTokens = 16;

// max_tokens (or max_completion_tokens): at most the limit and what the context leaves after
// the longest prompt.
void parse_max_tokens(const json& b, const ServeLimits& lim, Job& j) {
  size_t longest = 0;
  for (const auto& p : j.prompts) longest = std::max(longest, p.size());
  const int max_prompt = lim.max_prompt > 0 ? std::min(lim.max_prompt, lim.max_ctx - 1) : lim.max_ctx - 1;
  if (int64_t(longest) > max_prompt)
    throw ApiError(400,
                   "The prompt has " + std::to_string(longest) + " tokens; this server takes at most " + std::to_string(max_prompt) +
                       " (context " + std::to_string(lim.max_ctx) + " tokens, prompt and completion)",
                   j.chat ? "messages" : "prompt", "", "context_length_exceeded");
  std::optional<int64_t> mt = integer(b, "max_completion_tokens", 0, INT32_MAX);
  if (!mt) mt = integer(b, "max_tokens", 0, INT32_MAX);
  if (mt && *mt > lim.max_tokens)
    bad(field(b, "max_completion_tokens").is_null() ? "max_tokens" : "max_completion_tokens",
        "at most " + std::to_string(lim.max_tokens) + " tokens per request, got " + std::to_string(*mt));
  const int room = lim.max_ctx - int(longest);
  // Unset: chat runs to the context (OpenAI's chat default); the legacy completions stop
  // at 16 tokens, that API's documented default (vLLM's too).
  j.gen.max_new_tokens = int(std::min<int64_t>(mt.value_or(j.chat ? lim.max_tokens : kCompletionsDefaultMaxTokens), room));
  const int64_t least = integer(b, "min_tokens", 0, INT32_MAX).value_or(0);
  if (mt && least > *mt) bad("min_tokens", "above max_tokens (" + std::to_string(*mt) + ")");
  if (least > 0 && j.gen.constrained()) bad("min_tokens", "JSON output, forced tool calls, choices and regexes do not run with min_tokens");
  j.gen.min_tokens = int(least);
}

void parse_logprobs_chat(const json& b, const ServeLimits& lim, Job& j) {
  if (boolean(b, "logprobs").value_or(false)) j.logprobs = int(integer(b, "top_logprobs", 0, lim.max_top_logprobs).value_or(0));
  else if (!field(b, "top_logprobs").is_null()) integer(b, "top_logprobs", 0, lim.max_top_logprobs);
}

std::string content_text(const json& c, const std::string& where) {
  if (c.is_null()) return "";
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(where, "content must be a string, a list of text parts or null");
  std::string out;
  for (const json& p : c) {
    if (!p.is_object() || field(p, "type") != "text" || !field(p, "text").is_string())
      bad(where, "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
    out += p["text"].get<std::string>();
  }
  return out;
}

// The messages as the encoders take them: content as text, "reasoning" as reasoning_content.
json normalize_messages(const json& msgs) {
  if (!msgs.is_array() || msgs.empty()) bad("messages", "expected a non-empty list of messages");
  json out = json::array();
  for (size_t i = 0; i < msgs.size(); ++i) {
    const json& m = msgs[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) bad(where, "expected an object");
    const json& role = field(m, "role");
    if (!role.is_string()) bad(where + ".role", "expected a string");
    const std::string r = role.get<std::string>();
    if (r != "system" && r != "developer" && r != "user" && r != "assistant" && r != "tool")
      bad(where + ".role", "expected system, developer, user, assistant or tool, got '" + r + "'");
    json o = {{"role", r}, {"content", content_text(field(m, "content"), where + ".content")}};
    if (r == "assistant") {
      const json& rc = field(m, "reasoning_content").is_null() ? field(m, "reasoning") : field(m, "reasoning_content");
      if (!rc.is_null()) {
        if (!rc.is_string()) bad(where + ".reasoning_content", "expected a string");
        o["reasoning_content"] = rc;
      }
      const json& tc = field(m, "tool_calls");
      if (!tc.is_null()) {
        if (!tc.is_array()) bad(where + ".tool_calls", "expected a list");
        for (const json& c : tc)
          if (!c.is_object() || !field(c, "function").is_object() || !field(c["function"], "name").is_string())
            bad(where + ".tool_calls", "each call needs function.name and function.arguments");
        o["tool_calls"] = tc;
      }
    }
    if (r == "tool" && field(m, "tool_call_id").is_string()) o["tool_call_id"] = m["tool_call_id"];
    out.push_back(std::move(o));
  }
  return out;
}

// The tools offered, after tool_choice: none offers none, a named function only that one.
json offered_tools(const json& b) {
  const json& tools = field(b, "tools");
  if (tools.is_null()) return json::array();
  if (!tools.is_array()) bad("tools", "expected a list of tools");
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    if (!t.is_object() || field(t, "type") != "function" || !field(t, "function").is_object() || !field(t["function"], "name").is_string())
      bad("tools[" + std::to_string(i) + "]", "expected {\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  // The body keeps its key order, so the prompt shows the schemas as written.
  json out = tools;
  const json& choice = field(b, "tool_choice");
  if (choice.is_null() || choice == "auto" || choice == "required") return out;
  if (choice == "none") return json::array();
  if (choice.is_object() && field(choice, "type") == "function" && field(choice, "function").is_object() &&
      field(choice["function"], "name").is_string()) {
    const std::string name = choice["function"]["name"];
    for (const auto& t : out)
      if (t["function"]["name"] == name) return json::array({t});
    bad("tool_choice", "names the function '" + name + "', which is not in 'tools'");
  }
  bad("tool_choice", "expected \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
}

bool thinking_switch(const json& b) {
  const json& k = field(b, "chat_template_kwargs");
  if (k.is_null()) return false;
  if (!k.is_object()) bad("chat_template_kwargs", "expected an object");
  if (const auto t = boolean(k, "thinking")) return *t;
  return boolean(k, "enable_thinking").value_or(false);
}

std::string render(const ModelInfo& m, json msgs, const json& tools, bool thinking) {
  try {
    if (m.family == Family::DeepseekV32) {
      if (!tools.empty()) {  // tools sit in a system message (the encoding's convention)
        if (msgs[0]["role"] != "system" && msgs[0]["role"] != "developer") msgs.insert(msgs.begin(), json{{"role", "system"}, {"content", ""}});
        msgs[0]["tools"] = tools;
      }
      chat::dsv32::EncodeOptions o;
      o.thinking_mode = thinking ? chat::ThinkingMode::Thinking : chat::ThinkingMode::Chat;
      return chat::dsv32::encode_messages(msgs, o);
    }
    chat::glm5::RenderOptions o;
    o.enable_thinking = thinking;
    return chat::glm5::render(msgs, tools.empty() ? json(nullptr) : tools, o);
  } catch (const Error& e) {
    bad("messages", e.what());
  }
}

std::vector<int32_t> checked_ids(const json& a, const ModelInfo& m, const std::string& where) {
  std::vector<int32_t> ids = token_ids(a, m, where);
  if (ids.empty()) bad(where, "the prompt is empty");
  return ids;
}

std::vector<int32_t> encode_text(const std::string& text, const ModelInfo& m, const std::string& where) {
  if (!m.tok) bad(where, "this model has no tokenizer: give the prompt as token ids");
  try {
    std::vector<int32_t> ids = m.tok->encode(text, m.tok->default_add_bos());
    if (ids.empty()) bad(where, "the prompt is empty");
    return ids;
  } catch (const Error& e) {
    bad(where, e.what());
  }
}

// vLLM's structured_outputs (its newer home for guided_json and guided_choice): the member
// `key` when given, else null.
const json* structured_output(const json& b, const char* key) {
  const json& so = field(b, "structured_outputs");
  if (so.is_null()) return nullptr;
  if (!so.is_object()) bad("structured_outputs", "expected an object");
  for (const auto& [k, v] : so.items())
    if (k != "json" && k != "choice" && k != "regex") bad("structured_outputs", "'" + k + "' is not supported: json, choice and regex are");
  return so.contains(key) && !so[key].is_null() ? &so[key] : nullptr;
}

// response_format: "text"; "json_object" (JSON mode: the reply is one JSON object, or with
// llama-server's "schema" beside the type a text that schema admits); or "json_schema" with
// {"schema"} (name and strict are read past: the schema is always kept). vLLM's guided_json
// and llama-server's json_schema fields give a schema the same way. A schema outside the
// subset sampling/json_schema.h lists is refused rather than answered with JSON that may not
// follow it; so is JSON output with thinking, whose reasoning comes before the reply in the
// same text.
void parse_response_format(const json& b, const ModelInfo& m, Job& j) {
  const json& rf = field(b, "response_format");
  const json* schema = nullptr;
  std::string where = "response_format";
  bool json_out = false;
  if (!rf.is_null()) {
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string()) bad(where, "expected an object with a type");
    const std::string type = rf["type"].get<std::string>();
    if (type != "text" && type != "json_object" && type != "json_schema")
      bad(where, "'" + type + "' is not supported: the types are text, json_object and json_schema");
    json_out = type != "text";
    if (type == "json_object" && rf.contains("schema")) schema = &rf["schema"];
    if (type == "json_schema") {
      const json& js = field(rf, "json_schema");
      if (!js.is_object() || !js.contains("schema")) bad(where, "expected json_schema with a schema");
      schema = &js["schema"];
    }
  }
  for (const char* key : {"guided_json", "json_schema"})
    if (!field(b, key).is_null()) {
      if (schema) bad(key, "a second schema beside response_format's");
      schema = &b[key], where = key, json_out = true;
    }
  if (const json* so = structured_output(b, "json")) {  // vLLM's structured_outputs.json
    if (schema) bad("structured_outputs", "a second schema beside response_format's");
    schema = so, where = "structured_outputs", json_out = true;
  }
  if (!json_out) return;
  if (!m.tok) bad(where, "JSON output needs the model's tokenizer");
  if (j.thinking) bad(where, "JSON output does not run with thinking mode");
  j.gen.json = true;
  if (!schema) return;
  try {
    j.gen.json_schema = std::make_shared<const JsonSchema>(*schema);
  } catch (const Error& e) {
    bad(where, e.what());
  }
}

// vLLM's guided_choice (or structured_outputs.choice): the reply is one of these strings
// (sampling/choice_grammar.h). Not beside JSON output, nor with thinking (the reasoning would
// come before the choice in the same text).
void parse_choice(const json& b, const ModelInfo& m, Job& j) {
  const json* c = &field(b, "guided_choice");
  std::string where = "guided_choice";
  if (const json* so = structured_output(b, "choice")) {
    if (!c->is_null()) bad("structured_outputs", "a second choice beside guided_choice");
    c = so, where = "structured_outputs";
  }
  if (c->is_null()) return;
  if (!c->is_array() || !std::all_of(c->begin(), c->end(), [](const json& x) { return x.is_string(); }))
    bad(where, "expected a list of strings");
  if (!m.tok) bad(where, "a choice needs the model's tokenizer");
  if (j.gen.json) bad(where, "a choice does not run with JSON output");
  if (j.thinking) bad(where, "a choice does not run with thinking mode");
  try {
    j.gen.choices = std::make_shared<const ChoiceGrammar>(c->get<std::vector<std::string>>());
  } catch (const Error& e) {
    bad(where, e.what());
  }
}

// vLLM's guided_regex (or structured_outputs.regex): the whole reply matches the pattern
// (sampling/regex.h). Not beside JSON output or a choice, nor with thinking.
void parse_regex(const json& b, const ModelInfo& m, Job& j) {
  const json* r = &field(b, "guided_regex");
  std::string where = "guided_regex";
  if (const json* so = structured_output(b, "regex")) {
    if (!r->is_null()) bad("structured_outputs", "a second regex beside guided_regex");
    r = so, where = "structured_outputs";
  }
  if (r->is_null()) return;
  if (!r->is_string()) bad(where, "expected a regular expression as a string");
  if (!m.tok) bad(where, "a regex needs the model's tokenizer");
  if (j.gen.json || j.gen.choices) bad(where, "a regex does not run with JSON output or a choice");
  if (j.thinking) bad(where, "a regex does not run with thinking mode");
  try {
    j.gen.regex = std::make_shared<const Regex>(r->get<std::string>(), Regex::Match::Whole);
  } catch (const Error& e) {
    bad(where, e.what());
  }
}

// tool_choice "required" or a named function, on DeepSeek-V3.2: the reply is drawn as a DSML
// call block of the offered tools (sampling/tool_call_grammar.h), after the reasoning with
// thinking; one call for a named function or with parallel_tool_calls false, more for
// "required". On GLM-5 the choice selects the tools offered.
void parse_forced_tools(const json& b, const ModelInfo& m, const json& tools, Job& j) {
  const json& choice = field(b, "tool_choice");
  const bool named = choice.is_object(), required = choice == "required";
  if (required && tools.empty()) bad("tool_choice", "\"required\" needs tools to call");
  if (!named && !required) return;
  if (m.family != Family::DeepseekV32) return;
  if (j.gen.json) bad("tool_choice", "a forced tool call does not run with JSON output (response_format)");
  if (j.gen.choices) bad("tool_choice", "a forced tool call does not run with a choice (guided_choice)");
  if (j.gen.regex) bad("tool_choice", "a forced tool call does not run with a regex (guided_regex)");
  const bool several = required && boolean(b, "parallel_tool_calls").value_or(true);
  try {
    j.gen.tool_calls = std::make_shared<const ToolCallGrammar>(tools, several, j.thinking);
  } catch (const Error& e) {
    bad("tools", e.what());
  }
}

// logit_bias: {"token id": bias in [-100, 100]}, added to those logits before sampling.
void parse_logit_bias(const json& b, const ModelInfo& m, Job& j) {
  const json& lb = field(b, "logit_bias");
  if (lb.is_null()) return;
  if (!lb.is_object()) bad("logit_bias", "expected an object mapping token ids to biases");
  for (const auto& [key, v] : lb.items()) {
    size_t used = 0;
    int64_t id = -1;
    try {
      id = std::stoll(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != key.size()) bad("logit_bias", "expected token ids as keys, got '" + key + "'");
    if (id < 0 || id >= m.vocab_size) bad("logit_bias", "token id " + key + " out of range [0, " + std::to_string(m.vocab_size) + ")");
    if (!v.is_number() || !(v.get<double>() >= -100 && v.get<double>() <= 100))
      bad("logit_bias", "the bias of token " + key + ": expected a number in [-100, 100]");
    j.gen.sampling.logit_bias.emplace_back(int32_t(id), float(v.get<double>()));
  }
}

}  // namespace

Job parse_chat_request(const nlohmann::ordered_json& b, const ModelInfo& m, const ServeLimits& lim) {
  if (!b.is_object()) throw ApiError(400, "the request body must be a JSON object");
  if (!m.tok) throw ApiError(400, "this model has no tokenizer: use /v1/completions with token ids", "messages");
  check_model(b, m);
  Job j;
  j.chat = true;
  parse_common(b, m, lim, j);
  parse_logit_bias(b, m, j);
  parse_logprobs_chat(b, lim, j);
  j.thinking = thinking_switch(b);
  parse_response_format(b, m, j);
  parse_choice(b, m, j);
  parse_regex(b, m, j);
  const json tools = offered_tools(b);
  j.tools = !tools.empty();
  parse_forced_tools(b, m, tools, j);
  const std::string prompt = render(m, normalize_messages(field(b, "messages")), tools, j.thinking);
  try {
    j.prompts.push_back(m.tok->encode(prompt));  // the encoding carries BOS
  } catch (const Error& e) {
    bad("messages", e.what());
  }
  parse_max_tokens(b, lim, j);
  return j;
}

Job parse_completion_request(const nlohmann::ordered_json& b, const ModelInfo& m, const ServeLimits& lim) {
  if (!b.is_object()) throw ApiError(400, "the request body must be a JSON object");
  check_model(b, m);
  Job j;
  parse_common(b, m, lim, j);
  parse_logit_bias(b, m, j);
  parse_response_format(b, m, j);
  parse_choice(b, m, j);
  parse_regex(b, m, j);
  if (const auto lp = integer(b, "logprobs", 0, lim.max_top_logprobs)) j.logprobs = int(*lp);
  j.echo = boolean(b, "echo").value_or(false);
  const json& p = field(b, "prompt");
  auto add = [&](const json& one, const std::string& where) {
    if (one.is_string()) {
      j.prompts.push_back(encode_text(one.get<std::string>(), m, where));
      j.prompt_texts.push_back(one.get<std::string>());
    } else if (one.is_array()) {
      j.prompts.push_back(checked_ids(one, m, where));
      j.prompt_texts.push_back(m.tok ? m.tok->decode(j.prompts.back()) : "");
    } else {
      bad(where, "expected a string, a list of token ids, or a list of those");
    }
  };
  if (p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array())) {
    for (size_t i = 0; i < p.size(); ++i) add(p[i], "prompt[" + std::to_string(i) + "]");
  } else {
    add(p, "prompt");
  }
  if (int(j.prompts.size()) * j.n > lim.max_n * 4) bad("prompt", "too many prompts times n in one request");
  j.return_token_ids = j.return_token_ids || !m.tok;
  parse_max_tokens(b, lim, j);
  return j;
}

}  // namespace dsa::server
