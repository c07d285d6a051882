#include "server/server.h"

#include <httplib.h>

#include <thread>

#include <sys/socket.h>

#include "core/error.h"
#include "io/json.h"
#include "server/chat_page.h"
#include "server/exchange.h"

namespace dsa::server {

using json = nlohmann::json;

namespace {

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(e.body().dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

// Constant-time comparison: how long it takes says nothing about where a guess differs.
bool same_secret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (b.empty() ? 0 : b[i % b.size()]));
  return diff == 0;
}

// Bounded: copying, printing or compiling a JSON value recurses once per level, and a body of
// a few MB could otherwise nest deep enough to overflow the handler's stack.
nlohmann::ordered_json parse_body(const httplib::Request& req) {
  try {
    return parse_json_bounded<nlohmann::ordered_json>(req.body);
  } catch (const json::exception& e) {
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
  }
}

}  // namespace

Server::Server(Scheduler& sched, Metrics& metrics, ModelInfo model, ServerOptions opt)
    : sched_(sched), metrics_(metrics), model_(std::move(model)), opt_(std::move(opt)), http_(std::make_unique<httplib::Server>()) {
  const int threads = opt_.http_threads > 0 ? opt_.http_threads : 64;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http_->set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd_ = int(sock);  // the last socket tried is the one that binds
  });
  http_->set_payload_max_length(opt_.max_body);
  http_->set_read_timeout(30, 0);
  http_->set_write_timeout(30, 0);
  routes();
}

Server::~Server() { stop(); }

int Server::bind() {
  const int port = opt_.port == 0 ? http_->bind_to_any_port(opt_.host) : (http_->bind_to_port(opt_.host, opt_.port) ? opt_.port : -1);
  if (port <= 0) throw Error("serve: cannot listen on " + opt_.host + ":" + std::to_string(opt_.port) + " (in use, or not an address of this machine)");
  // cpp-httplib listens with a backlog of 5: sixteen clients connecting at once while the
  // accept loop waits for a core overflowed it, and the kernel reset some of them. Listening
  // again on the bound socket sets the system's maximum instead.
  if (listen_fd_ >= 0) ::listen(listen_fd_, SOMAXCONN);
  return port;
}

void Server::run() { http_->listen_after_bind(); }

void Server::stop() {
  if (http_) http_->stop();
}

void Server::drain_and_stop(double timeout_s) {
  draining_ = true;
  const auto until = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (!sched_.idle() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  sched_.stop();  // cancels what is left; its clients get their ends
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  stop();
}

void Server::routes() {
  httplib::Server& s = *http_;
  // The API key guards everything but the health check and the chat page (which sends the key itself).
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opt_.api_key.empty() || req.path == "/health" || (req.path == "/" && req.method == "GET")) return httplib::Server::HandlerResponse::Unhandled;
    const std::string h = req.get_header_value("Authorization");
    const std::string_view bearer = "Bearer ";
    if (h.size() > bearer.size() && h.compare(0, bearer.size(), bearer) == 0 &&
        same_secret(std::string_view(h).substr(bearer.size()), opt_.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError(401, "missing or wrong API key (send 'Authorization: Bearer <key>')", "", "", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // Errors the library answers itself (unknown path, body too large) get the API's error body.
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) send_error(res, ApiError(413, "the request body is too large"));
    else if (res.status == 404) send_error(res, ApiError(404, "no route for " + req.method + " " + req.path));
    else send_error(res, ApiError(res.status, "the request failed (HTTP " + std::to_string(res.status) + ")"));
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    try {
      std::rethrow_exception(ep);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const std::exception& e) {
      send_error(res, ApiError(500, e.what()));
    }
  });

  s.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("{}", "application/json"); });
  s.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content(std::string(kChatPage), "text/html; charset=utf-8"); });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.render(sched_.stats(), model_.name), "text/plain; version=0.0.4");
  });
  auto model_object = [this] {
    return json{{"id", model_.name}, {"object", "model"}, {"created", 0}, {"owned_by", "dsa"}, {"max_model_len", opt_.limits.max_ctx}};
  };
  s.Get("/v1/models", [model_object](const httplib::Request&, httplib::Response& res) {
    res.set_content(json{{"object", "list"}, {"data", json::array({model_object()})}}.dump(), "application/json");
  });
  // One model by id (the OpenAI client's models.retrieve; an id may hold slashes).
  s.Get(R"(/v1/models/(.+))", [this, model_object](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1].str() != model_.name) throw model_not_found(req.matches[1].str(), model_);
    res.set_content(model_object().dump(), "application/json");
  });
  s.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) { tokenize(req, res); });
  s.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) { detokenize(req, res); });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    generate(req, res, parse_chat_request(parse_body(req), model_, opt_.limits), "chatcmpl-");
  });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    generate(req, res, parse_completion_request(parse_body(req), model_, opt_.limits), "cmpl-");
  });
}

void Server::tokenize(const httplib::Request& req, httplib::Response& res) {
  const nlohmann::ordered_json b = parse_body(req);
  if (!b.is_object()) throw ApiError(400, "the request body must be a JSON object");
  std::vector<int32_t> ids;
  if (b.contains("messages")) {
    nlohmann::ordered_json chat = b;
    chat.erase("max_tokens");
    chat.erase("max_completion_tokens");
    ServeLimits lim = opt_.limits;
    lim.max_prompt = INT32_MAX / 2;
    lim.max_ctx = INT32_MAX / 2;
    ids = parse_chat_request(chat, model_, lim).prompts[0];
  } else {
    if (!b.contains("prompt") || !b["prompt"].is_string()) throw ApiError(400, "'prompt': expected a string (or give 'messages')", "prompt");
    if (!model_.tok) throw ApiError(400, "this model has no tokenizer", "prompt");
    const bool special = !b.contains("add_special_tokens") || (b["add_special_tokens"].is_boolean() && b["add_special_tokens"].get<bool>());
    try {
      ids = model_.tok->encode(b["prompt"].get<std::string>(), special && model_.tok->default_add_bos());
    } catch (const Error& e) {
      throw ApiError(400, std::string("'prompt': ") + e.what(), "prompt");
    }
  }
  res.set_content(json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", opt_.limits.max_ctx}}.dump(), "application/json");
}

void Server::detokenize(const httplib::Request& req, httplib::Response& res) {
  const nlohmann::ordered_json b = parse_body(req);
  if (!b.is_object() || !b.contains("tokens") || !b["tokens"].is_array()) throw ApiError(400, "'tokens': expected a list of token ids", "tokens");
  if (!model_.tok) throw ApiError(400, "this model has no tokenizer", "tokens");
  std::vector<int32_t> ids;
  for (const auto& t : b["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= model_.vocab_size)
      throw ApiError(400, "'tokens': expected token ids in [0, " + std::to_string(model_.vocab_size) + ")", "tokens");
    ids.push_back(t.get<int32_t>());
  }
  res.set_content(json{{"prompt", model_.tok->decode(ids)}}.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

// A non-streamed reply. One that is ready within kWholeReplyWait goes back whole, with its
// status. A longer one becomes a chunked body that sends a space (whitespace before a JSON
// value is part of the JSON grammar) four times a second until the reply object follows: a client
// gone shows as a failed write and cancels the request, as a stream's keep-alive comments
// do. Its status is 200 from the first space on, so an engine failure after that point
// arrives as the OpenAI error object in the body.
void Server::whole_reply(httplib::Response& res, const std::shared_ptr<Exchange>& ex, const std::shared_ptr<Job>& job) {
  const auto t0 = Clock::now();
  while (!ex->done() && Clock::now() - t0 < kWholeReplyWait) ex->poll(std::chrono::milliseconds(50));
  if (ex->done()) {
    if (!ex->error().empty()) throw ApiError(503, ex->error());
    res.set_content(ex->response().dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
    return;
  }
  res.set_chunked_content_provider(
      "application/json",
      [ex, job](size_t, httplib::DataSink& sink) {  // the exchange refers to the job: both live on
        auto last = Clock::now();
        while (!ex->done()) {
          ex->poll(std::chrono::milliseconds(50));
          if (Clock::now() - last < std::chrono::milliseconds(250)) continue;
          last = Clock::now();
          if (!sink.write(" ", 1)) {
            ex->cancel();
            return false;
          }
        }
        const std::string err = ex->error();
        const json body = err.empty() ? ex->response() : ApiError(503, err).body();
        const std::string out = body.dump(-1, ' ', false, json::error_handler_t::replace);
        if (!sink.write(out.data(), out.size())) return false;
        sink.done();
        return true;
      },
      [ex](bool) { ex->cancel(); });
}

void Server::generate(const httplib::Request&, httplib::Response& res, Job job, const char* prefix) {
  if (draining_) throw ApiError(503, "the server is shutting down");
  char idbuf[32];
  std::snprintf(idbuf, sizeof idbuf, "%016llx", static_cast<unsigned long long>(next_id_++));
  auto job_p = std::make_shared<Job>(std::move(job));
  auto ex = std::make_shared<Exchange>(*job_p, model_, std::string(prefix) + idbuf);
  try {
    if (!ex->submit(sched_)) throw ApiError(429, "the request queue is full; try again later");
  } catch (const Error& e) {
    throw ApiError(400, e.what());
  }
  if (!job_p->stream) {
    whole_reply(res, ex, job_p);
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [ex, job_p](size_t, httplib::DataSink& sink) {
        auto quiet_since = Clock::now();
        for (;;) {
          const bool got = ex->poll(std::chrono::milliseconds(250));
          std::string out = got ? ex->take_chunks() : "";
          // A comment now and then while nothing comes: a client gone shows as a failed write.
          if (out.empty() && Clock::now() - quiet_since > std::chrono::seconds(1)) out = ": keep-alive\n\n";
          if (!out.empty()) {
            quiet_since = Clock::now();
            if (!sink.write(out.data(), out.size())) {
              ex->cancel();
              return false;
            }
          }
          if (ex->done()) break;
        }
        const std::string err = ex->error();
        std::string tail = err.empty() ? ex->final_chunks() : "data: " + ApiError(503, err).body().dump() + "\n\n";
        if (!sink.write(tail.data(), tail.size())) return false;
        sink.done();
        return true;
      },
      [ex](bool) { ex->cancel(); });
}

}  // namespace dsa::server
