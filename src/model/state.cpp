#include "model/state.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/kernels.h"
#include "model/weights.h"

namespace dsa {
namespace {

// Frequencies as DeepSeek's precompute_freqs_cis: theta^(-2i/d), and under YaRN a linear
// ramp between the correction dims for beta_fast / beta_slow that blends interpolated
// (freq / factor) and original frequencies.
std::vector<double> rope_freqs(const ModelConfig& cfg) {
  const int d = cfg.qk_rope_head_dim;
  const double base = cfg.rope.theta;
  std::vector<double> f(static_cast<size_t>(d / 2));
  for (int i = 0; i < d / 2; ++i) f[size_t(i)] = 1.0 / std::pow(base, double(2 * i) / d);
  if (cfg.rope.yarn) {
    const double orig = cfg.rope.original_max_position;
    auto corr_dim = [&](double rot) { return d * std::log(orig / (rot * 2 * M_PI)) / (2 * std::log(base)); };
    double lo = std::max(std::floor(corr_dim(cfg.rope.beta_fast)), 0.0);
    double hi = std::min(std::ceil(corr_dim(cfg.rope.beta_slow)), double(d - 1));
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < d / 2; ++i) {
      const double ramp = std::clamp((i - lo) / (hi - lo), 0.0, 1.0);
      const double smooth = 1 - ramp;
      f[size_t(i)] = f[size_t(i)] / cfg.rope.factor * (1 - smooth) + f[size_t(i)] * smooth;
    }
  }
  return f;
}

}  // namespace

State::State(const ModelConfig& cfg, const StateOptions& o) : opt(o) {
  if (opt.max_ctx <= 0 || opt.max_tokens <= 0) throw Error("state: max_ctx and max_tokens must be positive");
  opt.max_tokens = std::min(opt.max_tokens, opt.max_ctx);
  opt.max_logit_rows = std::clamp(opt.max_logit_rows, 1, opt.max_tokens);
  const size_t C = size_t(opt.max_ctx), T = size_t(opt.max_tokens);
  const size_t H = size_t(cfg.hidden_size), nh = size_t(cfg.num_attention_heads);
  const size_t L = size_t(cfg.kv_lora_rank), R = size_t(cfg.qk_rope_head_dim);
  const int n_layers = cfg.num_hidden_layers + (opt.mtp ? 1 : 0);

  layers.resize(size_t(n_layers));
  for (int i = 0; i < n_layers; ++i) {
    LayerCache& lc = layers[size_t(i)];
    lc.view.type = opt.cache;
    lc.view.kv_lora = cfg.kv_lora_rank;
    lc.view.rope = cfg.qk_rope_head_dim;
    lc.view.ue8m0 = cfg.quant.scale_ue8m0;
    lc.mla.assign(C * lc.view.token_bytes(), 0);
    lc.view.data = lc.mla.data();
    if (cfg.is_indexer_full(i)) {
      lc.index_k.assign(C * 128, 0);
      lc.index_scale.assign(C, 0.0f);
    }
  }

  const std::vector<double> f = rope_freqs(cfg);
  const double mag = cfg.rope_attention_factor();
  rope_cos.resize(C * R / 2);
  rope_sin.resize(C * R / 2);
  for (size_t p = 0; p < C; ++p)
    for (size_t i = 0; i < R / 2; ++i) {
      const double a = double(p) * f[i];
      rope_cos[p * R / 2 + i] = float(std::cos(a) * mag);
      rope_sin[p * R / 2 + i] = float(std::sin(a) * mag);
    }

  const size_t qk = size_t(cfg.qk_head_dim()), nope = size_t(cfg.qk_nope_head_dim), v = size_t(cfg.v_head_dim);
  const size_t ih = size_t(cfg.index_n_heads), K = size_t(cfg.index_topk);
  x.resize(T * H); xn.resize(T * H); h_final.resize(T * H); proj.resize(T * H); moe_out.resize(T * H);
  qa.resize(T * size_t(cfg.q_lora_rank)); qr.resize(T * size_t(cfg.q_lora_rank));
  q.resize(T * nh * qk);
  kva.resize(T * (L + R));
  latent.resize(T * L); k_rope.resize(T * R);
  // Also the absorbed path's scratch ([n, nope] + [n, kv_lora] + [n, v]), which can exceed
  // [n, heads * (nope + v)] when there are few heads.
  kv.resize(T * std::max(nh * (nope + v), nope + L + v));
  q_lat.resize(T * nh * L); o_lat.resize(T * nh * L); q_pe.resize(T * nh * R);
  attn.resize(T * nh * v);
  // A prefill chunk after a cached prefix dequantizes one layer's latents once for all of
  // its queries (f32 [max_ctx, kv_lora + rope]); not needed when the cache is f32 already
  // or when calls never carry several tokens.
  if (opt.cache != CacheType::F32 && opt.max_tokens >= 4) lat_f32.resize(C * (L + R));
  iq.resize(T * ih * 128); iq8.resize(T * ih * 128); iq_scale.resize(T * ih); iw.resize(T * ih);
  ik.resize(T * 128);
  scores.resize(size_t(omp_get_max_threads()) * C);
  // Every worker thread's kernel scratch, sized now: a decode step then allocates nothing,
  // whichever thread takes which piece of a parallel kernel.
  const int widest = std::max({cfg.hidden_size * 2, cfg.intermediate_size, cfg.moe_intermediate_size, cfg.q_lora_rank,
                               cfg.kv_lora_rank, cfg.num_attention_heads * cfg.v_head_dim});
  kernels::reserve_scratch(widest, cfg.num_attention_heads, cfg.kv_lora_rank + cfg.qk_rope_head_dim);
  topk.resize(T * K); topk_n.resize(T);
  const size_t E = size_t(std::max(cfg.n_routed_experts, 1)), k = size_t(std::max(cfg.num_experts_per_tok, 1));
  // g/u hold [tokens, inter] for the dense MLP and the shared expert, and
  // [tokens * experts_per_tok, moe_inter] for the routed experts grouped by expert.
  const size_t dense_inter = size_t(std::max(cfg.intermediate_size, cfg.moe_intermediate_size * cfg.n_shared_experts));
  // (+ the shared expert's rows per token: decode and speculative steps run the routed and
  // shared experts together)
  const size_t shared_inter = size_t(cfg.moe_intermediate_size) * size_t(cfg.n_shared_experts);
  const size_t gu = std::max(T * dense_inter, T * k * size_t(cfg.moe_intermediate_size) + T * shared_inter);
  router.resize(T * E); expert_ids.resize(T * k); expert_w.resize(T * k);
  expert_count.resize(E); expert_offset.resize(E + 1); expert_rows.resize(T * k); expert_pos.resize(T * k); expert_active.resize(E);
  xg.resize(T * k * H); g.resize(gu); u.resize(gu); d.resize((T * k + T) * H);
  if (opt.mtp) mtp_cat.resize(T * 2 * H);
  logits.resize(size_t(opt.max_logit_rows) * size_t(cfg.vocab_size));
}

void fill_cache_synthetic(const ModelConfig& cfg, State& s, int depth, uint64_t seed) {
  if (depth < 0 || depth > s.opt.max_ctx) throw Error("synthetic depth " + std::to_string(depth) + " exceeds the cache capacity");
  const int L = cfg.kv_lora_rank, R = cfg.qk_rope_head_dim;
  // Layers in parallel, each with its own generator seeded from (seed, layer): the filler
  // is the same whatever the thread count.
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t l = 0; l < s.layers.size(); ++l) {
    uint64_t x = (seed * 0x9e3779b97f4a7c15ull + 1) ^ (uint64_t(l + 1) * 0xbf58476d1ce4e5b9ull);
    auto next = [&x] {  // xorshift64*: cheap and plenty for filler values
      x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
      return float(double((x * 0x2545f4914f6cdd1dull) >> 11) * 0x1.0p-53 * 3.4 - 1.7);
    };
    std::vector<float> lat(static_cast<size_t>(L)), kr(static_cast<size_t>(R)), ik(128);
    LayerCache& c = s.layers[l];
    for (int t = 0; t < depth; ++t) {
      for (float& v : lat) v = next();
      for (float& v : kr) v = next();
      kernels::mla_cache_write(c.view, t, lat.data(), kr.data());
      if (!c.index_k.empty()) {
        for (float& v : ik) v = next();
        kernels::act_quant_fp8(ik.data(), 128, 128, true, &c.index_k[size_t(t) * 128], &c.index_scale[size_t(t)]);
      }
    }
  }
  s.n_past = depth;
}

double decode_bytes_read(const Model& m, const State& s, int64_t context) {
  const ModelConfig& c = m.config;
  const ModelWeights& w = m.weights;
  auto vec_bytes = [](const Vec& v) { return double(v.n) * double(dtype_size(v.dtype)); };
  auto mlp_bytes = [](const MlpWeights& p) { return double(p.gate_proj.bytes() + p.up_proj.bytes() + p.down_proj.bytes()); };
  double b = double(w.embed_tokens.cols) * double(dtype_size(w.embed_tokens.dtype)) + vec_bytes(w.norm) + double(w.lm_head.bytes());
  const double keys = double(std::min<int64_t>(context, c.index_topk));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& L = w.layers[size_t(l)];
    const MlaWeights& a = L.self_attn;
    b += vec_bytes(L.input_layernorm) + vec_bytes(L.post_attention_layernorm) + vec_bytes(a.q_a_layernorm) + vec_bytes(a.kv_a_layernorm);
    b += double(a.q_a_proj.bytes() + a.q_b_proj.bytes() + a.kv_a_proj_with_mqa.bytes() + a.kv_b_proj.bytes() + a.o_proj.bytes());
    if (L.has_indexer) {
      const IndexerWeights& x = L.indexer;
      b += double(x.wq_b.bytes() + x.wk.bytes() + x.weights_proj.bytes()) + vec_bytes(x.k_norm_weight) + vec_bytes(x.k_norm_bias);
      b += double(context) * 132.0;  // every cached indexer key: 128 fp8 + one f32 scale
    }
    b += keys * double(s.layers[size_t(l)].view.token_bytes());
    if (L.is_moe) {
      b += double(L.moe.gate.bytes()) + vec_bytes(L.moe.e_score_correction_bias);
      b += double(c.num_experts_per_tok) * mlp_bytes(L.moe.experts[0]);
      if (L.moe.has_shared) b += mlp_bytes(L.moe.shared_experts);
    } else {
      b += mlp_bytes(L.mlp);
    }
  }
  return b;
}

}  // namespace dsa
