#include "sim/cost.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "core/error.h"
#include "model/weights.h"

namespace dsa::sim {

const char* phase_name(Phase p) { return p == Phase::Prefill ? "prefill" : "decode"; }

const char* op_class_name(OpClass c) {
  switch (c) {
    case OpClass::Gemm: return "gemm";
    case OpClass::AttentionDense: return "attention_dense";
    case OpClass::AttentionSparse: return "attention_sparse";
    case OpClass::Indexer: return "indexer";
    case OpClass::Topk: return "topk";
    case OpClass::Memory: return "memory";
    case OpClass::CommTP: return "comm_tp";
    case OpClass::CommEP: return "comm_ep";
    case OpClass::CommPP: return "comm_pp";
  }
  return "?";
}

WeightDtype parse_weight_dtype(const std::string& s) {
  if (s == "fp8") return WeightDtype::FP8;
  if (s == "bf16") return WeightDtype::BF16;
  if (s == "nvfp4" || s == "fp4") return WeightDtype::NVFP4;
  throw Error("unknown weight dtype '" + s + "' (expected fp8, bf16 or nvfp4)");
}

CacheDtype parse_cache_dtype(const std::string& s) {
  if (s == "fp8") return CacheDtype::FP8;
  if (s == "bf16") return CacheDtype::BF16;
  throw Error("unknown kv-cache dtype '" + s + "' (expected fp8 or bf16)");
}

void Layout::validate() const {
  auto pos = [](const char* what, int v) {
    if (v < 1) throw Error(std::string("--") + what + " must be at least 1, got " + std::to_string(v));
  };
  pos("tp", tp);
  pos("dp", dp);
  pos("ep", ep);
  pos("pp", pp);
  if (rep < 1) throw Error("attention replicas must be at least 1, got " + std::to_string(rep));
  if (rep > 1 && dp > 1)
    throw Error("--replicated-attention runs every sequence's attention on every device of a stage: it has no data-parallel groups "
                "(--dp " + std::to_string(dp) + ")");
  if (redundant_experts < 0) throw Error("--redundant-experts must not be negative, got " + std::to_string(redundant_experts));
  if ((tp * dp * rep) % ep != 0)
    throw Error("--ep " + std::to_string(ep) + " must divide the " + std::to_string(tp * dp * rep) +
                " devices of a pipeline stage (experts are spread over them)");
}

double weight_bytes_per_elem(WeightDtype w) {
  switch (w) {
    case WeightDtype::FP8: return 1.0 + 4.0 / (128.0 * 128.0);
    case WeightDtype::BF16: return 2.0;
    case WeightDtype::NVFP4: return 0.5 + 1.0 / 16.0;
  }
  return 2.0;
}

double mla_cache_bytes(const SimModel& m, CacheDtype c) {
  const auto& k = m.cfg;
  if (c == CacheDtype::FP8) return ModelConfig::mla_cache_bytes_fp8(k.kv_lora_rank, k.qk_rope_head_dim);
  return 2.0 * (k.kv_lora_rank + k.qk_rope_head_dim);
}

double indexer_cache_bytes(const SimModel& m) { return ModelConfig::indexer_cache_bytes(m.cfg.index_head_dim); }

double cache_bytes_per_token(const SimModel& m, const Options& o) {
  double b = 0;
  const int L = m.cfg.num_hidden_layers;
  for (int l = 0; l < L; ++l) b += mla_cache_bytes(m, o.cache) + (m.has_indexer && m.cfg.is_indexer_full(l) ? indexer_cache_bytes(m) : 0);
  if (o.mtp > 0 && m.cfg.num_nextn_predict_layers > 0) b += mla_cache_bytes(m, o.cache) + (m.has_indexer ? indexer_cache_bytes(m) : 0);
  return b;
}

double sum_keys(int64_t c, int64_t n, int64_t cap) {
  // Queries j = 1..n see c + j keys; those below the cap contribute an arithmetic series.
  if (n <= 0) return 0;
  const int64_t first = c + 1, last = c + n;
  if (last <= cap) return double(n) * double(first + last) / 2.0;
  if (first > cap) return double(n) * double(cap);
  const int64_t below = cap - c;  // queries j = 1..below see c + j <= cap keys
  return double(below) * double(first + cap) / 2.0 + double(n - below) * double(cap);
}

namespace {

constexpr int64_t kNoCap = std::numeric_limits<int64_t>::max() / 4;
// Dense attention and the indexer read each cached key once per sequence and step: the
// queries of a step (MTP verify tokens, a prefill chunk's tiles) share it through registers,
// shared memory or L2. Sparse attention gathers each query's own top-k rows.

struct Builder {
  const SimModel& m;
  const Layout& l;
  const Options& o;
  Phase phase;
  std::vector<Op> ops;
  std::unordered_map<std::string, size_t> index;
  std::string prefix;
  double weight = 1.0;  // count multiplier (1/pp for layers, mtp for draft passes)

  void add(Op op) {
    op.name = prefix + op.name;
    op.phase = phase;
    op.count = weight;
    op.flops *= weight;
    op.bytes *= weight;
    op.weight_elems *= weight;
    op.comm_intra *= weight;
    op.comm_inter *= weight;
    op.comm_hops *= weight;
    auto it = index.find(op.name);
    if (it == index.end()) {
      index.emplace(op.name, ops.size());
      ops.push_back(std::move(op));
      return;
    }
    Op& e = ops[it->second];
    e.count += op.count;
    e.flops += op.flops;
    e.bytes += op.bytes;
    e.weight_elems += op.weight_elems;
    e.comm_intra += op.comm_intra;
    e.comm_inter += op.comm_inter;
    e.comm_hops += op.comm_hops;
  }

  // y[M,N] = x[M,K] * W[N,K]^T. Activations enter at 1 byte for fp8/fp4 GEMMs (quantized
  // on the fly), 2 bytes otherwise; outputs leave as bf16.
  void gemm(const char* name, double M, double N, double K, WeightDtype w, bool bf16_weight = false) {
    Op op;
    op.name = name;
    op.cls = OpClass::Gemm;
    const double wb = bf16_weight ? 2.0 : weight_bytes_per_elem(w);
    op.bits = bf16_weight ? 16 : w == WeightDtype::FP8 ? 8 : w == WeightDtype::NVFP4 ? 4 : 16;
    const double act = op.bits <= 8 ? 1.0 : 2.0;
    op.flops = 2.0 * M * N * K;
    op.bytes = N * K * wb + M * K * act + M * N * 2.0;
    op.weight_elems = N * K;
    op.shape = "M=" + std::to_string(int64_t(M)) + ";N=" + std::to_string(int64_t(N)) + ";K=" + std::to_string(int64_t(K));
    add(std::move(op));
  }

  void memory(const char* name, double bytes, double flops, const std::string& shape) {
    Op op;
    op.name = name;
    op.cls = OpClass::Memory;
    op.bytes = bytes;
    op.flops = flops;
    op.shape = shape;
    add(std::move(op));
  }

  void comm(const char* name, OpClass cls, double intra, double inter, double hops, const std::string& shape) {
    Op op;
    op.name = name;
    op.cls = cls;
    op.comm_intra = intra;
    op.comm_inter = inter;
    op.comm_hops = hops;
    op.shape = shape;
    add(std::move(op));
  }
  // A collective among `ranks` devices: over NVLink-class links within a node, else over the
  // network.
  void comm_among(const char* name, OpClass cls, double bytes, double ranks, double hops, const std::string& shape) {
    const bool inter = ranks > l.devices_per_node;
    comm(name, cls, inter ? 0 : bytes, inter ? bytes : 0, hops, shape);
  }

  WeightDtype attn_w() const { return o.weight == WeightDtype::BF16 ? WeightDtype::BF16 : WeightDtype::FP8; }

  static std::string token_shape(double T) { return "T=" + std::to_string(int64_t(T)); }
  // Attention heads on this device.
  double heads() const { return double(m.cfg.num_attention_heads) / l.tp; }

  void layer(int li, const Step& s) {
    const auto& c = m.cfg;
    const double T = double(s.seqs) * double(s.new_tokens);
    attention_in(T);
    if (m.has_indexer && c.is_indexer_full(li)) indexer(T, s);
    attention_core(T, s);
    const double cb = mla_cache_bytes(m, o.cache);
    gemm("attn.o_proj", T, c.hidden_size, heads() * c.v_head_dim, attn_w());
    memory("attn.cache_write", T * cb, 0.0, token_shape(T));
    if (l.tp > 1) {
      // The engine gathers the heads' outputs, then o_proj's rows (mla.cpp).
      if (o.engine_collectives) tp_gathers(T, T * c.num_attention_heads * c.v_head_dim);
      else allreduce(T);
    }
    if (c.is_moe_layer(li)) moe(T, s);
    else mlp(T);
    if (l.tp > 1 && !o.engine_collectives) allreduce(T);
  }

  // The norms and the query and latent projections, with RoPE.
  void attention_in(double T) {
    const auto& c = m.cfg;
    const double h = c.hidden_size, ql = c.q_lora_rank, kvl = c.kv_lora_rank, rope = c.qk_rope_head_dim, H = heads();
    const WeightDtype aw = attn_w();
    memory("layer.norms", T * (2 * h + ql + kvl) * 2.0 * 2.0, T * 4.0 * (2 * h + ql + kvl), token_shape(T));
    gemm("attn.q_a_proj", T, ql, h, aw);
    gemm("attn.kv_a_proj", T, kvl + rope, h, aw);
    gemm("attn.q_b_proj", T, H * c.qk_head_dim(), ql, aw);
    // RoPE of every head's query and of the shared key, in place (bf16 in and out).
    memory("attn.rope", T * (H + 1) * rope * 2.0 * 2.0, T * (H + 1) * rope * 3.0, token_shape(T));
  }

  // A layer with its own lightning indexer: its projections, the scan over every cached key
  // and the top-k.
  void indexer(double T, const Step& s) {
    const auto& c = m.cfg;
    const double h = c.hidden_size, ql = c.q_lora_rank, IH = c.index_n_heads, D = c.index_head_dim;
    const WeightDtype aw = attn_w();
    gemm("indexer.wq_b", T, IH * D, ql, aw);
    gemm("indexer.wk", T, D, h, aw);
    ops[index.at(prefix + "indexer.wk")].bytes += T * indexer_cache_bytes(m) * weight;  // k cache write
    gemm("indexer.weights_proj", T, IH, h, aw, /*bf16_weight=*/true);
    // Each head's query and the token's key: RoPE, Hadamard rotation and fp8 quantization
    // (bf16 in, fp8 out; log2(128) = 7 butterfly additions per value plus the rotation,
    // the block max and the scaling).
    memory("indexer.quant", T * (IH + 1) * D * 3.0, T * (IH + 1) * D * 10.0, token_shape(T));
    const double keys_all = sum_keys(s.context, s.new_tokens, kNoCap);
    const double visible = double(s.context + s.new_tokens);
    Op score;
    score.name = "indexer.score";
    score.cls = OpClass::Indexer;
    score.bits = 8;
    score.flops = double(s.seqs) * keys_all * 2.0 * IH * D;
    score.bytes = double(s.seqs) * visible * indexer_cache_bytes(m) +
                  T * IH * D + double(s.seqs) * keys_all * 4.0;  // keys, fp8 q, fp32 logits out
    score.shape = "seqs=" + std::to_string(s.seqs) + ";new=" + std::to_string(s.new_tokens) +
                  ";ctx=" + std::to_string(s.context) + ";H=" + std::to_string(int64_t(IH));
    add(std::move(score));
    // Top-k of index_topk among every scored key: one pass over the fp32 logits in memory
    // terms (GPU radix selects keep the histogram passes on chip); its compute side counts
    // one operation per key, which the `topk` efficiency turns into the selection rate a
    // CPU radix select reaches over its several passes.
    Op tk;
    tk.name = "indexer.topk";
    tk.cls = OpClass::Topk;
    tk.bytes = double(s.seqs) * keys_all * 4.0;
    tk.flops = double(s.seqs) * keys_all;
    tk.shape = score_shape(s);
    add(std::move(tk));
  }

  // Decode always runs the absorbed (MQA, 576/512) form. Prefill of a dense model runs the
  // expanded (MHA, 192/128) form, as DeepSeek does; a sparse model uses it too ("masked MHA
  // mode") while that costs fewer FLOPs than the absorbed sparse form, i.e. for short prompts.
  // An engine that runs prefill absorbed too (Options::absorbed_prefill) never expands.
  bool expanded_attention(const Step& s) const {
    if (s.phase != Phase::Prefill || o.absorbed_prefill) return false;
    if (!m.has_indexer) return true;
    const auto& c = m.cfg;
    const double kvl = c.kv_lora_rank, rope = c.qk_rope_head_dim, nope = c.qk_nope_head_dim, vd = c.v_head_dim, H = heads();
    const double keys = sum_keys(s.context, s.new_tokens, int64_t(c.index_topk));
    const double visible = double(s.context + s.new_tokens);
    const double dense_keys = sum_keys(s.context, s.new_tokens, kNoCap);
    const double mha = dense_keys * 2.0 * H * (c.qk_head_dim() + vd) + visible * 2.0 * H * (nope + vd) * kvl;  // per sequence
    const double mqa = keys * 2.0 * H * (2.0 * kvl + rope) + double(s.new_tokens) * 2.0 * H * kvl * (nope + vd);  // per sequence
    return mha <= mqa;
  }

  // One of kv_b's halves applied per head in the absorbed form: q_nope into the latent space
  // (K half), or the latent output back to values (V half).
  void absorb(const char* name, double T, double in, double out) {
    const WeightDtype aw = attn_w();
    const double H = heads();
    Op op;
    op.name = name;
    op.cls = OpClass::Gemm;
    op.bits = aw == WeightDtype::FP8 ? 8 : 16;
    op.flops = 2.0 * T * H * in * out;
    op.bytes = H * in * out * weight_bytes_per_elem(aw) + T * H * in * 2.0 + T * H * out * 2.0;
    op.weight_elems = H * in * out;
    op.per_head = true;
    op.shape = token_shape(T) + ";H=" + std::to_string(int64_t(H));
    add(std::move(op));
  }

  // Scores and the weighted sum over the visible (dense, or the indexer's top-k) keys.
  void attention_core(double T, const Step& s) {
    const auto& c = m.cfg;
    const double kvl = c.kv_lora_rank, rope = c.qk_rope_head_dim, nope = c.qk_nope_head_dim, vd = c.v_head_dim;
    const double qk = c.qk_head_dim(), H = heads();
    const double keys = sum_keys(s.context, s.new_tokens, m.has_indexer ? int64_t(c.index_topk) : kNoCap);
    const double visible = double(s.context + s.new_tokens);
    const double cb = mla_cache_bytes(m, o.cache);
    const bool expanded = expanded_attention(s);
    Op core;
    core.name = "attn.core";
    core.bits = 16;  // fp8 caches are dequantized to bf16 before the MMA (FlashMLA)
    core.shape = score_shape(s) + ";H=" + std::to_string(int64_t(H));
    if (expanded) {
      gemm("attn.kv_b_proj", double(s.seqs) * visible, H * (nope + vd), kvl, attn_w());
      core.cls = OpClass::AttentionDense;
      core.flops = double(s.seqs) * sum_keys(s.context, s.new_tokens, kNoCap) * 2.0 * H * (qk + vd);
      core.bytes = double(s.seqs) * visible * H * (qk + vd) * 2.0 + T * H * (qk + vd) * 2.0;
    } else {
      absorb("attn.q_absorb", T, nope, kvl);
      core.cls = m.has_indexer ? OpClass::AttentionSparse : OpClass::AttentionDense;
      core.flops = double(s.seqs) * keys * 2.0 * H * (2.0 * kvl + rope);
      // Sparse queries gather their own top-k rows; dense ones share each cached key.
      const double key_bytes = m.has_indexer ? double(s.seqs) * keys * cb : double(s.seqs) * visible * cb;
      core.bytes = key_bytes + T * H * (kvl + rope) * 2.0 + T * H * kvl * 2.0;
    }
    add(std::move(core));
    if (!expanded) absorb("attn.v_up", T, kvl, vd);
  }

  // A dense layer's MLP.
  void mlp(double T) {
    const double I = double(m.cfg.intermediate_size) / l.tp;
    gemm("mlp.gate_up", T, 2 * I, m.cfg.hidden_size, o.weight);
    memory("mlp.act", T * I * 3.0 * 2.0, T * I * 4.0, token_shape(T));  // silu(gate) * up
    gemm("mlp.down", T, m.cfg.hidden_size, I, o.weight);
    // The engine gathers the intermediate's parts, then down_proj's rows (mlp.cpp).
    if (l.tp > 1 && o.engine_collectives) tp_gathers(T, T * double(m.cfg.intermediate_size));
  }

  static std::string score_shape(const Step& s) {
    return "seqs=" + std::to_string(s.seqs) + ";new=" + std::to_string(s.new_tokens) + ";ctx=" + std::to_string(s.context);
  }

  void allreduce(double T) {
    // Ring all-reduce of the bf16 hidden state: 2(tp-1)/tp of it leaves each device.
    const double bytes = 2.0 * (l.tp - 1) / l.tp * T * m.cfg.hidden_size * 2.0;
    comm_among("tp.allreduce", OpClass::CommTP, bytes, l.tp, 2.0 * (l.tp - 1),
               "T=" + std::to_string(int64_t(T)) + ";tp=" + std::to_string(l.tp));
  }

  // ---- this engine's collectives (Options::engine_collectives), in f32 ----
  // Ring all-gather among n ranks of `bytes` in all: (n-1)/n of it reaches each rank, in n-1
  // rounds.
  void allgather(const char* name, OpClass cls, double bytes, double n, const std::string& shape) {
    comm_among(name, cls, (n - 1) / n * bytes, n, n - 1, shape);
  }
  // Tensor parallelism around one split product pair: the members' parts of `inner` values
  // (all rows), then the T rows of the hidden output, each computed whole on one member.
  void tp_gathers(double T, double inner) {
    const std::string shape = "T=" + std::to_string(int64_t(T)) + ";tp=" + std::to_string(l.tp);
    allgather("tp.allgather", OpClass::CommTP, inner * 4.0, l.tp, shape);
    allgather("tp.allgather", OpClass::CommTP, T * m.cfg.hidden_size * 4.0, l.tp, shape);
  }
  // Data-parallel attention's MoE exchange (moe.cpp), the stage's dp members each holding T
  // of the total tokens: every member's count, then all-to-all when moe_alltoall_pays
  // (each token, with its routes as 2k floats, to the members that own one of its experts
  // and its partial output back), else every token to every member by all-gather and the
  // partial outputs summed back by reduce-scatter. Partial outputs travel as doubles (moe.cpp).
  void engine_dispatch(double T) {
    const auto& c = m.cfg;
    const double G = l.dp, k = c.num_experts_per_tok, h = c.hidden_size, total = T * G;
    const std::string shape = "T=" + std::to_string(int64_t(T)) + ";ranks=" + std::to_string(l.dp);
    allgather("moe.counts", OpClass::CommEP, 0.0, G, shape);
    if (moe_alltoall_pays(l.dp, c.num_experts_per_tok, int64_t(total))) {
      const double sent = T * (G - 1) * (1.0 - std::pow(1.0 - 1.0 / G, k));  // token copies to other members
      comm_among("moe.dispatch", OpClass::CommEP, sent * (h + 2 * k) * 4.0, G, 3 * (G - 1), shape);  // counts, rows, routes
      comm_among("moe.combine", OpClass::CommEP, sent * h * 8.0, G, G - 1, shape);
    } else {
      allgather("moe.dispatch", OpClass::CommEP, total * h * 4.0, G, shape);
      allgather("moe.combine", OpClass::CommEP, total * h * 8.0, G, shape);  // a reduce-scatter moves as much
    }
  }

  void moe(double T, const Step&) {
    const auto& c = m.cfg;
    gemm("moe.router", T, c.n_routed_experts, c.hidden_size, o.weight, /*bf16_weight=*/true);
    const double assigned = routed_experts(T);
    if (c.n_shared_experts > 0) {
      const double sI = double(c.n_shared_experts) * c.moe_intermediate_size / l.tp;
      gemm("moe.shared_gate_up", T, 2 * sI, c.hidden_size, o.weight);
      gemm("moe.shared_down", T, c.hidden_size, sI, o.weight);
    }
    moe_exchange(T, assigned);
  }

  // Routed experts: the stage's T*dp tokens pick k experts each, spread evenly over ep ranks
  // (balanced routing, as EPLB aims for). The E experts and their redundant replicas fill S =
  // E + redundant slots, each taking an equal share of the assignments. A slot's weights are
  // read once if any token landed on it: with uniform routing that happens with probability
  // 1-(1-k/S)^tokens. Returns this device's token-expert assignments.
  double routed_experts(double T) {
    const auto& c = m.cfg;
    const double h = c.hidden_size, mI = c.moe_intermediate_size, E = c.n_routed_experts, k = c.num_experts_per_tok;
    const double mtp_ways = l.moe_tp();
    const double S = E + l.redundant_experts;
    const double tokens = T * l.dp;
    const double assigned = tokens * k / l.ep;
    const double experts_dev = S / l.ep;
    const double hit = experts_dev * (1.0 - std::pow(1.0 - k / S, tokens));
    const double wb = weight_bytes_per_elem(o.weight);
    const int bits = o.weight == WeightDtype::FP8 ? 8 : o.weight == WeightDtype::NVFP4 ? 4 : 16;
    const double act = bits <= 8 ? 1.0 : 2.0;
    const double n_gu = 2.0 * mI / mtp_ways, n_d = mI / mtp_ways;
    Op gu;
    gu.name = "moe.experts_gate_up";
    gu.cls = OpClass::Gemm;
    gu.bits = bits;
    gu.flops = 2.0 * assigned * n_gu * h;
    gu.bytes = hit * n_gu * h * wb + assigned * h * act + assigned * n_gu * 2.0;
    gu.weight_elems = hit * n_gu * h;
    gu.shape = "tokens=" + std::to_string(int64_t(assigned)) + ";experts=" + std::to_string(int64_t(experts_dev)) +
               ";N=" + std::to_string(int64_t(n_gu)) + ";K=" + std::to_string(int64_t(h));
    add(gu);
    Op dn = gu;
    dn.name = "moe.experts_down";
    dn.flops = 2.0 * assigned * h * n_d;
    dn.bytes = hit * h * n_d * wb + assigned * n_d * act + assigned * h * 2.0;
    dn.weight_elems = hit * h * n_d;
    dn.shape = "tokens=" + std::to_string(int64_t(assigned)) + ";experts=" + std::to_string(int64_t(experts_dev)) +
               ";N=" + std::to_string(int64_t(h)) + ";K=" + std::to_string(int64_t(n_d));
    // silu(gate) * up of every routed and shared expert row this device computes.
    const double act_elems = assigned * n_d + (c.n_shared_experts > 0 ? T * double(c.n_shared_experts) * mI / l.tp : 0.0);
    memory("moe.act", act_elems * 3.0 * 2.0, act_elems * 4.0, "T=" + std::to_string(int64_t(T)));
    add(dn);
    // The assignments' inputs gathered into expert order before the experts, and each
    // token's k outputs summed back with its routing weights after them: one pass over the
    // assigned rows each (the CPU engine's gather and combine, the GPU frameworks' permute and
    // moe_sum).
    memory("moe.gather_tokens", assigned * h * 2.0 * 2.0, 0.0, "T=" + std::to_string(int64_t(T)));
    memory("moe.sum_outputs", assigned * h * 2.0 + T * h * 2.0, assigned * h * 2.0, "T=" + std::to_string(int64_t(T)));
    return assigned;
  }

  // What the experts' inputs and outputs cost to move between devices.
  void moe_exchange(double T, double assigned) {
    const auto& c = m.cfg;
    if (o.engine_collectives && l.tp > 1) {
      // The engine gathers the split intermediates (the shared expert's; the routed ones' when
      // tensor parallelism splits every expert), then the output's rows unless the experts
      // are whole and the all-reduce below sums them (moe.cpp).
      const double shared_inter = T * double(c.n_shared_experts) * c.moe_intermediate_size;
      const std::string shape = "T=" + std::to_string(int64_t(T)) + ";tp=" + std::to_string(l.tp);
      if (shared_inter > 0) allgather("tp.allgather", OpClass::CommTP, shared_inter * 4.0, l.tp, shape);
      if (l.moe_tp() > 1) tp_gathers(T, assigned * c.moe_intermediate_size);
    }
    if (l.rep > 1 || (o.engine_collectives && l.dp == 1 && l.ep > 1)) {
      // Every device of the stage already holds every token (replicated attention, or this
      // engine's tensor-parallel attention), so each computes its own experts' share of every
      // token and one ring all-reduce of the hidden state sums the shares, as the engine's
      // MoE does without --dp. The engine sums them as doubles (unrounded, so that any
      // layout gives one process's bits: moe.cpp); fp32 elsewhere.
      const double n = double(l.tp) * l.rep, elem = o.engine_collectives ? 8.0 : 4.0;
      comm_among("moe.allreduce", OpClass::CommEP, 2.0 * (n - 1) / n * T * c.hidden_size * elem, n, 2.0 * (n - 1),
                 "T=" + std::to_string(int64_t(T)) + ";ranks=" + std::to_string(int64_t(n)));
    } else if (l.ep > 1 && o.engine_collectives) {
      engine_dispatch(T);
    } else if (l.ep > 1) {
      deepep_dispatch(T);
    }
  }

  // Each device dispatches its share (T/tp) of the tokens to k experts: fp8 hidden plus one
  // fp32 scale per 128 going out, bf16 coming back (DeepSeek's dispatch/combine formats).
  // Copies to experts on this device stay local. Within one node everything moves over
  // NVLink. Across nodes, prefill (DeepEP normal kernels) sends a token once per destination
  // node and forwards it over NVLink there; decode (DeepEP low-latency kernels) sends every
  // remote copy over RDMA directly.
  void deepep_dispatch(double T) {
    const double h = m.cfg.hidden_size, k = m.cfg.num_experts_per_tok;
    const double send = T / l.tp;
    const int local = std::min(l.ep, l.devices_per_node);
    const double nodes = std::ceil(double(l.ep) / l.devices_per_node);
    double intra_copies = k * double(local - 1) / l.ep, inter_copies = 0;
    if (nodes > 1 && phase == Phase::Decode) {
      intra_copies = 0;
      inter_copies = k * double(l.ep - 1) / l.ep;
    } else if (nodes > 1) {
      inter_copies = (nodes - 1) * (1.0 - std::pow(1.0 - 1.0 / nodes, k));
    }
    const double d_bytes = h * (1.0 + 4.0 / 128.0), c_bytes = h * 2.0;
    const std::string shape = "T=" + std::to_string(int64_t(send)) + ";ep=" + std::to_string(l.ep);
    comm("moe.dispatch", OpClass::CommEP, send * intra_copies * d_bytes, send * inter_copies * d_bytes, 1.0, shape);
    comm("moe.combine", OpClass::CommEP, send * intra_copies * c_bytes, send * inter_copies * c_bytes, 1.0, shape);
  }

  // The embedding rows of T tokens. This engine's tensor parallelism splits the table by
  // vocabulary rows and sums the members' rows (each a token's row or zeros) with an
  // all-reduce (forward.cpp).
  void embed(double T) {
    const double h = m.cfg.hidden_size;
    memory("embed", T * h * 2.0 * 2.0, 0.0, "T=" + std::to_string(int64_t(T)));
    if (o.engine_collectives && l.tp > 1 && m.cfg.vocab_size % l.tp == 0)
      comm_among("embed.allreduce", OpClass::CommTP, 2.0 * (l.tp - 1) / l.tp * T * h * 4.0, l.tp, 2.0 * (l.tp - 1),
                 "T=" + std::to_string(int64_t(T)) + ";tp=" + std::to_string(l.tp));
  }

  // Embedding, final norm and lm_head for `logit_tokens` rows.
  void head(double T, double logit_tokens, bool with_embed) {
    const auto& c = m.cfg;
    const double h = c.hidden_size;
    if (with_embed) embed(T);
    memory("final_norm", logit_tokens * h * 2.0 * 2.0, logit_tokens * 4.0 * h, "T=" + std::to_string(int64_t(logit_tokens)));
    gemm("lm_head", logit_tokens, double(c.vocab_size) / (l.tp * l.rep), h, o.weight, /*bf16_weight=*/true);
    if (l.rep > 1 || (o.engine_collectives && l.tp > 1)) {
      // Replicas split the head by vocabulary rows; every device then gathers all fp32 logits.
      const double n = double(l.tp) * l.rep;
      comm_among("head.allgather", OpClass::CommTP, (n - 1) / n * logit_tokens * double(c.vocab_size) * 4.0, n, n - 1,
                 "T=" + std::to_string(int64_t(logit_tokens)) + ";ranks=" + std::to_string(int64_t(n)));
    }
  }
};

}  // namespace

std::vector<Op> op_plan(const SimModel& m, const Step& s, const Layout& l, const Options& o) {
  l.validate();
  const auto& c = m.cfg;
  if (c.num_attention_heads % l.tp != 0)
    throw Error("--tp " + std::to_string(l.tp) + " must divide the attention heads (" + std::to_string(c.num_attention_heads) + ")");
  if (c.n_routed_experts == 0 && l.redundant_experts > 0) throw Error("--redundant-experts needs a model with routed experts");
  const int slots = c.n_routed_experts + l.redundant_experts;
  if (c.n_routed_experts > 0 && slots % l.ep != 0) {
    const int fill = (l.ep - c.n_routed_experts % l.ep) % l.ep;  // smallest count that makes them divide
    throw Error("--ep " + std::to_string(l.ep) + " must divide the routed experts (" + std::to_string(c.n_routed_experts) +
                (l.redundant_experts > 0 ? " + " + std::to_string(l.redundant_experts) + " redundant" : std::string()) +
                ")" + (fill > 0 && l.redundant_experts == 0 ? "; --redundant-experts " + std::to_string(fill) + " would make them divide" : std::string()));
  }
  if (o.mtp > 0 && c.num_nextn_predict_layers == 0) throw Error("--mtp needs a model with an MTP layer (num_nextn_predict_layers is 0)");
  if (s.seqs < 1 || s.new_tokens < 1 || s.context < 0) throw Error("a step needs at least one sequence and one new token");

  Builder b{m, l, o, s.phase, {}, {}, "", 1.0};
  const double T = double(s.seqs) * double(s.new_tokens);
  const double logits = s.phase == Phase::Decode ? T : double(s.seqs);  // prefill: last token only
  b.weight = 1.0;
  b.embed(T);
  b.weight = 1.0 / l.pp;  // the average stage holds L/pp layers
  for (int li = 0; li < c.num_hidden_layers; ++li) b.layer(li, s);
  b.weight = 1.0;
  b.head(T, logits, /*with_embed=*/false);
  if (l.pp > 1) {
    b.comm_among("pp.send", OpClass::CommPP, T * c.hidden_size * 2.0, l.devices(), 1.0, "T=" + std::to_string(int64_t(T)));
  }

  if (o.mtp > 0) {
    // MTP draft layer: h = eh_proj([enorm(emb); hnorm(prev)]), a full decoder block (own
    // indexer), the shared head. Decode runs it once per draft token for every sequence;
    // prefill runs it once over the prompt to fill its cache.
    b.prefix = "mtp.";
    Step ds = s;
    if (s.phase == Phase::Decode) {
      ds.new_tokens = 1;
      b.weight = o.mtp;
    } else {
      b.weight = 1.0;
    }
    const double Td = double(ds.seqs) * double(ds.new_tokens);
    const double h = c.hidden_size;
    const double w = b.weight;
    b.memory("norms", Td * 2 * h * 2.0 * 2.0, Td * 8.0 * h, "T=" + std::to_string(int64_t(Td)));
    b.gemm("eh_proj", Td, h, 2 * h, o.weight, /*bf16_weight=*/true);
    b.layer(c.num_hidden_layers, ds);
    b.weight = w;
    b.head(Td, s.phase == Phase::Decode ? Td : double(s.seqs), /*with_embed=*/s.phase == Phase::Decode);
  }
  return b.ops;
}

double plan_total_flops(const std::vector<Op>& ops) {
  double f = 0;
  for (const auto& op : ops) f += op.flops;
  return f;
}

double plan_total_bytes(const std::vector<Op>& ops) {
  double b = 0;
  for (const auto& op : ops) b += op.bytes;
  return b;
}

double decode_bytes_per_token(const SimModel& m, int64_t context) {
  Step s{Phase::Decode, 1, 1, context};
  return plan_total_bytes(op_plan(m, s, Layout{1, 1, 1, 1, 1}, Options{}));
}

double prefill_flops_per_token(const SimModel& m, int64_t input_len) {
  if (input_len < 1) throw Error("prefill_flops_per_token: input_len must be positive");
  Step s{Phase::Prefill, 1, input_len, 0};
  return plan_total_flops(op_plan(m, s, Layout{1, 1, 1, 1, 1}, Options{})) / double(input_len);
}

}  // namespace dsa::sim
