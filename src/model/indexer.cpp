// The lightning indexer: scores every cached key in fp8 and picks the top-k per query.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"
#include "model/forward.h"

namespace dsa {

void indexer_block(const Model& m, const LayerWeights& w, State& s, int layer, int cache_layer, int pos0, int n,
                   const Tap* tap, bool projected) {
  const ModelConfig& c = m.config;
  const IndexerWeights& x = w.indexer;
  const int nih = c.index_n_heads, R = c.qk_rope_head_dim, K = c.index_topk;
  LayerCache& cache = s.layers[size_t(cache_layer)];
  // DeepSeek's indexer RoPE is half-split (NeoX, pairs i, i + rope/2) while MLA's is
  // interleaved (DeepSeek-V3.2-Exp inference fix of 2025-11-17); GLM-5 sets
  // indexer_rope_interleave. Both keep the rope dims FIRST: [rope | nope].
  const bool interleave = c.indexer_rope_interleave;
  auto cos_at = [&](int pos) { return &s.rope_cos[size_t(pos) * size_t(R / 2)]; };
  auto sin_at = [&](int pos) { return &s.rope_sin[size_t(pos) * size_t(R / 2)]; };

  // Queries from the MLA query latent (after q_a_layernorm), one 128-vector per head.
  if (!projected) kernels::linear(x.wq_b, s.qr.data(), n, s.iq.data());
  for (int i = 0; i < n; ++i)
    for (int h = 0; h < nih; ++h)
      kernels::rope(&s.iq[(size_t(i) * size_t(nih) + size_t(h)) * 128], R, cos_at(pos0 + i), sin_at(pos0 + i), interleave);
  // Hadamard rotation before fp8 (as DeepSeek's demo, SGLang and llama.cpp): spreads
  // outliers so one block scale fits; fp8 scales are ue8m0 for every checkpoint.
  kernels::hadamard128(s.iq.data(), n * nih);
  for (int r = 0; r < n * nih; ++r)
    kernels::act_quant_fp8(&s.iq[size_t(r) * 128], 128, 128, true, &s.iq8[size_t(r) * 128], &s.iq_scale[size_t(r)]);

  // One key per token: LayerNorm(wk(x)) (eps 1e-6), rope, Hadamard, fp8 into the cache.
  if (!projected) kernels::linear(x.wk, s.xn.data(), n, s.ik.data());
  kernels::layernorm(s.ik.data(), x.k_norm_weight, x.k_norm_bias, n, 128, 1e-6f, s.ik.data());
  for (int i = 0; i < n; ++i) kernels::rope(&s.ik[size_t(i) * 128], R, cos_at(pos0 + i), sin_at(pos0 + i), interleave);
  kernels::hadamard128(s.ik.data(), n);
  for (int i = 0; i < n; ++i)
    kernels::act_quant_fp8(&s.ik[size_t(i) * 128], 128, 128, true, &cache.index_k[size_t(pos0 + i) * 128],
                           &cache.index_scale[size_t(pos0 + i)]);

  // Head weights: weights_proj(x) * n_heads^-0.5 * q_scale * 128^-0.5 (the softmax scale
  // folded in, as the reference does).
  if (!projected) kernels::linear(x.weights_proj, s.xn.data(), n, s.iw.data());
  const float hs = 1.0f / std::sqrt(float(nih)), ds = 1.0f / std::sqrt(128.0f);
  for (int r = 0; r < n * nih; ++r) s.iw[size_t(r)] *= hs * s.iq_scale[size_t(r)] * ds;

  // Causal: query at position p scores keys 0..p and keeps min(index_topk, p + 1).
  auto one_query = [&](int i) {
    const int n_keys = pos0 + i + 1, k = std::min(K, n_keys);
    float* sc = &s.scores[size_t(omp_get_thread_num()) * size_t(s.opt.max_ctx)];
    int32_t* sel = &s.topk[size_t(i) * size_t(K)];
    kernels::indexer_scores(&s.iq8[size_t(i) * size_t(nih) * 128], &s.iw[size_t(i) * size_t(nih)], nih, cache.index_k.data(),
                            cache.index_scale.data(), n_keys, sc);
    kernels::topk(sc, n_keys, k, sel);
    std::fill(sel + k, sel + K, -1);
    s.topk_n[size_t(i)] = k;
    if (tap) {
      if (tap->floats) tap->floats("indexer.scores." + std::to_string(layer), pos0 + i, sc, n_keys);
      if (tap->ints) tap->ints("indexer.topk." + std::to_string(layer), pos0 + i, sel, K);
    }
  };
  // Many queries (prefill): one per thread. One query (decode): the scan parallelizes
  // inside the kernel. Not an `if(false)` parallel region around it: a parallel region
  // nested in even an inactive one builds a fresh thread team on every call.
  if (n > 1 && !tap) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < n; ++i) one_query(i);
  } else {
    for (int i = 0; i < n; ++i) one_query(i);
  }
}

}  // namespace dsa
