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

// The step's bytes and FLOPs from the operator table (one CPU, fp8 weights and caches).
struct StepCost {
  double bytes = 0, flops = 0;
};
StepCost plan_step(const dsa::sim::SimModel& sm, dsa::sim::Phase phase, int64_t seqs, int64_t tokens, int64_t context) {
  const auto ops = dsa::sim::op_plan(sm, dsa::sim::Step{phase, seqs, tokens, context}, dsa::sim::Layout{1, 1, 1, 1, 1}, dsa::sim::Options{});
  return {dsa::sim::plan_total_bytes(ops), dsa::sim::plan_total_flops(ops)};
}

// `--batch B`: B sequences at --depth decode -n tokens together (one step per token for all
// of them), then a mixed step: a -p prefill chunk of a new sequence joins the B decoding.
void run_batch(const Args& a, const dsa::Model& m, dsa::Engine& e, const std::vector<int32_t>& ids, int threads) {
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
  auto rewind = [&] {
    for (SeqId s : seqs) e.truncate(s, a.depth);
  };
  decode_items(0);
  e.step(std::span<const StepItem>(items.data(), size_t(B)));  // warm-up
  std::vector<double> tg, mixed;
  std::vector<kernels::WeightStat> dweights;  // the decode steps' matrix products by weight, all repeats
  for (int r = 0; r < a.repeat; ++r) {
    rewind();
    kernels::profile_reset();
    kernels::profile_enable(true);
    const double s = now();
    for (int t = 0; t < a.gen; ++t) {
      decode_items(t);
      e.step(std::span<const StepItem>(items.data(), size_t(B)));
    }
    tg.push_back(double(a.gen) / (now() - s));
    kernels::profile_enable(false);
    for (const auto& w : kernels::profile_weights()) {
      auto it = std::find_if(dweights.begin(), dweights.end(), [&](const kernels::WeightStat& d) { return d.same_row(w); });
      if (it == dweights.end()) dweights.push_back(w);
      else it->add(w);
    }
    if (!a.json) std::fprintf(stderr, "  decode %d x %d @ depth %d: %.1f tok/s aggregate\n", B, a.gen, a.depth, tg.back() * B);
    if (a.prompt > 0) {
      const SeqId p = e.add();
      decode_items(0);
      items[size_t(B)] = StepItem{p, ids.data(), a.prompt, false, 1, 0};
      const double s2 = now();
      e.step(std::span<const StepItem>(items.data(), size_t(B) + 1));
      mixed.push_back(now() - s2);
      e.release(p);
    }
  }
  const double bw = sim::measure_read_bandwidth_gbps(threads), peak = sim::measure_peak_gflops(threads);
  const sim::SimModel sm = sim::model_from_config(m.config, a.model);
  const int64_t mid = a.depth + a.gen / 2;
  const StepCost dc = plan_step(sm, sim::Phase::Decode, B, 1, mid);
  const double step_s = 1.0 / median(tg);
  const double roof_s = std::max(dc.bytes / (bw * 1e9), dc.flops / (peak * 1e9));
  // The mixed step as its two plans: the decode step and the chunk's prefill.
  const StepCost pc = a.prompt > 0 ? plan_step(sm, sim::Phase::Prefill, 1, a.prompt, 0) : StepCost{};
  const StepCost d0 = plan_step(sm, sim::Phase::Decode, B, 1, a.depth);
  const double mixed_s = median(mixed);
  const double mixed_roof = std::max((d0.bytes + pc.bytes) / (bw * 1e9), (d0.flops + pc.flops) / (peak * 1e9));
  nlohmann::json j = {{"model", a.model}, {"threads", threads}, {"isa", kernels::isa_name(kernels::isa())},
                      {"cpu_features", kernels::cpu_features()}, {"batch", B}, {"depth", a.depth}, {"gen_tokens", a.gen},
                      {"repeat", a.repeat}, {"kv_cache", a.kv_cache},
                      {"decode_aggregate_tokens_per_s", median(tg) * B}, {"decode_per_seq_tokens_per_s", median(tg)},
                      {"decode_step_ms", step_s * 1e3}, {"decode_step_bytes", dc.bytes}, {"decode_step_flops", dc.flops},
                      {"read_bandwidth_gbps", bw}, {"peak_gflops", peak}, {"decode_step_roofline_ms", roof_s * 1e3},
                      {"decode_roofline_fraction", roof_s / step_s},
                      {"decode_bound", dc.bytes / (bw * 1e9) >= dc.flops / (peak * 1e9) ? "bandwidth" : "compute"}};
  if (a.prompt > 0)
    j.update({{"mixed_prompt_tokens", a.prompt}, {"mixed_step_ms", mixed_s * 1e3}, {"mixed_step_roofline_ms", mixed_roof * 1e3},
              {"mixed_roofline_fraction", mixed_roof / mixed_s}});
  if (a.json) {
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("model %s, %d threads, %s kernels, batch %d, depth %d, kv cache %s\n", a.model.c_str(), threads,
              kernels::isa_name(kernels::isa()), B, a.depth, a.kv_cache.c_str());
  std::printf("decode  %d x %d tokens: %8.1f tok/s aggregate, %.1f tok/s per sequence, %.1f ms/step\n", B, a.gen, median(tg) * B,
              median(tg), step_s * 1e3);
  std::printf("        step: %.1f MB, %.1f GFLOP; roofline %.1f ms (%s-bound: %.1f GB/s read, %.0f GFLOP/s FMA peak) = %.2f of it\n",
              dc.bytes / 1e6, dc.flops / 1e9, roof_s * 1e3, j["decode_bound"].get<std::string>().c_str(), bw, peak, roof_s / step_s);
  if (a.prompt > 0)
    std::printf("mixed   %d decoding + one %d-token prefill chunk: %.1f ms/step; roofline %.1f ms = %.2f of it\n", B, a.prompt,
                mixed_s * 1e3, mixed_roof * 1e3, mixed_roof / mixed_s);
  std::sort(dweights.begin(), dweights.end(), [](const kernels::WeightStat& p, const kernels::WeightStat& q) { return p.seconds > q.seconds; });
  const double steps = double(a.gen) * a.repeat;
  std::printf("decode step matrix products by weight (first of a multi-weight call; x jobs):\n");
  for (const auto& w : dweights)
    std::printf("  %-10s %-8s %5dx%-5d x%-3d %5.1f calls/step %8.3f ms/step %7.1f GB/s\n", kernels::kernel_name(w.kernel), dtype_name(w.dtype),
                w.rows, w.cols, w.jobs, double(w.calls) / steps, w.seconds * 1e3 / steps, w.seconds > 0 ? w.bytes / w.seconds / 1e9 : 0);
}

// Three passes: the second one still ran at half speed where the effect was seen.
constexpr int kWarmPasses = 3;

void run(const Args& a) {
  using namespace dsa;
  if (a.prompt < 0 || a.gen < 0 || a.depth < 0 || a.repeat < 1) throw Error("bench: -p, -n, --depth must be >= 0 and --repeat >= 1");
  if (a.threads > 0) omp_set_num_threads(a.threads);
  const int threads = omp_get_max_threads();
  const double t0 = now();
  const RankShard shard = a.par.shard();
  auto m = Model::load(a.model, false, !a.json && shard.rank == 0, true, shard);
  const double load_s = now() - t0;
  const ModelConfig& c = m->config;
  // Untimed: the weights as a serving process finds them (Model::read_weights says why).
  const double w0 = now();
  const size_t warm_bytes = m->read_weights(kWarmPasses);
  if (!a.json && shard.rank == 0)
    std::fprintf(stderr, "read %.2f GB of weights %d times before timing (%.1f s)\n", double(warm_bytes) / 1e9, kWarmPasses, now() - w0);

  const int max_ctx = a.depth + std::max(a.prompt, 1) + a.gen + 1;
  if (max_ctx - 1 > c.max_position_embeddings)
    throw Error("bench: --depth + -p + -n = " + std::to_string(max_ctx - 1) + " tokens exceeds the model's max_position_embeddings (" +
                std::to_string(c.max_position_embeddings) + ")");
  EngineOptions eo;
  eo.cache = cli::parse_cache_type(a.kv_cache);
  eo.max_ctx = max_ctx;
  eo.max_seqs = a.batch + 1;  // and the mixed step's prefill
  eo.max_step_tokens = std::max(a.prompt, 1) + a.batch;
  eo.max_logit_rows = a.batch + 1;
  eo.cache_tokens = int64_t(eo.max_seqs) * ((max_ctx + eo.block_size - 1) / eo.block_size) * eo.block_size;
  eo.prefix_cache = false;
  Engine e(*m, eo);
  if (!a.json) std::fprintf(stderr, "%s\n", e.capacity().describe().c_str());
  std::vector<int32_t> ids(size_t(std::max(a.prompt, a.gen)) + 1);
  uint64_t x = a.seed;
  for (auto& id : ids) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    id = int32_t((x >> 33) % uint64_t(c.vocab_size));
  }
  if (a.batch > 1) {
    if (a.verify) throw Error("bench: --verify times one sequence's steps; leave out --batch");
    run_batch(a, *m, e, ids, threads);
    return;
  }
  if (!a.json) std::fprintf(stderr, "filling %d cached tokens ...\n", a.depth);
  const SeqId sq = e.add();
  e.fill_synthetic(sq, a.depth, a.seed);
  auto step = [&](const int32_t* t, int n, bool decode, int logits = 1, int unverified = 0) {
    const StepItem it{sq, t, n, decode, logits, unverified};
    e.step(std::span<const StepItem>(&it, 1));
  };

  // Kernel timings over the timed runs: the GEMM part's own FLOP rate, and a breakdown.
  using kernels::KernelId;
  std::vector<kernels::KernelStat> pstat(static_cast<size_t>(KernelId::kCount)), dstat(static_cast<size_t>(KernelId::kCount));  // not size_t(...): clang reads that as a parameter declaration
  // The decode step's matrix products by weight, summed over the repeats.
  std::vector<kernels::WeightStat> dweights;
  auto collect_weights = [&dweights] {
    for (const auto& w : kernels::profile_weights()) {
      auto it = std::find_if(dweights.begin(), dweights.end(), [&](const kernels::WeightStat& d) { return d.same_row(w); });
      if (it == dweights.end()) dweights.push_back(w);
      else it->add(w);
    }
  };
  auto collect = [](std::vector<kernels::KernelStat>& into) {
    for (int k = 0; k < int(KernelId::kCount); ++k) {
      const auto st = kernels::profile_stat(KernelId(k));
      into[size_t(k)].seconds += st.seconds;
      into[size_t(k)].thread_seconds += st.thread_seconds;
      into[size_t(k)].flops += st.flops;
      into[size_t(k)].bytes += st.bytes;
      into[size_t(k)].calls += st.calls;
    }
    kernels::profile_reset();
  };
  if (a.prompt > 0) {  // untimed warm-up: first touch of the mapped weights, thread start
    step(ids.data(), a.prompt, false);
    e.truncate(sq, a.depth);
  }
  // The MTP verification's shape: the main model over a token and its draft in one decode
  // step (both rows of logits), the draft then rejected, so each step adds one token as a
  // plain decode step does and the context grows alike.
  auto verify_run = [&] {
    e.truncate(sq, a.depth);
    step(ids.data(), 2, true, 2, 1);  // warm-up
    e.truncate(sq, a.depth);
    const double s = now();
    for (int i = 0; i < a.gen; ++i) {
      step(&ids[size_t(i)], 2, true, 2, 1);
      e.truncate(sq, e.length(sq) - 1);
    }
    return (now() - s) / a.gen;
  };
  std::vector<double> pp, tg, vs;
  for (int r = 0; r < a.repeat; ++r) {
    if (a.prompt > 0) {
      e.truncate(sq, a.depth);
      kernels::profile_reset();
      kernels::profile_enable(true);
      const double s = now();
      step(ids.data(), a.prompt, false);
      pp.push_back(a.prompt / (now() - s));
      kernels::profile_enable(false);
      collect(pstat);
      if (!a.json) std::fprintf(stderr, "  prefill %d @ depth %d: %.1f tok/s\n", a.prompt, a.depth, pp.back());
    }
    if (a.gen > 0) {
      e.truncate(sq, a.depth);
      step(ids.data(), 1, true);  // warm the step (caches, thread pool)
      e.truncate(sq, a.depth);
      kernels::profile_reset();
      kernels::profile_enable(true);
      const double s = now();
      for (int i = 0; i < a.gen; ++i) step(&ids[size_t(i)], 1, true);
      tg.push_back(a.gen / (now() - s));
      kernels::profile_enable(false);
      collect_weights();
      collect(dstat);
      if (!a.json) std::fprintf(stderr, "  decode %d @ depth %d: %.1f tok/s\n", a.gen, a.depth, tg.back());
      if (a.verify) {
        vs.push_back(verify_run());
        if (!a.json) std::fprintf(stderr, "  verify %d @ depth %d: %.2f ms/step\n", a.gen, a.depth, vs.back() * 1e3);
      }
    }
  }

  const double bw = sim::measure_read_bandwidth_gbps(threads), peak = sim::measure_peak_gflops(threads);
  const sim::SimModel sm = sim::model_from_config(c, a.model);
  const int64_t mid = a.depth + a.gen / 2;  // the decode run's average context
  const double bytes = sim::decode_bytes_per_token(sm, mid);
  const double engine_bytes = decode_bytes_read(*m, eo.cache, mid);
  const double flops = a.prompt > 0 ? sim::prefill_flops_per_token(sm, a.prompt) : 0;
  const double pps = median(pp), tgs = median(tg);
  const auto& gl = pstat[size_t(KernelId::Linear)];
  const auto& gt = pstat[size_t(KernelId::LinearT)];
  // Calls made one per thread inside a parallel loop (MoE experts, per-query attention in
  // prefill) count as their thread time divided by the threads: the wall time they take with
  // every thread busy.
  auto wall = [&](const kernels::KernelStat& x) { return x.seconds + x.thread_seconds / double(threads); };
  const double gemm_gflops = wall(gl) + wall(gt) > 0 ? (gl.flops + gt.flops) / (wall(gl) + wall(gt)) / 1e9 : 0;
  auto breakdown = [&](const std::vector<kernels::KernelStat>& v, double tokens) {
    nlohmann::json b = nlohmann::json::object();
    for (int k = 0; k < int(KernelId::kCount); ++k) {
      const auto& x = v[size_t(k)];
      if (x.calls == 0) continue;
      const double w = wall(x);
      b[kernels::kernel_name(KernelId(k))] = {{"ms_per_token", w * 1e3 / tokens},
                                              {"gflops", w > 0 ? x.flops / w / 1e9 : 0},
                                              {"gbps", w > 0 ? x.bytes / w / 1e9 : 0}};
    }
    return b;
  };
  // One entry per weight shape, the most time first: where a decode step's bytes go (the
  // bf16 lm_head and the fp8 experts stream at different fractions of the bandwidth).
  std::sort(dweights.begin(), dweights.end(), [](const kernels::WeightStat& x, const kernels::WeightStat& y) { return x.seconds > y.seconds; });
  nlohmann::json by_weight = nlohmann::json::array();
  const double dtok = double(a.gen) * a.repeat;
  for (const auto& w : dweights)
    by_weight.push_back({{"kernel", kernels::kernel_name(w.kernel)},
                         {"weight", std::to_string(w.rows) + "x" + std::to_string(w.cols)},
                         {"dtype", dtype_name(w.dtype)},
                         {"jobs", w.jobs},
                         {"calls_per_token", double(w.calls) / dtok},
                         {"ms_per_token", w.seconds * 1e3 / dtok},
                         {"gbps", w.seconds > 0 ? w.bytes / w.seconds / 1e9 : 0}});
  // Wall time per token of all repeats not spent inside a profiled kernel call: the
  // model's own glue (router selection, expert combine, residual adds, copies) and the
  // threads' fork/join waits between kernels.
  auto outside = [&](const std::vector<kernels::KernelStat>& v, const std::vector<double>& rates, int tokens) {
    double total = 0, in = 0;
    for (double r : rates) total += tokens / r;
    for (const auto& x : v) in += wall(x);
    return rates.empty() ? 0.0 : std::max(0.0, total - in) * 1e3 / (double(tokens) * double(rates.size()));
  };
  nlohmann::json j = {{"model", a.model},
                      {"threads", threads},
                      {"isa", kernels::isa_name(kernels::isa())},
                      {"cpu_features", kernels::cpu_features()},
                      {"numa_nodes", numa_status().nodes},
                      {"numa_interleaved", numa_status().interleaved},
                      {"depth", a.depth},
                      {"prompt_tokens", a.prompt},
                      {"gen_tokens", a.gen},
                      {"repeat", a.repeat},
                      {"kv_cache", a.kv_cache},
                      {"load_s", load_s},
                      {"prefill_tokens_per_s", pps},
                      {"decode_tokens_per_s", tgs},
                      {"decode_bytes_per_token", bytes},
                      {"decode_bytes_per_token_engine", engine_bytes},
                      {"read_bandwidth_gbps", bw},
                      {"decode_roofline_fraction", tgs * bytes / (bw * 1e9)},
                      {"prefill_flops_per_token", flops},
                      {"peak_gflops", peak},
                      {"prefill_peak_fraction", pps * flops / (peak * 1e9)},
                      {"prefill_gemm_gflops", gemm_gflops},
                      {"prefill_gemm_peak_fraction", gemm_gflops / peak},
                      {"prefill_kernels", breakdown(pstat, double(a.prompt) * a.repeat)},
                      {"decode_kernels", breakdown(dstat, double(a.gen) * a.repeat)},
                      {"decode_weights", by_weight},
                      {"decode_outside_kernels_ms_per_token", outside(dstat, tg, a.gen)},
                      {"prefill_outside_kernels_ms_per_token", outside(pstat, pp, a.prompt)}};
  if (!vs.empty()) {
    const double one = 1e3 / tgs, two = median(vs) * 1e3;
    j.update({{"verify_step_ms", two}, {"decode_step_ms", one}, {"verify_over_decode_step", two / one}});
  }
  if (a.json) {
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("model %s, %d threads, %s kernels, depth %d, kv cache %s, %d NUMA node%s%s\n", a.model.c_str(), threads,
              kernels::isa_name(kernels::isa()), a.depth, a.kv_cache.c_str(),
              numa_status().nodes, numa_status().nodes > 1 ? "s" : "", numa_status().interleaved ? " (pages interleaved)" : "");
  std::printf("prefill %4d tokens: %8.1f tok/s  (%.2f GFLOP/token, %.0f GFLOP/s = %.2f of the %.0f GFLOP/s FMA peak)\n", a.prompt, pps,
              flops / 1e9, pps * flops / 1e9, pps * flops / (peak * 1e9), peak);
  std::printf("        GEMM part:   %8.0f GFLOP/s = %.2f of the FMA peak\n", gemm_gflops, gemm_gflops / peak);
  std::printf("decode  %4d tokens: %8.1f tok/s  (%.1f MB/token, %.1f GB/s = %.2f of the %.1f GB/s read bandwidth)\n", a.gen, tgs,
              bytes / 1e6, tgs * bytes / 1e9, tgs * bytes / (bw * 1e9), bw);
  for (const char* phase : {"prefill_kernels", "decode_kernels"})
    for (auto& [k, v] : j[phase].items())
      std::printf("  %-8s %-15s %8.3f ms/token %8.1f GFLOP/s %7.1f GB/s\n", phase[0] == 'p' ? "prefill" : "decode", k.c_str(),
                  v["ms_per_token"].get<double>(), v["gflops"].get<double>(), v["gbps"].get<double>());
  if (j.contains("verify_step_ms"))
    std::printf("verify  %4d steps:  %8.2f ms/step for a token and its draft = %.2fx a one-token step (%.2f ms)\n", a.gen,
                j["verify_step_ms"].get<double>(), j["verify_over_decode_step"].get<double>(), j["decode_step_ms"].get<double>());
  if (!by_weight.empty()) std::printf("decode matrix products by weight (first of a multi-weight call; x jobs):\n");
  for (const auto& w : by_weight)
    std::printf("  %-16s %-8s %-8s x%-3d %5.1f calls/token %8.3f ms/token %7.1f GB/s\n", w["kernel"].get<std::string>().c_str(),
                w["dtype"].get<std::string>().c_str(), w["weight"].get<std::string>().c_str(), w["jobs"].get<int>(),
                w["calls_per_token"].get<double>(), w["ms_per_token"].get<double>(), w["gbps"].get<double>());
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
