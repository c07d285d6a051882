// Multi-head latent attention (MLA) with DeepSeek Sparse Attention: every query attends
// only to the index_topk keys its lightning indexer selected.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"

#include "kernels/kernels.h"
#include "model/forward.h"

namespace dsa {

void attention_block(const Model& m, const LayerWeights& w, State& s, int layer, int cache_layer, int pos0, int n,
                     const Tap* tap) {
  const ModelConfig& c = m.config;
  const MlaWeights& a = w.self_attn;
  const int nh = c.num_attention_heads, nope = c.qk_nope_head_dim, R = c.qk_rope_head_dim, vd = c.v_head_dim;
  const int qk = c.qk_head_dim(), Lr = c.kv_lora_rank, K = c.index_topk;
  const float eps = float(c.rms_norm_eps);
  LayerCache& cache = s.layers[size_t(cache_layer)];
  auto cos_at = [&](int pos) { return &s.rope_cos[size_t(pos) * size_t(R / 2)]; };
  auto sin_at = [&](int pos) { return &s.rope_sin[size_t(pos) * size_t(R / 2)]; };

  // q = q_b(rmsnorm(q_a(x))), per head [nope | rope]; MLA RoPE is interleaved (pairs 2i, 2i+1).
  // A decode step runs the projections that share an input together (one parallel region
  // each): q_a, kv_a and the indexer's wk and weights_proj on x; q_b and wq_b on q_a's norm.
  const bool fused = n == 1 && w.has_indexer;
  if (fused) {
    const kernels::LinearJob on_x[] = {{&a.q_a_proj, s.xn.data(), s.qa.data()},
                                       {&a.kv_a_proj_with_mqa, s.xn.data(), s.kva.data()},
                                       {&w.indexer.wk, s.xn.data(), s.ik.data()},
                                       {&w.indexer.weights_proj, s.xn.data(), s.iw.data()}};
    kernels::linear_multi(on_x, 4);
  } else {
    kernels::linear(a.q_a_proj, s.xn.data(), n, s.qa.data());
    kernels::linear(a.kv_a_proj_with_mqa, s.xn.data(), n, s.kva.data());
  }
  kernels::rmsnorm(s.qa.data(), a.q_a_layernorm, n, c.q_lora_rank, eps, s.qr.data());
  if (fused) {
    const kernels::LinearJob on_qr[] = {{&a.q_b_proj, s.qr.data(), s.q.data()}, {&w.indexer.wq_b, s.qr.data(), s.iq.data()}};
    kernels::linear_multi(on_qr, 2);
  } else {
    kernels::linear(a.q_b_proj, s.qr.data(), n, s.q.data());
  }
  for (int i = 0; i < n; ++i)
    for (int h = 0; h < nh; ++h)
      kernels::rope(&s.q[(size_t(i) * size_t(nh) + size_t(h)) * size_t(qk) + size_t(nope)], R, cos_at(pos0 + i), sin_at(pos0 + i), true);

  // kv_a(x) = [latent | k_rope]; the latent is normalized, the rope key rotated, and both
  // go to the cache. Attention below reads them back from the cache, so a quantized
  // cache (fp8) affects prefill and decode alike, as in deployment.
  for (int i = 0; i < n; ++i) {
    const float* kv = &s.kva[size_t(i) * size_t(Lr + R)];
    float* lat = &s.latent[size_t(i) * size_t(Lr)];
    float* kr = &s.k_rope[size_t(i) * size_t(R)];
    kernels::rmsnorm(kv, a.kv_a_layernorm, 1, Lr, eps, lat);
    std::memcpy(kr, kv + Lr, size_t(R) * sizeof(float));
    kernels::rope(kr, R, cos_at(pos0 + i), sin_at(pos0 + i), true);
    kernels::mla_cache_write(cache.view, pos0 + i, lat, kr);
  }

  // Key selection: a full layer runs its own indexer; a shared layer reuses the top-k of
  // the most recent full layer, still in s.topk for these same tokens.
  if (w.has_indexer) indexer_block(m, w, s, layer, cache_layer, pos0, n, tap, fused);
  else if (tap && tap->ints)
    for (int i = 0; i < n; ++i) tap->ints("indexer.topk." + std::to_string(layer), pos0 + i, &s.topk[size_t(i) * size_t(K)], K);

  const float scale = float(c.softmax_scale());
  // s.kv doubles as scratch for the absorbed path: [n, nope] + [n, kv_lora] + [n, v]
  // (State sizes it for both uses).
  DSA_CHECK(s.kv.size() >= size_t(n) * size_t(nope + Lr + vd), "kv scratch too small for the absorbed path");
  if (pos0 == 0) {
    // Prefill of a fresh sequence: expand the chunk's cached latents through kv_b once
    // (MHA form, compute-friendly), then each query attends to its selected keys.
    for (int i = 0; i < n; ++i)
      kernels::mla_cache_read(cache.view, i, &s.latent[size_t(i) * size_t(Lr)], &s.k_rope[size_t(i) * size_t(R)]);
    kernels::linear(a.kv_b_proj, s.latent.data(), n, s.kv.data());
    // The leading queries whose selection is every key up to their own position (all of
    // them while the prompt is no longer than index_topk) run in blocks of sixteen per head,
    // each loaded key serving the whole block; the rest attend to their own selections.
    int causal = 0;
    while (causal < n && s.topk_n[size_t(causal)] == causal + 1) ++causal;
    constexpr int kBlock = 16;
    const int blocks = (causal + kBlock - 1) / kBlock;
    const size_t q_row = size_t(nh) * size_t(qk), o_row = size_t(nh) * size_t(vd);
#pragma omp parallel for schedule(dynamic, 1) if (blocks * nh > 1 && !tap)
    for (int t = 0; t < blocks * nh; ++t) {
      const int blk = blocks - 1 - t / nh, h = t % nh;  // the longest (latest) blocks first
      const int i0 = blk * kBlock, cnt = std::min(kBlock, causal - i0);
      kernels::mha_causal_prefill_head(&s.q[size_t(i0) * q_row + size_t(h) * size_t(qk)], q_row, cnt, i0, s.kv.data(),
                                       s.k_rope.data(), nh, h, nope, R, vd, scale, &s.attn[size_t(i0) * o_row + size_t(h) * size_t(vd)],
                                       o_row);
    }
#pragma omp parallel for schedule(dynamic, 1) if (n - causal > 1 && !tap)
    for (int i = causal; i < n; ++i)
      kernels::mha_sparse_prefill(&s.q[size_t(i) * q_row], s.kv.data(), s.k_rope.data(), nh, nope, R, vd,
                                  &s.topk[size_t(i) * size_t(K)], s.topk_n[size_t(i)], scale, &s.attn[size_t(i) * o_row]);
  } else {
    // Absorbed (MQA) form over the cached latent: q_nope goes through the k part of kv_b,
    // attention runs in the kv_lora_rank space, the result through the v part. Per head,
    // all tokens of the call go through kv_b together (one pass over its rows).
    if (n < 4) {
      // Decode: one call per token covers every head (one parallel region, not 2 x heads).
      for (int i = 0; i < n; ++i) {
        const float* qi = &s.q[size_t(i) * size_t(nh) * size_t(qk)];
        float* qlat = &s.q_lat[size_t(i) * size_t(nh) * size_t(Lr)];
        float* qpe = &s.q_pe[size_t(i) * size_t(nh) * size_t(R)];
        float* olat = &s.o_lat[size_t(i) * size_t(nh) * size_t(Lr)];
        kernels::linear_t_heads(a.kv_b_proj, qi, qk, nh, nope + vd, 0, nope, qlat);
        for (int h = 0; h < nh; ++h) std::memcpy(qpe + size_t(h) * size_t(R), qi + size_t(h) * size_t(qk) + size_t(nope), size_t(R) * sizeof(float));
        kernels::mla_sparse_decode(cache.view, qlat, qpe, nh, &s.topk[size_t(i) * size_t(K)], s.topk_n[size_t(i)], scale, olat);
        kernels::linear_heads(a.kv_b_proj, olat, nh, nope + vd, nope, vd, &s.attn[size_t(i) * size_t(nh) * size_t(vd)], vd);
      }
      kernels::linear(a.o_proj, s.attn.data(), n, s.proj.data());
      return;
    }
    float* qn = s.kv.data();                         // [n, nope] one head's q_nope
    float* lat = s.kv.data() + size_t(n) * size_t(nope);  // [n, kv_lora] one head's latents
    for (int h = 0; h < nh; ++h) {
      for (int i = 0; i < n; ++i)
        std::memcpy(qn + size_t(i) * size_t(nope), &s.q[(size_t(i) * size_t(nh) + size_t(h)) * size_t(qk)], size_t(nope) * sizeof(float));
      kernels::linear_t(a.kv_b_proj, qn, n, lat, h * (nope + vd), nope);
      for (int i = 0; i < n; ++i) {
        std::memcpy(&s.q_lat[(size_t(i) * size_t(nh) + size_t(h)) * size_t(Lr)], lat + size_t(i) * size_t(Lr), size_t(Lr) * sizeof(float));
        std::memcpy(&s.q_pe[(size_t(i) * size_t(nh) + size_t(h)) * size_t(R)], &s.q[(size_t(i) * size_t(nh) + size_t(h)) * size_t(qk) + size_t(nope)],
                    size_t(R) * sizeof(float));
      }
    }
    // The chunk's queries select overlapping keys (each cached token is read by many of
    // them): dequantize the layer's cache once into f32 rows, then run one query per
    // thread, each attending single-threaded over the f32 view.
    MlaCacheView view = cache.view;
    const int ctx = pos0 + n;
    if (view.type != CacheType::F32 && s.lat_f32.size() >= size_t(ctx) * size_t(Lr + R)) {
      float* f = s.lat_f32.data();
#pragma omp parallel for schedule(static)
      for (int t = 0; t < ctx; ++t)
        kernels::mla_cache_read(cache.view, t, f + size_t(t) * size_t(Lr + R), f + size_t(t) * size_t(Lr + R) + size_t(Lr));
      view.type = CacheType::F32;
      view.data = reinterpret_cast<uint8_t*>(f);
    }
    auto attend = [&](int i) {
      kernels::mla_sparse_decode(view, &s.q_lat[size_t(i) * size_t(nh) * size_t(Lr)], &s.q_pe[size_t(i) * size_t(nh) * size_t(R)], nh,
                                 &s.topk[size_t(i) * size_t(K)], s.topk_n[size_t(i)], scale, &s.o_lat[size_t(i) * size_t(nh) * size_t(Lr)]);
    };
    if (!tap) {
#pragma omp parallel for schedule(dynamic, 1)
      for (int i = 0; i < n; ++i) attend(i);
    } else {
      for (int i = 0; i < n; ++i) attend(i);  // not inside an inactive parallel region (see indexer_block)
    }
    float* ov = lat + size_t(n) * size_t(Lr);  // [n, v] one head's output, after the latents
    for (int h = 0; h < nh; ++h) {
      for (int i = 0; i < n; ++i)
        std::memcpy(lat + size_t(i) * size_t(Lr), &s.o_lat[(size_t(i) * size_t(nh) + size_t(h)) * size_t(Lr)], size_t(Lr) * sizeof(float));
      kernels::linear(a.kv_b_proj, lat, n, ov, h * (nope + vd) + nope, vd);
      for (int i = 0; i < n; ++i)
        std::memcpy(&s.attn[(size_t(i) * size_t(nh) + size_t(h)) * size_t(vd)], ov + size_t(i) * size_t(vd), size_t(vd) * sizeof(float));
    }
  }
  kernels::linear(a.o_proj, s.attn.data(), n, s.proj.data());
}

}  // namespace dsa
