// `dsa bench`: prefill and decode speed of a checkpoint on this machine, as medians of
// repeats, and as fractions of the machine's own measured limits: streaming-read
// bandwidth for decode (memory-bound) and FMA peak for prefill (compute-bound). Bytes and
// FLOPs per token come from the operator plan shared with `dsa plan`.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "command.h"
#include "core/dtype.h"
#include "core/numa.h"
#include "kernels/kernels.h"
#include "model/forward.h"
#include "runtime/engine.h"
#include "sim/cost.h"
#include "sim/probe.h"

namespace {

struct Args {
  std::string model, kv_cache = "fp8";
  int prompt = 512, gen = 128, depth = 0, threads = 0, repeat = 3, batch = 1;
  bool json = false, verify = false;
  uint64_t seed = 1;
  dsa::cli::ParallelFlags par;
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// The step's bytes and FLOPs from the operator table (one CPU, fp8 weights and caches,
// prefill attention in the absorbed form as this engine runs it).
struct StepCost {
  double bytes = 0, flops = 0;
};
StepCost plan_step(const dsa::sim::SimModel& sm, dsa::sim::Phase phase, int64_t seqs, int64_t tokens, int64_t context) {
  dsa::sim::Options o;
  o.absorbed_prefill = true;
  const auto ops = dsa::sim::op_plan(sm, dsa::sim::Step{phase, seqs, tokens, context}, dsa::sim::Layout{1, 1, 1, 1, 1}, o);
  return {dsa::sim::plan_total_bytes(ops), dsa::sim::plan_total_flops(ops)};
}

// A step's roofline in seconds: its bytes at the read bandwidth or its FLOPs at the FMA peak,
// whichever takes longer.
double roofline_s(const StepCost& c, double bw_gbps, double peak_gflops) {
  return std::max(c.bytes / (bw_gbps * 1e9), c.flops / (peak_gflops * 1e9));
}

// Kernel timings by kernel, summed over the timed runs of one phase.
struct KernelTable {
  std::vector<dsa::kernels::KernelStat> stats = std::vector<dsa::kernels::KernelStat>(static_cast<size_t>(dsa::kernels::KernelId::kCount));
  // Adds the profile's counts and resets it.
  void collect() {
    for (int k = 0; k < int(dsa::kernels::KernelId::kCount); ++k) {
      const auto st = dsa::kernels::profile_stat(dsa::kernels::KernelId(k));
      auto& into = stats[size_t(k)];
      into.seconds += st.seconds;
      into.thread_seconds += st.thread_seconds;
      into.flops += st.flops;
      into.bytes += st.bytes;
      into.calls += st.calls;
    }
    dsa::kernels::profile_reset();
  }
  const dsa::kernels::KernelStat& operator[](dsa::kernels::KernelId k) const { return stats[size_t(k)]; }
};

// The decode steps' matrix products by weight shape, summed over the timed runs.
struct WeightTable {
  std::vector<dsa::kernels::WeightStat> rows;
  void collect() {
    for (const auto& w : dsa::kernels::profile_weights()) {
      auto it = std::find_if(rows.begin(), rows.end(), [&](const dsa::kernels::WeightStat& d) { return d.same_row(w); });
      if (it == rows.end()) rows.push_back(w);
      else it->add(w);
    }
  }
  // The most time first: where a decode step's bytes go (the bf16 lm_head and the fp8
  // experts stream at different fractions of the bandwidth).
  void sort_by_time() {
    std::sort(rows.begin(), rows.end(), [](const dsa::kernels::WeightStat& x, const dsa::kernels::WeightStat& y) { return x.seconds > y.seconds; });
  }
};

// Runs fn with the kernel profile on.
template <class F>
void profiled(F&& fn) {
  dsa::kernels::profile_reset();
  dsa::kernels::profile_enable(true);
  fn();
  dsa::kernels::profile_enable(false);
}

// ---- --batch B: B sequences decoding together ------------------------------------------

struct BatchTimings {
  std::vector<double> tg, mixed;  // per-sequence decode tok/s; mixed-step seconds
  WeightTable weights;
};

// B sequences at --depth decode -n tokens together (one step per token for all of them),
// then a mixed step: a -p prefill chunk of a new sequence joins the B decoding.
BatchTimings time_batch(const Args& a, dsa::Engine& e, const std::vector<int32_t>& ids) {
  using namespace dsa;
  const int B = a.batch;
  if (!a.json) std::fprintf(stderr, "filling %d sequences to depth %d ...\n", B, a.depth);
  std::vector<SeqId> seqs(static_cast<size_t>(B));
  for (int i = 0; i < B; ++i) {
    seqs[size_t(i)] = e.add();
    e.fill_synthetic(seqs[size_t(i)], a.depth, a.seed + uint64_t(i));
  }
  std::vector<StepItem> items(static_cast<size_t>(B) + 1);
  auto decode_items = [&](int t) {
    for (int i = 0; i < B; ++i) items[size_t(i)] = StepItem{seqs[size_t(i)], &ids[size_t((t + 7 * i) % a.gen)], 1, true, 1, 0};
  };
  auto run_step = [&](int n_items) { e.step(std::span<const StepItem>(items.data(), size_t(n_items))); };
  decode_items(0);
  run_step(B);  // warm-up
  BatchTimings bt;
  for (int r = 0; r < a.repeat; ++r) {
    for (SeqId s : seqs) e.truncate(s, a.depth);
    profiled([&] {
      const double s = now();
      for (int t = 0; t < a.gen; ++t) {
        decode_items(t);
        run_step(B);
      }
      bt.tg.push_back(double(a.gen) / (now() - s));
    });
    bt.weights.collect();
    if (!a.json) std::fprintf(stderr, "  decode %d x %d @ depth %d: %.1f tok/s aggregate\n", B, a.gen, a.depth, bt.tg.back() * B);
    if (a.prompt > 0) {
      const SeqId p = e.add();
      decode_items(0);
      items[size_t(B)] = StepItem{p, ids.data(), a.prompt, false, 1, 0};
      const double s = now();
      run_step(B + 1);
      bt.mixed.push_back(now() - s);
      e.release(p);
    }
  }
  return bt;
}

// A by-weight table as JSON rows, the most time first: calls and milliseconds per `unit`
// (a token, or a batched step), `per` of them in the table.
nlohmann::json weight_rows(WeightTable t, double per, const std::string& unit) {
  t.sort_by_time();
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& w : t.rows)
    rows.push_back({{"kernel", dsa::kernels::kernel_name(w.kernel)},
                    {"weight", std::to_string(w.rows) + "x" + std::to_string(w.cols)},
                    {"dtype", dsa::dtype_name(w.dtype)},
                    {"jobs", w.jobs},
                    {"calls_per_" + unit, double(w.calls) / per},
                    {"ms_per_" + unit, w.seconds * 1e3 / per},
                    {"gflops", w.seconds > 0 ? w.flops / w.seconds / 1e9 : 0},
                    {"gbps", w.seconds > 0 ? w.bytes / w.seconds / 1e9 : 0}});
  return rows;
}

// The batch's figures against the step's roofline: max(bytes / read bandwidth, FLOPs / peak).
nlohmann::json batch_report(const Args& a, const dsa::Model& m, const BatchTimings& bt, int threads) {
  using namespace dsa;
  const int B = a.batch;
  const double bw = sim::measure_read_bandwidth_gbps(threads), peak = sim::measure_peak_gflops(threads);
  const sim::SimModel sm = sim::model_from_config(m.config, a.model);
  const StepCost dc = plan_step(sm, sim::Phase::Decode, B, 1, a.depth + a.gen / 2);
  const double step_s = 1.0 / median(bt.tg);
  const double roof_s = roofline_s(dc, bw, peak);
  nlohmann::json j = {{"model", a.model}, {"threads", threads}, {"isa", kernels::isa_name(kernels::isa())},
                      {"bf16_dot", kernels::bf16_dot()}, {"cpu_features", kernels::cpu_features()}, {"batch", B}, {"depth", a.depth}, {"gen_tokens", a.gen},
                      {"repeat", a.repeat}, {"kv_cache", a.kv_cache},
                      {"weights_huge_page_fraction", m.files.huge_fraction()},
                      {"decode_aggregate_tokens_per_s", median(bt.tg) * B}, {"decode_per_seq_tokens_per_s", median(bt.tg)},
                      {"decode_step_ms", step_s * 1e3}, {"decode_step_bytes", dc.bytes}, {"decode_step_flops", dc.flops},
                      {"read_bandwidth_gbps", bw}, {"peak_gflops", peak}, {"bf16_dot_peak_gflops", sim::measure_bf16_dot_peak_gflops(threads)},
                      {"amx_peak_gflops", sim::measure_amx_peak_gflops(threads)},
                      {"decode_step_roofline_ms", roof_s * 1e3},
                      {"decode_roofline_fraction", roof_s / step_s},
                      {"decode_bound", dc.bytes / (bw * 1e9) >= dc.flops / (peak * 1e9) ? "bandwidth" : "compute"},
                      {"decode_step_weights", weight_rows(bt.weights, double(a.gen) * a.repeat, "step")}};
  if (a.prompt > 0) {
    // The mixed step as its two plans: the decode step and the chunk's prefill.
    const StepCost pc = plan_step(sm, sim::Phase::Prefill, 1, a.prompt, 0), d0 = plan_step(sm, sim::Phase::Decode, B, 1, a.depth);
    const double mixed_s = median(bt.mixed);
    const double mixed_roof = roofline_s(StepCost{d0.bytes + pc.bytes, d0.flops + pc.flops}, bw, peak);
    j.update({{"mixed_prompt_tokens", a.prompt}, {"mixed_step_ms", mixed_s * 1e3}, {"mixed_step_roofline_ms", mixed_roof * 1e3},
              {"mixed_roofline_fraction", mixed_roof / mixed_s}});
  }
  return j;
}

// The tier's note on its bf16 dot products and AMX tiles, with the peaks their probes measured.
std::string tier_note(const nlohmann::json& j) {
  std::string note;
  char buf[96];
  if (dsa::kernels::bf16_dot()) {
    std::snprintf(buf, sizeof buf, "bf16 dot products, %.0f GFLOP/s peak", j["bf16_dot_peak_gflops"].get<double>());
    note = buf;
  }
  if (dsa::kernels::isa() == dsa::kernels::Isa::Amx) {
    std::snprintf(buf, sizeof buf, "%sAMX tiles, %.0f GFLOP/s peak", note.empty() ? "" : "; ", j["amx_peak_gflops"].get<double>());
    note += buf;
  }
  return note.empty() ? note : " (" + note + ")";
}

// One by-weight table (weight_rows' JSON): calls per `calls_per` (the prompt's products count
// per prompt, each under one call per token), time per `per` (the rows' unit), and the rate
// that bounds the phase: GFLOP/s for compute-bound products, GB/s for weight streams.
void weight_table(const std::string& title, const nlohmann::json& rows, const char* calls_per, double calls_scale, const std::string& per,
                  const char* rate, const char* unit) {
  if (!rows.empty()) std::printf("%s matrix products by weight (first of a multi-weight call; x jobs):\n", title.c_str());
  for (const auto& w : rows)
    std::printf("  %-16s %-8s %-10s x%-3d %5.1f calls/%-6s %8.3f ms/%-5s %7.1f %s\n", w["kernel"].get<std::string>().c_str(),
                w["dtype"].get<std::string>().c_str(), w["weight"].get<std::string>().c_str(), w["jobs"].get<int>(),
                w["calls_per_" + per].get<double>() * calls_scale, calls_per, w["ms_per_" + per].get<double>(), per.c_str(),
                w[rate].get<double>(), unit);
}

void print_batch(const Args& a, const nlohmann::json& j) {
  using namespace dsa;
  const auto num = [&](const char* k) { return j[k].get<double>(); };
  std::printf("model %s, %d threads, %s kernels%s, batch %d, depth %d, kv cache %s\n", a.model.c_str(), j["threads"].get<int>(),
              kernels::isa_name(kernels::isa()), tier_note(j).c_str(), a.batch, a.depth, a.kv_cache.c_str());
  std::printf("decode  %d x %d tokens: %8.1f tok/s aggregate, %.1f tok/s per sequence, %.1f ms/step\n", a.batch, a.gen,
              num("decode_aggregate_tokens_per_s"), num("decode_per_seq_tokens_per_s"), num("decode_step_ms"));
  std::printf("        step: %.1f MB, %.1f GFLOP; roofline %.1f ms (%s-bound: %.1f GB/s read, %.0f GFLOP/s FMA peak) = %.2f of it\n",
              num("decode_step_bytes") / 1e6, num("decode_step_flops") / 1e9, num("decode_step_roofline_ms"),
              j["decode_bound"].get<std::string>().c_str(), num("read_bandwidth_gbps"), num("peak_gflops"), num("decode_roofline_fraction"));
  if (a.prompt > 0)
    std::printf("mixed   %d decoding + one %d-token prefill chunk: %.1f ms/step; roofline %.1f ms = %.2f of it\n", a.batch, a.prompt,
                num("mixed_step_ms"), num("mixed_step_roofline_ms"), num("mixed_roofline_fraction"));
  const bool compute = j["decode_bound"] == "compute";
  weight_table("decode step", j["decode_step_weights"], "step", 1, "step", compute ? "gflops" : "gbps", compute ? "GFLOP/s" : "GB/s");
}

// ---- one sequence: prefill, decode and MTP verification ------------------------------

struct SingleTimings {
  std::vector<double> pp, tg, vs;  // prefill and decode tok/s; verification seconds per step
  KernelTable prefill, decode;
  WeightTable prefill_weights, weights, verify_weights;
};

// One sequence's steps through the engine.
struct OneSeq {
  dsa::Engine& e;
  dsa::SeqId sq;
  void step(const int32_t* t, int n, bool decode, int logits = 1, int unverified = 0) {
    const dsa::StepItem it{sq, t, n, decode, logits, unverified};
    e.step(std::span<const dsa::StepItem>(&it, 1));
  }
};

// The MTP verification's shape: the main model over a token and its draft in one decode
// step (both rows of logits), the draft then rejected, so each step adds one token as a
// plain decode step does and the context grows alike. Profiled like the decode steps it is
// compared with; seconds per step.
void time_verify(const Args& a, OneSeq& q, const std::vector<int32_t>& ids, SingleTimings& st) {
  q.e.truncate(q.sq, a.depth);
  q.step(ids.data(), 2, true, 2, 1);  // warm-up
  q.e.truncate(q.sq, a.depth);
  profiled([&] {
    const double s = now();
    for (int i = 0; i < a.gen; ++i) {
      q.step(&ids[size_t(i)], 2, true, 2, 1);
      q.e.truncate(q.sq, q.e.length(q.sq) - 1);
    }
    st.vs.push_back((now() - s) / a.gen);
  });
  st.verify_weights.collect();
  if (!a.json) std::fprintf(stderr, "  verify %d @ depth %d: %.2f ms/step\n", a.gen, a.depth, st.vs.back() * 1e3);
}

// -n decode steps from --depth, timed and profiled.
void time_decode(const Args& a, OneSeq& q, const std::vector<int32_t>& ids, SingleTimings& st) {
  q.e.truncate(q.sq, a.depth);
  q.step(ids.data(), 1, true);  // warm the step (caches, thread pool)
  q.e.truncate(q.sq, a.depth);
  profiled([&] {
    const double s = now();
    for (int i = 0; i < a.gen; ++i) q.step(&ids[size_t(i)], 1, true);
    st.tg.push_back(a.gen / (now() - s));
  });
  st.weights.collect();
  st.decode.collect();
  if (!a.json) std::fprintf(stderr, "  decode %d @ depth %d: %.1f tok/s\n", a.gen, a.depth, st.tg.back());
}

SingleTimings time_single(const Args& a, dsa::Engine& e, const std::vector<int32_t>& ids) {
  if (!a.json) std::fprintf(stderr, "filling %d cached tokens ...\n", a.depth);
  OneSeq q{e, e.add()};
  e.fill_synthetic(q.sq, a.depth, a.seed);
  if (a.prompt > 0) {  // untimed warm-up: first touch of the mapped weights, thread start
    q.step(ids.data(), a.prompt, false);
    e.truncate(q.sq, a.depth);
  }
  SingleTimings st;
  for (int r = 0; r < a.repeat; ++r) {
    if (a.prompt > 0) {
      e.truncate(q.sq, a.depth);
      profiled([&] {
        const double s = now();
        q.step(ids.data(), a.prompt, false);
        st.pp.push_back(a.prompt / (now() - s));
      });
      st.prefill_weights.collect();  // before the kernel table, whose collect resets the profile
      st.prefill.collect();
      if (!a.json) std::fprintf(stderr, "  prefill %d @ depth %d: %.1f tok/s\n", a.prompt, a.depth, st.pp.back());
    }
    if (a.gen == 0) continue;
    time_decode(a, q, ids, st);
    if (a.verify) time_verify(a, q, ids, st);
  }
  return st;
}

// Calls made one per thread inside a parallel loop (MoE experts, per-query attention in
// prefill) count as their thread time divided by the threads: the wall time they take with
// every thread busy.
double wall_seconds(const dsa::kernels::KernelStat& x, int threads) { return x.seconds + x.thread_seconds / double(threads); }

nlohmann::json kernel_breakdown(const KernelTable& t, double tokens, int threads) {
  nlohmann::json b = nlohmann::json::object();
  for (int k = 0; k < int(dsa::kernels::KernelId::kCount); ++k) {
    const auto& x = t[dsa::kernels::KernelId(k)];
    if (x.calls == 0) continue;
    const double w = wall_seconds(x, threads);
    b[dsa::kernels::kernel_name(dsa::kernels::KernelId(k))] = {
        {"ms_per_token", w * 1e3 / tokens}, {"gflops", w > 0 ? x.flops / w / 1e9 : 0}, {"gbps", w > 0 ? x.bytes / w / 1e9 : 0}};
  }
  return b;
}

// Wall time per token of all repeats not spent inside a profiled kernel call: the model's
// own glue (router selection, expert combine, residual adds, copies) and the threads'
// fork/join waits between kernels.
double outside_ms(const KernelTable& t, const std::vector<double>& rates, int tokens, int threads) {
  double total = 0, in = 0;
  for (double r : rates) total += tokens / r;
  for (const auto& x : t.stats) in += wall_seconds(x, threads);
  return rates.empty() ? 0.0 : std::max(0.0, total - in) * 1e3 / (double(tokens) * double(rates.size()));
}

// Bytes and FLOPs per token from the operator table, against the machine's own limits.
nlohmann::json single_report(const Args& a, const dsa::Model& m, dsa::CacheType cache, const SingleTimings& st, int threads) {
  using namespace dsa;
  const double bw = sim::measure_read_bandwidth_gbps(threads), peak = sim::measure_peak_gflops(threads);
  const sim::SimModel sm = sim::model_from_config(m.config, a.model);
  const int64_t mid = a.depth + a.gen / 2;  // the decode run's average context
  const double bytes = sim::decode_bytes_per_token(sm, mid);
  // The prompt's work at its depth, in the absorbed form this engine runs.
  const double flops = a.prompt > 0 ? plan_step(sm, sim::Phase::Prefill, 1, a.prompt, a.depth).flops / a.prompt : 0;
  const double pps = median(st.pp), tgs = median(st.tg);
  const auto& gl = st.prefill[kernels::KernelId::Linear];
  const auto& gt = st.prefill[kernels::KernelId::LinearT];
  const double gemm_s = wall_seconds(gl, threads) + wall_seconds(gt, threads);
  const double gemm_gflops = gemm_s > 0 ? (gl.flops + gt.flops) / gemm_s / 1e9 : 0;
  const double amx_peak = sim::measure_amx_peak_gflops(threads);
  const double dtok = double(a.gen) * a.repeat;
  nlohmann::json j = {{"model", a.model},
                      {"threads", threads},
                      {"isa", kernels::isa_name(kernels::isa())},
                      {"bf16_dot", kernels::bf16_dot()},
                      {"cpu_features", kernels::cpu_features()},
                      {"numa_nodes", numa_status().nodes},
                      {"numa_interleaved", numa_status().interleaved},
                      {"weights_huge_page_fraction", m.files.huge_fraction()},
                      {"depth", a.depth},
                      {"prompt_tokens", a.prompt},
                      {"gen_tokens", a.gen},
                      {"repeat", a.repeat},
                      {"kv_cache", a.kv_cache},
                      {"prefill_tokens_per_s", pps},
                      {"decode_tokens_per_s", tgs},
                      {"decode_bytes_per_token", bytes},
                      {"decode_bytes_per_token_engine", decode_bytes_read(m, cache, mid)},
                      {"read_bandwidth_gbps", bw},
                      {"decode_roofline_fraction", tgs * bytes / (bw * 1e9)},
                      {"prefill_flops_per_token", flops},
                      {"peak_gflops", peak},
                      {"bf16_dot_peak_gflops", sim::measure_bf16_dot_peak_gflops(threads)},
                      {"amx_peak_gflops", amx_peak},
                      {"prefill_peak_fraction", pps * flops / (peak * 1e9)},
                      {"prefill_gemm_gflops", gemm_gflops},
                      {"prefill_gemm_peak_fraction", gemm_gflops / peak},
                      {"prefill_gemm_amx_peak_fraction", amx_peak > 0 ? gemm_gflops / amx_peak : 0.0},
                      {"prefill_kernels", kernel_breakdown(st.prefill, double(a.prompt) * a.repeat, threads)},
                      {"decode_kernels", kernel_breakdown(st.decode, dtok, threads)},
                      {"prefill_weights", weight_rows(st.prefill_weights, double(a.prompt) * a.repeat, "token")},
                      {"decode_weights", weight_rows(st.weights, dtok, "token")},
                      {"decode_outside_kernels_ms_per_token", outside_ms(st.decode, st.tg, a.gen, threads)},
                      {"prefill_outside_kernels_ms_per_token", outside_ms(st.prefill, st.pp, a.prompt, threads)}};
  if (!st.vs.empty()) {
    const double one = 1e3 / tgs, two = median(st.vs) * 1e3;
    // What the ratio can be at best: the two steps' rooflines. The draft routes to experts of
    // its own, so the verification step reads more bytes than a one-token step.
    const auto roofline = [&](int64_t tokens) { return roofline_s(plan_step(sm, sim::Phase::Decode, 1, tokens, mid), bw, peak); };
    j.update({{"verify_weights", weight_rows(st.verify_weights, double(a.gen) * a.repeat, "step")},
              {"verify_step_ms", two},
              {"decode_step_ms", one},
              {"verify_over_decode_step", two / one},
              {"verify_roofline_over_decode", roofline(2) / roofline(1)}});
  }
  return j;
}

void print_single(const Args& a, const nlohmann::json& j) {
  using namespace dsa;
  const auto num = [&](const char* k) { return j[k].get<double>(); };
  const double bytes = num("decode_bytes_per_token"), flops = num("prefill_flops_per_token"), peak = num("peak_gflops");
  const double bw = num("read_bandwidth_gbps"), pps = num("prefill_tokens_per_s"), tgs = num("decode_tokens_per_s");
  const int nodes = j["numa_nodes"].get<int>();
  std::printf("model %s, %d threads, %s kernels%s, depth %d, kv cache %s, %d NUMA node%s%s, %.0f%% of the weights on 2 MiB pages\n",
              a.model.c_str(), j["threads"].get<int>(), kernels::isa_name(kernels::isa()), tier_note(j).c_str(), a.depth, a.kv_cache.c_str(),
              nodes, nodes > 1 ? "s" : "", j["numa_interleaved"].get<bool>() ? " (pages interleaved)" : "",
              100 * num("weights_huge_page_fraction"));
  std::printf("prefill %4d tokens: %8.1f tok/s  (%.2f GFLOP/token, %.0f GFLOP/s = %.2f of the %.0f GFLOP/s FMA peak)\n", a.prompt, pps,
              flops / 1e9, pps * flops / 1e9, pps * flops / (peak * 1e9), peak);
  std::printf("        GEMM part:   %8.0f GFLOP/s = %.2f of the FMA peak", num("prefill_gemm_gflops"), num("prefill_gemm_peak_fraction"));
  // Each activation goes through the tiles as three bf16 parts: a third of the peak is the
  // GEMM's own ceiling there.
  if (num("amx_peak_gflops") > 0) std::printf(", %.3f of the AMX tile peak", num("prefill_gemm_amx_peak_fraction"));
  std::printf("\n");
  std::printf("decode  %4d tokens: %8.1f tok/s  (%.1f MB/token, %.1f GB/s = %.2f of the %.1f GB/s read bandwidth)\n", a.gen, tgs,
              bytes / 1e6, tgs * bytes / 1e9, tgs * bytes / (bw * 1e9), bw);
  for (const char* phase : {"prefill_kernels", "decode_kernels"})
    for (auto& [k, v] : j[phase].items())
      std::printf("  %-8s %-15s %8.3f ms/token %8.1f GFLOP/s %7.1f GB/s\n", phase[0] == 'p' ? "prefill" : "decode", k.c_str(),
                  v["ms_per_token"].get<double>(), v["gflops"].get<double>(), v["gbps"].get<double>());
  if (j.contains("verify_step_ms"))
    std::printf("verify  %4d steps:  %8.2f ms/step for a token and its draft = %.2fx a one-token step (%.2f ms; rooflines %.2fx)\n",
                a.gen, num("verify_step_ms"), num("verify_over_decode_step"), num("decode_step_ms"), num("verify_roofline_over_decode"));
  // The experts of a prefill chunk run one per thread inside a parallel loop and are not
  // listed: their time is in the kernel table above.
  weight_table("prefill (outside the experts' loop)", j["prefill_weights"], "prompt", a.prompt, "token", "gflops", "GFLOP/s");
  weight_table("decode", j["decode_weights"], "token", 1, "token", "gbps", "GB/s");
  // The verification step beside it: where its second token costs more than its bytes.
  if (j.contains("verify_weights")) weight_table("verification step", j["verify_weights"], "step", 1, "step", "gbps", "GB/s");
}

// ---- setup ------------------------------------------------------------------------------

// Three passes: the second one still ran at half speed where the effect was seen.
constexpr int kWarmPasses = 3;

// The engine sized for the run: one sequence (or --batch of them) plus the mixed step's
// prefill, each holding --depth + -p + -n tokens; no prefix cache (every run starts cold).
dsa::EngineOptions engine_options(const Args& a, const dsa::ModelConfig& c) {
  const int max_ctx = a.depth + std::max(a.prompt, 1) + a.gen + 1;
  if (max_ctx - 1 > c.max_position_embeddings)
    throw dsa::Error("bench: --depth + -p + -n = " + std::to_string(max_ctx - 1) + " tokens exceeds the model's max_position_embeddings (" +
                     std::to_string(c.max_position_embeddings) + ")");
  dsa::EngineOptions eo;
  eo.cache = dsa::cli::parse_cache_type(a.kv_cache);
  eo.max_ctx = max_ctx;
  eo.max_seqs = a.batch + 1;
  eo.max_step_tokens = std::max(a.prompt, 1) + a.batch;
  eo.max_logit_rows = a.batch + 1;
  eo.cache_tokens = int64_t(eo.max_seqs) * ((max_ctx + eo.block_size - 1) / eo.block_size) * eo.block_size;
  eo.prefix_cache = false;
  return eo;
}

// The prompt and decode tokens: ids from a fixed linear congruential sequence.
std::vector<int32_t> bench_ids(const Args& a, int vocab) {
  std::vector<int32_t> ids(size_t(std::max(a.prompt, a.gen)) + 1);
  uint64_t x = a.seed;
  for (auto& id : ids) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    id = int32_t((x >> 33) % uint64_t(vocab));
  }
  return ids;
}

void run(const Args& a) {
  using namespace dsa;
  if (a.prompt < 0 || a.gen < 0 || a.depth < 0 || a.repeat < 1) throw Error("bench: -p, -n, --depth must be >= 0 and --repeat >= 1");
  if (a.batch > 1 && a.verify) throw Error("bench: --verify times one sequence's steps; leave out --batch");
  if (a.threads > 0) omp_set_num_threads(a.threads);
  const int threads = omp_get_max_threads();
  const double t0 = now();
  const RankShard shard = a.par.shard();
  auto m = Model::load(a.model, false, !a.json && shard.rank == 0, true, shard);
  const double load_s = now() - t0;
  // Untimed: the weights as a serving process finds them (Model::read_weights says why).
  const double w0 = now();
  const size_t warm_bytes = m->read_weights(kWarmPasses);
  if (!a.json && shard.rank == 0)
    std::fprintf(stderr, "read %.2f GB of weights %d times before timing (%.1f s)\n", double(warm_bytes) / 1e9, kWarmPasses, now() - w0);
  const EngineOptions eo = engine_options(a, m->config);
  Engine e(*m, eo);
  if (!a.json) std::fprintf(stderr, "%s\n", e.capacity().describe().c_str());
  const std::vector<int32_t> ids = bench_ids(a, m->config.vocab_size);
  if (a.batch > 1) {
    const BatchTimings bt = time_batch(a, e, ids);
    const nlohmann::json j = batch_report(a, *m, bt, threads);
    if (a.json) std::printf("%s\n", j.dump().c_str());
    else print_batch(a, j);
    return;
  }
  const SingleTimings st = time_single(a, e, ids);
  nlohmann::json j = single_report(a, *m, eo.cache, st, threads);
  j["load_s"] = load_s;
  if (a.json) std::printf("%s\n", j.dump().c_str());
  else print_single(a, j);
}

void setup_bench(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("bench", "Measure prefill and decode speed against this machine's bandwidth and FMA peak");
  cmd->add_option("--model", a->model, "Model directory");
  a->par.add(cmd);
  cmd->require_subcommand(0, 1);
  cmd->add_option("-p,--prompt", a->prompt, "Prefill tokens (0: skip)")->capture_default_str()->check(dsa::cli::int_in(0, dsa::cli::kMaxTokens));
  cmd->add_option("-n,--gen", a->gen, "Decode tokens (0: skip)")->capture_default_str()->check(dsa::cli::int_in(0, dsa::cli::kMaxTokens));
  cmd->add_option("--depth", a->depth, "Tokens already in the cache before prefill and decode (filled synthetically)")->capture_default_str()->check(dsa::cli::int_in(0, dsa::cli::kMaxTokens));
  cmd->add_option("-t,--threads", a->threads, "Threads (default: OpenMP's, the cores)")->check(dsa::cli::thread_count());
  cmd->add_option("--repeat", a->repeat, "Repeats; medians are reported")->capture_default_str()->check(dsa::cli::int_in(1, 1000));
  cmd->add_option("--kv-cache", a->kv_cache, "f32 | bf16 | fp8 | fp8-656")->capture_default_str();
  cmd->add_option("--batch", a->batch,
                  "Sequences decoding together (aggregate and per-sequence tok/s, the step against its roofline, and a step with one "
                  "-p prefill chunk joining them)")
      ->capture_default_str()
      ->check(dsa::cli::int_in(1, 1024));
  cmd->add_option("--seed", a->seed, "Seed for the random prompt and cache")->capture_default_str();
  cmd->add_flag("--verify", a->verify,
                "Also time -n MTP verification steps (a token and its draft through the main model in one step) against the "
                "one-token steps");
  cmd->add_flag("--json", a->json, "Print one JSON object");
  cmd->callback([a, cmd] {
    if (cmd->get_subcommands().empty()) {
      if (a->model.empty()) throw dsa::Error("bench: --model is required (or `dsa bench tokenizer --model DIR`)");
      run(*a);
    }
  });
}

}  // namespace

DSA_COMMAND(70, setup_bench);
