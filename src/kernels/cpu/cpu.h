#pragma once
// Optimized CPU kernels: AVX2 + FMA + F16C inner loops (chosen at run time, with a
// portable path when the CPU lacks them) and OpenMP threads. Same signatures and
// semantics as kernels/ref; tests/kernels compares every one against its twin.
#include "kernels/kernels.h"

namespace dsa::kernels::cpu {

void linear(const Linear& w, const float* x, int n, float* y, int row0, int nrows);
void linear_t(const Linear& w, const float* x, int n, float* y, int row0, int nrows);
void linear_decode(const Linear& w, const float* x, int n, float* y, int row0, int nrows);
void linear_multi(const LinearJob* jobs, int n_jobs);
void linear_t_heads(const Linear& w, const float* x, int x_stride, int n_heads, int head_stride, int row0, int nrows, float* y);
void linear_heads(const Linear& w, const float* x, int n_heads, int head_stride, int row0, int nrows, float* y, int y_stride);
void rmsnorm(const float* x, const Vec& w, int n, int dim, float eps, float* y);
void silu_mul(const float* gate, const float* up, size_t n, float* out);
void hadamard128(float* x, int n_vec);
void indexer_scores(const uint8_t* q8, const float* w, int n_heads, const IndexKeyView& keys, int n_keys, float* out);
void topk(const float* scores, int n, int k, int32_t* out);
void mla_sparse_decode(const MlaCacheView& c, const float* q_lat, const float* q_rope, int n_heads,
                       const int32_t* idx, int n_idx, float scale, float* o_lat);
void mha_sparse_prefill(const float* q, const float* kv, const float* k_rope, int n_heads, int nope, int rope,
                        int v_dim, const int32_t* idx, int n_idx, float scale, float* out);
void mha_causal_prefill_head(const float* q, size_t q_stride, int n_q, int pos0, const float* kv, const float* k_rope,
                             int n_heads, int head, int nope, int rope, int v_dim, float scale, float* out, size_t out_stride);

// Size the calling thread's GEMV input buffers and sparse-decode tile (see reserve_scratch).
void reserve_gemv_scratch(int max_cols);
void reserve_decode_scratch(int n_heads, int latent_dim, int kv_lora, int max_selected);

int num_threads();
bool has_avx2_fma();

}  // namespace dsa::kernels::cpu
