// Multi-head latent attention (MLA) with DeepSeek Sparse Attention: every query attends
// only to the index_topk keys its lightning indexer selected.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/kernels.h"
#include "model/blocks.h"

namespace dsa {
namespace {

// q_a, kv_a (and the indexer's wk and weights_proj) on x, then q_b (and the indexer's wq_b)
// on q_a's norm, for every token of the step. Decode tokens run the projections that share
// an input together (one parallel region each).
void project(const Step& st, const LayerWeights& w) {
  const ModelConfig& c = st.m.config;
  Workspace& ws = st.ws;
  const MlaWeights& a = w.self_attn;
  const IndexerWeights& ix = w.indexer;
  const int n = st.n, nd = st.nd, np = n - nd;
  const size_t H = size_t(c.hidden_size), Q = size_t(c.q_lora_rank);
  // Tensor parallelism: this rank's heads are rows [q0, q0 + qn) of q_b.
  const int qk = c.qk_head_dim(), q0 = st.m.shard.head0(c.num_attention_heads) * qk, qn = st.m.shard.n_heads(c.num_attention_heads) * qk;
  const bool all_heads = qn == a.q_b_proj.rows;
  if (nd > 0) {
    const kernels::LinearJob on_x[] = {{&a.q_a_proj, ws.xn.data(), ws.qa.data(), nd},
                                       {&a.kv_a_proj_with_mqa, ws.xn.data(), ws.kva.data(), nd},
                                       {&ix.wk, ws.xn.data(), ws.ik.data(), nd},
                                       {&ix.weights_proj, ws.xn.data(), ws.iw.data(), nd}};
    kernels::linear_multi(on_x, w.has_indexer ? 4 : 2);
  }
  if (np > 0) {
    const float* xp = ws.xn.data() + size_t(nd) * H;
    kernels::linear(a.q_a_proj, xp, np, ws.qa.data() + size_t(nd) * Q);
    kernels::linear(a.kv_a_proj_with_mqa, xp, np, ws.kva.data() + size_t(nd) * size_t(a.kv_a_proj_with_mqa.rows));
    if (w.has_indexer) {
      kernels::linear(ix.wk, xp, np, ws.ik.data() + size_t(nd) * 128);
      kernels::linear(ix.weights_proj, xp, np, ws.iw.data() + size_t(nd) * size_t(ix.weights_proj.rows));
    }
  }
  kernels::rmsnorm(ws.qa.data(), a.q_a_layernorm, n, c.q_lora_rank, float(c.rms_norm_eps), ws.qr.data());
  if (nd > 0 && all_heads) {
    const kernels::LinearJob on_qr[] = {{&a.q_b_proj, ws.qr.data(), ws.q.data(), nd}, {&ix.wq_b, ws.qr.data(), ws.iq.data(), nd}};
    kernels::linear_multi(on_qr, w.has_indexer ? 2 : 1);
  } else if (nd > 0) {
    kernels::linear_decode(a.q_b_proj, ws.qr.data(), nd, ws.q.data(), q0, qn);
    if (w.has_indexer) kernels::linear_decode(ix.wq_b, ws.qr.data(), nd, ws.iq.data());
  }
  if (np > 0) {
    const float* qp = ws.qr.data() + size_t(nd) * Q;
    kernels::linear(a.q_b_proj, qp, np, ws.q.data() + size_t(nd) * size_t(qn), q0, qn);
    if (w.has_indexer) kernels::linear(ix.wq_b, qp, np, ws.iq.data() + size_t(nd) * size_t(ix.wq_b.rows));
  }
}

// The decode tokens [0, nd) in the absorbed (MQA) form over their sequences' caches: every
// token's q_nope through the k part of kv_b in one call (each head's rows read once for all
// of them), sparse attention in the kv_lora space one query at a time (several of them one
// per thread, a single one with the kernel's own threads), the results through the v part
// in one call. The kernels give each token the same bits however many share a call and
// whichever thread runs it (kernels.h).
void absorbed_queries(const Step& st, const MlaWeights& a, int cache_layer, int nd) {
  if (nd <= 0) return;
  const ModelConfig& c = st.m.config;
  Workspace& ws = st.ws;
  const int nh = st.m.shard.n_heads(c.num_attention_heads), nope = c.qk_nope_head_dim, R = c.qk_rope_head_dim, vd = c.v_head_dim;
  const int qk = c.qk_head_dim(), Lr = c.kv_lora_rank, K = c.index_topk;
  const int kv0 = st.m.shard.head0(c.num_attention_heads) * (nope + vd);  // this rank's first head in kv_b
  kernels::linear_t_heads(a.kv_b_proj, ws.q.data(), qk, nh, nope + vd, kv0, nope, ws.q_lat.data(), nd);
  for (size_t r = 0; r < size_t(nd) * size_t(nh); ++r)
    std::memcpy(&ws.q_pe[r * size_t(R)], &ws.q[r * size_t(qk) + size_t(nope)], size_t(R) * sizeof(float));
  auto attend = [&](int i) {
    const SeqStep& q = st.b.seqs[ws.tok_seq[size_t(i)]];
    const size_t r = size_t(i) * size_t(nh);
    kernels::mla_sparse_decode(st.kv.mla(cache_layer, q.blocks), &ws.q_lat[r * size_t(Lr)], &ws.q_pe[r * size_t(R)], nh,
                               &ws.topk[size_t(i) * size_t(K)], ws.topk_n[size_t(i)], float(c.softmax_scale()), &ws.o_lat[r * size_t(Lr)]);
  };
  if (nd > 1 && !st.b.tap) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < nd; ++i) attend(i);
  } else {
    for (int i = 0; i < nd; ++i) attend(i);
  }
  kernels::linear_heads(a.kv_b_proj, ws.o_lat.data(), nh, nope + vd, kv0 + nope, vd, ws.attn.data(), vd, nd);
}

// A prefill chunk (tokens [t0, t0 + n) at positions pos0 ..), in the absorbed form like
// decode: the chunk's q_nope through the k part of kv_b together per head (the GEMM, reading
// and writing each head's slice of the [tokens][heads] rows in place), the layer's cache
// dequantized once into f32 rows (the chunk's queries select overlapping keys), one query
// per thread over the f32 view, the outputs through the v part (the GEMM).
// Every step of it computes a token from that token's inputs and the cache alone, so a
// prompt's cache and logits are the same bits however it is chunked, and a prefix taken
// from the prefix cache gives what computing it would.
void prefill_attention(const Step& st, const MlaWeights& a, const MlaCacheView& cache, int t0, int n, int pos0) {
  const ModelConfig& c = st.m.config;
  Workspace& ws = st.ws;
  const int nh = st.m.shard.n_heads(c.num_attention_heads), nope = c.qk_nope_head_dim, R = c.qk_rope_head_dim, vd = c.v_head_dim;
  const int qk = c.qk_head_dim(), Lr = c.kv_lora_rank, K = c.index_topk, h0 = st.m.shard.head0(c.num_attention_heads);
  auto row = [&](int i, int h) { return (size_t(t0 + i) * size_t(nh) + size_t(h)); };
  const size_t tok = size_t(nh);  // rows of one token in the per-head arrays
  for (int h = 0; h < nh; ++h)
    kernels::linear_t(a.kv_b_proj, &ws.q[row(0, h) * size_t(qk)], tok * size_t(qk), n, &ws.q_lat[row(0, h) * size_t(Lr)],
                      tok * size_t(Lr), (h0 + h) * (nope + vd), nope);
  for_each_token(n, [&](int i) {
    for (int h = 0; h < nh; ++h)
      std::memcpy(&ws.q_pe[row(i, h) * size_t(R)], &ws.q[row(i, h) * size_t(qk) + size_t(nope)], size_t(R) * sizeof(float));
  });
  MlaCacheView view = cache;
  const int ctx = pos0 + n;
  if (view.type != CacheType::F32 && ws.lat_f32.size() >= size_t(ctx) * size_t(Lr + R)) {
    float* f = ws.lat_f32.data();
#pragma omp parallel for schedule(static)
    for (int t = 0; t < ctx; ++t)
      kernels::mla_cache_read(cache, t, f + size_t(t) * size_t(Lr + R), f + size_t(t) * size_t(Lr + R) + size_t(Lr));
    view.type = CacheType::F32;
    view.data = reinterpret_cast<uint8_t*>(f);
    view.blocks = nullptr;
  }
  auto attend = [&](int i) {
    const size_t r = row(i, 0);
    kernels::mla_sparse_decode(view, &ws.q_lat[r * size_t(Lr)], &ws.q_pe[r * size_t(R)], nh, &ws.topk[size_t(t0 + i) * size_t(K)],
                               ws.topk_n[size_t(t0 + i)], float(c.softmax_scale()), &ws.o_lat[r * size_t(Lr)]);
  };
  if (!st.b.tap) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < n; ++i) attend(i);
  } else {
    for (int i = 0; i < n; ++i) attend(i);  // not inside an inactive parallel region (see indexer_block)
  }
  for (int h = 0; h < nh; ++h)
    kernels::linear(a.kv_b_proj, &ws.o_lat[row(0, h) * size_t(Lr)], tok * size_t(Lr), n, &ws.attn[row(0, h) * size_t(vd)],
                    tok * size_t(vd), (h0 + h) * (nope + vd) + nope, vd);
}

// o_proj over the heads' outputs. Tensor parallelism gathers every rank's heads and then
// splits o_proj by output rows, gathering those too: two all-gathers instead of the usual
// one all-reduce of o_proj's partial sums over split input columns. Each rank receives
// (heads * v + hidden) * (tp - 1) / tp floats per token against a ring all-reduce's
// 2 * hidden * (tp - 1) / tp (1.6x for DeepSeek-V3.2; at decode's few tokens latency, not
// bytes, sets the cost), but every output is computed whole in one process's order (the
// logits are the same bits at any --tp) and the kernels need no column-strided weights.
void output_projection(const Step& st, const MlaWeights& a) {
  const ModelConfig& c = st.m.config;
  Workspace& ws = st.ws;
  const RankShard& sh = st.m.shard;
  if (sh.tp <= 1) {
    linear_by_role(a.o_proj, ws.attn.data(), st.n, st.nd, ws.proj.data());
    return;
  }
  DSA_CHECK(sh.gather_columns && ws.opt.tp == sh.tp, "attention: a tensor-parallel model without its gather");
  const int H = c.hidden_size, per = H / sh.tp;
  sh.gather_columns(ws.attn.data(), st.n, c.num_attention_heads * c.v_head_dim, ws.attn_all.data());
  linear_by_role(a.o_proj, ws.attn_all.data(), st.n, st.nd, ws.proj_part.data(), sh.member() * per, per);
  sh.gather_columns(ws.proj_part.data(), st.n, H, ws.proj.data());
}

}  // namespace

void attention_block(const Step& st, const LayerWeights& w, int layer, int cache_layer) {
  const ModelConfig& c = st.m.config;
  Workspace& ws = st.ws;
  const MlaWeights& a = w.self_attn;
  const int nh = st.m.shard.n_heads(c.num_attention_heads), nope = c.qk_nope_head_dim, R = c.qk_rope_head_dim;
  const int qk = c.qk_head_dim(), Lr = c.kv_lora_rank, K = c.index_topk, n = st.n;
  const float eps = float(c.rms_norm_eps);
  auto cos_at = [&](int pos) { return &ws.rope_cos[size_t(pos) * size_t(R / 2)]; };
  auto sin_at = [&](int pos) { return &ws.rope_sin[size_t(pos) * size_t(R / 2)]; };

  // q = q_b(rmsnorm(q_a(x))), per head [nope | rope]; MLA RoPE is interleaved (pairs 2i, 2i+1).
  project(st, w);
  for_each_token(n, [&](int i) {
    for (int h = 0; h < nh; ++h)
      kernels::rope(&ws.q[(size_t(i) * size_t(nh) + size_t(h)) * size_t(qk) + size_t(nope)], R, cos_at(ws.pos[size_t(i)]),
                    sin_at(ws.pos[size_t(i)]), true);
  });

  // kv_a(x) = [latent | k_rope]; the latent is normalized, the rope key rotated, and both
  // go to the sequence's cache. Attention below reads them back from the cache, so a
  // quantized cache (fp8) affects prefill and decode alike, as in deployment.
  for_each_token(n, [&](int i) {
    const int p = ws.pos[size_t(i)];
    const float* kv = &ws.kva[size_t(i) * size_t(Lr + R)];
    float* lat = &ws.latent[size_t(i) * size_t(Lr)];
    float* kr = &ws.k_rope[size_t(i) * size_t(R)];
    kernels::rmsnorm(kv, a.kv_a_layernorm, 1, Lr, eps, lat);
    std::memcpy(kr, kv + Lr, size_t(R) * sizeof(float));
    kernels::rope(kr, R, cos_at(p), sin_at(p), true);
    kernels::mla_cache_write(st.kv.mla(cache_layer, st.b.seqs[ws.tok_seq[size_t(i)]].blocks), p, lat, kr);
  });

  // Key selection: a full layer runs its own indexer; a shared layer reuses the top-k of
  // the most recent full layer, still in ws.topk for these same tokens.
  const Tap* tap = st.b.tap;
  if (w.has_indexer) indexer_block(st, w, layer, cache_layer);
  else if (tap && tap->ints)
    for (int i = 0; i < n; ++i) tap->ints("indexer.topk." + std::to_string(layer), ws.pos[size_t(i)], &ws.topk[size_t(i) * size_t(K)], K);

  // Decode tokens (all of them together), then each prefill chunk.
  absorbed_queries(st, a, cache_layer, st.nd);
  for (int s = 0; s < st.b.n_seqs; ++s) {
    const SeqStep& q = st.b.seqs[s];
    if (!q.decode) prefill_attention(st, a, st.kv.mla(cache_layer, q.blocks), st.first(s), q.n, q.pos0);
  }
  output_projection(st, a);
}

}  // namespace dsa
