#pragma once
// Costs an operator plan on a hardware profile and turns it into serving figures: TTFT,
// TPOT, tokens/s per device, cost per million tokens, and sweeps over context and batch.
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "sim/cost.h"
#include "sim/hardware.h"
#include "sim/memory.h"

namespace dsa::sim {

// Measured latencies (CSV "op,shape,latency_us", one invocation) that override the roofline
// estimate of an operator whose name and shape match exactly.
struct KernelTable {
  std::map<std::pair<std::string, std::string>, double> latency_us;
  // Rows some lookup matched: a row that never matches (a misspelt op or shape) is
  // reported instead of being ignored without a word.
  mutable std::set<std::pair<std::string, std::string>> matched;
  const double* find(const std::string& op, const std::string& shape) const;
};
KernelTable kernel_table_from_csv(const std::string& text, const std::string& where);
KernelTable load_kernel_table(const std::string& path);

struct OpTime {
  Op op;
  double compute_us = 0, memory_us = 0, comm_us = 0;
  double time_us = 0;
  std::string bound;  // compute | memory | communication | measured
};

struct PhaseResult {
  Step step;
  std::vector<OpTime> ops;
  double compute_us = 0;   // sum over non-communication ops
  double ep_comm_us = 0;   // expert-parallel all-to-all
  double other_comm_us = 0;  // tensor-parallel all-reduce, pipeline sends
  double step_us = 0;      // one pipeline stage's step
  int micro_batches = 1;   // 2: the step ran as two overlapped micro-batches (ops sum both)
  int steps = 1;           // prefill in chunks: the steps it took (ops and times sum them)
};

// Time of one op: max(compute at its efficiency, memory at its efficiency) + launch overhead,
// or link time + latency for communication, unless the kernel table covers it.
OpTime time_op(const Op& op, const Hardware& hw, const KernelTable* kt);
// Step time. One batch: compute + all-to-all + TP/PP communication. With `overlap`, the step
// may instead run as two micro-batches (half the sequences each, or a lone prompt's two
// halves) whose MoE-layer stages interleave, each stage of one beside a stage of the other
// (see cost_step in simulate.cpp), taken when that is faster than one batch.
PhaseResult cost_step(const SimModel& m, const Hardware& hw, const Layout& l, const Options& o, const Step& s,
                      const KernelTable* kt, bool overlap);
// One pipeline round of a phase's step over pp stages with `micro_batches` (at most pp) in
// flight: the longer of one micro-batch's pass through every stage (its layers once, the
// embedding, head and MTP layer once) and micro_batches steps of the slowest (last) stage.
double pipeline_round_us(const PhaseResult& r, int pp, int64_t micro_batches);

struct PlanRequest {
  int devices = 0;           // 0: tp*dp*pp, or the node size when nothing is given
  int tp = 1, dp = 0, ep = 0, pp = 1;  // dp 0: devices/(tp*pp); ep 0: tp*dp (all of a stage)
  bool replicated_attention = false;   // Layout::rep = devices/(tp*pp), dp 1 (the engine's --ep without --dp)
  int redundant_experts = 0;  // extra expert replicas (EPLB), spread with the experts
  int64_t batch = 0;         // concurrent sequences in the whole deployment; 0: auto
  int64_t input_len = 4096, output_len = 1024;
  int64_t context = -1;      // decode depth; -1: input_len + output_len/2
  int64_t prefill_batch = 1; // sequences per data-parallel group in one prefill step
  // Tokens of each prompt per prefill step (chunked prefill, as vLLM and SGLang run long
  // prompts; SGLang's default size): the activation workspace holds one chunk, TTFT sums
  // the chunks, each attending to the ones before. 0: the whole prompt in one step.
  int64_t prefill_chunk = 8192;
  // Fraction of each prompt found in a prefix cache (DeepSeek's on-disk KV cache): prefill
  // computes only the rest, attending to the cached part, and counts every prompt token in
  // its throughput, as DeepSeek's published figures do.
  double cache_hit = 0;
  Options opt;
  double acceptance = 0.8;   // per-draft-token MTP acceptance rate
  double price_per_hour = -1;  // < 0: the profile's
  bool overlap = true;
};

struct PlanResult {
  Layout layout;
  int64_t batch = 0;
  bool batch_auto = false;
  int64_t context = 0;
  double tokens_per_step = 1;  // 1 + sum of acceptance^i over draft tokens
  PhaseResult prefill, decode;
  MemoryPlan memory;
  double ttft_ms = 0, tpot_ms = 0;
  double prefill_tokens_per_s_per_device = 0;           // prompt tokens, cache hits included
  double prefill_computed_tokens_per_s_per_device = 0;  // prompt tokens prefill computed
  double decode_tokens_per_s_per_device = 0;
  double e2e_output_tokens_per_s_per_device = 0;  // prefill and decode sharing the devices
  double price_per_hour = 0;
  double prefill_cost_per_m = 0, decode_cost_per_m = 0;  // $ per million tokens
  // Tokens a device caches during the decode step (a dp group's sequences at the decode
  // depth plus the step's new tokens) and whether its cache holds them: an explicit batch
  // beyond the cache is costed as asked but reported as not fitting.
  int64_t decode_cached_tokens_per_device = 0;
  bool decode_fits = false;
};

Layout resolve_layout(const PlanRequest& r, const Hardware& hw);
// $ per device-hour a plan charges: --price when given, else the profile's assumption.
double plan_price_per_hour(const Hardware& hw, const PlanRequest& r);
// $ per million tokens at `tokens_per_s` per device (0 when nothing is produced).
double cost_per_million(double price_per_hour, double tokens_per_s);
PlanResult simulate(const SimModel& m, const Hardware& hw, const PlanRequest& r, const KernelTable* kt = nullptr);

// $ per million tokens at one token position: prefill (a chunk of `chunk` tokens ending at
// `position`) and decode (one step at depth `position` with the plan's batch).
struct PositionCost {
  int64_t position = 0;
  double prefill_cost_per_m = 0, decode_cost_per_m = 0;
  double tpot_ms = 0, decode_tokens_per_s_per_device = 0;
  bool fits = false;  // the cache holds the plan's batch at this position
};
PositionCost cost_at_position(const SimModel& m, const Hardware& hw, const PlanRequest& r, const PlanResult& base,
                              int64_t position, const KernelTable* kt = nullptr, int64_t chunk = 2048);

}  // namespace dsa::sim
