// The lightning indexer: scores every cached key in fp8 and picks the top-k per query.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"
#include "model/blocks.h"

namespace dsa {
void indexer_block(const Step& st, const LayerWeights& w, int layer, int cache_layer) {
  const ModelConfig& c = st.m.config;
  Workspace& ws = st.ws;
  const IndexerWeights& x = w.indexer;
  const int nih = c.index_n_heads, R = c.qk_rope_head_dim, K = c.index_topk, n = st.n;
  const Tap* tap = st.b.tap;
  // DeepSeek's indexer RoPE is half-split (NeoX, pairs i, i + rope/2) while MLA's is
  // interleaved (DeepSeek-V3.2-Exp inference fix of 2025-11-17); GLM-5 sets
  // indexer_rope_interleave. Both keep the rope dims FIRST: [rope | nope].
  const bool interleave = c.indexer_rope_interleave;
  auto cos_at = [&](int pos) { return &ws.rope_cos[size_t(pos) * size_t(R / 2)]; };
  auto sin_at = [&](int pos) { return &ws.rope_sin[size_t(pos) * size_t(R / 2)]; };

  // Queries from the MLA query latent (after q_a_layernorm, projected with the attention's
  // queries), one 128-vector per head. Hadamard rotation before fp8 (as DeepSeek's demo,
  // SGLang and llama.cpp): spreads outliers so one block scale fits; fp8 scales are ue8m0
  // for every checkpoint.
  for_each_token(n, [&](int i) {
    for (int h = 0; h < nih; ++h)
      kernels::rope(&ws.iq[(size_t(i) * size_t(nih) + size_t(h)) * 128], R, cos_at(ws.pos[size_t(i)]), sin_at(ws.pos[size_t(i)]), interleave);
  });
  kernels::hadamard128(ws.iq.data(), n * nih);
  for_each_token(n, [&](int i) {
    for (size_t r = size_t(i) * size_t(nih); r < size_t(i + 1) * size_t(nih); ++r)
      kernels::act_quant_fp8(&ws.iq[r * 128], 128, 128, true, &ws.iq8[r * 128], &ws.iq_scale[r]);
  });

  // One key per token: LayerNorm(wk(x)) (eps 1e-6), rope, Hadamard, fp8 into the cache.
  kernels::layernorm(ws.ik.data(), x.k_norm_weight, x.k_norm_bias, n, 128, 1e-6f, ws.ik.data());
  for_each_token(n, [&](int i) { kernels::rope(&ws.ik[size_t(i) * 128], R, cos_at(ws.pos[size_t(i)]), sin_at(ws.pos[size_t(i)]), interleave); });
  kernels::hadamard128(ws.ik.data(), n);
  for_each_token(n, [&](int i) {
    const int64_t slot = st.kv.mla(cache_layer, st.b.seqs[ws.tok_seq[size_t(i)]].blocks).slot(ws.pos[size_t(i)]);
    kernels::act_quant_fp8(&ws.ik[size_t(i) * 128], 128, 128, true, st.kv.index_k(cache_layer) + size_t(slot) * 128,
                           st.kv.index_scale(cache_layer) + slot);
  });

  // Head weights: weights_proj(x) * n_heads^-0.5 * q_scale * 128^-0.5 (the softmax scale
  // folded in, as the reference does).
  const float hs = 1.0f / std::sqrt(float(nih)), ds = 1.0f / std::sqrt(128.0f);
  for (int r = 0; r < n * nih; ++r) ws.iw[size_t(r)] *= hs * ws.iq_scale[size_t(r)] * ds;

  // Causal: query at position p scores keys 0..p and keeps min(index_topk, p + 1).
  auto one_query = [&](int i) {
    const int n_keys = ws.pos[size_t(i)] + 1, k = std::min(K, n_keys);
    float* sc = &ws.scores[size_t(omp_get_thread_num()) * size_t(ws.opt.max_ctx)];
    int32_t* sel = &ws.topk[size_t(i) * size_t(K)];
    kernels::IndexKeyView keys;
    keys.k8 = st.kv.index_k(cache_layer);
    keys.k_scale = st.kv.index_scale(cache_layer);
    keys.blocks = st.b.seqs[ws.tok_seq[size_t(i)]].blocks;
    keys.block_size = st.kv.block_size();
    kernels::indexer_scores(&ws.iq8[size_t(i) * size_t(nih) * 128], &ws.iw[size_t(i) * size_t(nih)], nih, keys, n_keys, sc);
    kernels::topk(sc, n_keys, k, sel);
    std::fill(sel + k, sel + K, -1);
    ws.topk_n[size_t(i)] = k;
    if (tap) {
      if (tap->floats) tap->floats("indexer.scores." + std::to_string(layer), ws.pos[size_t(i)], sc, n_keys);
      if (tap->ints) tap->ints("indexer.topk." + std::to_string(layer), ws.pos[size_t(i)], sel, K);
    }
  };
  // Many queries: one per thread. One query (a lone decode step): the scan parallelizes
  // inside the kernel (the same scores either way). Not an `if(false)` parallel region around it: a parallel region nested in even
  // an inactive one builds a fresh thread team on every call.
  if (n > 1 && !tap) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < n; ++i) one_query(i);
  } else {
    for (int i = 0; i < n; ++i) one_query(i);
  }
}

}  // namespace dsa
