// `dsa plan`: deployment planner and operator-level performance simulator. Answers how many
// devices, which layout, how much cache per user, TTFT/TPOT and cost per million tokens from
// a model config and a hardware profile, operator by operator.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cli_util.h"
#include "command.h"
#include "core/error.h"
#include "sim/comm_profile.h"
#include "sim/report.h"
#include "sim/search.h"
#include "sim/simulate.h"

namespace {

using namespace dsa::sim;

struct Args {
  std::string model = "deepseek-v3.2";
  std::string hardware = "h200";
  std::string weight, cache = "fp8";  // weight empty: what the checkpoint holds
  std::string kernel_table, comm, svg_cost, svg_throughput, compare;
  std::vector<int64_t> sweep_context, sweep_batch;
  bool json = false, no_ops = false, no_overlap = false, list = false, show_hardware = false;
  bool search = false;
  int max_devices = 256, top = 10;
  double max_ttft = 0, max_tpot = 0;
  PlanRequest req;
};

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) throw dsa::Error("cannot write '" + path + "'");
  out << text;
}

std::vector<SweepRow> run_sweeps(const SimModel& m, const Hardware& hw, const PlanRequest& req, const PlanResult& base,
                                 const Args& a, const KernelTable* kt) {
  std::vector<SweepRow> rows;
  for (int64_t ctx : a.sweep_context) {
    const PositionCost c = cost_at_position(m, hw, req, base, ctx, kt);
    rows.push_back({"context", ctx, c.tpot_ms, c.decode_tokens_per_s_per_device, c.decode_cost_per_m, c.prefill_cost_per_m,
                    c.fits});
  }
  for (int64_t b : a.sweep_batch) {
    PlanRequest r = req;
    r.batch = b;
    const PlanResult p = simulate(m, hw, r, kt);
    rows.push_back({"batch", b, p.tpot_ms, p.decode_tokens_per_s_per_device, p.decode_cost_per_m, p.prefill_cost_per_m,
                    p.decode_fits});
  }
  return rows;
}

void cost_plot(const SimModel& m, const Hardware& hw, const PlanRequest& req, const PlanResult& base, const Args& a,
               const KernelTable* kt) {
  // Positions up to 128K (the V3.2 paper's figure), or up to the last position every plotted
  // model can decode when one of them stops earlier.
  int64_t last = 131072;
  const SimModel other = a.compare.empty() ? m : load_model(a.compare);
  for (const SimModel* mm : {&m, &other})
    if (mm->cfg.max_position_embeddings > 0) last = std::min<int64_t>(last, mm->cfg.max_position_embeddings - 1 - req.opt.mtp);
  std::vector<int64_t> positions = {std::min<int64_t>(1024, last)};
  for (int64_t p = 8192; p < last; p += 8192) positions.push_back(p);
  if (positions.back() != last) positions.push_back(last);
  std::vector<Series> series;
  auto add = [&](const SimModel& mm, bool dashed) {
    PlanRequest r = req;
    r.batch = base.batch;
    const PlanResult b = simulate(mm, hw, r, kt);
    Series pre{mm.name + " prefill", {}, dashed}, dec{mm.name + " decode", {}, dashed};
    for (int64_t p : positions) {
      const PositionCost c = cost_at_position(mm, hw, r, b, p, kt);
      pre.points.emplace_back(double(p), c.prefill_cost_per_m);
      dec.points.emplace_back(double(p), c.decode_cost_per_m);
    }
    series.push_back(pre);
    series.push_back(dec);
  };
  add(m, false);
  if (!a.compare.empty()) add(other, true);
  char title[256];
  std::snprintf(title, sizeof title, "Cost per million tokens vs token position: %d x %s, $%.2f/device-hour, batch %lld",
                base.layout.devices(), hw.name.c_str(), base.price_per_hour, (long long)base.batch);
  write_file(a.svg_cost, svg_line_plot(title, "token position", "$ per million tokens", series, false));
}

void throughput_plot(const SimModel& m, const Hardware& hw, const PlanRequest& req, const PlanResult& base, const Args& a,
                     const KernelTable* kt) {
  Series s{"decode tokens/s per device", {}, false};
  const int devices = base.layout.devices();
  for (int64_t per = 1; per <= 256; per *= 2) {
    PlanRequest r = req;
    r.batch = per * devices;
    const PlanResult p = simulate(m, hw, r, kt);
    s.points.emplace_back(double(per), p.decode_tokens_per_s_per_device);
  }
  char title[256];
  std::snprintf(title, sizeof title, "%s on %d x %s: decode throughput vs batch (depth %lld)", m.name.c_str(), devices,
                hw.name.c_str(), (long long)base.context);
  write_file(a.svg_throughput, svg_line_plot(title, "sequences per device", "tokens/s per device", {s}, true));
}

// A kernel-table row that no operator matched is a misspelt op or shape: say so rather than
// let the roofline stand in for it without a word.
void warn_unmatched(const KernelTable* kt, const std::string& path) {
  if (!kt || kt->matched.size() >= kt->latency_us.size()) return;
  for (const auto& [key, us] : kt->latency_us)
    if (!kt->matched.count(key)) {
      std::fprintf(stderr, "warning: %s: %zu of %zu rows match no operator of this plan (first: %s,%s); shapes are as printed by --json\n",
                   path.c_str(), kt->latency_us.size() - kt->matched.size(), kt->latency_us.size(), key.first.c_str(),
                   key.second.c_str());
      return;
    }
}

void run(const Args& a) {
  if (a.list) {
    std::printf("models:");
    for (const auto& n : builtin_model_names()) std::printf(" %s", n.c_str());
    std::printf("\nhardware:");
    for (const auto& n : builtin_hardware_names()) std::printf(" %s", n.c_str());
    std::printf("\n");
    return;
  }
  // The model first: `local` streams its bf16 GEMV probe in rows as long as the model's
  // lm_head rows (hidden_size), which set how fast that probe reads.
  const SimModel m = load_model(a.model);
  // Several profiles (h200,b200,...) are compared by --search; a plain plan has one device.
  const std::vector<std::string> names = dsa::cli::split_commas(a.hardware);
  for (const auto& n : names)
    if (n.empty()) throw dsa::Error("--hardware '" + a.hardware + "': an empty name in the list");
  if (names.size() > 1 && !a.search)
    throw dsa::Error("--hardware " + a.hardware + ": several profiles are compared by --search; a plan takes one");
  std::vector<Hardware> hws;
  for (const auto& n : names) hws.push_back(load_hardware(n, m.cfg.hidden_size));
  if (!a.comm.empty()) {
    const CommMeasurement cm = load_comm_measurement(a.comm);
    for (Hardware& h : hws) {
      const std::string line = calibrate_links(h, cm);
      h.description += "; " + line + " (measured, " + a.comm + ")";
      h.sources += "; links fitted to " + a.comm;
    }
  }
  const Hardware& hw = hws[0];
  if (a.show_hardware) {
    std::printf("%s\n", hardware_to_json(hw).c_str());
    return;
  }
  PlanRequest req = a.req;
  // Weights are costed as the checkpoint stores them (the engine maps them, never converts),
  // unless --weight-dtype asks what another release or a quantized copy would do.
  req.opt.weight = a.weight.empty() ? (m.cfg.quant.fp8 ? WeightDtype::FP8 : WeightDtype::BF16) : parse_weight_dtype(a.weight);
  req.opt.cache = parse_cache_dtype(a.cache);
  req.overlap = !a.no_overlap;
  std::unique_ptr<KernelTable> kt;
  if (!a.kernel_table.empty()) kt = std::make_unique<KernelTable>(load_kernel_table(a.kernel_table));
  const PlanContext ctx{&m, &hw, &req};
  if (a.search) {
    SearchRequest sr;
    sr.base = req;
    sr.devices = req.devices;
    sr.max_devices = a.max_devices;
    sr.max_ttft_ms = a.max_ttft;
    sr.max_tpot_ms = a.max_tpot;
    const SearchResult res = search_hardware(m, hws, sr, kt.get());
    warn_unmatched(kt.get(), a.kernel_table);
    std::printf("%s%s",
                a.json ? format_search_json(ctx, hws, sr, res, a.top).c_str() : format_search_text(ctx, hws, sr, res, a.top).c_str(),
                a.json ? "\n" : "");
    return;
  }
  const PlanResult p = simulate(m, hw, req, kt.get());
  const std::vector<SweepRow> sweeps = run_sweeps(m, hw, req, p, a, kt.get());
  if (!a.svg_cost.empty()) cost_plot(m, hw, req, p, a, kt.get());
  if (!a.svg_throughput.empty()) throughput_plot(m, hw, req, p, a, kt.get());
  warn_unmatched(kt.get(), a.kernel_table);
  if (a.json) std::printf("%s\n", format_json(ctx, p, sweeps).c_str());
  else std::printf("%s", format_text(ctx, p, sweeps, !a.no_ops).c_str());
}

// How the devices split the model: tensor, data, expert and pipeline parallelism.
void add_layout_options(CLI::App* cmd, Args* a) {
  cmd->add_option("--devices", a->req.devices, "Devices in total (default: one node, or tp*dp*pp)")->check(dsa::cli::int_in(1, 1 << 20));
  cmd->add_option("--tp", a->req.tp, "Tensor-parallel ways for attention and dense layers")->capture_default_str()->check(dsa::cli::int_in(1, 1 << 20));
  cmd->add_option("--dp", a->req.dp, "Data-parallel attention groups (default: devices / (tp*pp))")->check(dsa::cli::int_in(1, 1 << 20));
  cmd->add_option("--ep", a->req.ep, "Expert-parallel ways for MoE (default: every device of a pipeline stage)")->check(dsa::cli::int_in(1, 1 << 20));
  cmd->add_flag("--replicated-attention", a->req.replicated_attention,
                "Every device of a pipeline stage attends for every sequence, as `dsa` does with --ep and no --dp: the experts "
                "split over the devices, one all-reduce per MoE layer sums their outputs, the head splits by vocabulary rows "
                "(default: data-parallel attention)");
  cmd->add_option("--redundant-experts", a->req.redundant_experts,
                  "Extra replicas of popular experts (EPLB), spread with the experts: ep must divide experts + these (default 0)")
      ->check(dsa::cli::int_in(0, 1 << 20));
  cmd->add_option("--pp", a->req.pp, "Pipeline stages")->capture_default_str()->check(dsa::cli::int_in(1, 1 << 20));
}

// The requests, the batch, the caches, MTP and the price.
void add_workload_options(CLI::App* cmd, Args* a) {
  cmd->add_option("--batch", a->req.batch,
                  "Concurrent sequences in the whole deployment (default: what fits in memory, at most 128 per device)")
      ->check(dsa::cli::int_in(1, int64_t(1) << 40));
  cmd->add_option("--input-len", a->req.input_len, "Prompt tokens per request")->capture_default_str()->check(dsa::cli::int_in(1, int64_t(1) << 30));
  cmd->add_option("--output-len", a->req.output_len, "Generated tokens per request")->capture_default_str()->check(dsa::cli::int_in(1, int64_t(1) << 30));
  cmd->add_option("--context", a->req.context, "Cached tokens at which decode is evaluated (default: input + output/2)")
      ->check(dsa::cli::int_in(0, int64_t(1) << 30));
  cmd->add_option("--prefill-batch", a->req.prefill_batch, "Prompts per data-parallel group in one prefill step")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", a->req.prefill_chunk,
                  "Tokens of a prompt per prefill step (chunked prefill; the workspace holds one chunk); 0: the whole prompt")
      ->capture_default_str()
      ->check(dsa::cli::int_in(0, dsa::cli::kMaxTokens));
  cmd->add_option("--cache-hit", a->req.cache_hit,
                  "Fraction of each prompt already in a prefix cache: prefill computes the rest and counts all")
      ->capture_default_str()
      ->check(dsa::cli::finite_in(0, 1));
  cmd->add_option("--weight-dtype", a->weight,
                  "Weights: fp8 (128x128 blocks), bf16, or nvfp4 (MLP/experts in fp4) (default: the checkpoint's, fp8 for the built-in models)");
  cmd->add_option("--kv-cache", a->cache, "MLA latent cache: fp8 (656 B/token/layer) or bf16 (1152)")->capture_default_str();
  cmd->add_option("--mtp", a->req.opt.mtp, "Multi-token-prediction draft tokens per decode step")->capture_default_str()->check(dsa::cli::int_in(0, 16));
  cmd->add_option("--acceptance", a->req.acceptance, "Acceptance rate of each draft token")->capture_default_str()->check(dsa::cli::finite_in(0, 1));
  cmd->add_option("--price", a->req.price_per_hour, "$ per device-hour (default: the profile's assumption)")->check(dsa::cli::finite_in(0, 1e9));
  cmd->add_flag("--no-overlap", a->no_overlap, "Do not overlap expert all-to-all with compute (single micro-batch)");
}

// Measurements that replace parts of the profile: the interconnect and kernel latencies.
void add_measured_inputs(CLI::App* cmd, Args* a) {
  cmd->add_option("--comm", a->comm,
                  "Interconnect measured on the real job: the JSON of mpirun -np N dsa bench comm --json, fitted to the profile's link "
                  "latency and bandwidth (several nodes: the inter-node link; one: the intra-node link, the ranks sharing the node)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--kernel-table", a->kernel_table,
                  "CSV of measured latencies (op,shape,latency_us) that override the roofline where they match")
      ->check(dsa::cli::regular_file());
}

// Sweeps, plots and the report's form.
void add_output_options(CLI::App* cmd, Args* a) {
  cmd->add_option("--sweep-context", a->sweep_context, "Decode depths to sweep (comma-separated)")->delimiter(',')->check(dsa::cli::int_in(0, int64_t(1) << 30));
  cmd->add_option("--sweep-batch", a->sweep_batch, "Deployment batch sizes to sweep (comma-separated)")->delimiter(',')->check(dsa::cli::int_in(1, int64_t(1) << 40));
  cmd->add_option("--svg-cost", a->svg_cost, "Write an SVG of cost per million tokens vs token position")->check(dsa::cli::non_empty());
  cmd->add_option("--svg-throughput", a->svg_throughput, "Write an SVG of decode throughput vs batch")->check(dsa::cli::non_empty());
  cmd->add_option("--compare", a->compare, "Second model for the cost plot (e.g. deepseek-v3 against deepseek-v3.2)");
  cmd->add_flag("--json", a->json, "Print one JSON object (all figures, per-op table, sweeps) instead of text");
  cmd->add_flag("--no-ops", a->no_ops, "Leave the per-operator tables out of the text report");
  cmd->add_flag("--list", a->list, "List built-in models and hardware profiles");
  cmd->add_flag("--show-hardware", a->show_hardware, "Print the hardware profile as JSON (a template for your own)");
}

// --search and its targets.
void add_search_options(CLI::App* cmd, Args* a) {
  auto* search = cmd->add_flag("--search", a->search,
                                "Search device counts, layouts and batch for the cheapest output tokens that meet "
                                "--max-ttft/--max-tpot (--devices fixes the count)");
  cmd->add_option("--max-devices", a->max_devices, "Largest device count --search tries")
      ->capture_default_str()
      ->check(dsa::cli::int_in(1, 1 << 20))
      ->needs(search);
  cmd->add_option("--max-ttft", a->max_ttft, "--search target: time to first token, ms")->check(dsa::cli::finite_in(0, 1e9))->needs(search);
  cmd->add_option("--max-tpot", a->max_tpot, "--search target: time per output token, ms")->check(dsa::cli::finite_in(0, 1e9))->needs(search);
  cmd->add_option("--top", a->top, "Candidates --search prints")->capture_default_str()->check(dsa::cli::int_in(1, 1 << 20))->needs(search);
}

void setup_plan(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "plan",
      "Plan a deployment: simulate prefill and decode operator by operator on a hardware profile\n"
      "(TTFT, TPOT, tokens/s per device, cost per million tokens, memory and cache capacity).\n"
      "With no options: DeepSeek-V3.2 on one 8 x H200 node.");
  cmd->add_option("--model", a->model,
                  "Built-in model (deepseek-v3.2, deepseek-v3.2-exp, deepseek-v3, glm-5, glm-5.2, v32-mini), "
                  "a model directory or a config.json")
      ->capture_default_str();
  cmd->add_option("--hardware", a->hardware,
                  "Hardware profile: h800, h100, h200, h20, b200, gb200, mi300x, ascend-910b, ascend-910c, "
                  "local (measure this CPU), or a profile JSON file; with --search, several (comma-separated)")
      ->capture_default_str();
  add_layout_options(cmd, a.get());
  add_workload_options(cmd, a.get());
  add_measured_inputs(cmd, a.get());
  add_output_options(cmd, a.get());
  add_search_options(cmd, a.get());
  cmd->callback([a, cmd] {
    // The search chooses these itself (or has no single plan to draw); one given as well
    // would be silently ignored.
    if (a->search)
      for (const char* name : {"--tp", "--dp", "--ep", "--pp", "--replicated-attention", "--redundant-experts", "--batch", "--context", "--sweep-context",
                               "--sweep-batch", "--svg-cost", "--svg-throughput", "--compare", "--no-ops"})
        if (cmd->count(name) > 0) throw dsa::Error(std::string("--search chooses the layout and batch itself: leave out ") + name);
    run(*a);
  });
}

}  // namespace

DSA_COMMAND(80, setup_plan);
