#include "model/forward.h"

#include <string>

#include "core/error.h"
#include "kernels/kernels.h"

namespace dsa {

void mlp_block(const MlpWeights& w, State& s, int n, const float* in, float* out) {
  const int inter = w.gate_proj.rows;
  kernels::linear(w.gate_proj, in, n, s.g.data());
  kernels::linear(w.up_proj, in, n, s.u.data());
  kernels::silu_mul(s.g.data(), s.u.data(), size_t(n) * size_t(inter), s.g.data());
  kernels::linear(w.down_proj, s.g.data(), n, out);
}

void decoder_layer(const Model& m, const LayerWeights& w, State& s, int layer, int cache_layer, int pos0, int n,
                   const Tap* tap) {
  const ModelConfig& c = m.config;
  const int H = c.hidden_size;
  const float eps = float(c.rms_norm_eps);
  const size_t nH = size_t(n) * size_t(H);

  kernels::rmsnorm(s.x.data(), w.input_layernorm, n, H, eps, s.xn.data());
  attention_block(m, w, s, layer, cache_layer, pos0, n, tap);
  for (size_t i = 0; i < nH; ++i) s.x[i] += s.proj[i];

  kernels::rmsnorm(s.x.data(), w.post_attention_layernorm, n, H, eps, s.xn.data());
  if (w.is_moe) moe_block(m, w.moe, s, layer, pos0, n, tap);
  else mlp_block(w.mlp, s, n, s.xn.data(), s.moe_out.data());
  for (size_t i = 0; i < nH; ++i) s.x[i] += s.moe_out[i];

  if (tap && tap->floats && layer < c.num_hidden_layers)
    for (int i = 0; i < n; ++i) tap->floats("hidden." + std::to_string(layer), pos0 + i, &s.x[size_t(i) * size_t(H)], H);
}

static void check_call(const Model& m, const State& s, const int32_t* ids, int n, int pos0) {
  if (n <= 0) throw Error("forward: no tokens given");
  if (n > s.opt.max_tokens)
    throw Error("forward: " + std::to_string(n) + " tokens in one call, the state holds at most " + std::to_string(s.opt.max_tokens));
  if (pos0 + n > s.opt.max_ctx)
    throw Error("forward: context of " + std::to_string(pos0 + n) + " tokens exceeds the cache capacity " + std::to_string(s.opt.max_ctx));
  for (int i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= m.config.vocab_size)
      throw Error("token id " + std::to_string(ids[i]) + " out of range [0, " + std::to_string(m.config.vocab_size) + ")");
}

const float* forward(const Model& m, State& s, const int32_t* ids, int n, const ForwardOptions& opt) {
  const ModelConfig& c = m.config;
  const ModelWeights& w = m.weights;
  const int pos0 = s.n_past, H = c.hidden_size;
  check_call(m, s, ids, n, pos0);
  if (opt.all_logits && n > s.opt.max_logit_rows)
    throw Error("forward: " + std::to_string(n) + " logit rows requested, the state holds " + std::to_string(s.opt.max_logit_rows));

  kernels::embed(w.embed_tokens, ids, n, s.x.data());
  for (int l = 0; l < c.num_hidden_layers; ++l) decoder_layer(m, w.layers[size_t(l)], s, l, l, pos0, n, opt.tap);
  kernels::rmsnorm(s.x.data(), w.norm, n, H, float(c.rms_norm_eps), s.h_final.data());
  if (opt.all_logits) kernels::linear(w.lm_head, s.h_final.data(), n, s.logits.data());
  else kernels::linear(w.lm_head, s.h_final.data() + size_t(n - 1) * size_t(H), 1, s.logits.data());
  s.n_past += n;
  return s.logits.data();
}

const float* forward_mtp(const Model& m, State& s, const float* h_final, const int32_t* next_ids, int n,
                         const ForwardOptions& opt) {
  const ModelConfig& c = m.config;
  if (!m.weights.mtp || !s.opt.mtp) throw Error("forward_mtp: the model or state has no MTP layer loaded");
  const MtpWeights& w = *m.weights.mtp;
  const int pos0 = s.mtp_n_past, H = c.hidden_size, L = c.num_hidden_layers;
  const float eps = float(c.rms_norm_eps);
  check_call(m, s, next_ids, n, pos0);
  if (opt.all_logits && n > s.opt.max_logit_rows) throw Error("forward_mtp: too many logit rows requested");

  // x = eh_proj([enorm(embed(next)) ; hnorm(h)]), the embedding zeroed at position 0 as
  // vLLM does (SGLang keeps it; llama.cpp feeds the pre-norm hidden state instead).
  kernels::embed(w.embed_tokens, next_ids, n, s.xn.data());
  for (int i = 0; i < n; ++i) {
    float* cat = &s.mtp_cat[size_t(i) * 2 * size_t(H)];
    if (pos0 + i == 0) std::fill(cat, cat + H, 0.0f);
    else kernels::rmsnorm(&s.xn[size_t(i) * size_t(H)], w.enorm, 1, H, eps, cat);
    kernels::rmsnorm(h_final + size_t(i) * size_t(H), w.hnorm, 1, H, eps, cat + H);
  }
  kernels::linear(w.eh_proj, s.mtp_cat.data(), n, s.x.data());
  decoder_layer(m, w.block, s, L, L, pos0, n, opt.tap);
  kernels::rmsnorm(s.x.data(), w.shared_head_norm, n, H, eps, s.xn.data());
  if (opt.all_logits) kernels::linear(w.shared_head_head, s.xn.data(), n, s.logits.data());
  else kernels::linear(w.shared_head_head, s.xn.data() + size_t(n - 1) * size_t(H), 1, s.logits.data());
  s.mtp_n_past += n;
  return s.logits.data();
}

}  // namespace dsa
