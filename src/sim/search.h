#pragma once
// Layout search (`dsa plan --search`): which device count, parallel layout and batch serve
// a workload at the lowest cost per output token while meeting TTFT and TPOT targets. Every
// candidate is an ordinary plan (simulate()), so its row reads the same as `dsa plan` with
// its options.
#include <cstdint>
#include <string>
#include <vector>

#include "sim/simulate.h"

namespace dsa::sim {

struct SearchRequest {
  PlanRequest base;        // workload, dtypes, MTP, overlap; layout and batch are searched
  int devices = 0;         // > 0: only this device count
  int max_devices = 256;   // otherwise counts up to this
  double max_ttft_ms = 0;  // 0: no target
  double max_tpot_ms = 0;  // 0: no target
};

struct Candidate {
  PlanRequest req;  // the layout and batch found (as `dsa plan` options)
  PlanResult plan;
  double cost_per_million_output = 0;  // prefill and decode on the same devices
  std::string hardware;                // the profile's name
};

// Prefill and decode on their own devices (as DeepSeek's EP32 prefill and EP144 decode
// units): each pool at the layout that serves its phase best within its target, sized in
// proportion to the device-seconds a request spends in each phase.
struct Disaggregated {
  Candidate prefill;  // the most prompt tokens/s per device with TTFT within the target
  Candidate decode;   // the most output tokens/s per device with TPOT within the target
  double prefill_device_s = 0, decode_device_s = 0;  // per request: input / rate, output / rate
  double prefill_share = 0;  // prefill devices / all devices
  double output_tokens_per_s_per_device = 0;  // output / (prefill_device_s + decode_device_s)
  double cost_per_million_output = 0;
};

struct SearchResult {
  int layouts = 0;     // layouts tried
  int fitting = 0;     // whose weights, workspace and at least one sequence fit
  std::vector<Candidate> candidates;  // those meeting the targets, cheapest output first
  bool has_disaggregated = false;     // a prefill and a decode layout each met its target
  Disaggregated disaggregated;
};

// Device counts tried: powers of two inside a node, then whole nodes in powers of two
// (1, 2, 4, 8, 16, ... for 8-device nodes; 64 x 2^k past one node of 72).
std::vector<int> search_device_counts(const Hardware& hw, int max_devices);

// Tries every layout of those counts (tp a power of two inside a node that divides the heads,
// pp a power of two, dp the rest, experts over the whole stage with the fewest redundant
// replicas that make them divide), each at the largest batch that fits the cache (at most
// 128 sequences per device, as `dsa plan` picks) or, under a TPOT target, the largest that
// meets it.
SearchResult search_layouts(const SimModel& m, const Hardware& hw, const SearchRequest& s,
                            const KernelTable* kt = nullptr);

// The same over several hardware profiles (`--hardware h200,b200,...`), each at its own price
// and node size: the candidates of all of them, cheapest output first (by $ per million
// output tokens when every profile has a price, else by output tokens/s per device), and the
// cheapest of their prefill/decode pools.
SearchResult search_hardware(const SimModel& m, const std::vector<Hardware>& hws, const SearchRequest& s,
                             const KernelTable* kt = nullptr);

}  // namespace dsa::sim
