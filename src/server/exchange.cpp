#include "server/exchange.h"

#include <ctime>

namespace dsa::server {

using json = nlohmann::json;

namespace {
// Token text can be part of a UTF-8 character: such bytes become U+FFFD instead of failing.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }
}  // namespace

Exchange::Exchange(const Job& job, const ModelInfo& model, const std::string& id)
    : job_(job), model_(model), id_(id), created_(int64_t(std::time(nullptr))) {
  for (size_t p = 0; p < job.prompts.size(); ++p)
    for (int k = 0; k < job.n; ++k) {
      Choice c;
      c.index = int(choices_.size());
      c.prompt = int(p);
      c.req = std::make_shared<Request>();
      c.req->prompt = job.prompts[p];
      c.req->gen = job.gen;
      // Choices of one request differ by seed; a given seed gives choice 0 that seed.
      c.req->gen.sampling.seed = job.gen.sampling.seed + uint64_t(k);
      c.req->logprobs = job.logprobs;
      c.req->prompt_logprobs = prompt_logprobs() ? job.logprobs : -1;
      c.req->stream = job.stream;
      if (job.chat) c.reply = std::make_unique<ReplyStream>(model.family, job.thinking, id + "_" + std::to_string(c.index));
      choices_.push_back(std::move(c));
    }
}

Exchange::~Exchange() { cancel(); }

bool Exchange::submit(Scheduler& s) {
  for (Choice& c : choices_)
    if (!s.submit(c.req)) {
      cancel();
      return false;
    }
  submitted_ = true;
  return true;
}

void Exchange::cancel() {
  for (Choice& c : choices_)
    if (!c.done) c.req->cancel();
}

bool Exchange::done() const {
  for (const Choice& c : choices_)
    if (!c.done) return false;
  return true;
}

std::string Exchange::error() const {
  for (const Choice& c : choices_)
    if (!c.error.empty()) return c.error;
  return "";
}

bool Exchange::poll(std::chrono::milliseconds timeout) {
  bool got = false;
  const auto each = choices_.size() > 1 ? std::chrono::milliseconds(5) : timeout;
  const auto until = Clock::now() + timeout;
  do {
    for (Choice& c : choices_) {
      if (c.done) continue;
      Request::Output out;
      if (c.req->take(out, got ? std::chrono::milliseconds(0) : each)) {
        absorb(c, out);
        got = true;
      }
    }
  } while (!got && !done() && Clock::now() < until);
  return got;
}

void Exchange::absorb(Choice& c, Request::Output& out) {
  for (TokenOut& t : out.prompt) c.prompt_lp.push_back(std::move(t));
  for (TokenOut& t : out.tokens) c.tokens.push_back(std::move(t));
  if (c.reply) c.reply->feed(out.text, c.delta);
  c.text += out.text;
  c.new_text += out.text;
  if (!out.done) return;
  c.done = true;
  c.result = std::move(out.result);
  c.error = std::move(out.error);
  if (c.reply) c.reply->finish(c.result.reason == StopReason::Eos, c.delta);
}

std::string Exchange::finish_reason(const Choice& c) const {
  const bool natural = c.result.reason == StopReason::Eos || c.result.reason == StopReason::StopString;
  if (c.reply && natural && !c.reply->tool_calls().empty()) return "tool_calls";
  return server::finish_reason(c.result.reason);
}

// vLLM's stop_reason: the stop string or stop token id that ended the choice (null for an
// end-of-sequence token or a length limit).
json Exchange::stop_reason(const Choice& c) const {
  if (!c.result.stop_string.empty()) return c.result.stop_string;
  if (c.result.stop_token >= 0) return c.result.stop_token;
  return nullptr;
}

std::string Exchange::token_text(int32_t id) const { return model_.tok ? model_.tok->decode_bytes(std::span<const int32_t>(&id, 1)) : ""; }

json Exchange::logprobs_chat(const Choice& c, size_t from) const {
  json content = json::array();
  for (size_t i = from; i < c.tokens.size(); ++i) {
    const TokenOut& t = c.tokens[i];
    json top = json::array();
    for (const auto& [id, lp] : t.top) top.push_back({{"token", token_text(id)}, {"logprob", lp}});
    content.push_back({{"token", token_text(t.id)}, {"logprob", t.logprob}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json Exchange::logprobs_completion(const Choice& c, size_t p_from, size_t p_to, size_t from, size_t& offset) const {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  auto add = [&](const TokenOut* t, int32_t id) {
    const std::string s = token_text(id);
    tokens.push_back(s);
    lps.push_back(t ? json(t->logprob) : json(nullptr));
    json top = json::object();
    if (t)
      for (const auto& [alt, lp] : t->top) top[token_text(alt)] = lp;
    tops.push_back(t && job_.logprobs > 0 ? top : json(nullptr));
    offs.push_back(offset);
    offset += s.size();
  };
  // The prompt's first token has nothing before it: null, as OpenAI and vLLM give it.
  for (size_t e = p_from; e < p_to; ++e)
    if (e == 0) add(nullptr, job_.prompts[size_t(c.prompt)][0]);
    else add(&c.prompt_lp[e - 1], c.prompt_lp[e - 1].id);
  for (size_t i = from; i < c.tokens.size(); ++i) add(&c.tokens[i], c.tokens[i].id);
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

json Exchange::usage() const {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (const Choice& c : choices_) {
    completion += int64_t(c.tokens.size());
    if (c.index % job_.n == 0) {  // the prompt once per prompt, as OpenAI counts it
      prompt += int64_t(job_.prompts[size_t(c.prompt)].size());
      cached += c.result.reused_tokens;
    }
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json Exchange::message(const Choice& c) const {
  const ReplyStream& r = *c.reply;
  json m = {{"role", "assistant"}, {"content", r.content().empty() && !r.tool_calls().empty() ? json(nullptr) : json(r.content())}};
  if (job_.thinking || !r.reasoning().empty()) m["reasoning_content"] = r.reasoning();
  if (!r.tool_calls().empty()) {
    json calls = json::array();
    for (const ToolCallOut& t : r.tool_calls())
      calls.push_back({{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
    m["tool_calls"] = calls;
  }
  return m;
}

json Exchange::response() const {
  json choices = json::array();
  for (const Choice& c : choices_) {
    json ch = {{"index", c.index}};
    if (job_.chat) {
      ch["message"] = message(c);
      ch["logprobs"] = job_.logprobs >= 0 ? logprobs_chat(c, 0) : json(nullptr);
    } else {
      const std::string& pre = job_.echo ? job_.prompt_texts[size_t(c.prompt)] : std::string();
      ch["text"] = pre + c.text;
      size_t offset = 0;
      ch["logprobs"] = job_.logprobs >= 0 ? logprobs_completion(c, 0, prompt_entries(c), 0, offset) : json(nullptr);
    }
    ch["finish_reason"] = finish_reason(c);
    ch["stop_reason"] = stop_reason(c);
    if (job_.return_token_ids) {
      json ids = json::array();
      for (const TokenOut& t : c.tokens) ids.push_back(t.id);
      ch["token_ids"] = ids;
    }
    choices.push_back(std::move(ch));
  }
  return {{"id", id_}, {"object", job_.chat ? "chat.completion" : "text_completion"}, {"created", created_},
          {"model", model_.name}, {"choices", choices}, {"usage", usage()}};
}

json Exchange::chunk(const json& choice) const {
  json j = {{"id", id_}, {"object", job_.chat ? "chat.completion.chunk" : "text_completion"}, {"created", created_},
            {"model", model_.name}, {"choices", json::array({choice})}};
  if (job_.include_usage) j["usage"] = nullptr;
  return j;
}

std::string Exchange::take_chunks() {
  std::string out;
  for (Choice& c : choices_) {
    const size_t p_to = prompt_entries(c);
    const json lp = job_.logprobs < 0 || (c.tokens_sent == c.tokens.size() && c.prompt_sent == p_to)
                        ? json(nullptr)
                        : (job_.chat ? logprobs_chat(c, c.tokens_sent) : logprobs_completion(c, c.prompt_sent, p_to, c.tokens_sent, c.offset_sent));
    c.tokens_sent = c.tokens.size();
    c.prompt_sent = p_to;
    auto piece = [&](json delta_or_text, bool with_lp) {
      json ch = {{"index", c.index}};
      if (job_.chat) ch["delta"] = std::move(delta_or_text);
      else ch["text"] = std::move(delta_or_text);
      ch["logprobs"] = with_lp ? lp : json(nullptr);
      ch["finish_reason"] = nullptr;
      if (job_.return_token_ids && !job_.chat) ch["token_ids"] = nullptr;
      out += sse(chunk(ch));
    };
    if (job_.chat) {
      if (!c.started) piece(json{{"role", "assistant"}, {"content", ""}}, false);
      if (!c.delta.reasoning.empty()) piece(json{{"reasoning_content", c.delta.reasoning}}, false);
      if (!c.delta.content.empty() || !lp.is_null()) piece(json{{"content", c.delta.content}}, true);
      if (!c.delta.calls.empty()) {
        json calls = json::array();
        for (const ToolCallDelta& d : c.delta.calls) {
          json t = {{"index", d.index}, {"function", {{"arguments", d.arguments}}}};
          if (d.first) {
            t["id"] = d.id;
            t["type"] = "function";
            t["function"]["name"] = d.name;
          }
          calls.push_back(std::move(t));
        }
        piece(json{{"tool_calls", calls}}, false);
      }
      c.delta = ReplyDelta{};
    } else {
      if (!c.started && job_.echo) c.new_text = job_.prompt_texts[size_t(c.prompt)] + c.new_text;
      if (!c.new_text.empty() || !lp.is_null()) piece(c.new_text, true);
    }
    c.new_text.clear();
    c.started = true;
    if (c.done && !c.finish_sent) {
      json ch = {{"index", c.index}, {"logprobs", nullptr}, {"finish_reason", finish_reason(c)}, {"stop_reason", stop_reason(c)}};
      if (job_.chat) ch["delta"] = json::object();
      else ch["text"] = "";
      if (job_.return_token_ids && !job_.chat) {
        json ids = json::array();
        for (const TokenOut& t : c.tokens) ids.push_back(t.id);
        ch["token_ids"] = ids;
      }
      out += sse(chunk(ch));
      c.finish_sent = true;
    }
  }
  return out;
}

std::string Exchange::final_chunks() {
  std::string out;
  if (job_.include_usage) {
    json j = {{"id", id_}, {"object", job_.chat ? "chat.completion.chunk" : "text_completion"}, {"created", created_},
              {"model", model_.name}, {"choices", json::array()}, {"usage", usage()}};
    out += sse(j);
  }
  return out + "data: [DONE]\n\n";
}

}  // namespace dsa::server
