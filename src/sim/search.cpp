#include "sim/search.h"

#include <algorithm>

#include "core/error.h"

namespace dsa::sim {

std::vector<int> search_device_counts(const Hardware& hw, int max_devices) {
  const int node = std::max(1, hw.devices_per_node);
  // A profile without an inter-node link cannot span nodes (resolve_layout refuses it).
  const int limit = hw.inter_node_bandwidth_gbps > 0 ? max_devices : std::min(max_devices, node);
  std::vector<int> v;
  for (int c = 1; c < node && c <= limit; c *= 2) v.push_back(c);
  for (int64_t c = node; c <= limit; c *= 2) v.push_back(int(c));
  return v;
}

namespace {

// The plan of one layout at `batch` sequences (0: what fits).
PlanResult plan_at(const SimModel& m, const Hardware& hw, PlanRequest r, int64_t batch, const KernelTable* kt) {
  r.batch = batch;
  return simulate(m, hw, r, kt);
}

// Cheapest output first. On one profile that is the most output tokens/s per device (the
// price is common); across profiles it is $ per million output tokens when all have a price.
// Ties go to the smaller deployment.
void rank(std::vector<Candidate>& v, bool by_cost) {
  std::stable_sort(v.begin(), v.end(), [by_cost](const Candidate& a, const Candidate& b) {
    if (by_cost && a.cost_per_million_output != b.cost_per_million_output)
      return a.cost_per_million_output < b.cost_per_million_output;
    const double x = a.plan.e2e_output_tokens_per_s_per_device, y = b.plan.e2e_output_tokens_per_s_per_device;
    if (x != y) return x > y;
    return a.req.devices < b.req.devices;
  });
}

}  // namespace

namespace {

// The layout's request: tp x pp with data-parallel attention over the rest of the devices,
// experts over every device of a stage, and EPLB-style replicas, only as many as make the
// experts spread evenly.
PlanRequest layout_request(const PlanRequest& base, const ModelConfig& c, int devices, int tp, int pp) {
  PlanRequest r = base;
  r.devices = devices;
  r.tp = tp;
  r.pp = pp;
  r.dp = devices / (tp * pp);
  r.ep = tp * r.dp;
  r.redundant_experts = c.n_routed_experts > 0 ? (r.ep - c.n_routed_experts % r.ep) % r.ep : 0;
  return r;
}

// Under a TPOT target the target bounds the batch, not the plain plan's 128 per device
// (which would hide what a large-memory device can hold): the largest number of sequences
// per unit (dp group and micro-batch) that fits and meets the target, 0 if none. Both fail
// from some batch on (the workspace grows with the batch, the cache shrinks), so double
// from `start` until one fails, then bisect. p ends as the plan of the answer.
int64_t largest_batch_meeting_tpot(const SimModel& m, const Hardware& hw, const PlanRequest& r, int64_t unit, int64_t start,
                                   double max_tpot_ms, const KernelTable* kt, PlanResult& p) {
  const auto ok = [&](int64_t n) {
    PlanResult q = plan_at(m, hw, r, n * unit, kt);
    const bool pass = q.decode_fits && q.tpot_ms <= max_tpot_ms;
    if (pass) p = std::move(q);  // a batch that passes becomes lo: no final re-run
    return pass;
  };
  int64_t lo = 0, hi = start;
  while (ok(hi)) {
    lo = hi;
    hi *= 2;
  }
  while (hi - lo > 1) {  // lo meets it (0: none found yet), hi does not
    const int64_t mid = (lo + hi) / 2;
    (ok(mid) ? lo : hi) = mid;
  }
  return lo;
}

// Separate prefill and decode pools, each with its best layout, sized so that the prefill
// pool's device-seconds per request match the decode pool's.
Disaggregated disaggregate(const Candidate& prefill, const Candidate& decode, const PlanRequest& w) {
  Disaggregated d;
  d.prefill = prefill;
  d.decode = decode;
  d.prefill_device_s = double(w.input_len) / prefill.plan.prefill_tokens_per_s_per_device;
  d.decode_device_s = double(w.output_len) / decode.plan.decode_tokens_per_s_per_device;
  d.prefill_share = d.prefill_device_s / (d.prefill_device_s + d.decode_device_s);
  d.output_tokens_per_s_per_device = double(w.output_len) / (d.prefill_device_s + d.decode_device_s);
  d.cost_per_million_output = cost_per_million(decode.plan.price_per_hour, d.output_tokens_per_s_per_device);
  return d;
}

}  // namespace

SearchResult search_layouts(const SimModel& m, const Hardware& hw, const SearchRequest& s, const KernelTable* kt) {
  if (s.devices < 0) throw Error("--devices must be positive (or left out)");
  if (s.max_devices < 1) throw Error("--max-devices must be at least 1");
  if (!(s.max_ttft_ms >= 0) || !(s.max_tpot_ms >= 0)) throw Error("--max-ttft and --max-tpot must not be negative");
  const auto& c = m.cfg;
  const int node = std::max(1, hw.devices_per_node);
  const std::vector<int> counts = s.devices > 0 ? std::vector<int>{s.devices} : search_device_counts(hw, s.max_devices);
  SearchResult out;
  Candidate best_prefill, best_decode;
  bool have_prefill = false, have_decode = false;
  // Every layout of every count: tensor parallelism stays inside a node (its all-reduces are
  // per layer) and splits heads; pipeline stages split the layers.
  for (int devices : counts)
    for (int tp = 1; tp <= std::min(node, devices); tp *= 2) {
      if (devices % tp != 0 || c.num_attention_heads % tp != 0) continue;
      for (int pp = 1; pp <= std::min(devices / tp, c.num_hidden_layers); pp *= 2) {
        if ((devices / tp) % pp != 0) continue;
        PlanRequest r = layout_request(s.base, c, devices, tp, pp);
        ++out.layouts;
        PlanResult p = plan_at(m, hw, r, 0, kt);
        if (!p.memory.fits || !p.decode_fits) continue;
        ++out.fitting;
        // TTFT does not depend on the decode batch: one check per layout.
        const bool ttft_ok = !(s.max_ttft_ms > 0 && p.ttft_ms > s.max_ttft_ms);
        if (ttft_ok && (!have_prefill || p.prefill_tokens_per_s_per_device > best_prefill.plan.prefill_tokens_per_s_per_device)) {
          best_prefill = Candidate{r, p, 0, hw.name};
          best_prefill.req.batch = p.batch;
          have_prefill = true;
        }
        // Sequences per dp group and micro-batch: the batch moves in steps of dp*pp.
        const int64_t unit = int64_t(r.dp) * r.pp;
        int64_t seqs = std::max<int64_t>(1, p.batch / unit);
        if (s.max_tpot_ms > 0) seqs = largest_batch_meeting_tpot(m, hw, r, unit, seqs, s.max_tpot_ms, kt, p);
        else p = plan_at(m, hw, r, seqs * unit, kt);  // the explicit batch's plan, as its options give
        if (seqs == 0) continue;
        r.batch = seqs * unit;
        Candidate cand{r, p, cost_per_million(p.price_per_hour, p.e2e_output_tokens_per_s_per_device), hw.name};
        // A decode pool never prefills, so TTFT does not bind it.
        if (!have_decode || p.decode_tokens_per_s_per_device > best_decode.plan.decode_tokens_per_s_per_device) {
          best_decode = cand;
          have_decode = true;
        }
        if (ttft_ok) out.candidates.push_back(std::move(cand));
      }
    }
  if (have_prefill && have_decode) {
    out.disaggregated = disaggregate(best_prefill, best_decode, s.base);
    out.has_disaggregated = true;
  }
  rank(out.candidates, false);
  return out;
}

SearchResult search_hardware(const SimModel& m, const std::vector<Hardware>& hws, const SearchRequest& s,
                             const KernelTable* kt) {
  if (hws.empty()) throw Error("--search needs at least one hardware profile");
  if (hws.size() == 1) return search_layouts(m, hws[0], s, kt);
  bool priced = true;
  for (const auto& hw : hws) priced = priced && plan_price_per_hour(hw, s.base) > 0;
  // The pools of one profile against another's, by the same rule as the rows.
  const auto better = [priced](const Disaggregated& x, const Disaggregated& y) {
    return priced ? x.cost_per_million_output < y.cost_per_million_output
                  : x.output_tokens_per_s_per_device > y.output_tokens_per_s_per_device;
  };
  SearchResult out;
  for (const auto& hw : hws) {
    SearchResult r = search_layouts(m, hw, s, kt);
    out.layouts += r.layouts;
    out.fitting += r.fitting;
    for (auto& c : r.candidates) out.candidates.push_back(std::move(c));
    if (r.has_disaggregated && (!out.has_disaggregated || better(r.disaggregated, out.disaggregated))) {
      out.disaggregated = r.disaggregated;
      out.has_disaggregated = true;
    }
  }
  rank(out.candidates, priced);
  return out;
}

}  // namespace dsa::sim
