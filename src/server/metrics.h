#pragma once
// Prometheus metrics in the text exposition format, named as vLLM names its own (with a
// "dsa:" prefix instead of "vllm:"), so dashboards built for vLLM need only the prefix
// changed: request counts, tokens, cache blocks, prefix-cache lookups, preemptions,
// speculative drafts, and latency histograms.
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/scheduler.h"

namespace dsa::server {

class Histogram {
public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  void write(std::string& out, const std::string& name, const std::string& help) const;

private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;
  double sum_ = 0;
  int64_t n_ = 0;
};

class Metrics {
public:
  Metrics();
  // A request that ended (called on the engine thread).
  void record(const Request& r, const GenerateResult& res);
  std::string render(const SchedulerStats& s, const std::string& model) const;

private:
  mutable std::mutex mu_;
  std::map<std::string, int64_t> finished_;  // by finish reason
  int64_t drafted_ = 0, accepted_ = 0;
  Histogram ttft_, tpot_, e2e_, queue_;
};

}  // namespace dsa::server
