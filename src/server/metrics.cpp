#include "server/metrics.h"

#include <cstdio>

#include "server/protocol.h"

namespace dsa::server {

namespace {
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}
}  // namespace

void Histogram::observe(double v) {
  size_t k = 0;
  while (k < bounds_.size() && v > bounds_[k]) ++k;
  ++counts_[k];
  sum_ += v;
  ++n_;
}

void Histogram::write(std::string& out, const std::string& name, const std::string& help) const {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  int64_t cum = 0;
  for (size_t k = 0; k < bounds_.size(); ++k) {
    cum += counts_[k];
    out += name + "_bucket{le=\"" + num(bounds_[k]) + "\"} " + std::to_string(cum) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(n_) + "\n";
  out += name + "_sum " + num(sum_) + "\n" + name + "_count " + std::to_string(n_) + "\n";
}

// Bucket bounds in seconds, as vLLM's.
Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      tpot_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0}),
      e2e_({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0}),
      queue_({0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0}) {}

void Metrics::record(const Request& r, const GenerateResult& res) {
  std::lock_guard lk(mu_);
  ++finished_[finish_reason(res.reason)];
  if (r.scheduled != Clock::time_point{}) queue_.observe(secs(r.arrived, r.scheduled));
  if (r.first_token != Clock::time_point{}) ttft_.observe(secs(r.arrived, r.first_token));
  e2e_.observe(secs(r.arrived, r.finished));
  drafted_ += res.drafted;
  accepted_ += res.accepted;
  if (res.tokens.size() > 1 && r.first_token != Clock::time_point{})
    tpot_.observe(secs(r.first_token, r.finished) / double(res.tokens.size() - 1));
}

std::string Metrics::render(const SchedulerStats& s, const std::string& model) const {
  const std::string lab = "{model_name=\"" + model + "\"}";
  std::string out;
  auto gauge = [&](const char* name, const char* help, double v) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + lab + " " + num(v) + "\n";
  };
  auto counter = [&](const char* name, const char* help, double v) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n" + name + lab + " " + num(v) + "\n";
  };
  gauge("dsa:num_requests_running", "Requests in the running batch.", s.running);
  gauge("dsa:num_requests_waiting", "Requests waiting to be scheduled.", s.waiting);
  counter("dsa:prompt_tokens_total", "Prompt tokens of admitted requests.", double(s.prompt_tokens));
  counter("dsa:generation_tokens_total", "Generated tokens.", double(s.generation_tokens));
  counter("dsa:num_preemptions_total", "Requests preempted (their blocks given back, recomputed later).", double(s.preemptions));
  counter("dsa:engine_steps_total", "Forward steps run.", double(s.steps));
  gauge("dsa:cache_blocks_total", "KV cache blocks in the pool.", s.blocks);
  gauge("dsa:cache_blocks_used", "KV cache blocks held by sequences.", s.blocks - s.blocks_free);
  gauge("dsa:cache_blocks_free", "KV cache blocks that can be allocated (free or cached and unreferenced).", s.blocks_free);
  gauge("dsa:kv_cache_usage_perc", "Fraction of the KV cache blocks held by sequences (0 to 1).",
        s.blocks > 0 ? double(s.blocks - s.blocks_free) / s.blocks : 0.0);
  counter("dsa:prefix_cache_queries_total", "Full prompt blocks looked up in the prefix cache.", double(s.prefix.queries));
  counter("dsa:prefix_cache_hits_total", "Full prompt blocks found in the prefix cache.", double(s.prefix.hits));
  std::lock_guard lk(mu_);
  counter("dsa:spec_decode_num_draft_tokens_total", "Speculative draft tokens verified.", double(drafted_));
  counter("dsa:spec_decode_num_accepted_tokens_total", "Speculative draft tokens accepted.", double(accepted_));
  out += "# HELP dsa:request_success_total Finished requests by finish reason.\n# TYPE dsa:request_success_total counter\n";
  for (const char* r : {"stop", "length", "abort"}) {
    const auto it = finished_.find(r);
    out += "dsa:request_success_total{model_name=\"" + model + "\",finished_reason=\"" + r + "\"} " +
           std::to_string(it == finished_.end() ? 0 : it->second) + "\n";
  }
  ttft_.write(out, "dsa:time_to_first_token_seconds", "Time from arrival to the first generated token.");
  tpot_.write(out, "dsa:time_per_output_token_seconds", "Mean time per generated token after the first, per request.");
  e2e_.write(out, "dsa:e2e_request_latency_seconds", "Time from arrival to the end of the request.");
  queue_.write(out, "dsa:request_queue_time_seconds", "Time from arrival to admission into the running batch.");
  return out;
}

}  // namespace dsa::server
