// `dsa serve`: an OpenAI-compatible HTTP server over the batched engine (continuous
// batching, chunked prefill, prefix caching, preemption). SIGINT / SIGTERM stop admitting,
// let running requests finish for --drain-timeout seconds, cancel the rest and exit 0.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "cli_util.h"
#include "command.h"
#include "gen_cli.h"
#include "runtime/scheduler.h"
#include "server/server.h"

namespace {

struct Args {
  std::string model, name, host = "127.0.0.1", api_key, kv_cache = "fp8", max_body = "8M";
  int port = 8080, ctx = 4096, max_seqs = 16, max_batch_tokens = 512, max_queue = 256, max_tokens = 0, max_n = 8;
  int http_threads = 0;
  double drain_timeout = 30;
  bool mtp = false;
  dsa::cli::CacheFlags cache;
  dsa::cli::ParallelFlags par;
};

// Logit rows a step keeps beyond its sequences' own for prompt log-probabilities: the
// longest such prompt chunk (each row is vocab_size floats: 64 MB at DeepSeek-V3.2's vocab).
constexpr int kPromptLogitRows = 128;

dsa::EngineOptions engine_options(const Args& a, const dsa::ModelConfig& c) {
  dsa::EngineOptions eo;
  eo.cache = dsa::cli::parse_cache_type(a.kv_cache);
  eo.max_ctx = c.max_position_embeddings > 0 ? std::min(a.ctx, c.max_position_embeddings) : a.ctx;
  eo.max_seqs = a.max_seqs;
  eo.max_step_tokens = std::max(a.max_batch_tokens, a.max_seqs * (a.mtp ? 2 : 1));  // a verify step carries two tokens
  eo.mtp = a.mtp;
  // Two rows per sequence (a verify step's pair), and room for prompt log-probabilities
  // (completions with echo and logprobs), whose prompt chunks return a row per token.
  eo.max_logit_rows = 2 * a.max_seqs + kPromptLogitRows;
  a.cache.apply(eo);
  return eo;
}

dsa::SchedulerOptions scheduler_options(const Args& a, const dsa::EngineOptions& eo) {
  dsa::SchedulerOptions so;
  so.max_seqs = a.max_seqs;
  so.max_batch_tokens = eo.max_step_tokens;
  so.prefill_chunk = eo.max_step_tokens;
  so.max_waiting = a.max_queue;
  so.mtp = a.mtp;
  return so;
}

// The model as /v1/models names it: --served-model-name, else the directory's name.
dsa::server::ModelInfo model_info(const Args& a, const dsa::ModelConfig& c, const dsa::Tokenizer* tok) {
  dsa::server::ModelInfo info;
  info.name = a.name.empty() ? std::filesystem::path(a.model).lexically_normal().filename().string() : a.name;
  if (info.name.empty()) info.name = std::filesystem::path(a.model).lexically_normal().parent_path().filename().string();
  info.family = c.family;
  info.vocab_size = c.vocab_size;
  info.tok = tok;
  return info;
}

dsa::server::ServerOptions server_options(const Args& a, const dsa::EngineOptions& eo) {
  dsa::server::ServerOptions o;
  o.host = a.host;
  o.port = a.port;
  o.api_key = a.api_key;
  o.max_body = size_t(dsa::cli::parse_bytes(a.max_body, "--max-body"));
  o.http_threads = a.http_threads > 0 ? a.http_threads : a.max_seqs + a.max_queue + 8;
  o.limits.max_ctx = eo.max_ctx;
  o.limits.max_tokens = a.max_tokens > 0 ? a.max_tokens : eo.max_ctx;
  o.limits.max_n = a.max_n;
  return o;
}

// Rank 0's serving: the HTTP server on its own thread, the scheduler (and so the engine) on
// this one, a third thread waiting for SIGINT/SIGTERM (blocked in every thread) to drain.
void serve_until_stopped(const Args& a, dsa::Engine& engine, dsa::Scheduler& sched, dsa::server::Server& srv, const sigset_t& sigs) {
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    std::fprintf(stderr, "signal %d: draining (up to %.0f s)\n", sig, a.drain_timeout);
    srv.drain_and_stop(a.drain_timeout);
  });
  std::thread http([&] {
    srv.run();
    sched.stop();  // also when listening fails
  });
  sched.run();  // the engine on this thread, whose OpenMP pool loaded the model
  engine.stop_followers();
  srv.stop();
  http.join();
  pthread_kill(waiter.native_handle(), SIGTERM);  // wakes it if no signal came
  waiter.join();
}

void serve(Args& a) {
  using namespace dsa;
  // Signals are taken by one waiting thread: block them before any thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  // Under mpirun rank 0 serves and drives the engine; the other ranks' engines follow its
  // calls (mpirun forwards SIGINT/SIGTERM to them too: blocked above, the leader's drain
  // ends them).
  const RankShard shard = a.par.shard();
  const bool leader = shard.rank == 0;
  auto model = Model::load(a.model, /*load_mtp=*/a.mtp, /*verbose=*/leader, /*prefetch=*/true, shard);
  const EngineOptions eo = engine_options(a, model->config);
  Engine engine(*model, eo);
  if (!leader) {
    engine.follow();
    return;
  }
  engine.lead();
  std::optional<Tokenizer> tok;
  if (std::filesystem::exists(std::filesystem::path(a.model) / "tokenizer.json")) tok.emplace(Tokenizer::from_dir(a.model));
  else std::fprintf(stderr, "no tokenizer.json: serving token ids only (/v1/completions with id prompts)\n");
  std::fprintf(stderr, "%s\n", engine.capacity().describe().c_str());

  server::Metrics metrics;
  Scheduler sched(engine, tok ? &*tok : nullptr, scheduler_options(a, eo),
                  [&](const Request& r, const GenerateResult& res, const std::string&) { metrics.record(r, res); });
  const server::ModelInfo info = model_info(a, model->config, tok ? &*tok : nullptr);
  server::Server srv(sched, metrics, info, server_options(a, eo));
  const int port = srv.bind();
  std::fprintf(stderr, "serving '%s' on http://%s:%d (OpenAI API under /v1, chat page at /)\n", info.name.c_str(), a.host.c_str(), port);
  if (shard.ranks > 1)
    std::fprintf(stderr, "%d ranks (%s); rank 0 is pid %d: SIGTERM it to drain (signalling mpirun ends the job at once)\n", shard.ranks,
                 shard.describe().c_str(), int(::getpid()));
  std::fflush(stderr);
  serve_until_stopped(a, engine, sched, srv, sigs);
  std::fprintf(stderr, "stopped\n");
}

void setup_serve(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API (continuous batching)");
  cmd->add_option("--model", a->model, "Model directory (config.json, safetensors, tokenizer.json)")->required();
  cmd->add_option("--served-model-name", a->name, "The model id clients send (default: the directory's name)");
  cmd->add_option("--host", a->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", a->port, "Port to listen on; 0 picks a free one (printed)")->capture_default_str()->check(dsa::cli::int_in(0, 65535));
  cmd->add_option("--api-key", a->api_key, "Require 'Authorization: Bearer KEY' (not for /health)");
  cmd->add_option("--ctx", a->ctx, "Context per request: prompt + completion tokens")->capture_default_str()->check(dsa::cli::int_in(2, dsa::cli::kMaxTokens));
  cmd->add_option("--max-seqs", a->max_seqs, "Requests running together")->capture_default_str()->check(dsa::cli::int_in(1, 1024));
  cmd->add_option("--max-batch-tokens", a->max_batch_tokens, "Tokens per step (decodes + prefill chunks)")->capture_default_str()->check(dsa::cli::int_in(1, 1 << 16));
  cmd->add_option("--max-queue", a->max_queue, "Requests waiting; more get 429")->capture_default_str()->check(dsa::cli::int_in(1, 1 << 16));
  cmd->add_option("--max-tokens", a->max_tokens, "Largest max_tokens a request may ask (default: the context)")->check(dsa::cli::int_in(1, dsa::cli::kMaxTokens));
  cmd->add_option("--max-n", a->max_n, "Largest n (choices) per request")->capture_default_str()->check(dsa::cli::int_in(1, 128));
  cmd->add_option("--max-body", a->max_body, "Largest request body (K/M/G); larger get 413")->capture_default_str();
  cmd->add_option("--http-threads", a->http_threads, "HTTP worker threads (default: max-seqs + max-queue + 8)")->check(dsa::cli::int_in(1, 4096));
  cmd->add_option("--drain-timeout", a->drain_timeout, "Seconds running requests may take to finish after SIGINT/SIGTERM")
      ->capture_default_str()
      ->check(dsa::cli::finite_in(0, 86400));
  cmd->add_option("--kv-cache", a->kv_cache, "f32, bf16, fp8 or fp8-656")->capture_default_str();
  cmd->add_flag("--mtp", a->mtp, dsa::cli::kMtpHelp);
  a->cache.add(cmd);
  a->par.add(cmd);
  cmd->callback([a] { serve(*a); });
}

}  // namespace

DSA_COMMAND(14, setup_serve);
