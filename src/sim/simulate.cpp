#include "sim/simulate.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "core/mmap_file.h"

namespace dsa::sim {

const double* KernelTable::find(const std::string& op, const std::string& shape) const {
  auto it = latency_us.find({op, shape});
  if (it == latency_us.end()) return nullptr;
  matched.insert(it->first);
  return &it->second;
}

KernelTable kernel_table_from_csv(const std::string& text, const std::string& where) {
  KernelTable t;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    std::stringstream ls(line);
    std::string x;
    while (std::getline(ls, x, ',')) f.push_back(x);
    if (f.size() != 3) throw Error(where + ":" + std::to_string(n) + ": expected 3 fields op,shape,latency_us");
    if (f[0] == "op" && n == 1) continue;  // header
    char* end = nullptr;
    const double us = std::strtod(f[2].c_str(), &end);
    if (end == f[2].c_str() || *end != '\0' || !(us >= 0) || !std::isfinite(us))
      throw Error(where + ":" + std::to_string(n) + ": latency_us must be a finite number >= 0, got '" + f[2] + "'");
    t.latency_us[{f[0], f[1]}] = us;
  }
  return t;
}

KernelTable load_kernel_table(const std::string& path) {
  return kernel_table_from_csv(read_text_file(path, "kernel table"), path);
}

static double efficiency(const Hardware& hw, const Op& op) {
  switch (op.cls) {
    case OpClass::AttentionDense:
      return op.phase == Phase::Prefill ? hw.eff.attention_dense_prefill : hw.eff.attention_dense;
    case OpClass::AttentionSparse:
      return op.phase == Phase::Prefill ? hw.eff.attention_sparse_prefill : hw.eff.attention_sparse_decode;
    case OpClass::Indexer: return hw.eff.indexer;
    case OpClass::Topk: return hw.eff.topk;
    default: return op.per_head ? hw.eff.gemm_heads : hw.eff.gemm;
  }
}

OpTime time_op(const Op& op, const Hardware& hw, const KernelTable* kt) {
  OpTime t;
  t.op = op;
  if (kt) {
    if (const double* us = kt->find(op.name, op.shape)) {
      t.time_us = *us * op.count;
      t.bound = "measured";
      return t;
    }
  }
  const bool is_comm = op.cls == OpClass::CommTP || op.cls == OpClass::CommEP || op.cls == OpClass::CommPP;
  if (is_comm) {
    const double intra = hw.intra_node_bandwidth_gbps > 0 ? op.comm_intra / (hw.intra_node_bandwidth_gbps * 1e9 * hw.eff.comm) : 0;
    const double inter = hw.inter_node_bandwidth_gbps > 0 ? op.comm_inter / (hw.inter_node_bandwidth_gbps * 1e9 * hw.eff.comm) : 0;
    const double lat = op.comm_inter > 0 ? hw.inter_node_latency_us : hw.intra_node_latency_us;
    // NVLink and NIC transfers proceed in parallel; each round pays one hop latency.
    t.comm_us = std::max(intra, inter) * 1e6 + op.comm_hops * lat;
    t.time_us = t.comm_us;
    t.bound = "communication";
    return t;
  }
  // Per-weight extra work: widening (every low-precision weight streamed) and, from
  // kPackedGemmMinRows rows per weight on, panel packing. Rows per weight = FLOPs / 2 per
  // weight element (for MoE experts: tokens per expert hit). bf16 weights need neither.
  // Decode-phase products on a profile that measured its decode GEMV: that kernel's cost
  // (it never packs, whatever the tokens per weight), the bf16 tile's own where measured.
  const bool low = op.bits <= 8;
  const bool gemv = op.phase == Phase::Decode && op.cls == OpClass::Gemm && hw.decode_gemv_efficiency > 0;
  const bool gemv_bf16 = gemv && !low && hw.decode_gemv_bf16_efficiency > 0;
  const double peak = hw.peak_flops(op.bits) * hw.eff.sustained;
  // Seconds at efficiency e with f FLOP-equivalents per weight beside the product's FLOPs.
  auto seconds = [&](double e, double f) { return (op.flops + op.weight_elems * f) / (peak * e); };
  double s = 0;
  if (gemv) {
    const double e1 = gemv_bf16 ? hw.decode_gemv_bf16_efficiency : hw.decode_gemv_efficiency;
    const double f1 = gemv_bf16 ? hw.decode_gemv_bf16_flops_per_weight : low ? hw.decode_gemv_flops_per_weight : 0;
    s = seconds(e1, f1);
    // Tokens past the bend at the steeper rate, where the profile measured one.
    const double e2 = gemv_bf16 ? hw.decode_gemv_bf16_many_efficiency : hw.decode_gemv_many_efficiency;
    const double past = op.weight_elems > 0 ? op.flops / (2.0 * op.weight_elems) - hw.decode_gemv_bend_tokens : 0;
    if (e2 > 0 && hw.decode_gemv_bend_tokens > 0 && past > 0) s += 2.0 * past * op.weight_elems / peak * (1.0 / e2 - 1.0 / e1);
  } else {
    double per_weight = 0;
    if (low) {
      per_weight = hw.dequant_flops_per_weight;
      if (op.weight_elems > 0 && op.flops / (2.0 * op.weight_elems) >= kPackedGemmMinRows) per_weight += hw.pack_flops_per_weight;
    }
    s = seconds(efficiency(hw, op), per_weight);
  }
  t.compute_us = s * 1e6;
  const double mem_eff = op.cls == OpClass::Memory ? hw.eff.elementwise : hw.eff.memory;
  t.memory_us = op.bytes / (hw.memory_bandwidth_gbps * 1e9 * mem_eff) * 1e6;
  t.time_us = std::max(t.compute_us, t.memory_us) + hw.launch_overhead_us * op.count;
  t.bound = t.compute_us >= t.memory_us ? "compute" : "memory";
  return t;
}

// One batch, every operator in turn: the all-to-all waits for the computation around it.
static PhaseResult cost_single(const SimModel& m, const Hardware& hw, const Layout& l, const Options& o, const Step& s,
                               const KernelTable* kt) {
  PhaseResult r;
  r.step = s;
  Options eo = o;
  eo.absorbed_prefill = o.absorbed_prefill || hw.prefill_absorbed;  // the engine the profile measured
  eo.engine_collectives = o.engine_collectives || hw.engine_collectives;
  for (const Op& op : op_plan(m, s, l, eo)) {
    OpTime t = time_op(op, hw, kt);
    if (op.cls == OpClass::CommEP) r.ep_comm_us += t.time_us;
    else if (op.cls == OpClass::CommTP || op.cls == OpClass::CommPP) r.other_comm_us += t.time_us;
    else r.compute_us += t.time_us;
    r.ops.push_back(std::move(t));
  }
  r.step_us = r.compute_us + r.ep_comm_us + r.other_comm_us;
  return r;
}

// The two halves of a step run as micro-batches: by sequences, or a lone prompt by chunks
// (the second attends to the first). One decode sequence cannot be split.
static bool split_step(const Step& s, Step& a, Step& b) {
  a = b = s;
  if (s.seqs >= 2) {
    a.seqs = s.seqs / 2;
    b.seqs = s.seqs - a.seqs;
    return true;
  }
  if (s.phase == Phase::Prefill && s.new_tokens >= 2) {
    a.new_tokens = s.new_tokens / 2;
    b.new_tokens = s.new_tokens - a.new_tokens;
    b.context = s.context + a.new_tokens;
    return true;
  }
  return false;
}

// A micro-batch's time in the four stages of a MoE layer that the two-micro-batch schedule
// interleaves: the expert all-to-all's two directions, the routed experts, and the rest of
// the computation (attention, shared expert, router, norms; the dense layers and the head
// are counted here too).
struct Stages {
  double rest = 0, experts = 0, dispatch = 0, combine = 0;
};
static bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}
static Stages stages(const PhaseResult& r) {
  Stages st;
  for (const OpTime& t : r.ops) {
    const std::string& n = t.op.name;
    if (ends_with(n, "moe.dispatch")) st.dispatch += t.time_us;
    else if (ends_with(n, "moe.combine")) st.combine += t.time_us;
    else if (t.op.cls == OpClass::CommEP || t.op.cls == OpClass::CommTP || t.op.cls == OpClass::CommPP) continue;
    else if (ends_with(n, "moe.experts_gate_up") || ends_with(n, "moe.experts_down") || ends_with(n, "moe.act") ||
             ends_with(n, "moe.gather_tokens") || ends_with(n, "moe.sum_outputs"))
      st.experts += t.time_us;
    else st.rest += t.time_us;
  }
  return st;
}

// Adds b's operator rows (matched by name: two halves of a prompt may pick different
// attention forms) and times into `into`; the step times add.
static void add_phase(PhaseResult& into, const PhaseResult& b) {
  into.compute_us += b.compute_us;
  into.ep_comm_us += b.ep_comm_us;
  into.other_comm_us += b.other_comm_us;
  into.step_us += b.step_us;
  into.micro_batches = std::max(into.micro_batches, b.micro_batches);
  for (const OpTime& u : b.ops) {
    auto t = std::find_if(into.ops.begin(), into.ops.end(), [&](const OpTime& x) { return x.op.name == u.op.name; });
    if (t == into.ops.end()) {
      into.ops.push_back(u);
      continue;
    }
    t->op.count += u.op.count;
    t->op.flops += u.op.flops;
    t->op.bytes += u.op.bytes;
    t->op.weight_elems += u.op.weight_elems;
    t->op.comm_intra += u.op.comm_intra;
    t->op.comm_inter += u.op.comm_inter;
    t->op.comm_hops += u.op.comm_hops;
    if (u.op.shape != t->op.shape) t->op.shape += " + " + u.op.shape;
    t->compute_us += u.compute_us;
    t->memory_us += u.memory_us;
    t->comm_us += u.comm_us;
    t->time_us += u.time_us;
    if (t->bound != u.bound) t->bound = t->time_us - u.time_us >= u.time_us ? t->bound : u.bound;
  }
}

PhaseResult cost_step(const SimModel& m, const Hardware& hw, const Layout& l, const Options& o, const Step& s,
                      const KernelTable* kt, bool overlap) {
  PhaseResult one = cost_single(m, hw, l, o, s, kt);
  Step sa, sb;
  // Replicated attention sums the experts with an all-reduce, not the dispatch and combine
  // this schedule interleaves; this engine runs a step as one batch.
  if (!overlap || l.rep > 1 || hw.engine_collectives || one.ep_comm_us <= 0 || !split_step(s, sa, sb)) return one;
  // Two micro-batches (DeepSeek's and TensorRT-LLM's wide-EP serving, SGLang's two-batch
  // overlap): in every MoE layer each stage of one runs beside a stage of the other,
  //   [rest 0 | combine 1]  [dispatch 0 | rest 1]  [experts 0 | dispatch 1]  [combine 0 | experts 1],
  // and each pair takes the longer of the two, so communication hides only behind the
  // computation it is paired with (at best the step is the longer of all computation and all
  // communication). Each half reads the weights again and pays every message latency again,
  // which is why splitting only pays when there is enough communication to hide; the faster
  // schedule is taken.
  const PhaseResult a = cost_single(m, hw, l, o, sa, kt), b = cost_single(m, hw, l, o, sb, kt);
  const Stages x = stages(a), y = stages(b);
  const double split_us = std::max(x.rest, y.combine) + std::max(x.dispatch, y.rest) + std::max(x.experts, y.dispatch) +
                          std::max(x.combine, y.experts) + a.other_comm_us + b.other_comm_us;
  if (split_us >= one.step_us) return one;
  PhaseResult r = a;  // the same operator list; each row now sums both micro-batches
  add_phase(r, b);
  r.step = s;
  r.micro_batches = 2;
  r.step_us = split_us;
  return r;
}

// The work of a step that one pipeline stage does once: the embedding (first stage), the final
// norm, the head and its gather, and the MTP layer (last stage).
static double edge_stage_us(const PhaseResult& r) {
  double us = 0;
  for (const OpTime& t : r.ops) {
    const std::string& n = t.op.name;
    if (n == "embed" || n == "final_norm" || n == "lm_head" || n == "head.allgather" || n.rfind("mtp.", 0) == 0) us += t.time_us;
  }
  return us;
}

// Micro-batches of `seqs` sequences that a batch fills in each dp group (at most pp).
static int64_t micro_batches_in_flight(int64_t batch, const Layout& l, int64_t seqs) {
  return std::clamp<int64_t>((batch + l.dp * seqs - 1) / (l.dp * seqs), 1, l.pp);
}

double pipeline_round_us(const PhaseResult& r, int pp, int64_t micro_batches) {
  // step_us is the average stage's layers plus all the edge work: the last stage, the
  // slowest. A micro-batch's own pass runs every stage in turn (the layers once, the edge
  // work once), and mb micro-batches in flight need mb of the slowest stage's steps.
  const double edge = edge_stage_us(r);
  const double pass = (r.step_us - edge) * pp + edge;
  return std::max(pass, double(micro_batches) * r.step_us);
}

Layout resolve_layout(const PlanRequest& r, const Hardware& hw) {
  // 0 means "derive it" for devices, dp and ep; tp and pp have no automatic value.
  if (r.tp < 1 || r.pp < 1) throw Error("--tp and --pp must be at least 1");
  if (r.devices < 0 || r.dp < 0 || r.ep < 0) throw Error("--devices, --dp and --ep must be positive (or left out)");
  Layout l;
  l.devices_per_node = std::max(1, hw.devices_per_node);
  l.tp = r.tp;
  l.pp = r.pp;
  // Default: one node (at most 8 devices; 1 for the local CPU), or what tp/dp/pp imply.
  int devices = r.devices;
  if (devices <= 0) devices = r.dp > 0 ? l.tp * r.dp * l.pp : std::max(std::min(l.devices_per_node, 8), l.tp * l.pp);
  if (devices % (l.tp * l.pp) != 0)
    throw Error("--devices " + std::to_string(devices) + " is not a multiple of tp*pp = " + std::to_string(l.tp * l.pp));
  if (r.replicated_attention) {
    if (r.dp > 1)
      throw Error("--replicated-attention runs every sequence's attention on every device of a stage: leave out --dp " + std::to_string(r.dp));
    l.dp = 1;
    l.rep = devices / (l.tp * l.pp);
  } else {
    l.dp = r.dp > 0 ? r.dp : devices / (l.tp * l.pp);
  }
  if (l.tp * l.dp * l.rep * l.pp != devices)
    throw Error("tp*dp*pp = " + std::to_string(l.tp * l.dp * l.pp) + " does not match --devices " + std::to_string(devices));
  l.ep = r.ep > 0 ? r.ep : l.tp * l.dp * l.rep;
  l.redundant_experts = r.redundant_experts;
  if (devices > l.devices_per_node && !(hw.inter_node_bandwidth_gbps > 0))
    throw Error("--devices " + std::to_string(devices) + " spans several nodes, but hardware profile '" + hw.name +
                "' gives no inter_node_bandwidth_gbps");
  l.validate();
  return l;
}

// Positions past max_position_embeddings are outside what the model was built for (its RoPE
// tables stop there, and the engine refuses them): a plan for them would cost a model nobody
// can run. `tokens` counts positions 0 .. tokens-1.
static void check_positions(const SimModel& m, int64_t tokens, const std::string& what) {
  const int64_t max_pos = m.cfg.max_position_embeddings;
  if (max_pos > 0 && tokens > max_pos)
    throw Error(what + " = " + std::to_string(tokens) + " positions exceeds " + m.name + "'s max_position_embeddings (" +
                std::to_string(max_pos) + ")");
}

static double tokens_per_step(const PlanRequest& r) {
  double t = 1, a = 1;
  for (int i = 0; i < r.opt.mtp; ++i) {
    a *= r.acceptance;
    t += a;
  }
  return t;
}

// Whether one device's cache holds a dp group's `group_seqs` sequences of `tokens` tokens:
// every device of a tp group holds the whole latent of its group's sequences (MLA's one
// latent head cannot be split), pipeline stages hold their own layers' share.
static bool cache_holds(const MemoryPlan& mem, int64_t group_seqs, int64_t tokens) {
  return mem.fits && group_seqs * tokens <= mem.max_cached_tokens_per_device;
}

double plan_price_per_hour(const Hardware& hw, const PlanRequest& r) {
  return r.price_per_hour >= 0 ? r.price_per_hour : hw.price_per_hour;
}

double cost_per_million(double price_per_hour, double tokens_per_s) {
  return tokens_per_s > 0 ? price_per_hour / 3600.0 / tokens_per_s * 1e6 : 0.0;
}

PlanResult simulate(const SimModel& m, const Hardware& hw, const PlanRequest& r, const KernelTable* kt) {
  if (r.input_len < 1 || r.output_len < 1) throw Error("--input-len and --output-len must be positive");
  if (r.prefill_batch < 1) throw Error("--prefill-batch must be positive");
  if (r.prefill_chunk < 0) throw Error("--prefill-chunk must not be negative (0: the whole prompt in one step)");
  if (!(r.cache_hit >= 0 && r.cache_hit < 1)) throw Error("--cache-hit must be in [0, 1)");
  if (r.opt.mtp < 0) throw Error("--mtp must not be negative");
  if (r.batch < 0 || r.context < -1) throw Error("--batch and --context must not be negative");
  if (r.pp > m.cfg.num_hidden_layers)
    throw Error("--pp " + std::to_string(r.pp) + " exceeds the model's " + std::to_string(m.cfg.num_hidden_layers) + " layers");
  if (r.opt.mtp > 0 && !(r.acceptance >= 0 && r.acceptance <= 1)) throw Error("--acceptance must be in [0, 1]");
  check_positions(m, r.input_len + r.output_len, "--input-len " + std::to_string(r.input_len) + " + --output-len " + std::to_string(r.output_len));
  if (r.context >= 0)  // the decode step verifies 1 + mtp tokens after the context
    check_positions(m, r.context + 1 + r.opt.mtp, "--context " + std::to_string(r.context) + " + " + std::to_string(1 + r.opt.mtp) + " decoded");
  PlanResult p;
  p.layout = resolve_layout(r, hw);
  const Layout& l = p.layout;
  const int devices = l.devices();
  p.context = r.context >= 0 ? r.context : r.input_len + r.output_len / 2;
  p.tokens_per_step = tokens_per_step(r);
  p.price_per_hour = plan_price_per_hour(hw, r);
  const int64_t decode_depth = p.context + 1 + r.opt.mtp;  // cached tokens per sequence during a decode step

  // Memory first: the automatic batch is what fits (sequences of input+output tokens), at
  // most 128 per device (DeepSeek's decode profile runs 128 per GPU; beyond it decode is
  // compute-bound and only latency grows).
  const int64_t cap_batch = int64_t(128) * devices;
  const int64_t probe_seqs = (r.batch > 0 ? r.batch : cap_batch);
  const int64_t step_tokens = (probe_seqs + l.dp * l.pp - 1) / (l.dp * l.pp) * (1 + r.opt.mtp);
  // Prefill: each data-parallel group runs prefill_batch prompts of input_len tokens, of
  // which the cached prefix (cache_hit) is only attended to; the rest goes in chunks.
  const int64_t hit = std::min<int64_t>(r.input_len - 1, int64_t(std::llround(r.cache_hit * double(r.input_len))));
  const int64_t computed = r.input_len - hit;
  const int64_t chunk = r.prefill_chunk > 0 ? std::min(r.prefill_chunk, computed) : computed;
  p.memory = plan_memory(m, hw, l, r.opt, step_tokens, r.prefill_batch * chunk, hit + computed - chunk);
  if (r.batch > 0) {
    p.batch = r.batch;
  } else {
    p.batch_auto = true;
    const int64_t depth = std::max(r.input_len + r.output_len, decode_depth);
    const int64_t per_group = p.memory.max_cached_tokens_per_device / depth;
    p.batch = std::clamp<int64_t>(per_group * l.dp, 1, cap_batch);
  }

  for (int64_t done = 0; done < computed; done += chunk) {
    const Step ps{Phase::Prefill, r.prefill_batch, std::min(chunk, computed - done), hit + done};
    const PhaseResult ph = cost_step(m, hw, l, r.opt, ps, kt, r.overlap);
    if (done == 0) p.prefill = ph;
    else add_phase(p.prefill, ph);
    p.prefill.steps = int((done + chunk) / chunk);
  }
  p.prefill.step = Step{Phase::Prefill, r.prefill_batch, computed, hit};
  p.ttft_ms = pipeline_round_us(p.prefill, l.pp, 1) / 1e3;  // a lone prompt's pass
  p.prefill_tokens_per_s_per_device =
      double(r.prefill_batch) * double(r.input_len) * l.dp / (p.prefill.step_us / 1e6) / devices;
  p.prefill_computed_tokens_per_s_per_device = p.prefill_tokens_per_s_per_device * double(r.input_len - hit) / double(r.input_len);

  // Decode: the batch is spread over dp groups and pp micro-batches; each step verifies
  // 1 + mtp tokens per sequence and keeps tokens_per_step of them on average.
  const int64_t seqs = std::max<int64_t>(1, (p.batch + l.dp * l.pp - 1) / (l.dp * l.pp));
  const int64_t mb = micro_batches_in_flight(p.batch, l, seqs);
  const Step ds{Phase::Decode, seqs, 1 + r.opt.mtp, p.context};
  p.decode = cost_step(m, hw, l, r.opt, ds, kt, r.overlap);
  p.decode_cached_tokens_per_device = seqs * l.pp * decode_depth;
  p.decode_fits = cache_holds(p.memory, seqs * l.pp, decode_depth);
  const double round_s = pipeline_round_us(p.decode, l.pp, mb) / 1e6;  // every sequence advances once
  p.tpot_ms = round_s * 1e3 / p.tokens_per_step;
  p.decode_tokens_per_s_per_device = double(seqs) * l.dp * double(mb) * p.tokens_per_step / round_s / devices;

  // Prefill and decode sharing the same devices (no disaggregation): every sequence costs
  // its share of a prefill step and output_len/tokens_per_step decode rounds.
  const double prefill_s = double(seqs) * double(mb) / double(r.prefill_batch) * p.prefill.step_us / 1e6;
  const double decode_s = double(r.output_len) / p.tokens_per_step * round_s;
  p.e2e_output_tokens_per_s_per_device = double(seqs) * l.dp * double(mb) * double(r.output_len) / (prefill_s + decode_s) / devices;

  p.prefill_cost_per_m = cost_per_million(p.price_per_hour, p.prefill_tokens_per_s_per_device);
  p.decode_cost_per_m = cost_per_million(p.price_per_hour, p.decode_tokens_per_s_per_device);
  return p;
}

PositionCost cost_at_position(const SimModel& m, const Hardware& hw, const PlanRequest& r, const PlanResult& base,
                              int64_t position, const KernelTable* kt, int64_t chunk) {
  const Layout& l = base.layout;
  const int devices = l.devices();
  check_positions(m, position + 1 + r.opt.mtp, "position " + std::to_string(position) + " + " + std::to_string(1 + r.opt.mtp) + " decoded");
  PositionCost c;
  c.position = position;
  const int64_t n = std::max<int64_t>(1, std::min(chunk, position));
  const Step ps{Phase::Prefill, r.prefill_batch, n, std::max<int64_t>(0, position - n)};
  const PhaseResult pr = cost_step(m, hw, l, r.opt, ps, kt, r.overlap);
  const double prefill_tps = double(r.prefill_batch) * double(n) * l.dp / (pr.step_us / 1e6) / devices;
  const int64_t seqs = std::max<int64_t>(1, (base.batch + l.dp * l.pp - 1) / (l.dp * l.pp));
  const int64_t mb = micro_batches_in_flight(base.batch, l, seqs);
  const Step ds{Phase::Decode, seqs, 1 + r.opt.mtp, position};
  const PhaseResult dr = cost_step(m, hw, l, r.opt, ds, kt, r.overlap);
  c.fits = cache_holds(base.memory, seqs * l.pp, position + 1 + r.opt.mtp);
  const double round_s = pipeline_round_us(dr, l.pp, mb) / 1e6;
  c.tpot_ms = round_s * 1e3 / base.tokens_per_step;
  c.decode_tokens_per_s_per_device = double(seqs) * l.dp * double(mb) * base.tokens_per_step / round_s / devices;
  c.prefill_cost_per_m = cost_per_million(base.price_per_hour, prefill_tps);
  c.decode_cost_per_m = cost_per_million(base.price_per_hour, c.decode_tokens_per_s_per_device);
  return c;
}

}  // namespace dsa::sim
