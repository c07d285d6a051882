#pragma once
// `dsa serve`: the OpenAI-compatible HTTP front of the scheduler. HTTP threads (a pool of
// cpp-httplib) parse and check requests, queue them with the scheduler and stream their
// output back; the engine thread alone runs the model. The server sees the engine only
// through the scheduler's request API.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "runtime/scheduler.h"
#include "server/metrics.h"
#include "server/protocol.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace dsa::server {

class Exchange;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                   // 0: any free port (see bind())
  std::string api_key;               // empty: no key needed
  size_t max_body = 8u << 20;        // request body limit in bytes (413 beyond)
  int http_threads = 0;              // 0: enough for every running and queued request
  ServeLimits limits;
};

class Server {
public:
  Server(Scheduler& sched, Metrics& metrics, ModelInfo model, ServerOptions opt);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int bind();   // binds host:port; returns the port (throws dsa::Error when it cannot)
  void run();   // serves until stop()
  // Stops admitting (new generation requests get 503), waits up to `timeout_s` for the
  // running and queued ones to finish, cancels what is left, and stops serving.
  void drain_and_stop(double timeout_s);
  void stop();

private:
  Scheduler& sched_;
  Metrics& metrics_;
  ModelInfo model_;
  ServerOptions opt_;
  std::unique_ptr<httplib::Server> http_;
  int listen_fd_ = -1;  // the listening socket, once bound
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{1};
  void routes();
  void tokenize(const httplib::Request& req, httplib::Response& res);
  void detokenize(const httplib::Request& req, httplib::Response& res);
  void generate(const httplib::Request& req, httplib::Response& res, Job job, const char* id_prefix);
  static constexpr std::chrono::milliseconds kWholeReplyWait{1000};
  static void whole_reply(httplib::Response& res, const std::shared_ptr<Exchange>& ex, const std::shared_ptr<Job>& job);
};

}  // namespace dsa::server
