#pragma once
// The kernel contract: the only header model/ uses to compute. Every function here has
// a naive twin in kernels/ref (scalar, f64 accumulation where it matters) and, where it
// is hot, an optimized version in kernels/cpu with the same signature; `set_backend`
// picks which one runs and tests run both against each other.
//
// Activations are f32 row-major. Weights are views into the mmapped checkpoint.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace dsa {

// A weight matrix [rows = out features, cols = in features] exactly as stored. For fp8
// (e4m3fn) weights `scale` is the checkpoint's weight_scale_inv [ceil(rows/br), ceil(cols/bc)]
// and W[r][c] = fp8(W8[r][c]) * scale[r/br][c/bc] (edge blocks may be partial).
struct Linear {
  DType dtype = DType::F32;
  const uint8_t* data = nullptr;
  int rows = 0, cols = 0;
  const float* scale = nullptr;
  int block_rows = 128, block_cols = 128;
  int scale_cols() const { return (cols + block_cols - 1) / block_cols; }
  size_t bytes() const;  // weights plus scales, what one full pass reads
};

// A 1-D weight (norm gains, biases), any float dtype, read element-wise.
struct Vec {
  DType dtype = DType::F32;
  const uint8_t* data = nullptr;
  int n = 0;
  float at(int i) const;
};

// How the MLA latent cache stores one token: kv_lora_rank latent values + the shared
// rope key. FP8: e4m3 latent with one f32 scale per 128 values (DeepSeek's act_quant,
// ue8m0 when the checkpoint says so) and the rope key kept exact in f32, as the
// reference keeps it (784 bytes for 512 + 64). FP8_656: DeepSeek's deployment layout
// (FlashMLA "FP8 with scale", 656 bytes): the same latent, the rope key in bf16.
enum class CacheType { F32, BF16, FP8, FP8_656 };

// Paged: token t of the sequence lives in slot blocks[t / block_size] * block_size +
// t % block_size of `data` (a block table into one pool); without a table, slot t.
struct MlaCacheView {
  CacheType type = CacheType::F32;
  uint8_t* data = nullptr;
  int kv_lora = 0, rope = 0;
  bool ue8m0 = false;  // fp8: power-of-two scales (checkpoint scale_fmt)
  const int32_t* blocks = nullptr;
  int block_size = 0;
  size_t token_bytes() const;
  int64_t slot(int64_t t) const { return blocks ? int64_t(blocks[t / block_size]) * block_size + t % block_size : t; }
  uint8_t* token(int64_t t) const { return data + size_t(slot(t)) * token_bytes(); }
};

enum class Backend { Ref, Cpu };

namespace kernels {

void set_backend(Backend b);
Backend backend();

// Instruction-set tiers of the cpu backend, chosen at run time (one binary runs on every
// x86-64 machine): generic (portable loops), avx2 (AVX2 + FMA + F16C), avx512 (F, BW, VL,
// DQ: the decode GEMV, the prefill GEMM, the indexer scan and the sparse attention tile in
// 512-bit registers, the other kernels the avx2 ones), amx (the avx512 tier with the prefill
// GEMM on AMX BF16 tiles; the CPU, Linux's tile permission and a self-check must allow it).
// The best tier the CPU and the OS allow runs unless DSA_ISA names a lower one. Each tier
// keeps the batch invariance of the products below; tiers differ from each other only in
// summation order, and amx's GEMM in its rounding (activations as three bf16 parts).
enum class Isa { Generic, Avx2, Avx512, Amx };
const char* isa_name(Isa t);
bool isa_supported(Isa t);
Isa isa();
void set_isa(Isa t);  // throws when the CPU cannot run it
// The vector extensions CPUID reports, e.g. "avx2 fma f16c avx512f ... amx-tile".
std::string cpu_features();
// AVX512-BF16 dot products inside the avx512 and amx tiers, for the one product whose
// operands are exact in bf16: the indexer scan's fp8 q and keys (twice the products per
// instruction of an f32 FMA). On where the CPU has AVX512-BF16, unless DSA_BF16=0; off in
// other tiers. Its scores differ from the f32 scan's in the last bits (pairs of products
// summed per step).
bool bf16_dot_supported();
bool bf16_dot();
void set_bf16_dot(bool on);  // throws when on and unsupported
// The amx tier's peak probe on the calling thread: iters rounds of four independent
// 16 x 16 x 32-pair tile products (TDPBF16PS). Only in the amx tier.
void amx_probe_loop(int64_t iters);

// Sizes every worker thread's kernel scratch (GEMV input buffers up to max_cols columns, the
// sparse decode's tile for n_heads heads of latent_dim = kv_lora + rope values and its
// partials for up to max_selected keys) in one parallel region, so that a step allocates
// nothing whichever thread picks up which piece of work. The Workspace does this once.
void reserve_scratch(int max_cols, int n_heads, int latent_dim, int kv_lora, int max_selected);

// Per-kernel wall time and work, accumulated while profiling is on (off by default; one
// branch per call when off). `dsa bench` uses it for its per-kernel breakdown and for the
// GEMM part's fraction of the FMA peak.
// seconds: wall time of calls made outside parallel regions; thread_seconds: time of calls
// made by the threads of a caller's parallel loop, summed over those threads. flops, bytes
// and calls count both.
struct KernelStat {
  double seconds = 0, thread_seconds = 0, flops = 0, bytes = 0;
  long calls = 0;
};
enum class KernelId { Linear, LinearT, IndexerScores, Topk, SparseDecode, Other, kCount };
const char* kernel_name(KernelId k);
void profile_enable(bool on);
void profile_reset();
KernelStat profile_stat(KernelId k);
// The matrix products of the profile by weight (calls made outside parallel regions: every
// call of a decode step; prefill's per-expert calls run inside the MoE's parallel loop and
// are not listed): the weight's rows x cols and dtype (of the first job of a linear_multi
// call, with the call's job count), the kernel (linear or linear_t), time and bytes.
struct WeightStat {
  KernelId kernel = KernelId::Linear;
  int rows = 0, cols = 0, jobs = 1;
  DType dtype = DType::F32;
  double seconds = 0, bytes = 0, flops = 0;
  long calls = 0;
  // One row of the table per kernel, weight shape, dtype and job count.
  bool same_row(const WeightStat& o) const {
    return kernel == o.kernel && rows == o.rows && cols == o.cols && dtype == o.dtype && jobs == o.jobs;
  }
  void add(const WeightStat& o) {
    seconds += o.seconds;
    bytes += o.bytes;
    flops += o.flops;
    calls += o.calls;
  }
};
std::vector<WeightStat> profile_weights();

// ---- dense algebra -------------------------------------------------------------
// Batch invariance: every product below computes each output of a token from that token's
// inputs alone, in an order that depends neither on how many tokens share the call, nor on
// where the token sits among them, nor on the thread count. The two row kernels differ in
// order from each other, so the caller picks one per token role and keeps it:
//   linear:        the packed GEMM (prefill chunks): per output, Σ over k in order.
//   linear_decode: the streaming GEMV (decode and verify tokens): per output the order of
//                  the one-token GEMV, for any number of tokens (weights are read once per
//                  group of rows and reused from cache by every token).
// y[n, nrows] = x[n, cols] · W[row0 : row0 + nrows]ᵀ   (nrows < 0: all rows)
void linear(const Linear& w, const float* x, int n, float* y, int row0 = 0, int nrows = -1);
void linear_decode(const Linear& w, const float* x, int n, float* y, int row0 = 0, int nrows = -1);
// y[n, cols] = x[n, nrows] · W[row0 : row0 + nrows]  (the transposed direction, used to
// absorb kv_b's k part into the query in MLA decode)
void linear_t(const Linear& w, const float* x, int n, float* y, int row0, int nrows);
// The same two GEMMs over token rows ldx and ldy floats apart (x read from, y written into,
// rows of wider matrices: one head's slice of a chunk's [tokens][heads] blocks), each
// output the same bits as with packed rows.
void linear(const Linear& w, const float* x, size_t ldx, int n, float* y, size_t ldy, int row0, int nrows);
void linear_t(const Linear& w, const float* x, size_t ldx, int n, float* y, size_t ldy, int row0, int nrows);
// Several decode-role products in one call (one parallel region): y_j = x_j · W_jᵀ for n_j
// tokens, each output exactly as linear_decode computes it. Decode uses it for the
// projections that share an input and for the routed experts its tokens picked; a job may
// take a range of W's rows (a tensor-parallel rank's part).
constexpr int kMaxLinearJobs = 64;
struct LinearJob {
  const Linear* w;
  const float* x;  // [n, w->cols]
  float* y;        // [n, nrows]
  int n = 1;
  int row0 = 0, nrows = -1;  // rows [row0, row0 + nrows) of W; nrows < 0: to the last row
  int rows() const { return nrows < 0 ? w->rows - row0 : nrows; }
};
void linear_multi(const LinearJob* jobs, int n_jobs);
// n_tok tokens through per-head slices of one weight (the absorbed MLA decode): for every
// head h the rows [h * head_stride + row0, + nrows) of W. x and y hold [n_tok][n_heads]
// blocks (token i's start n_heads per-head strides after token i - 1's):
//   linear_t_heads: y[i, h, 0:cols]  = x[i, h * x_stride + 0 : nrows] · W[rows of h]
//   linear_heads:   y[i, h * y_stride + 0 : nrows] = W[rows of h] · x[i, h, 0:cols]
// Decode-role products: each token's outputs are the same bits whatever n_tok (batch
// invariance); a call reads each head's rows once for all its tokens.
void linear_t_heads(const Linear& w, const float* x, int x_stride, int n_heads, int head_stride, int row0, int nrows, float* y,
                    int n_tok = 1);
void linear_heads(const Linear& w, const float* x, int n_heads, int head_stride, int row0, int nrows, float* y, int y_stride,
                  int n_tok = 1);
// y[n, cols] = table[ids[i]] (bf16/f16/f32 embedding rows)
void embed(const Linear& table, const int32_t* ids, int n, float* y);

// ---- elementwise ---------------------------------------------------------------
void rmsnorm(const float* x, const Vec& w, int n, int dim, float eps, float* y);
void layernorm(const float* x, const Vec& w, const Vec& b, int n, int dim, float eps, float* y);
void silu_mul(const float* gate, const float* up, size_t n, float* out);  // silu(g) * u
// Rotates `dim` values at x with cos/sin [dim/2]. interleaved: pairs (2i, 2i+1);
// otherwise half-split (NeoX): pairs (i, i + dim/2). Both use frequency i.
void rope(float* x, int dim, const float* cos, const float* sin, bool interleaved);
// Normalized Hadamard transform (Sylvester order, scale 128^-0.5) of n_vec rows of 128.
void hadamard128(float* x, int n_vec);
// DeepSeek's act_quant on blocks of `block`: amax >= 1e-4, s = amax * (1/448) (f32
// multiply), ue8m0 rounds s up to a power of two, codes = rne_e4m3(clamp(x/s, ±448)).
void act_quant_fp8(const float* x, int n, int block, bool ue8m0, uint8_t* codes, float* scales);

// ---- MoE dispatch and combine --------------------------------------------------
// y[i, 0:width] = x[rows[i], 0:width] for i < n (x rows ldx floats apart): the tokens that
// picked an expert, gathered into its GEMM's input.
void gather_rows(const float* x, size_t ldx, const int32_t* rows, int n, int width, float* y);
// acc[t, 0:width] = Σ_j w[t * k + j] · d[pos[t * k + j], 0:width] for t < n, the k slots in
// order, a slot with pos < 0 left out (another rank's expert); d rows `width` floats. In
// doubles: a product of two floats is exact, so fused or not each sum is the reference's
// bits on every tier.
void moe_combine(const float* d, int width, const int32_t* pos, const float* w, int n, int k, double* acc);

// ---- lightning indexer ---------------------------------------------------------
// A sequence's cached indexer keys: key t in slot slot(t) of k8 [slots, 128] (e4m3 codes)
// and k_scale [slots], paged like MlaCacheView.
struct IndexKeyView {
  const uint8_t* k8 = nullptr;
  const float* k_scale = nullptr;
  const int32_t* blocks = nullptr;
  int block_size = 0;
  int64_t slot(int64_t t) const { return blocks ? int64_t(blocks[t / block_size]) * block_size + t % block_size : t; }
};
// out[t] = k_scale[t] * Σ_h w[h] * relu(q8[h] · k8[t])  for t in [0, n_keys)
// q8 [n_heads, 128] e4m3 codes; w already holds q_scale. Each score depends on its key
// and the query only.
void indexer_scores(const uint8_t* q8, const float* w, int n_heads, const IndexKeyView& keys, int n_keys, float* out);
// The positions of the k largest of scores[0..n) (k <= n), ties toward the lower
// position, listed in ascending position order: the sparse attention then walks the
// cache forward, and no sort of the winners is needed. Compare as sets with references
// that list by score.
void topk(const float* scores, int n, int k, int32_t* out);

// ---- MLA caches and attention ---------------------------------------------------
void mla_cache_write(const MlaCacheView& c, int64_t t, const float* latent, const float* k_rope);
void mla_cache_read(const MlaCacheView& c, int64_t t, float* latent, float* k_rope);

// Absorbed (MQA) sparse attention for one query over the selected cached tokens:
//   score_j = (q_lat[h] · latent[idx_j] + q_rope[h] · k_rope[idx_j]) * scale
//   o_lat[h] = Σ_j softmax(score)_j latent[idx_j]
// q_lat [n_heads, kv_lora], q_rope [n_heads, rope], o_lat [n_heads, kv_lora].
// Only the n_idx selected tokens are read: cost grows with index_topk, not the context.
// The selection is split into fixed pieces of kDecodePart tokens whose softmax partials are
// merged in piece order, whether the pieces run on several threads or on one: the result
// depends on the query and its selection only.
constexpr int kDecodePart = 256;
void mla_sparse_decode(const MlaCacheView& c, const float* q_lat, const float* q_rope, int n_heads,
                       const int32_t* idx, int n_idx, float scale, float* o_lat);

}  // namespace kernels
}  // namespace dsa
