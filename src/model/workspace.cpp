#include "model/workspace.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/kernels.h"

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

void fill_rope(const ModelConfig& cfg, size_t C, std::vector<float>& cos_t, std::vector<float>& sin_t) {
  const size_t R = size_t(cfg.qk_rope_head_dim);
  const std::vector<double> f = rope_freqs(cfg);
  const double mag = cfg.rope_attention_factor();
  cos_t.resize(C * R / 2);
  sin_t.resize(C * R / 2);
  for (size_t p = 0; p < C; ++p)
    for (size_t i = 0; i < R / 2; ++i) {
      const double a = double(p) * f[i];
      cos_t[p * R / 2 + i] = float(std::cos(a) * mag);
      sin_t[p * R / 2 + i] = float(std::sin(a) * mag);
    }
}

}  // namespace

Workspace::Workspace(const ModelConfig& cfg, const WorkspaceOptions& o) : opt(o) {
  if (opt.max_ctx <= 0 || opt.max_tokens <= 0 || opt.max_seqs <= 0)
    throw Error("workspace: max_ctx, max_tokens and max_seqs must be positive");
  opt.max_logit_rows = std::clamp(opt.max_logit_rows, 1, opt.max_tokens);
  const size_t C = size_t(opt.max_ctx), T = size_t(opt.max_tokens);
  const size_t H = size_t(cfg.hidden_size), nh = size_t(cfg.num_attention_heads);
  const size_t L = size_t(cfg.kv_lora_rank), R = size_t(cfg.qk_rope_head_dim);
  fill_rope(cfg, C, rope_cos, rope_sin);

  const size_t qk = size_t(cfg.qk_head_dim()), v = size_t(cfg.v_head_dim);
  const size_t ih = size_t(cfg.index_n_heads), K = size_t(cfg.index_topk);
  pos.resize(T); tok_seq.resize(T); ids.resize(T); seq_first.resize(size_t(opt.max_seqs) + 1); logit_first.resize(size_t(opt.max_seqs));
  x.resize(T * H); xn.resize(T * H); h_final.resize(T * H); proj.resize(T * H); moe_out.resize(T * H); moe_acc.resize(T * H);
  qa.resize(T * size_t(cfg.q_lora_rank)); qr.resize(T * size_t(cfg.q_lora_rank));
  q.resize(T * nh * qk);
  kva.resize(T * (L + R));
  latent.resize(T * L); k_rope.resize(T * R);
  q_lat.resize(T * nh * L); o_lat.resize(T * nh * L); q_pe.resize(T * nh * R);
  attn.resize(T * nh * v);
  if (opt.tp > 1) {
    attn_all.resize(T * nh * v);
    proj_part.resize(T * H / size_t(opt.tp));
  }
  // A prefill chunk after a cached prefix dequantizes one layer's latents once for all of
  // its queries (f32 [max_ctx, kv_lora + rope]).
  if (opt.chunk_latents && opt.max_tokens >= 4) lat_f32.resize(C * (L + R));
  iq.resize(T * ih * 128); iq8.resize(T * ih * 128); iq_scale.resize(T * ih); iw.resize(T * ih);
  ik.resize(T * 128);
  scores.resize(size_t(omp_get_max_threads()) * C);
  // Every worker thread's kernel scratch, sized now: a step then allocates nothing,
  // whichever thread takes which piece of a parallel kernel.
  const int widest = std::max({cfg.hidden_size * 2, cfg.intermediate_size, cfg.moe_intermediate_size, cfg.q_lora_rank,
                               cfg.kv_lora_rank, cfg.num_attention_heads * cfg.v_head_dim});
  kernels::reserve_scratch(widest, cfg.num_attention_heads, cfg.kv_lora_rank + cfg.qk_rope_head_dim, cfg.kv_lora_rank,
                           std::min(cfg.index_topk, opt.max_ctx));
  topk.resize(T * K); topk_n.resize(T);
  const size_t E = size_t(std::max(cfg.n_routed_experts, 1)), k = size_t(std::max(cfg.num_experts_per_tok, 1));
  // g/u hold [tokens, inter] for the dense MLP and the shared expert, and
  // [tokens * experts_per_tok, moe_inter] for the routed experts grouped by expert
  // (+ the shared expert's rows per token: decode steps run the routed and shared experts
  // together).
  const size_t dense_inter = size_t(std::max(cfg.intermediate_size, cfg.moe_intermediate_size * cfg.n_shared_experts));
  const size_t shared_inter = size_t(cfg.moe_intermediate_size) * size_t(cfg.n_shared_experts);
  const size_t gu = std::max(T * dense_inter, T * k * size_t(cfg.moe_intermediate_size) + T * shared_inter);
  router.resize(T * E); expert_ids.resize(T * k); expert_w.resize(T * k);
  expert_count.resize(E); expert_offset.resize(E + 1); expert_rows.resize(T * k); expert_pos.resize(T * k); expert_token.resize(T * k); expert_active.resize(E);
  xg.resize(T * k * H); g.resize(gu); u.resize(gu); d.resize((T * k + T) * H);
  if (opt.mtp) mtp_cat.resize(T * 2 * H);
  if (opt.dp_ranks > 1) {
    moe_x.resize(T * H);
    moe_part.resize(T * H);
    moe_back.resize(T * std::min(size_t(opt.dp_ranks), k) * H);
    dp_send_rows.resize(size_t(opt.dp_ranks));
    dp_recv_rows.resize(size_t(opt.dp_ranks));
    dp_ids.resize(T * k);
    dp_routes_out.resize(T * k * 2 * k);
    dp_routes_in.resize(T * 2 * k);
  }
  dp_rows.resize(size_t(std::max(opt.dp_ranks, 1)));
  h_rows.resize(size_t(opt.max_logit_rows) * H);
  logits.resize(size_t(opt.max_logit_rows) * size_t(cfg.vocab_size));
  if (opt.head_ranks > 1) logits_part.resize(size_t(opt.max_logit_rows) * size_t(cfg.vocab_size / opt.head_ranks));
}

}  // namespace dsa
