#pragma once
// Naive reference kernels: obvious loops, f64 accumulation, no SIMD, no threads.
// Same signatures as kernels.h; the optimized twins in cpu/ are tested against these.
#include "kernels/kernels.h"

namespace dsa::kernels::ref {

void linear(const Linear& w, const float* x, int n, float* y, int row0, int nrows);
void linear_t(const Linear& w, const float* x, int n, float* y, int row0, int nrows);
void linear(const Linear& w, const float* x, size_t ldx, int n, float* y, size_t ldy, int row0, int nrows);
void linear_t(const Linear& w, const float* x, size_t ldx, int n, float* y, size_t ldy, int row0, int nrows);
void linear_decode(const Linear& w, const float* x, int n, float* y, int row0, int nrows);
void linear_multi(const LinearJob* jobs, int n_jobs);
void linear_t_heads(const Linear& w, const float* x, int x_stride, int n_heads, int head_stride, int row0, int nrows, float* y, int n_tok);
void linear_heads(const Linear& w, const float* x, int n_heads, int head_stride, int row0, int nrows, float* y, int y_stride, int n_tok);
void embed(const Linear& table, const int32_t* ids, int n, float* y);
void rmsnorm(const float* x, const Vec& w, int n, int dim, float eps, float* y);
void layernorm(const float* x, const Vec& w, const Vec& b, int n, int dim, float eps, float* y);
void silu_mul(const float* gate, const float* up, size_t n, float* out);
void rope(float* x, int dim, const float* cos, const float* sin, bool interleaved);
void hadamard128(float* x, int n_vec);
void gather_rows(const float* x, size_t ldx, const int32_t* rows, int n, int width, float* y);
void moe_combine(const float* d, int width, const int32_t* pos, const float* w, int n, int k, double* acc);
void act_quant_fp8(const float* x, int n, int block, bool ue8m0, uint8_t* codes, float* scales);
// act_quant_fp8's scale for a block whose largest |x| is amax (the other tiers share it).
float act_quant_scale(float amax, bool ue8m0);
void indexer_scores(const uint8_t* q8, const float* w, int n_heads, const IndexKeyView& keys, int n_keys, float* out);
void topk(const float* scores, int n, int k, int32_t* out);
void mla_cache_write(const MlaCacheView& c, int64_t t, const float* latent, const float* k_rope);
void mla_cache_read(const MlaCacheView& c, int64_t t, float* latent, float* k_rope);
void mla_sparse_decode(const MlaCacheView& c, const float* q_lat, const float* q_rope, int n_heads,
                       const int32_t* idx, int n_idx, float scale, float* o_lat);

// Element (r, c) of a weight as f32, dequantized (fp8: times its block scale).
float weight_at(const Linear& w, int r, int c);

}  // namespace dsa::kernels::ref
