#include "sim/report.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace dsa::sim {
namespace {

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  // Sized first: names from a config or a hardware profile can be of any length.
  va_list ap, again;
  va_start(ap, f);
  va_copy(again, ap);
  const int n = std::vsnprintf(nullptr, 0, f, ap);
  va_end(ap);
  std::string out(size_t(std::max(n, 0)), '\0');
  std::vsnprintf(out.data(), out.size() + 1, f, again);
  va_end(again);
  return out;
}

const char* weight_name(WeightDtype w) { return w == WeightDtype::FP8 ? "fp8" : w == WeightDtype::BF16 ? "bf16" : "nvfp4"; }
const char* cache_name(CacheDtype c) { return c == CacheDtype::FP8 ? "fp8" : "bf16"; }
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string grouped(int64_t v) {  // 1234567 -> 1,234,567
  std::string s = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return (v < 0 ? "-" : "") + out;
}

// How the layout's experts meet their tokens: one all-reduce of their outputs when every
// device holds every token (replicated attention, or this engine's tensor-parallel attention),
// else an exchange (all-to-all, or this engine's choice of all-gather or all-to-all).
const char* expert_comm_name(const Layout& l, const Hardware& hw) {
  if (l.rep > 1 || (hw.engine_collectives && l.dp == 1)) return "all-reduce";
  return hw.engine_collectives ? "exchange" : "all-to-all";
}

void phase_table(std::string& o, const PhaseResult& r, const char* expert_comm) {
  o += fmt("  %-28s %7s %11s %11s %11s %6s  %s\n", "operator", "count", "GFLOP", "MB", "time us", "share", "bound");
  const double total = std::max(r.compute_us + r.ep_comm_us + r.other_comm_us, 1e-9);
  for (const auto& t : r.ops)
    o += fmt("  %-28s %7.1f %11.3f %11.3f %11.1f %5.1f%%  %s\n", t.op.name.c_str(), t.op.count, t.op.flops / 1e9,
             (t.op.bytes + t.op.comm_intra + t.op.comm_inter) / 1e6, t.time_us, 100.0 * t.time_us / total, t.bound.c_str());
  double flops = 0, bytes = 0;
  for (const auto& t : r.ops) {
    flops += t.op.flops;
    bytes += t.op.bytes + t.op.comm_intra + t.op.comm_inter;
  }
  o += fmt("  %-28s %7s %11.1f %11.1f %11.1f\n", "total", "", flops / 1e9, bytes / 1e6, r.compute_us + r.ep_comm_us + r.other_comm_us);
  o += fmt("  step: compute+memory %.1f us, expert %s %.1f us%s, other communication %.1f us -> %.1f us\n",
           r.compute_us, expert_comm, r.ep_comm_us,
           r.micro_batches > 1 ? " (two micro-batches: each hides the other's all-to-all; rows sum both)" : "",
           r.other_comm_us, r.step_us);
}

// The header: model, hardware, layout, dtypes and workload.
void header_text(std::string& o, const PlanContext& c, const PlanResult& p) {
  const auto& m = *c.model;
  const auto& hw = *c.hw;
  const auto& r = *c.req;
  const auto& l = p.layout;
  o += fmt("dsa plan: %s on %d x %s (%s)\n", m.name.c_str(), l.devices(), hw.name.c_str(), hw.description.c_str());
  const std::string groups = l.rep > 1 ? fmt("%d attention replicas", l.rep) : fmt("dp %d", l.dp);
  o += fmt("layout    tp %d x %s x pp %d = %d devices; experts ep %d (%d routed experts per device", l.tp, groups.c_str(), l.pp,
           l.devices(), l.ep, (m.cfg.n_routed_experts + l.redundant_experts) / std::max(1, l.ep));
  if (l.redundant_experts > 0) o += fmt(": %d experts + %d redundant replicas", m.cfg.n_routed_experts, l.redundant_experts);
  o += ")\n";
  o += fmt("dtypes    weights %s, kv cache %s, attention %s, mtp %d", weight_name(r.opt.weight), cache_name(r.opt.cache),
           m.has_indexer ? "sparse (DSA, top-k)" : "dense MLA", r.opt.mtp);
  if (r.opt.mtp > 0) o += fmt(" (acceptance %.2f -> %.2f tokens per step)", r.acceptance, p.tokens_per_step);
  o += "\n";
  o += fmt("workload  batch %s%s, input %s, output %s, decode depth %s\n\n", grouped(p.batch).c_str(),
           p.batch_auto ? " (auto: what fits, at most 128 per device)" : "", grouped(r.input_len).c_str(),
           grouped(r.output_len).c_str(), grouped(p.context).c_str());
}

void memory_text(std::string& o, const PlanContext& c, const PlanResult& p) {
  const auto& r = *c.req;
  const auto& mem = p.memory;
  const auto& w = mem.weights;
  o += "memory per device\n";
  o += fmt("  capacity %.1f GiB, usable %.1f GiB, reserve %.1f GiB\n", mem.capacity_bytes / kGiB, mem.usable_bytes / kGiB,
           mem.reserve_bytes / kGiB);
  o += fmt("  weights %.2f GiB (attention %.2f, indexer %.2f, dense mlp %.2f, routed experts %.2f, shared %.2f, "
           "embed+head %.2f, mtp %.2f, other %.2f)\n",
           w.total() / kGiB, w.attention / kGiB, w.indexer / kGiB, w.dense_mlp / kGiB, w.routed_experts / kGiB,
           w.shared_experts / kGiB, w.embed_head / kGiB, w.mtp / kGiB, (w.router + w.norms) / kGiB);
  o += fmt("  activation workspace %.2f GiB; kv cache budget %.2f GiB%s\n", mem.workspace_bytes / kGiB,
           mem.cache_budget_bytes / kGiB, mem.fits ? "" : "  ** DOES NOT FIT: add devices or use more parallelism **");
  o += fmt("  cache %s B per token (%s B on each device); max %s cached tokens per device = %s sequences of %s tokens "
           "in the deployment\n",
           grouped(int64_t(mem.cache_bytes_per_token)).c_str(), grouped(int64_t(mem.cache_bytes_per_token_per_device)).c_str(),
           grouped(mem.max_cached_tokens_per_device).c_str(),
           grouped(mem.max_cached_tokens_per_device / (r.input_len + r.output_len) * p.layout.dp).c_str(),
           grouped(r.input_len + r.output_len).c_str());
  o += fmt("  decode step caches %s tokens per device (%s sequences per dp group at depth %s + %d)%s\n\n",
           grouped(p.decode_cached_tokens_per_device).c_str(), grouped(p.decode.step.seqs * p.layout.pp).c_str(),
           grouped(p.context).c_str(), 1 + r.opt.mtp,
           p.decode_fits ? "" : "  ** DOES NOT FIT the cache: lower --batch or --context, or add devices **");
}

// The per-operator tables of both phases.
void ops_text(std::string& o, const PlanContext& c, const PlanResult& p) {
  const auto& r = *c.req;
  o += fmt("prefill: %s sequence(s) x %s tokens per dp group%s%s, one device\n", grouped(p.prefill.step.seqs).c_str(),
           grouped(p.prefill.step.new_tokens).c_str(),
           p.prefill.step.context > 0 ? fmt(" after %s cached", grouped(p.prefill.step.context).c_str()).c_str() : "",
           p.prefill.steps > 1 ? fmt(" in %d chunks of up to %s (rows sum them)", p.prefill.steps, grouped(r.prefill_chunk).c_str()).c_str()
                               : "");
  phase_table(o, p.prefill, expert_comm_name(p.layout, *c.hw));
  o += fmt("\ndecode: %s sequences x %s token(s) at depth %s per dp group, one device\n", grouped(p.decode.step.seqs).c_str(),
           grouped(p.decode.step.new_tokens).c_str(), grouped(p.decode.step.context).c_str());
  phase_table(o, p.decode, expert_comm_name(p.layout, *c.hw));
  o += "\n";
}

void results_text(std::string& o, const PlanContext& c, const PlanResult& p) {
  const auto& r = *c.req;
  o += "results\n";
  o += fmt("  TTFT %.2f ms   TPOT %.2f ms (%.1f tokens/s per sequence)\n", p.ttft_ms, p.tpot_ms, 1e3 / p.tpot_ms);
  o += fmt("  prefill %s tokens/s per device, decode %s tokens/s per device\n",
           grouped(int64_t(std::lround(p.prefill_tokens_per_s_per_device))).c_str(),
           grouped(int64_t(std::lround(p.decode_tokens_per_s_per_device))).c_str());
  if (r.cache_hit > 0)
    o += fmt("  prefill computes %s of those tokens/s per device (%.1f%% of each prompt is a prefix-cache hit)\n",
             grouped(int64_t(std::lround(p.prefill_computed_tokens_per_s_per_device))).c_str(), r.cache_hit * 100);
  o += fmt("  prefill and decode on the same devices: %s output tokens/s per device\n",
           grouped(int64_t(std::lround(p.e2e_output_tokens_per_s_per_device))).c_str());
  if (p.price_per_hour > 0)
    o += fmt("  at $%.2f per device-hour: $%.4f per million prompt tokens, $%.4f per million output tokens\n",
             p.price_per_hour, p.prefill_cost_per_m, p.decode_cost_per_m);
}

void sweeps_text(std::string& o, const std::vector<SweepRow>& sweeps) {
  for (const char* axis : {"context", "batch"}) {
    bool header = false;
    for (const auto& s : sweeps) {
      if (s.axis != axis) continue;
      if (!header) {
        o += fmt("\nsweep over %s\n  %10s %10s %16s %14s %14s\n", axis, axis, "TPOT ms", "decode tok/s/dev",
                 "decode $/M", "prefill $/M");
        header = true;
      }
      o += fmt("  %10s %10.2f %16.0f %14.4f %14.4f%s\n", grouped(s.value).c_str(), s.tpot_ms,
               s.decode_tokens_per_s_per_device, s.decode_cost_per_m, s.prefill_cost_per_m,
               s.fits ? "" : "  (cache does not fit)");
    }
  }
}

}  // namespace

std::string format_text(const PlanContext& c, const PlanResult& p, const std::vector<SweepRow>& sweeps, bool show_ops) {
  std::string o;
  header_text(o, c, p);
  memory_text(o, c, p);
  if (show_ops) ops_text(o, c, p);
  results_text(o, c, p);
  sweeps_text(o, sweeps);
  return o;
}

std::string format_json(const PlanContext& c, const PlanResult& p, const std::vector<SweepRow>& sweeps) {
  using nlohmann::json;
  const auto& r = *c.req;
  const auto& mem = p.memory;
  json ops = json::array();
  for (const PhaseResult* ph : {&p.prefill, &p.decode})
    for (const auto& t : ph->ops)
      ops.push_back({{"name", t.op.name}, {"phase", phase_name(t.op.phase)}, {"flops", t.op.flops},
                     {"bytes", t.op.bytes}, {"comm_bytes", t.op.comm_intra + t.op.comm_inter}, {"time_us", t.time_us},
                     {"bound", t.bound}, {"count", t.op.count}, {"class", op_class_name(t.op.cls)},
                     {"shape", t.op.shape}, {"compute_us", t.compute_us}, {"memory_us", t.memory_us}});
  json sw = json::array();
  for (const auto& s : sweeps)
    sw.push_back({{"axis", s.axis}, {"value", s.value}, {"tpot_ms", s.tpot_ms},
                  {"decode_tokens_per_s_per_device", s.decode_tokens_per_s_per_device},
                  {"decode_cost_per_million_tokens", s.decode_cost_per_m},
                  {"prefill_cost_per_million_tokens", s.prefill_cost_per_m}, {"fits", s.fits}});
  const auto& w = mem.weights;
  json j = {
      {"model", c.model->name},
      {"hardware", c.hw->name},
      {"hardware_description", c.hw->description},
      {"has_indexer", c.model->has_indexer},
      {"devices", p.layout.devices()},
      {"layout",
       {{"tp", p.layout.tp}, {"dp", p.layout.dp}, {"attention_replicas", p.layout.rep}, {"ep", p.layout.ep}, {"pp", p.layout.pp},
        {"redundant_experts", p.layout.redundant_experts}}},
      {"weight_dtype", weight_name(r.opt.weight)},
      {"kv_cache", cache_name(r.opt.cache)},
      {"mtp", r.opt.mtp},
      {"acceptance", r.acceptance},
      {"tokens_per_step", p.tokens_per_step},
      {"batch", p.batch},
      {"batch_auto", p.batch_auto},
      {"input_len", r.input_len},
      {"output_len", r.output_len},
      {"context", p.context},
      {"prefill_batch", r.prefill_batch},
      {"prefill_chunk", r.prefill_chunk},
      {"prefill_steps", p.prefill.steps},
      {"ttft_ms", p.ttft_ms},
      {"tpot_ms", p.tpot_ms},
      {"prefill_tokens_per_s_per_device", p.prefill_tokens_per_s_per_device},
      {"prefill_computed_tokens_per_s_per_device", p.prefill_computed_tokens_per_s_per_device},
      {"cache_hit", r.cache_hit},
      {"decode_tokens_per_s_per_device", p.decode_tokens_per_s_per_device},
      {"e2e_output_tokens_per_s_per_device", p.e2e_output_tokens_per_s_per_device},
      {"prefill_step_us", p.prefill.step_us},
      {"decode_step_us", p.decode.step_us},
      {"prefill_micro_batches", p.prefill.micro_batches},
      {"decode_micro_batches", p.decode.micro_batches},
      {"price_per_device_hour", p.price_per_hour},
      {"prefill_cost_per_million_tokens", p.prefill_cost_per_m},
      {"decode_cost_per_million_tokens", p.decode_cost_per_m},
      {"cache_bytes_per_token", mem.cache_bytes_per_token},
      {"cache_bytes_per_token_per_device", mem.cache_bytes_per_token_per_device},
      {"max_cached_tokens_per_device", mem.max_cached_tokens_per_device},
      {"decode_cached_tokens_per_device", p.decode_cached_tokens_per_device},
      {"decode_fits", p.decode_fits},
      {"memory",
       {{"capacity_bytes", mem.capacity_bytes}, {"usable_bytes", mem.usable_bytes}, {"reserve_bytes", mem.reserve_bytes},
        {"weight_bytes", w.total()}, {"workspace_bytes", mem.workspace_bytes},
        {"cache_budget_bytes", mem.cache_budget_bytes}, {"fits", mem.fits},
        {"weights", {{"attention", w.attention}, {"indexer", w.indexer}, {"dense_mlp", w.dense_mlp},
                     {"routed_experts", w.routed_experts}, {"shared_experts", w.shared_experts}, {"router", w.router},
                     {"embed_head", w.embed_head}, {"norms", w.norms}, {"mtp", w.mtp}}}}},
      {"ops", ops},
      {"sweeps", sw},
  };
  return j.dump(2);
}

namespace {

std::string targets(const SearchRequest& s) {
  std::string t;
  if (s.max_ttft_ms > 0) t += fmt("TTFT <= %g ms", s.max_ttft_ms);
  if (s.max_tpot_ms > 0) t += fmt("%sTPOT <= %g ms", t.empty() ? "" : ", ", s.max_tpot_ms);
  return t.empty() ? "no latency targets" : t;
}

// The `dsa plan` options that reproduce a candidate (workload options as the user gave them).
std::string plan_options(const Candidate& k, bool with_hardware) {
  const auto& r = k.req;
  std::string o = with_hardware ? "--hardware " + k.hardware + " " : "";
  o += fmt("--devices %d --tp %d --pp %d", r.devices, r.tp, r.pp);
  if (r.redundant_experts > 0) o += fmt(" --redundant-experts %d", r.redundant_experts);
  return o + fmt(" --batch %lld", (long long)r.batch);
}

// A cost cell: "-" when the profile has no price (the local CPU) rather than $0.0000.
std::string dollars(double price_per_hour, double cost) { return price_per_hour > 0 ? fmt("%.4f", cost) : "-"; }

nlohmann::json candidate_json(const Candidate& k, bool with_hardware) {
  const auto& l = k.plan.layout;
  return {{"hardware", k.hardware}, {"devices", l.devices()}, {"tp", l.tp}, {"dp", l.dp}, {"ep", l.ep}, {"pp", l.pp},
          {"redundant_experts", l.redundant_experts}, {"batch", k.plan.batch}, {"ttft_ms", k.plan.ttft_ms},
          {"tpot_ms", k.plan.tpot_ms}, {"e2e_output_tokens_per_s_per_device", k.plan.e2e_output_tokens_per_s_per_device},
          {"decode_tokens_per_s_per_device", k.plan.decode_tokens_per_s_per_device},
          {"prefill_tokens_per_s_per_device", k.plan.prefill_tokens_per_s_per_device},
          {"cost_per_million_output_tokens", k.cost_per_million_output},
          {"decode_cached_tokens_per_device", k.plan.decode_cached_tokens_per_device},
          {"max_cached_tokens_per_device", k.plan.memory.max_cached_tokens_per_device},
          {"plan_options", plan_options(k, with_hardware)}};
}

std::string disaggregated_text(const SearchResult& r, bool multi) {
  if (!r.has_disaggregated) return "";
  const Disaggregated& d = r.disaggregated;
  auto pool = [](const char* what, const Candidate& k, const std::string& figures) {
    const Layout& l = k.plan.layout;
    return fmt("  %-8s %d devices (tp %d x dp %d x pp %d, ep %d%s): %s\n", what, l.devices(), l.tp, l.dp, l.pp, l.ep,
               l.redundant_experts > 0 ? fmt(" + %d redundant", l.redundant_experts).c_str() : "", figures.c_str());
  };
  std::string o = fmt("\nPrefill and decode on their own devices%s, each pool at its best layout within its target:\n",
                      multi ? fmt(" (%s, the cheapest profile for them)", d.decode.hardware.c_str()).c_str() : "");
  o += pool("prefill", d.prefill,
            fmt("%s prompt tokens/s per device, TTFT %.1f ms",
                grouped(std::llround(d.prefill.plan.prefill_tokens_per_s_per_device)).c_str(), d.prefill.plan.ttft_ms));
  o += pool("decode", d.decode,
            fmt("batch %s, TPOT %.2f ms, %s output tokens/s per device", grouped(d.decode.plan.batch).c_str(),
                d.decode.plan.tpot_ms, grouped(std::llround(d.decode.plan.decode_tokens_per_s_per_device)).c_str()));
  o += fmt("  a request takes %.3f prefill and %.3f decode device-seconds: %.1f%% of the devices prefill\n"
           "  (%.2f decode devices per prefill device); %s output tokens/s per device%s\n",
           d.prefill_device_s, d.decode_device_s, 100 * d.prefill_share, d.decode_device_s / d.prefill_device_s,
           grouped(std::llround(d.output_tokens_per_s_per_device)).c_str(),
           d.decode.plan.price_per_hour > 0 ? fmt(", $%.4f per million output tokens", d.cost_per_million_output).c_str() : "");
  return o;
}

}  // namespace

std::string format_search_text(const PlanContext& c, const std::vector<Hardware>& hws, const SearchRequest& s,
                               const SearchResult& r, int top) {
  const auto& req = *c.req;
  const bool multi = hws.size() > 1;
  std::string on;
  for (const auto& hw : hws) on += (on.empty() ? "" : ", ") + hw.name;
  if (!multi && !hws.empty()) on += " (" + hws[0].description + ")";
  std::string o = fmt("dsa plan --search: %s on %s, input %s, output %s, weights %s, mtp %d\n", c.model->name.c_str(),
                      on.c_str(), grouped(req.input_len).c_str(), grouped(req.output_len).c_str(),
                      weight_name(req.opt.weight), req.opt.mtp);
  o += fmt("%d layouts tried (%s), %d fit in memory", r.layouts,
           s.devices > 0 ? fmt("%d devices", s.devices).c_str() : fmt("up to %d devices", s.max_devices).c_str(), r.fitting);
  o += s.max_ttft_ms > 0 || s.max_tpot_ms > 0 ? fmt(", %zu of them meet %s", r.candidates.size(), targets(s).c_str())
                                              : std::string(" (no latency targets)");
  o += "; cheapest output first\n\n";
  if (r.candidates.empty()) {
    o += r.fitting == 0 ? "No layout holds the weights: allow more devices (--max-devices) or smaller weights (--weight-dtype).\n"
                        : "No layout meets the targets with prefill and decode on the same devices: relax them or allow more devices "
                          "(--max-devices).\n";
    return o + disaggregated_text(r, multi);
  }
  const std::string hw_col = multi ? fmt(" %-11s", "hardware") : "";
  o += fmt("  %4s%s %7s %3s %4s %3s %4s %4s %8s %9s %8s %12s %14s %10s\n", "rank", hw_col.c_str(), "devices", "tp", "dp",
           "pp", "ep", "+red", "batch", "TTFT ms", "TPOT ms", "out tok/s/d", "decode tok/s/d", "$/M out");
  auto row = [&](size_t i) {
    const auto& k = r.candidates[i];
    const auto& l = k.plan.layout;
    o += fmt("  %4zu%s %7d %3d %4d %3d %4d %4d %8s %9.1f %8.2f %12.0f %14.0f %10s\n", i + 1,
             multi ? fmt(" %-11s", k.hardware.c_str()).c_str() : "", l.devices(), l.tp, l.dp, l.pp, l.ep,
             l.redundant_experts, grouped(k.plan.batch).c_str(), k.plan.ttft_ms, k.plan.tpot_ms,
             k.plan.e2e_output_tokens_per_s_per_device, k.plan.decode_tokens_per_s_per_device,
             dollars(k.plan.price_per_hour, k.cost_per_million_output).c_str());
  };
  const size_t n = std::min<size_t>(size_t(top), r.candidates.size());
  for (size_t i = 0; i < n; ++i) row(i);
  if (r.candidates.size() > n) o += fmt("  ... %zu more (--top N)\n", r.candidates.size() - n);
  if (multi) {  // one profile's rows can fill the table: the best row of every other one too
    std::vector<std::string> seen;
    std::vector<size_t> more;
    for (size_t i = 0; i < r.candidates.size(); ++i) {
      const std::string& h = r.candidates[i].hardware;
      if (std::find(seen.begin(), seen.end(), h) != seen.end()) continue;
      seen.push_back(h);
      if (i >= n) more.push_back(i);
    }
    if (!more.empty()) o += "  the best of each other profile:\n";
    for (size_t i : more) row(i);
  }
  const double price = r.candidates[0].plan.price_per_hour;
  o += fmt("\nout tok/s/d: output tokens/s per device with prefill and decode on the same devices; %s.\n"
           "The first in full: dsa plan <same options> %s\n",
           multi       ? "$/M out at each profile's price per device-hour (--price sets one for all)"
           : price > 0 ? fmt("$/M out at $%.2f per device-hour", price).c_str()
                       : "no price per device-hour (--price)",
           plan_options(r.candidates[0], multi).c_str());
  return o + disaggregated_text(r, multi);
}

std::string format_search_json(const PlanContext& c, const std::vector<Hardware>& hws, const SearchRequest& s,
                               const SearchResult& r, int top) {
  using nlohmann::json;
  const bool multi = hws.size() > 1;
  json cands = json::array(), names = json::array();
  for (const auto& hw : hws) names.push_back(hw.name);
  const int n = std::min<int>(top, int(r.candidates.size()));
  for (int i = 0; i < n; ++i) cands.push_back(candidate_json(r.candidates[size_t(i)], multi));
  json j = {{"model", c.model->name},
            {"hardware", names},
            {"input_len", c.req->input_len},
            {"output_len", c.req->output_len},
            {"weight_dtype", weight_name(c.req->opt.weight)},
            {"mtp", c.req->opt.mtp},
            {"devices", s.devices},
            {"max_devices", s.max_devices},
            {"max_ttft_ms", s.max_ttft_ms},
            {"max_tpot_ms", s.max_tpot_ms},
            {"layouts_tried", r.layouts},
            {"layouts_fitting", r.fitting},
            {"layouts_meeting_targets", r.candidates.size()},
            {"candidates", cands}};
  if (r.has_disaggregated) {
    const Disaggregated& d = r.disaggregated;
    j["disaggregated"] = {{"prefill", candidate_json(d.prefill, multi)},
                          {"decode", candidate_json(d.decode, multi)},
                          {"prefill_device_s_per_request", d.prefill_device_s},
                          {"decode_device_s_per_request", d.decode_device_s},
                          {"prefill_device_share", d.prefill_share},
                          {"output_tokens_per_s_per_device", d.output_tokens_per_s_per_device},
                          {"cost_per_million_output_tokens", d.cost_per_million_output}};
  }
  return j.dump(2);
}

namespace {

// The x axis's tick positions over [x0, x1].
std::vector<double> x_ticks(double x0, double x1, bool log_x) {
  std::vector<double> xt;
  if (log_x) {
    for (double x = std::pow(2.0, std::floor(std::log2(x0))); x <= x1 * 1.0001; x *= 2)
      if (x >= x0 * 0.9999) xt.push_back(x);
    while (xt.size() > 10) {
      std::vector<double> v;
      for (size_t i = 0; i < xt.size(); i += 2) v.push_back(xt[i]);
      xt = v;
    }
  } else {
    // About eight ticks at round values: token positions (ranges from 1K up) step by powers
    // of two, so they read 16K, 32K, ...; anything else by 1, 2 or 5 x 10^k. The left end is
    // labelled too when the first round tick is far from it.
    const double rx = (x1 - x0) / 8;
    double sx;
    if (x1 - x0 >= 1024) {
      sx = std::exp2(std::ceil(std::log2(rx)));
    } else {
      const double mx = std::pow(10.0, std::floor(std::log10(rx)));
      sx = rx / mx <= 1 ? mx : rx / mx <= 2 ? 2 * mx : rx / mx <= 5 ? 5 * mx : 10 * mx;
    }
    for (double x = std::ceil(x0 / sx) * sx; x <= x1 * (1 + 1e-9); x += sx) xt.push_back(x);
    if (xt.empty() || xt.front() - x0 > sx / 2) xt.insert(xt.begin(), x0);
  }
  return xt;
}

}  // namespace

std::string svg_line_plot(const std::string& title, const std::string& xlabel, const std::string& ylabel,
                          const std::vector<Series>& series, bool log_x) {
  const double W = 760, H = 460, L = 80, R = 30, T = 50, B = 60;
  double x0 = 1e300, x1 = -1e300, y1 = 0;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) {
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y1 = std::max(y1, y);
    }
  if (!(x1 > x0)) x1 = x0 + 1;
  if (!(y1 > 0)) y1 = 1;
  auto fx = [&](double x) {
    const double t = log_x ? (std::log(x) - std::log(x0)) / (std::log(x1) - std::log(x0)) : (x - x0) / (x1 - x0);
    return L + t * (W - L - R);
  };
  // y ticks at 1, 2 or 5 x 10^k, about five of them.
  const double raw = y1 / 5;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / mag < 2 ? 2 * mag : raw / mag < 5 ? 5 * mag : 10 * mag;
  const double ymax = std::ceil(y1 * 1.05 / step) * step;
  auto fy = [&](double y) { return H - B - y / ymax * (H - T - B); };
  std::string o = fmt("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
                      "font-family=\"sans-serif\" font-size=\"12\">\n",
                      W, H, W, H);
  o += fmt("<rect width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", W, H);
  o += fmt("<text x=\"%.0f\" y=\"28\" text-anchor=\"middle\" font-size=\"15\">%s</text>\n", W / 2, title.c_str());
  for (double y = 0; y <= ymax + step / 2; y += step) {
    o += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, fy(y), W - R, fy(y));
    o += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", L - 6, fy(y) + 4, y);
  }
  const std::vector<double> xt = x_ticks(x0, x1, log_x);
  for (double x : xt) {
    o += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", fx(x), T, fx(x), H - B);
    const std::string label = x >= 1024 && std::fmod(x, 1024) == 0 ? fmt("%gK", x / 1024) : fmt("%g", x);
    o += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", fx(x), H - B + 18, label.c_str());
  }
  o += fmt("<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, H - B, W - R, H - B);
  o += fmt("<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, T, L, H - B);
  o += fmt("<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">%s</text>\n", (L + W - R) / 2, H - 18, xlabel.c_str());
  o += fmt("<text x=\"18\" y=\"%.0f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.0f)\">%s</text>\n", (T + H - B) / 2,
           (T + H - B) / 2, ylabel.c_str());
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
  for (size_t i = 0; i < series.size(); ++i) {
    const auto& s = series[i];
    const char* col = colors[i % 6];
    std::string pts;
    for (const auto& [x, y] : s.points) pts += fmt("%.1f,%.1f ", fx(x), fy(y));
    o += fmt("<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"%s\"/>\n", col,
             s.dashed ? " stroke-dasharray=\"6 4\"" : "", pts.c_str());
    for (const auto& [x, y] : s.points) o += fmt("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n", fx(x), fy(y), col);
    const double ly = T + 14 + 18.0 * double(i);
    o += fmt("<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"%s/>\n", L + 14, ly, L + 40,
             ly, col, s.dashed ? " stroke-dasharray=\"6 4\"" : "");
    o += fmt("<text x=\"%.0f\" y=\"%.1f\">%s</text>\n", L + 46, ly + 4, s.name.c_str());
  }
  o += "</svg>\n";
  return o;
}

}  // namespace dsa::sim
