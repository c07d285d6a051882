// `dsa serve` end to end: the server runs in the test process on 127.0.0.1 (a free port)
// over the tiny random model with the synthetic tokenizer and over the golden models, and
// is driven over HTTP. Its output is checked against `dsa run` (greedy), against itself
// alone (16 concurrent clients, prefix-cache hits, preemption in a small pool), and its
// errors against the OpenAI error shape while /health stays ok.
#include <gtest/gtest.h>
#include <httplib.h>
#include <spawn.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <regex>
#include <thread>

#include "fixtures.h"
#include "runtime/scheduler.h"
#include "runtime/teacher_forcing.h"
#include "sampling/json_prefix.h"
#include "sampling/json_schema.h"
#include "server/reply.h"
#include "server/server.h"
#include "tiny_model.h"

using namespace dsa;
using json = nlohmann::json;

namespace {

using Sh = test::ShellResult;
Sh sh(const std::string& cmd) { return test::shell(cmd + " 2>/dev/null"); }

struct Options {
  int max_seqs = 16, max_queue = 64, ctx = 512, block_size = 64, batch_tokens = 256;
  int64_t cache_tokens = 0;
  CacheType cache = CacheType::FP8;
  bool mtp = false;
  std::string api_key;
};

// A whole server in the test process: model, engine, scheduler, HTTP.
class TestServer {
public:
  TestServer(const std::string& dir, const Options& o = {}) {
    model_ = Model::load(dir, o.mtp, false);
    if (std::filesystem::exists(dir + "/tokenizer.json")) tok_.emplace(Tokenizer::from_dir(dir));
    EngineOptions eo;
    eo.cache = o.cache;
    eo.mtp = o.mtp;
    eo.max_ctx = o.ctx;
    eo.max_seqs = o.max_seqs;
    eo.max_step_tokens = o.batch_tokens;
    eo.block_size = o.block_size;
    eo.cache_tokens = o.cache_tokens > 0 ? o.cache_tokens : int64_t(o.ctx) * o.max_seqs;
    engine_.emplace(*model_, eo);
    SchedulerOptions so;
    so.max_seqs = o.max_seqs;
    so.max_waiting = o.max_queue;
    so.mtp = o.mtp;
    so.prefill_chunk = 64;  // several chunks per prompt
    sched_.emplace(*engine_, tok_ ? &*tok_ : nullptr, so, [this](const Request& r, const GenerateResult& res, const std::string&) { metrics_.record(r, res); });
    engine_thread_ = std::thread([this] { sched_->run(); });
    server::ModelInfo mi{"m", model_->config.family, model_->config.vocab_size, tok_ ? &*tok_ : nullptr};
    server::ServerOptions so2;
    so2.port = 0;
    so2.api_key = o.api_key;
    so2.http_threads = o.max_seqs + o.max_queue + 8;
    so2.limits.max_ctx = o.ctx;
    so2.limits.max_tokens = o.ctx;
    srv_.emplace(*sched_, metrics_, mi, so2);
    port_ = srv_->bind();
    thread_ = std::thread([this] { srv_->run(); });
  }
  ~TestServer() {
    srv_->stop();
    thread_.join();
    sched_->stop();
    engine_thread_.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    return c;
  }
  // Bodies are sent with their keys in the order built (a json's sorted, an ordered_json's as written).
  json post(const std::string& path, const nlohmann::ordered_json& body, int want_status = 200) const {
    auto r = client().Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r) << path << ": " << httplib::to_string(r.error());
    if (!r) return {};
    EXPECT_EQ(r->status, want_status) << r->body;
    return json::parse(r->body);
  }
  // A streamed request's events (the JSON of each data line, [DONE] excluded); *done: it ended with [DONE].
  std::vector<json> stream(const std::string& path, nlohmann::ordered_json body, bool* done = nullptr) const {
    body["stream"] = true;
    std::string all;
    auto r = client().Post(path, httplib::Headers{}, body.dump(), "application/json");
    EXPECT_TRUE(r) << path << ": " << httplib::to_string(r.error());
    if (!r) return {};
    EXPECT_EQ(r->status, 200) << r->body;
    all = r->body;
    std::vector<json> ev;
    bool saw_done = false;
    for (size_t at = 0; (at = all.find("data: ", at)) != std::string::npos;) {
      const size_t end = all.find("\n\n", at);
      const std::string d = all.substr(at + 6, end - at - 6);
      at = end;
      if (d == "[DONE]") saw_done = true;
      else ev.push_back(json::parse(d));
    }
    if (done) *done = saw_done;
    return ev;
  }
  bool healthy() const {
    auto r = client().Get("/health");
    return r && r->status == 200;
  }
  std::string metrics() const {
    auto r = client().Get("/metrics");
    return r ? r->body : "";
  }
  int port() const { return port_; }

private:
  std::unique_ptr<Model> model_;
  std::optional<Tokenizer> tok_;
  std::optional<Engine> engine_;
  server::Metrics metrics_;
  std::optional<Scheduler> sched_;
  std::optional<server::Server> srv_;
  int port_ = 0;
  std::thread thread_, engine_thread_;
};

double metric(const std::string& text, const std::string& name) {
  std::smatch m;
  if (std::regex_search(text, m, std::regex("\n" + std::regex_replace(name, std::regex(R"([{}\"])"), R"(\$&)") + R"((\{[^}]*\})? ([0-9.e+-]+))")))
    return std::stod(m[2].str());
  return -1;
}

json chat_body(const std::string& user, int max_tokens, double temperature = 0, int64_t seed = 0) {
  return {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", user}}}}, {"max_tokens", max_tokens},
          {"temperature", temperature}, {"seed", seed}};
}

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s;
}

std::vector<int32_t> ids_of(const json& choice) { return choice.at("token_ids").get<std::vector<int32_t>>(); }

TEST(Serve, GreedyChatEqualsDsaRunAndStreamingEqualsWhole) {
  const std::string dir = test::tiny_model_dir();
  TestServer s(dir);
  for (const std::string user : {"Hello", "Tell me a story about a lazy fox"}) {
    const json r = s.post("/v1/chat/completions", chat_body(user, 24));
    const std::string content = r["choices"][0]["message"]["content"];
    const Sh run = sh(test::dsa_binary() + " run --model " + dir + " --chat --greedy -n 24 -p '" + user + "'");
    ASSERT_EQ(run.code, 0);
    EXPECT_EQ(content + "\n", run.out) << user;
    EXPECT_EQ(r["usage"]["completion_tokens"], 24);
    bool done = false;
    std::string streamed;
    const auto ev = s.stream("/v1/chat/completions", chat_body(user, 24), &done);
    EXPECT_TRUE(done);
    ASSERT_FALSE(ev.empty());
    EXPECT_EQ(ev.front()["choices"][0]["delta"]["role"], "assistant");
    for (const json& e : ev)
      if (e["choices"][0]["delta"].contains("content")) streamed += e["choices"][0]["delta"]["content"].get<std::string>();
    EXPECT_EQ(streamed, content);
    EXPECT_EQ(ev.back()["choices"][0]["finish_reason"], r["choices"][0]["finish_reason"]);
  }
}

// Chat logprobs: each greedy token is its distribution's most likely, so its log-probability
// is the first alternative's; the alternatives come in order, k of them, and are probabilities.
TEST(Serve, ChatLogprobsOfGreedyTokensAreTheirTopAlternatives) {
  TestServer s(test::tiny_model_dir());
  json body = chat_body("Tell me a story", 12);
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  const json r = s.post("/v1/chat/completions", body);
  const json& content = r["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 12u);
  std::string text;
  for (const json& t : content) {
    text += t["token"].get<std::string>();
    const json& top = t["top_logprobs"];
    ASSERT_EQ(top.size(), 3u);
    EXPECT_DOUBLE_EQ(t["logprob"].get<double>(), top[0]["logprob"].get<double>());
    double mass = 0;
    for (size_t k = 0; k < top.size(); ++k) {
      const double lp = top[k]["logprob"].get<double>();
      EXPECT_LE(lp, 0.0);
      if (k > 0) {
        EXPECT_LE(lp, top[k - 1]["logprob"].get<double>());
      }
      mass += std::exp(lp);
    }
    EXPECT_LE(mass, 1.0 + 1e-6);
  }
  EXPECT_EQ(text, r["choices"][0]["message"]["content"].get<std::string>());
}

// JSON mode (response_format json_object) on the random-weight model, whose replies are not
// JSON without it: every reply, greedy and sampled, chat and completions, is a JSON object
// when it ends on its own, and the start of one when max_tokens cuts it. JSON mode with
// thinking is refused.
TEST(Serve, JsonModeRepliesAreJsonObjects) {
  TestServer s(test::tiny_model_dir());
  int whole = 0, plain_json = 0;
  for (int k = 0; k < 6; ++k) {
    json chat = chat_body("Reply in JSON, please " + std::to_string(k), 48, k == 0 ? 0.0 : 1.0, k);
    const std::string plain = s.post("/v1/chat/completions", chat)["choices"][0]["message"]["content"];
    plain_json += nlohmann::json::accept(plain);
    chat["response_format"] = {{"type", "json_object"}};
    // With ignore_eos (odd k) a closed object is followed by spaces up to max_tokens.
    json comp = {{"prompt", "JSON " + std::to_string(k)}, {"max_tokens", 48}, {"temperature", k == 0 ? 0.0 : 1.0}, {"seed", k},
                 {"response_format", {{"type", "json_object"}}}, {"ignore_eos", k % 2 == 1}};
    for (const json& c : {s.post("/v1/chat/completions", chat)["choices"][0], s.post("/v1/completions", comp)["choices"][0]}) {
      const std::string text = c.contains("message") ? c["message"]["content"].get<std::string>() : c["text"].get<std::string>();
      if (c["finish_reason"] == "stop") {
        ++whole;
        const json parsed = json::parse(text, nullptr, false);
        EXPECT_TRUE(parsed.is_object()) << text;
      } else {
        EXPECT_EQ(c["finish_reason"], "length");
        JsonPrefix p(true);
        EXPECT_TRUE(p.feed(text)) << text;
      }
    }
  }
  EXPECT_GT(whole, 0) << "no reply ended on its own";
  EXPECT_EQ(plain_json, 0) << "the model's replies are JSON anyway: this tests nothing";
  json thinking = chat_body("x", 4);
  thinking["response_format"] = {{"type", "json_object"}};
  thinking["chat_template_kwargs"] = {{"thinking", true}};
  s.post("/v1/chat/completions", thinking, 400);
}

// response_format json_schema on the random-weight model: every reply that ends on its own
// is JSON that follows the schema, its keys in the schema's order (not sorted, as a JSON
// object's keys would be on the way); one cut by max_tokens is the start of such a text; a
// streamed reply too; vLLM's guided_json (also beside a text response_format) and
// structured_outputs.json, and llama-server's json_object with a schema give the same
// replies; a schema outside the supported subset is refused with 400 naming the keyword.
TEST(Serve, JsonSchemaRepliesFollowTheSchema) {
  TestServer s(test::tiny_model_dir());
  const auto schema = nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
      "name": {"enum": ["ann", "bob"]}, "age": {"type": "integer", "minimum": 18, "exclusiveMaximum": 100},
      "ok": {"type": ["boolean", "null"]}, "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2},
      "nick": {"type": "string", "minLength": 1, "maxLength": 3}, "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d+$"}},
      "required": ["name", "ok", "nick"]})");
  const JsonSchema compiled(schema);
  auto check = [&](const std::string& text, const json& finish) {
    if (finish != "stop") {
      EXPECT_EQ(finish, "length");
      JsonSchemaPrefix p(compiled);
      EXPECT_TRUE(p.feed(text)) << text;
      return 0;
    }
    const auto v = nlohmann::ordered_json::parse(text, nullptr, false);
    EXPECT_TRUE(v.is_object()) << text;
    if (!v.is_object()) return 0;
    EXPECT_TRUE(v["name"] == "ann" || v["name"] == "bob") << text;
    EXPECT_TRUE(v["ok"].is_boolean() || v["ok"].is_null()) << text;
    EXPECT_TRUE(!v.contains("age") || (v["age"].is_number_integer() && v["age"] >= 18 && v["age"] < 100)) << text;
    EXPECT_TRUE(!v.contains("tags") || (v["tags"].is_array() && v["tags"].size() <= 2)) << text;
    EXPECT_TRUE(v["nick"].is_string()) << text;
    if (v["nick"].is_string()) {
      const std::string nick = v["nick"];
      const auto chars = std::count_if(nick.begin(), nick.end(), [](char ch) { return (static_cast<unsigned char>(ch) & 0xC0) != 0x80; });
      EXPECT_TRUE(chars >= 1 && chars <= 3) << text;
    }
    EXPECT_TRUE(!v.contains("code") || (v["code"].is_string() && std::regex_match(v["code"].get<std::string>(), std::regex("[A-Z]{2}-\\d+"))))
        << text;
    std::vector<std::string> keys, order = {"name", "age", "ok", "tags", "nick", "code"};
    for (const auto& [k, x] : v.items()) keys.push_back(k);
    EXPECT_TRUE(std::includes(order.begin(), order.end(), keys.begin(), keys.end(), [&](const std::string& a, const std::string& b) {
      return std::find(order.begin(), order.end(), a) < std::find(order.begin(), order.end(), b);
    })) << text;
    return 1;
  };
  int whole = 0;
  for (int k = 0; k < 6; ++k) {
    nlohmann::ordered_json chat = chat_body("Describe a person " + std::to_string(k), 120, k == 0 ? 0.0 : 1.0, k);
    chat["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"schema", schema}, {"strict", true}}}};
    const json c = s.post("/v1/chat/completions", chat)["choices"][0];
    whole += check(c["message"]["content"], c["finish_reason"]);
    nlohmann::ordered_json vllm = chat;
    vllm.erase("response_format");
    vllm["guided_json"] = schema;
    EXPECT_EQ(s.post("/v1/chat/completions", vllm)["choices"][0]["message"]["content"], c["message"]["content"]);
    vllm["response_format"] = {{"type", "text"}};  // a client's default beside the schema
    EXPECT_EQ(s.post("/v1/chat/completions", vllm)["choices"][0]["message"]["content"], c["message"]["content"]);
    nlohmann::ordered_json newer = chat;  // vLLM's newer form
    newer.erase("response_format");
    newer["structured_outputs"] = {{"json", schema}};
    EXPECT_EQ(s.post("/v1/chat/completions", newer)["choices"][0]["message"]["content"], c["message"]["content"]);
    nlohmann::ordered_json llama = chat;  // llama-server's form: the schema beside json_object
    llama["response_format"] = {{"type", "json_object"}, {"schema", schema}};
    EXPECT_EQ(s.post("/v1/chat/completions", llama)["choices"][0]["message"]["content"], c["message"]["content"]);
    nlohmann::ordered_json comp = {{"prompt", "Person " + std::to_string(k)}, {"max_tokens", 120}, {"temperature", 1.0}, {"seed", k},
                                   {"response_format", chat["response_format"]}};
    const json d = s.post("/v1/completions", comp)["choices"][0];
    whole += check(d["text"], d["finish_reason"]);
    std::string streamed;
    json finish;
    for (const json& e : s.stream("/v1/completions", comp)) {
      streamed += e["choices"][0]["text"].get<std::string>();
      if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(streamed, d["text"]);
    check(streamed, finish);
  }
  EXPECT_GT(whole, 0) << "no reply ended on its own";
  nlohmann::ordered_json bad = chat_body("x", 4);
  bad["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"type", "string"}, {"pattern", "(a)\\1"}}}}}};
  const json e = s.post("/v1/chat/completions", bad, 400);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("backreferences are not supported"), std::string::npos) << e.dump();
  EXPECT_EQ(e["error"]["param"], "response_format");
}

// vLLM's guided_choice (and structured_outputs.choice) on the random-weight model: every reply
// is one of the choices and ends there (finish_reason stop), streamed or not, on both
// endpoints; what cannot be a choice, or cannot run beside one, is refused with 400.
TEST(Serve, GuidedChoiceRepliesAreAChoice) {
  TestServer s(test::tiny_model_dir());
  const json choices = json::array({"positive", "pos", "negative", "neutral", "not sure"});
  auto is_choice = [&](const json& text) { return std::find(choices.begin(), choices.end(), text) != choices.end(); };
  for (int k = 0; k < 4; ++k) {
    nlohmann::ordered_json chat = chat_body("How was it? " + std::to_string(k), 40, k == 0 ? 0.0 : 1.0, k);
    chat["guided_choice"] = choices;
    const json c = s.post("/v1/chat/completions", chat)["choices"][0];
    EXPECT_TRUE(is_choice(c["message"]["content"])) << c.dump();
    EXPECT_EQ(c["finish_reason"], "stop");
    nlohmann::ordered_json so = chat;
    so.erase("guided_choice");
    so["structured_outputs"] = {{"choice", choices}};
    EXPECT_EQ(s.post("/v1/chat/completions", so)["choices"][0]["message"]["content"], c["message"]["content"]);
    std::string streamed;
    for (const json& e : s.stream("/v1/chat/completions", chat))
      if (e["choices"][0]["delta"].contains("content")) streamed += e["choices"][0]["delta"]["content"].get<std::string>();
    EXPECT_EQ(streamed, c["message"]["content"]);
    const nlohmann::ordered_json comp = {{"prompt", "Verdict " + std::to_string(k)}, {"max_tokens", 40}, {"temperature", 1.0}, {"seed", k},
                                         {"guided_choice", choices}};
    EXPECT_TRUE(is_choice(s.post("/v1/completions", comp)["choices"][0]["text"]));
  }
  const std::pair<const char*, nlohmann::ordered_json> bad[] = {
      {"guided_choice", {{"guided_choice", json::array()}}},
      {"guided_choice", {{"guided_choice", json::array({"a", 1})}}},
      {"guided_choice", {{"guided_choice", json::array({"a", ""})}}},
      {"guided_choice", {{"guided_choice", json::array({"a"})}, {"response_format", {{"type", "json_object"}}}}},
      {"guided_choice", {{"guided_choice", json::array({"a"})}, {"chat_template_kwargs", {{"thinking", true}}}}},
      {"min_tokens", {{"guided_choice", json::array({"a"})}, {"min_tokens", 2}}},
      {"structured_outputs", {{"structured_outputs", {{"grammar", "root ::= \"a\""}}}}},
      {"structured_outputs", {{"structured_outputs", {{"choice", json::array({"a"})}}}, {"guided_choice", json::array({"b"})}}},
  };
  for (const auto& [param, extra] : bad) {
    nlohmann::ordered_json body = chat_body("x", 4);
    for (const auto& [k, v] : extra.items()) body[k] = v;
    const json e = s.post("/v1/chat/completions", body, 400);
    EXPECT_EQ(e["error"]["param"], param) << body.dump() << "\n" << e.dump();
  }
}

// vLLM's guided_regex (and structured_outputs.regex) on the random-weight model: every reply
// is a whole match and ends once nothing can go on (finish_reason stop), streamed or not, on
// both endpoints; a pattern outside the subset, or one beside what it cannot run with, is
// refused with 400 naming the field.
TEST(Serve, GuidedRegexRepliesMatch) {
  TestServer s(test::tiny_model_dir());
  const std::string pattern = "(yes|no), [0-9]{1,3} (apples|pears)!";
  const std::regex oracle(pattern);
  for (int k = 0; k < 4; ++k) {
    nlohmann::ordered_json chat = chat_body("Any fruit? " + std::to_string(k), 60, k == 0 ? 0.0 : 1.0, k);
    chat["guided_regex"] = pattern;
    const json c = s.post("/v1/chat/completions", chat)["choices"][0];
    EXPECT_TRUE(std::regex_match(c["message"]["content"].get<std::string>(), oracle)) << c.dump();
    EXPECT_EQ(c["finish_reason"], "stop");
    nlohmann::ordered_json so = chat;
    so.erase("guided_regex");
    so["structured_outputs"] = {{"regex", pattern}};
    EXPECT_EQ(s.post("/v1/chat/completions", so)["choices"][0]["message"]["content"], c["message"]["content"]);
    std::string streamed;
    for (const json& e : s.stream("/v1/chat/completions", chat))
      if (e["choices"][0]["delta"].contains("content")) streamed += e["choices"][0]["delta"]["content"].get<std::string>();
    EXPECT_EQ(streamed, c["message"]["content"]);
    const nlohmann::ordered_json comp = {{"prompt", "Count " + std::to_string(k)}, {"max_tokens", 60}, {"temperature", 1.0}, {"seed", k},
                                         {"guided_regex", pattern}};
    EXPECT_TRUE(std::regex_match(s.post("/v1/completions", comp)["choices"][0]["text"].get<std::string>(), oracle));
  }
  const std::pair<const char*, nlohmann::ordered_json> bad[] = {
      {"guided_regex", {{"guided_regex", "(a)\\1"}}},
      {"guided_regex", {{"guided_regex", 5}}},
      {"guided_regex", {{"guided_regex", "a"}, {"response_format", {{"type", "json_object"}}}}},
      {"guided_regex", {{"guided_regex", "a"}, {"guided_choice", json::array({"a"})}}},
      {"guided_regex", {{"guided_regex", "a"}, {"chat_template_kwargs", {{"thinking", true}}}}},
      {"min_tokens", {{"guided_regex", "a+"}, {"min_tokens", 2}}},
      {"structured_outputs", {{"structured_outputs", {{"regex", "a"}}}, {"guided_regex", "b"}}},
  };
  for (const auto& [param, extra] : bad) {
    nlohmann::ordered_json body = chat_body("x", 4);
    for (const auto& [k, v] : extra.items()) body[k] = v;
    const json e = s.post("/v1/chat/completions", body, 400);
    EXPECT_EQ(e["error"]["param"], param) << body.dump() << "\n" << e.dump();
  }
}

// stop_token_ids (vLLM's): the reply ends at the first of them it samples, ignore_eos or not,
// with finish_reason stop, vLLM's stop_reason naming it and the tokens before it unchanged;
// ids outside the vocabulary get 400. A stop string is named in stop_reason too, streamed or
// not, and ends the text with include_stop_str_in_output; an end-of-sequence token or the
// length limit leaves stop_reason null.
TEST(Serve, StopTokenIdsEndTheReply) {
  TestServer s(test::tiny_model_dir());
  json body = {{"prompt", {5, 6, 7, 8}}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}, {"return_token_ids", true}};
  const std::vector<int32_t> all = ids_of(s.post("/v1/completions", body)["choices"][0]);
  ASSERT_EQ(all.size(), 12u);
  const int32_t stop = all[5];
  const size_t k = size_t(std::find(all.begin(), all.end(), stop) - all.begin());
  body["stop_token_ids"] = {stop};
  const json r = s.post("/v1/completions", body);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["completion_tokens"], k + 1);
  const std::vector<int32_t> got = ids_of(r["choices"][0]);
  ASSERT_GE(got.size(), k);
  EXPECT_TRUE(std::equal(all.begin(), all.begin() + ptrdiff_t(k), got.begin()));
  EXPECT_EQ(r["choices"][0]["stop_reason"], stop);
  json plain = body;
  plain.erase("stop_token_ids");
  const json p = s.post("/v1/completions", plain)["choices"][0];
  EXPECT_TRUE(p["stop_reason"].is_null()) << p.dump();
  const std::string text = p["text"];
  const std::string stop_string = text.substr(text.size() / 2, 2);
  plain["stop"] = {stop_string};
  const json cut = s.post("/v1/completions", plain)["choices"][0];
  EXPECT_EQ(cut["stop_reason"], stop_string);
  plain["include_stop_str_in_output"] = true;  // vLLM's: the stop string ends the text
  EXPECT_EQ(s.post("/v1/completions", plain)["choices"][0]["text"], cut["text"].get<std::string>() + stop_string);
  plain.erase("include_stop_str_in_output");
  json last;
  for (const json& e : s.stream("/v1/completions", plain)) last = e;
  EXPECT_EQ(last["choices"][0]["stop_reason"], stop_string);
  for (const json& bad : {json{-1}, json{"7"}, json(7), json{1 << 30}}) {
    body["stop_token_ids"] = bad;
    s.post("/v1/completions", body, 400);
  }
}

// min_tokens (vLLM's): before that many tokens are out, a stop id is never drawn (greedy
// takes the next best where it stood) and a stop string is not matched; the tokens before
// the first stop are the same. With JSON output, above max_tokens or negative: 400.
TEST(Serve, MinTokensHoldsStopsBack) {
  TestServer s(test::tiny_model_dir());
  json body = {{"prompt", {5, 6, 7, 8}}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}, {"return_token_ids", true}};
  const json plain = s.post("/v1/completions", body)["choices"][0];
  const std::vector<int32_t> all = ids_of(plain);
  ASSERT_EQ(all.size(), 12u);
  const int32_t stop = all[2];
  const size_t k = size_t(std::find(all.begin(), all.end(), stop) - all.begin());
  body["stop_token_ids"] = {stop};
  EXPECT_EQ(s.post("/v1/completions", body)["usage"]["completion_tokens"], k + 1);
  body["min_tokens"] = 8;
  const json held = s.post("/v1/completions", body);
  const std::vector<int32_t> got = ids_of(held["choices"][0]);
  ASSERT_GE(got.size(), 8u) << held.dump();
  EXPECT_TRUE(std::equal(all.begin(), all.begin() + ptrdiff_t(k), got.begin()));
  for (size_t i = 0; i < 8; ++i) EXPECT_NE(got[i], stop) << i;
  const std::string first = plain["text"];  // its first character as the stop string
  const unsigned char c0 = static_cast<unsigned char>(first[0]);
  const size_t len = c0 < 0x80 ? 1 : c0 >= 0xF0 ? 4 : c0 >= 0xE0 ? 3 : 2;
  json text = {{"prompt", {5, 6, 7, 8}}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}, {"stop", {first.substr(0, len)}}};
  EXPECT_LT(s.post("/v1/completions", text)["usage"]["completion_tokens"], 6);
  text["min_tokens"] = 6;
  EXPECT_GE(s.post("/v1/completions", text)["usage"]["completion_tokens"], 6);
  for (const json& bad : {json{{"min_tokens", 13}}, json{{"min_tokens", -1}}, json{{"min_tokens", 2}, {"response_format", {{"type", "json_object"}}}}}) {
    json b = body;
    b.update(bad);
    s.post("/v1/completions", b, 400);
  }
}

// Without max_tokens a completion stops at 16 tokens (the OpenAI completions default) and a
// chat runs on (to the context or a stop).
TEST(Serve, UnsetMaxTokensFollowsOpenAIDefaults) {
  Options o;
  o.ctx = 64;
  TestServer s(test::tiny_model_dir(), o);
  const json c = s.post("/v1/completions", {{"prompt", {5, 6, 7, 8}}, {"temperature", 0}, {"ignore_eos", true}});
  EXPECT_EQ(c["usage"]["completion_tokens"], 16);
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  json chat = chat_body("Hello", 0);
  chat.erase("max_tokens");
  chat["ignore_eos"] = true;
  const json r = s.post("/v1/chat/completions", chat);
  EXPECT_EQ(r["usage"]["prompt_tokens"].get<int>() + r["usage"]["completion_tokens"].get<int>(), 64);
}

// logit_bias: +100 on a token makes greedy decoding repeat it; -100 on the greedy first token
// makes the first token another; chat and completions alike.
TEST(Serve, LogitBiasSteersGreedyTokens) {
  TestServer s(test::tiny_model_dir());
  const json base = {{"prompt", {5, 6, 7, 8}}, {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true}, {"return_token_ids", true}};
  const std::vector<int32_t> plain = ids_of(s.post("/v1/completions", base)["choices"][0]);
  ASSERT_EQ(plain.size(), 6u);
  json up = base;
  up["logit_bias"] = {{"300", 100}};
  EXPECT_EQ(ids_of(s.post("/v1/completions", up)["choices"][0]), std::vector<int32_t>(6, 300));
  json down = base;
  down["logit_bias"] = {{std::to_string(plain[0]), -100}};
  EXPECT_NE(ids_of(s.post("/v1/completions", down)["choices"][0])[0], plain[0]);
  json chat = chat_body("Hello", 4);
  chat["logit_bias"] = {{"300", 100}};
  chat["return_token_ids"] = true;
  const json r = s.post("/v1/chat/completions", chat);
  EXPECT_EQ(r["usage"]["completion_tokens"], 4);
  EXPECT_EQ(r["choices"][0]["message"]["content"].get<std::string>(),
            s.post("/detokenize", {{"tokens", std::vector<int32_t>(4, 300)}})["prompt"].get<std::string>());
}

TEST(Serve, GreedyCompletionIdsEqualDsaRunOnEveryGoldenModel) {
  const auto cases = test::golden_cases();
  ASSERT_TRUE(test::golden_cases_complete(cases));
  for (const auto& name : cases) {
    const std::string dir = test::golden_dir() + "/" + name + "/model";
    std::ifstream in(test::golden_dir() + "/" + name + "/case.json");
    const json c = json::parse(in);
    std::vector<int32_t> prompt = c["ids"].get<std::vector<int32_t>>();
    prompt.resize(size_t(c["prompt_len"].get<int>()));
    const std::string ids = join(prompt);
    Options o;
    const bool fp8 = c["kv_cache"] == "fp8";  // "exact": the float cache
    o.ctx = 128;
    o.max_seqs = 4;
    o.cache = fp8 ? CacheType::FP8 : CacheType::F32;
    TestServer s(dir, o);
    const json r = s.post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}});
    const Sh run = sh(test::dsa_binary() + " run --model " + dir + " --ids " + ids + " --print-ids --greedy --ignore-eos -n 8 --kv-cache " +
                      (fp8 ? "fp8" : "f32"));
    ASSERT_EQ(run.code, 0) << name;
    EXPECT_EQ(join(ids_of(r["choices"][0])) + "\n", run.out) << name;
  }
}

// A row of logits as log-probabilities, in double.
std::vector<double> log_softmax(const float* row, int V) {
  const double mx = *std::max_element(row, row + V);
  double sum = 0;
  for (int v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
  std::vector<double> lp(static_cast<size_t>(V));
  for (int v = 0; v < V; ++v) lp[size_t(v)] = double(row[v]) - mx - std::log(sum);
  return lp;
}

// Completions with echo and logprobs (what evaluation harnesses score prompts with): every
// prompt token after the first has its log-probability under the model, the teacher-forced
// prefill's row before it, the first none; the generated tokens follow with the decode rows'.
// The prompt runs in chunks of a few rows (the engine keeps two per sequence), a repeat whose
// prefix the cache holds gives the same, and so does the stream. On every golden model.
TEST(Serve, EchoWithLogprobsGivesThePromptsTeacherForcedLogprobs) {
  const auto cases = test::golden_cases();
  ASSERT_TRUE(test::golden_cases_complete(cases));
  for (const auto& name : cases) {
    SCOPED_TRACE(name);
    const std::string dir = test::golden_dir() + "/" + name + "/model";
    std::ifstream in(test::golden_dir() + "/" + name + "/case.json");
    const json c = json::parse(in);
    std::vector<int32_t> prompt = c["ids"].get<std::vector<int32_t>>();
    prompt.resize(size_t(c["prompt_len"].get<int>()));
    const int P = int(prompt.size()), G = 4, K = 3;
    ASSERT_GT(P, 8) << "a prompt of one chunk tests no chunking";
    Options o;
    const CacheType cache = c["kv_cache"] == "fp8" ? CacheType::FP8 : CacheType::F32;
    o.ctx = 128;
    o.max_seqs = 4;
    o.block_size = 8;  // the prompt's full blocks are cached for the repeat
    o.cache = cache;
    TestServer s(dir, o);
    const json body = {{"prompt", prompt}, {"max_tokens", G},   {"temperature", 0},         {"ignore_eos", true},
                       {"echo", true},     {"logprobs", K},      {"return_token_ids", true}};
    const json r = s.post("/v1/completions", body);
    const json& lp = r["choices"][0]["logprobs"];
    std::vector<int32_t> ids = prompt;
    for (int32_t id : ids_of(r["choices"][0])) ids.push_back(id);
    ASSERT_EQ(int(ids.size()), P + G);
    ASSERT_EQ(lp["token_logprobs"].size(), ids.size());
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
    EXPECT_TRUE(lp["top_logprobs"][0].is_null());

    const auto model = Model::load(dir, false, false);
    const TeacherForcedResult tf = run_teacher_forced(*model, ids, P, cache, false, false);
    const int V = tf.vocab;
    for (int i = 1; i < P + G; ++i) {
      const std::vector<double> want = log_softmax(&tf.logits[size_t(i - 1) * size_t(V)], V);
      EXPECT_NEAR(lp["token_logprobs"][size_t(i)].get<double>(), want[size_t(ids[size_t(i)])], 1e-4) << "token " << i;
      // The alternatives are among the row's K most likely (token texts may coincide as keys).
      std::vector<double> best = want;
      std::partial_sort(best.begin(), best.begin() + K, best.end(), std::greater<>());
      const json& top = lp["top_logprobs"][size_t(i)];
      EXPECT_TRUE(top.is_object() && !top.empty() && top.size() <= size_t(K)) << "token " << i;
      for (const auto& [text, v] : top.items()) {
        bool found = false;
        for (int k = 0; k < K; ++k) found |= std::fabs(v.get<double>() - best[size_t(k)]) < 1e-4;
        EXPECT_TRUE(found) << "token " << i << " alternative " << text;
      }
    }
    const auto& offsets = lp["text_offset"];
    for (size_t i = 1; i < offsets.size(); ++i) EXPECT_GE(offsets[i].get<size_t>(), offsets[i - 1].get<size_t>());

    EXPECT_EQ(s.post("/v1/completions", body)["choices"][0]["logprobs"], lp) << "a repeat (prefix cached)";
    json streamed = json::array();
    for (const json& e : s.stream("/v1/completions", body))
      if (!e["choices"][0]["logprobs"].is_null())
        for (const json& v : e["choices"][0]["logprobs"]["token_logprobs"]) streamed.push_back(v);
    EXPECT_EQ(streamed, lp["token_logprobs"]) << "streamed";
  }
}

// MTP speculative decoding inside the batch, on the golden models with an MTP layer: greedy
// output is that of `dsa run` without MTP; sampled, each of 4 concurrent requests gets the
// tokens `dsa run --mtp` gives it alone with its seed; drafts are verified and counted.
TEST(Serve, MtpInTheBatchGivesEachRequestItsSoloTokens) {
  int with_mtp = 0;
  for (const auto& name : test::golden_cases()) {
    const std::string dir = test::golden_dir() + "/" + name + "/model";
    std::ifstream cfg(dir + "/config.json");
    if (json::parse(cfg).value("num_nextn_predict_layers", 0) < 1) continue;
    ++with_mtp;
    std::ifstream in(test::golden_dir() + "/" + name + "/case.json");
    const json c = json::parse(in);
    std::vector<int32_t> prompt = c["ids"].get<std::vector<int32_t>>();
    prompt.resize(size_t(c["prompt_len"].get<int>()));
    const bool fp8 = c["kv_cache"] == "fp8";
    Options o;
    o.ctx = 128;
    o.max_seqs = 4;
    o.mtp = true;
    o.cache = fp8 ? CacheType::FP8 : CacheType::F32;
    TestServer s(dir, o);
    const std::string run = test::dsa_binary() + " run --model " + dir + " --ids " + join(prompt) + " --print-ids --ignore-eos -n 16 --kv-cache " +
                            (fp8 ? "fp8" : "f32");
    const json g = s.post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0}, {"ignore_eos", true}});
    EXPECT_EQ(join(ids_of(g["choices"][0])) + "\n", sh(run + " --greedy").out) << name;
    std::vector<std::future<json>> f;
    for (int k = 0; k < 4; ++k)
      f.push_back(std::async(std::launch::async, [&s, &prompt, k] {
        return s.post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0.8}, {"seed", 11 + k}, {"ignore_eos", true}});
      }));
    for (int k = 0; k < 4; ++k)
      EXPECT_EQ(join(ids_of(f[size_t(k)].get()["choices"][0])) + "\n",
                sh(run + " --mtp --temp 0.8 --top-k 0 --top-p 1 --min-p 0 --seed " + std::to_string(11 + k)).out)
          << name << " seed " << 11 + k;
    EXPECT_GT(metric(s.metrics(), "dsa:spec_decode_num_draft_tokens_total"), 0) << name;
    EXPECT_GT(metric(s.metrics(), "dsa:spec_decode_num_accepted_tokens_total"), 0) << name;
  }
  EXPECT_GE(with_mtp, 1) << "no golden model with an MTP layer";
}

// Each request's seeded, sampled tokens: alone, then all 16 at once.
TEST(Serve, SixteenConcurrentClientsGetTheirSoloTokens) {
  TestServer s(test::tiny_model_dir());
  std::vector<json> bodies;
  for (int i = 0; i < 16; ++i) {
    json b = {{"prompt", "Request number " + std::to_string(i) + std::string(size_t(i * 7), 'x')}, {"max_tokens", 12 + i},
              {"temperature", 0.9}, {"top_p", 0.95}, {"seed", 1000 + i}, {"return_token_ids", true}};
    bodies.push_back(b);
  }
  std::vector<std::vector<int32_t>> alone;
  for (const json& b : bodies) alone.push_back(ids_of(s.post("/v1/completions", b)["choices"][0]));
  std::vector<std::future<std::vector<int32_t>>> f;
  for (size_t i = 0; i < bodies.size(); ++i)
    f.push_back(std::async(std::launch::async, [&, i] {
      if (i % 2) {  // half of them streamed
        const auto ev = s.stream("/v1/completions", bodies[i]);
        return ev.empty() ? std::vector<int32_t>{} : ids_of(ev.back()["choices"][0]);
      }
      return ids_of(s.post("/v1/completions", bodies[i])["choices"][0]);
    }));
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(f[i].get(), alone[i]) << "request " << i;
}

TEST(Serve, PrefixCacheHitGivesTheTokensOfAMiss) {
  Options o;
  o.ctx = 2048;
  o.max_seqs = 2;
  TestServer s(test::tiny_model_dir(), o);
  std::string longp;
  for (int i = 0; i < 40; ++i) longp += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + ". ";
  const json b = {{"prompt", longp}, {"max_tokens", 16}, {"temperature", 0.7}, {"seed", 7}, {"return_token_ids", true}};
  const json miss = s.post("/v1/completions", b);
  const json hit = s.post("/v1/completions", b);
  EXPECT_EQ(miss["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_GT(hit["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 64);
  EXPECT_EQ(ids_of(hit["choices"][0]), ids_of(miss["choices"][0]));
  EXPECT_GT(metric(s.metrics(), "dsa:prefix_cache_hits_total"), 0);
}

// Each body's first choice run alone, then all of them at once, four running in a pool of
// `blocks` blocks of 16 tokens, too small for all of them to grow: the youngest are preempted
// and recomputed.
struct AloneAndTogether {
  std::vector<json> alone, together;
  double preemptions = 0;
};
AloneAndTogether alone_then_in_a_small_pool(const std::vector<json>& bodies, int blocks) {
  AloneAndTogether r;
  {
    TestServer big(test::tiny_model_dir());
    for (const json& b : bodies) r.alone.push_back(big.post("/v1/completions", b)["choices"][0]);
  }
  Options o;
  o.block_size = 16;
  o.cache_tokens = int64_t(blocks) * 16;
  o.max_seqs = 4;
  TestServer s(test::tiny_model_dir(), o);
  std::vector<std::future<json>> f;
  for (const json& b : bodies) f.push_back(std::async(std::launch::async, [&s, b] { return s.post("/v1/completions", b); }));
  for (auto& x : f) r.together.push_back(x.get()["choices"][0]);
  r.preemptions = metric(s.metrics(), "dsa:num_preemptions_total");
  EXPECT_TRUE(s.healthy());
  return r;
}

// 4 requests of up to 20 + 40 tokens each in 6 blocks: each still gets its solo tokens.
TEST(Serve, PreemptionInASmallPoolGivesEveryRequestItsSoloTokens) {
  std::vector<json> bodies;
  for (int i = 0; i < 4; ++i)
    bodies.push_back({{"prompt", "Preempt me " + std::to_string(i) + " please"}, {"max_tokens", 40}, {"temperature", 0.8},
                      {"seed", 50 + i}, {"ignore_eos", true}, {"return_token_ids", true}});
  const AloneAndTogether r = alone_then_in_a_small_pool(bodies, 6);
  for (size_t i = 0; i < bodies.size(); ++i) EXPECT_EQ(ids_of(r.together[i]), ids_of(r.alone[i])) << "request " << i;
  EXPECT_GT(r.preemptions, 0);
}

// The same with echo and logprobs (prompts of 30-39 tokens, 8 blocks): each request gets the
// prompt and token log-probabilities it gets alone, every prompt position once, also when
// preempted in the middle of its prompt.
TEST(Serve, PreemptionKeepsEachRequestsPromptLogprobs) {
  std::vector<json> bodies;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> prompt;
    for (int t = 0; t < 30 + 3 * i; ++t) prompt.push_back(int32_t(7 + 31 * t + 5 * i) % 1000);
    bodies.push_back({{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0.8}, {"seed", 70 + i}, {"ignore_eos", true},
                      {"echo", true}, {"logprobs", 1}});
  }
  const AloneAndTogether r = alone_then_in_a_small_pool(bodies, 8);
  for (size_t i = 0; i < bodies.size(); ++i) {
    const json& lp = r.together[i]["logprobs"];
    EXPECT_EQ(lp["token_logprobs"].size(), bodies[i]["prompt"].size() + 40) << "request " << i;
    EXPECT_EQ(lp, r.alone[i]["logprobs"]) << "request " << i;
  }
  EXPECT_GT(r.preemptions, 0);
}

// A schema of n levels, nesting through `via` (items: schema within schema, n levels of the
// body too; anyOf: a chain of n $defs, each an anyOf of the next, a flat body).
std::string deep_schema(int n, const std::string& via) {
  std::string s;  // built by appending: GCC 12 warns (-Wrestrict) on chains of + here
  if (via == "items") {
    for (int i = 0; i < n; ++i) s += R"({"type": "array", "items": )";
    s += "{}";
    s.append(size_t(n), '}');
    return s;
  }
  s += R"({"$defs": {)";
  for (int i = 0; i < n; ++i) {
    s += i ? ", \"d" : "\"d";
    s += std::to_string(i);
    s += "\": ";
    if (i + 1 < n) {
      s += R"({"anyOf": [{"$ref": "#/$defs/d)";
      s += std::to_string(i + 1);
      s += "\"}]}";
    } else {
      s += R"({"type": "null"})";
    }
  }
  s += R"(}, "$ref": "#/$defs/d0"})";
  return s;
}

TEST(Serve, BadRequestsGetTheirStatusAndTheServerKeepsServing) {
  Options o;
  o.api_key = "sekrit";
  TestServer s(test::tiny_model_dir(), o);
  httplib::Client c = s.client();
  const httplib::Headers auth = {{"Authorization", "Bearer sekrit"}};
  auto expect = [&](int status, const std::string& path, const std::string& body, const httplib::Headers& h, const std::string& what) {
    auto r = c.Post(path, h, body, "application/json");
    ASSERT_TRUE(r) << what;
    EXPECT_EQ(r->status, status) << what << ": " << r->body;
    const json e = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(e.is_object() && e.contains("error")) << what << ": " << r->body;
    for (const char* k : {"message", "type", "param", "code"}) EXPECT_TRUE(e["error"].contains(k)) << what << " lacks " << k;
    EXPECT_TRUE(s.healthy()) << "after " << what;
  };
  const std::string ok = chat_body("hi", 2).dump();
  expect(401, "/v1/chat/completions", ok, {}, "no API key");
  expect(401, "/v1/chat/completions", ok, {{"Authorization", "Bearer sekrix"}}, "wrong API key");
  expect(400, "/v1/chat/completions", "{\"messages\": [", auth, "malformed JSON");
  expect(400, "/v1/chat/completions", R"({"messages": "hi"})", auth, "messages of the wrong type");
  expect(400, "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})", auth, "temperature a string");
  expect(400, "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1})", auth, "negative max_tokens");
  expect(400, "/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "x"}]})", auth, "unknown role");
  expect(400, "/v1/completions", R"({"prompt": [1, 2, 99999999]})", auth, "token id out of range");
  expect(400, "/v1/completions", R"({"prompt": [1, 2], "logit_bias": {"abc": 1}})", auth, "logit_bias key not an id");
  expect(400, "/v1/completions", R"({"prompt": [1, 2], "logit_bias": {"5": 101}})", auth, "logit_bias beyond 100");
  expect(400, "/v1/completions", R"({"prompt": [1, 2], "logit_bias": {"99999999": 1}})", auth, "logit_bias id out of range");
  expect(400, "/v1/completions", R"({"prompt": [1, 2], "logit_bias": [1]})", auth, "logit_bias not an object");
  expect(400, "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}})", auth,
         "an unknown response_format");
  expect(400, "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "response_format": "json"})", auth,
         "response_format not an object");
  expect(400, "/v1/completions", json{{"prompt", std::string(4000, 'a')}}.dump(), auth, "prompt longer than the context");
  expect(404, "/v1/chat/completions", R"({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]})", auth, "unknown model");
  expect(404, "/v1/nothing", "{}", auth, "unknown path");
  expect(413, "/v1/chat/completions", std::string(64u << 20, ' '), auth, "64 MiB body");
  // 200,000 levels in a tool's parameters: copying or printing them would overflow a stack.
  std::string deep = R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": )";
  deep.append(200000, '[');
  deep.append(200000, ']');
  deep += "}}]}";
  expect(400, "/v1/chat/completions", deep, auth, "a body nested 200,000 deep");
  for (const std::string& schema : {deep_schema(200, "items"), deep_schema(1000, "anyOf")}) {
    std::string body = R"({"prompt": [1, 2], "guided_json": )";
    body += schema;
    body += '}';
    expect(400, "/v1/completions", body, auth, "a schema nested deep");
  }
  auto ok_r = c.Post("/v1/chat/completions", auth, ok, "application/json");
  ASSERT_TRUE(ok_r);
  EXPECT_EQ(ok_r->status, 200);
  json text_format = json::parse(ok);
  text_format["response_format"] = {{"type", "text"}};
  auto text_r = c.Post("/v1/chat/completions", auth, text_format.dump(), "application/json");
  ASSERT_TRUE(text_r);
  EXPECT_EQ(text_r->status, 200) << "response_format text";
  auto h = httplib::Client("127.0.0.1", s.port()).Get("/health");  // no key needed
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

// One running, one waiting, and the queue holds one: the next request is refused with 429.
TEST(Serve, AFullQueueIs429) {
  Options o;
  o.max_seqs = 1;
  o.max_queue = 1;
  o.ctx = 1100;
  TestServer s(test::tiny_model_dir(), o);
  const json slow = {{"prompt", "long one"}, {"max_tokens", 1000}, {"ignore_eos", true}};
  auto post = [&] { return s.client().Post("/v1/completions", slow.dump(), "application/json"); };
  auto until = [&](const char* name, double v) {
    for (int i = 0; i < 1000 && metric(s.metrics(), name) != v; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return metric(s.metrics(), name) == v;
  };
  auto a = std::async(std::launch::async, post);
  ASSERT_TRUE(until("dsa:num_requests_running", 1));
  auto b = std::async(std::launch::async, post);
  ASSERT_TRUE(until("dsa:num_requests_waiting", 1));
  auto r = s.client().Post("/v1/completions", slow.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "rate_limit_error");
  EXPECT_TRUE(s.healthy());
  EXPECT_EQ(a.get()->status, 200);
  EXPECT_EQ(b.get()->status, 200);
}

// A client that goes away mid-stream: its request is cancelled (counted as "abort") and
// its blocks freed, while the server keeps serving.
TEST(Serve, ADisconnectMidStreamCancelsTheRequest) {
  TestServer s(test::tiny_model_dir());
  {
    httplib::Client c = s.client();
    int chunks = 0;
    const json b = {{"prompt", "stream and leave"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}};
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = b.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };  // false: hang up
    httplib::Response res;
    httplib::Error err;
    c.send(req, res, err);
    EXPECT_GE(chunks, 3);
  }
  double aborted = -1;
  for (int i = 0; i < 100; ++i) {
    const std::string m = s.metrics();
    aborted = metric(m, "dsa:request_success_total{model_name=\"m\",finished_reason=\"abort\"}");
    if (aborted >= 1 && metric(m, "dsa:num_requests_running") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(aborted, 1);
  EXPECT_EQ(metric(s.metrics(), "dsa:cache_blocks_used"), 0);
  EXPECT_TRUE(s.healthy());
}

// A non-streamed reply that takes longer than a second goes out as spaces, four a second,
// then the reply object (still one JSON value): a client that waits gets all its tokens, and
// one that gives up shows as a failed write, so its request is cancelled and its blocks freed.
TEST(Serve, ADisconnectDuringAWholeReplyCancelsTheRequest) {
  Options o;
  o.ctx = 3072;
  o.max_seqs = 2;
  TestServer s(test::tiny_model_dir(), o);
  const int n = 3000;
  const json b = {{"prompt", "wait for it"}, {"max_tokens", n}, {"ignore_eos", true}};
  const auto t0 = std::chrono::steady_clock::now();
  auto whole = s.client().Post("/v1/completions", b.dump(), "application/json");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->status, 200);
  ASSERT_GT(took, 1.5) << "the reply came too fast to take the chunked path; raise n";
  EXPECT_EQ(whole->body.front(), ' ') << took << " s";
  EXPECT_EQ(json::parse(whole->body).at("usage").at("completion_tokens").get<int>(), n);
  {
    httplib::Client c = s.client();
    c.set_read_timeout(0, 500000);
    auto r = c.Post("/v1/completions", b.dump(), "application/json");
    EXPECT_FALSE(r) << "the client should have timed out";
  }
  double aborted = -1;
  for (int i = 0; i < 200; ++i) {
    const std::string m = s.metrics();
    aborted = metric(m, "dsa:request_success_total{model_name=\"m\",finished_reason=\"abort\"}");
    if (aborted >= 1 && metric(m, "dsa:num_requests_running") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(aborted, 1);
  EXPECT_EQ(metric(s.metrics(), "dsa:cache_blocks_used"), 0);
  EXPECT_TRUE(s.healthy());
}

TEST(Serve, ModelsTokenizeDetokenizeAndMetrics) {
  TestServer s(test::tiny_model_dir());
  auto models = s.client().Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "m");
  auto one = s.client().Get("/v1/models/m");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  EXPECT_EQ(json::parse(one->body), json::parse(models->body)["data"][0]);
  auto none = s.client().Get("/v1/models/gpt-9");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 404);
  EXPECT_EQ(json::parse(none->body)["error"]["code"], "model_not_found");
  const json t = s.post("/tokenize", {{"prompt", "hello world"}});
  ASSERT_GT(t["count"].get<int>(), 0);
  const json d = s.post("/detokenize", {{"tokens", t["tokens"]}});
  EXPECT_NE(d["prompt"].get<std::string>().find("hello world"), std::string::npos);
  // A chat's prompt through /tokenize is the prompt the chat request runs.
  const json tc = s.post("/tokenize", {{"messages", {{{"role", "user"}, {"content", "Hello"}}}}});
  const json r = s.post("/v1/chat/completions", chat_body("Hello", 1));
  EXPECT_EQ(r["usage"]["prompt_tokens"], tc["count"]);
  const std::string m = s.metrics();
  for (const char* name : {"dsa:num_requests_running", "dsa:num_requests_waiting", "dsa:prompt_tokens_total", "dsa:generation_tokens_total",
                           "dsa:cache_blocks_used", "dsa:cache_blocks_free", "dsa:kv_cache_usage_perc", "dsa:prefix_cache_queries_total",
                           "dsa:prefix_cache_hits_total", "dsa:num_preemptions_total", "dsa:spec_decode_num_draft_tokens_total",
                           "dsa:time_to_first_token_seconds_count", "dsa:time_per_output_token_seconds_count",
                           "dsa:e2e_request_latency_seconds_count", "dsa:request_queue_time_seconds_count"})
    EXPECT_GE(metric(m, name), 0) << name;
  EXPECT_GE(metric(m, "dsa:generation_tokens_total"), 1);
}

// Tools offered and a tool result sent back: the request's prompt is the chat encoding of
// the conversation with the tools (checked through /tokenize against the encoder's string).
TEST(Serve, ToolsAndToolResultsAreEncodedAsTheModelExpects) {
  Options o;
  o.ctx = 4096;
  o.max_seqs = 2;
  TestServer s(test::tiny_model_dir(), o);
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  const json msgs = json::parse(R"([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}])");
  const json r = s.post("/v1/chat/completions", {{"messages", msgs}, {"tools", tools}, {"max_tokens", 4}, {"temperature", 0}});
  EXPECT_EQ(r["object"], "chat.completion");
  const json tk = s.post("/tokenize", {{"messages", msgs}, {"tools", tools}});
  EXPECT_EQ(r["usage"]["prompt_tokens"], tk["count"]);
  const json none = s.post("/tokenize", {{"messages", msgs}, {"tools", tools}, {"tool_choice", "none"}});
  EXPECT_LT(none["count"].get<int>(), tk["count"].get<int>()) << "tool_choice none offers no tools";
  s.post("/v1/chat/completions", {{"messages", msgs}, {"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}},
         400);
}

// tool_choice "required" or a named function on the random-weight model: every reply is a
// call block (finish_reason tool_calls) of the offered tools, the named one alone, with
// arguments that follow the tool's schema, streamed or not, also after reasoning in thinking
// mode; without the choice the model writes no calls. Choices that cannot be kept get 400.
TEST(Serve, ForcedToolCallsFollowTheTools) {
  Options o;
  o.ctx = 2048;
  TestServer s(test::tiny_model_dir(), o);
  const auto tools = nlohmann::ordered_json::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "unit": {"enum": ["celsius", "fahrenheit"]}, "hourly": {"type": "boolean"},
        "fields": {"type": "array", "items": {"enum": ["temp", "wind"]}, "maxItems": 2}}, "required": ["unit"]}}},
      {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"anyOf": [{"enum": ["utc", "local"]}, {"type": "null"}]}}, "required": ["zone"]}}}])");
  auto check_call = [](const json& call) {
    const json args = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
    ASSERT_TRUE(args.is_object()) << call.dump();
    if (call["function"]["name"] == "get_weather") {
      EXPECT_TRUE(args["unit"] == "celsius" || args["unit"] == "fahrenheit") << call.dump();
      EXPECT_TRUE(!args.contains("hourly") || args["hourly"].is_boolean()) << call.dump();
      EXPECT_TRUE(!args.contains("fields") || (args["fields"].is_array() && args["fields"].size() <= 2)) << call.dump();
    } else {
      EXPECT_EQ(call["function"]["name"], "get_time");
      EXPECT_TRUE(args["zone"] == "utc" || args["zone"] == "local" || args["zone"].is_null()) << call.dump();
    }
  };
  int free_calls = 0, whole = 0;
  for (int k = 0; k < 4; ++k) {
    nlohmann::ordered_json body = chat_body("What is the weather? " + std::to_string(k), 400, k == 0 ? 0.0 : 1.0, k);
    body["tools"] = tools;
    const json plain = s.post("/v1/chat/completions", body)["choices"][0];
    free_calls += plain["finish_reason"] == "tool_calls";
    for (const nlohmann::ordered_json& choice : {nlohmann::ordered_json("required"),
                                                 nlohmann::ordered_json{{"type", "function"}, {"function", {{"name", "get_time"}}}}}) {
      body["tool_choice"] = choice;
      SCOPED_TRACE(choice.dump());
      // A reply cut by max_tokens ("required" may go on calling) still lists its whole calls.
      const json c = s.post("/v1/chat/completions", body)["choices"][0];
      EXPECT_TRUE(c["finish_reason"] == "tool_calls" || c["finish_reason"] == "length") << c.dump();
      whole += c["finish_reason"] == "tool_calls";
      const json& calls = c["message"]["tool_calls"];
      ASSERT_TRUE(c["finish_reason"] == "length" || (calls.is_array() && !calls.empty())) << c.dump();
      EXPECT_TRUE(!choice.is_object() || calls.size() == 1u) << c.dump();
      EXPECT_TRUE(c["message"]["content"].is_null() || c["message"]["content"] == "") << c.dump();
      for (const json& call : calls) {
        check_call(call);
        EXPECT_TRUE(!choice.is_object() || call["function"]["name"] == "get_time") << call.dump();
      }
      std::string args;
      json finish;
      for (const json& e : s.stream("/v1/chat/completions", body)) {
        const json& d = e["choices"][0]["delta"];
        if (d.contains("tool_calls"))
          for (const json& t : d["tool_calls"])
            if (t.contains("function") && t["function"].contains("arguments")) args += t["function"]["arguments"].get<std::string>();
        if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
      }
      std::string all;
      for (const json& call : calls) all += call["function"]["arguments"].get<std::string>();
      EXPECT_EQ(args.substr(0, all.size()), all);
      EXPECT_EQ(finish, c["finish_reason"]);
    }
  }
  EXPECT_GT(whole, 4) << "few replies ended on their own";
  EXPECT_EQ(free_calls, 0) << "the model calls tools anyway: this tests nothing";
  nlohmann::ordered_json bad = chat_body("x", 4);
  bad["tool_choice"] = "required";
  s.post("/v1/chat/completions", bad, 400);  // no tools
  bad["tools"] = tools;
  bad["response_format"] = {{"type", "json_object"}};
  s.post("/v1/chat/completions", bad, 400);
  bad.erase("response_format");
  bad["min_tokens"] = 2;
  s.post("/v1/chat/completions", bad, 400);
  bad.erase("min_tokens");
  bad["tools"][0]["function"]["parameters"]["properties"]["unit"] = {{"type", "string"}, {"pattern", "(c)\\1"}};
  bad["max_tokens"] = 300;
  const json loose = s.post("/v1/chat/completions", bad)["choices"][0];  // without "strict": what can be kept is
  EXPECT_TRUE(loose["finish_reason"] == "tool_calls" || loose["finish_reason"] == "length") << loose.dump();
  bad["tools"][0]["function"]["strict"] = true;
  const json e = s.post("/v1/chat/completions", bad, 400);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("backreferences are not supported"), std::string::npos) << e.dump();
  EXPECT_EQ(e["error"]["param"], "tools");
  bad["chat_template_kwargs"] = {{"thinking", true}};
  s.post("/v1/chat/completions", bad, 400);
  // With thinking the reasoning comes first, free, and the block follows "</think>" (nudged
  // by a logit bias: the random weights would take long to write it).
  const int32_t think_end = s.post("/tokenize", {{"prompt", "</think>"}})["tokens"].back().get<int32_t>();
  int reasoned = 0;
  for (int k = 0; k < 3; ++k) {
    nlohmann::ordered_json body = chat_body("Think, then call. " + std::to_string(k), 600, 1.0, k);
    body["tools"] = tools;
    body["tool_choice"] = "required";
    body["chat_template_kwargs"] = {{"thinking", true}};
    body["logit_bias"] = {{std::to_string(think_end), 4}};
    const json c = s.post("/v1/chat/completions", body)["choices"][0];
    ASSERT_EQ(c["finish_reason"], "tool_calls") << c.dump();
    EXPECT_TRUE(c["message"]["content"].is_null() || c["message"]["content"] == "") << c.dump();
    reasoned += c["message"].contains("reasoning_content") && !c["message"]["reasoning_content"].get<std::string>().empty();
    for (const json& call : c["message"]["tool_calls"]) check_call(call);
  }
  EXPECT_GT(reasoned, 0) << "no reply reasoned before its calls";
}

// The reply parser on the model's own markup: thinking into reasoning_content, DSML into
// tool calls whose arguments stream in pieces, nothing of the markup in content.
TEST(Serve, ReplyStreamSplitsThinkingAndToolCalls) {
  const std::string text =
      "Need the weather.</think>Let me check.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Paris, France</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜function_calls>";
  server::ReplyStream r(Family::DeepseekV32, true, "x");
  std::string reasoning, content, args;
  int arg_pieces = 0;
  for (size_t i = 0; i < text.size(); i += 3) {
    server::ReplyDelta d;
    r.feed(std::string_view(text).substr(i, 3), d);
    reasoning += d.reasoning;
    content += d.content;
    for (const auto& c : d.calls) {
      args += c.arguments;
      arg_pieces += !c.arguments.empty();
    }
  }
  server::ReplyDelta d;
  r.finish(true, d);
  for (const auto& c : d.calls) args += c.arguments;
  EXPECT_EQ(reasoning, "Need the weather.");
  EXPECT_EQ(content, "Let me check.");
  ASSERT_EQ(r.tool_calls().size(), 1u);
  EXPECT_EQ(r.tool_calls()[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls()[0].arguments, R"({"city": "Paris, France", "days": 3})");
  EXPECT_EQ(args, r.tool_calls()[0].arguments);
  EXPECT_GT(arg_pieces, 3) << "arguments stream as they are generated";
  // Cut off by max_tokens inside reasoning: what came is reasoning, nothing is lost or thrown.
  server::ReplyStream cut(Family::DeepseekV32, true, "y");
  server::ReplyDelta d2;
  cut.feed("half a thou", d2);
  cut.finish(false, d2);
  EXPECT_EQ(cut.reasoning(), "half a thou");
  // GLM-5 markup.
  server::ReplyStream g(Family::GlmMoeDsa, true, "z");
  server::ReplyDelta d3;
  g.feed("hmm</think>ok<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>", d3);
  g.finish(true, d3);
  EXPECT_EQ(g.reasoning(), "hmm");
  EXPECT_EQ(g.content(), "ok");
  ASSERT_EQ(g.tool_calls().size(), 1u);
  EXPECT_EQ(g.tool_calls()[0].arguments, R"({"city": "Paris"})");
}

// SIGTERM: stop admitting, let the running request finish, exit 0.
TEST(Serve, SigtermDrainsAndExitsZero) {
  const std::string log = test::scratch("serve_log");
  const std::string cmd = "exec " + test::dsa_binary() + " serve --model " + test::tiny_model_dir() + " --port 0 --ctx 512 2>" + log;
  pid_t pid = 0;
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  ASSERT_EQ(::posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char* const*>(argv), environ), 0);
  int port = 0;
  for (int i = 0; i < 400 && !port; ++i) {
    std::ifstream in(log);
    const std::string s((std::istreambuf_iterator<char>(in)), {});
    std::smatch m;
    if (std::regex_search(s, m, std::regex(R"(http://127\.0\.0\.1:(\d+))"))) port = std::stoi(m[1].str());
    else std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GT(port, 0);
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  auto running = std::async(std::launch::async, [&] {
    return c.Post("/v1/completions", json{{"prompt", "drain me"}, {"max_tokens", 64}, {"ignore_eos", true}}.dump(), "application/json");
  });
  // SIGTERM once the request runs: a fixed sleep raced the request on a loaded machine (not
  // yet admitted, it found the server already gone).
  httplib::Client probe("127.0.0.1", port);
  for (int i = 0; i < 400; ++i) {
    auto m = probe.Get("/metrics");
    if (m && m->status == 200 && metric(m->body, "dsa:num_requests_running") >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGTERM);
  auto r = running.get();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 64);
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
  // After the drain nothing is accepted any more.
  EXPECT_FALSE(httplib::Client("127.0.0.1", port).Get("/health"));
}

}  // namespace
