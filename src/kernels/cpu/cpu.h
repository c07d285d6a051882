#pragma once
// Optimized CPU kernels: AVX2 + FMA + F16C inner loops, AVX-512 ones for the matrix
// products (the tier chosen at run time, kernels.h; portable loops for the generic tier)
// and OpenMP threads. Same signatures and
// semantics as kernels/ref; tests/kernels compares every one against its twin.
#include "kernels/kernels.h"

namespace dsa::kernels::cpu {

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
void hadamard128(float* x, int n_vec);
void gather_rows(const float* x, size_t ldx, const int32_t* rows, int n, int width, float* y);
void moe_combine(const float* d, int width, const int32_t* pos, const float* w, int n, int k, double* acc);
void rope(float* x, int dim, const float* cos, const float* sin, bool interleaved);
void act_quant_fp8(const float* x, int n, int block, bool ue8m0, uint8_t* codes, float* scales);
void indexer_scores(const uint8_t* q8, const float* w, int n_heads, const IndexKeyView& keys, int n_keys, float* out);
void topk(const float* scores, int n, int k, int32_t* out);
void mla_cache_write(const MlaCacheView& c, int64_t t, const float* latent, const float* k_rope);
void mla_cache_read(const MlaCacheView& c, int64_t t, float* latent, float* k_rope);
void mla_sparse_decode(const MlaCacheView& c, const float* q_lat, const float* q_rope, int n_heads,
                       const int32_t* idx, int n_idx, float scale, float* o_lat);

// Size the calling thread's GEMV input buffers and sparse-decode tile (see reserve_scratch).
void reserve_gemv_scratch(int max_cols);
void reserve_decode_scratch(int n_heads, int latent_dim, int kv_lora, int max_selected);

int num_threads();
bool use_avx2();  // the tier in use has the AVX2 kernels (every tier but generic)
bool use_avx512();  // the tier in use has the AVX-512 kernels (avx512 and amx)

// Weight lines pulled into L2 one at a time while a kernel computes: the rows of the GEMM's
// next panel unit, which its pack would otherwise wait for line by line from memory.
struct LinePrefetch {
  const char* base = nullptr;  // first row; none when null
  size_t ld = 0;               // bytes between rows
  int rows = 0, row_bytes = 0;
  int r = 0, off = 0;          // the next line
  void next() {
    if (r >= rows) return;
    __builtin_prefetch(base + size_t(r) * ld + size_t(off), 0, 2);
    off += 64;
    if (off >= row_bytes) off = 0, ++r;
  }
};

// The kernels the avx512 tier runs in place of the avx2 ones; everything else in the tier
// is the avx2 code. One table per build of avx512.cpp: the native one, and in the
// tests the same source built on an emulation of the intrinsics, so that the tier's logic is
// checked on machines without AVX-512 too.
struct Avx512Kernels {
  // The decode-role product (linear_decode's contract) of rows [r0, r1) for n tokens of an
  // fp8 (128-column blocks a multiple of 64 wide run vectorized) or bf16 weight: x [n,
  // cols], y [n, ldy] (row r at y[r - base]); xbuf holds min(n, kTokBuf) x cols floats for
  // bf16, twice that for fp8 (the prepared x and its copy scaled for one 128-row block).
  void (*gemv_rows)(const Linear& w, const float* x, int n, float* y, size_t ldy, int base, int r0, int r1, float* xbuf);
  // The prefill GEMM's micro-kernel over two adjacent 16-row panels (pk0, pk1, k-major
  // [kc][16]; nr0, nr1 of their rows valid) for n tokens packed in blocks of six (the avx2
  // layout): y [n, ldy] columns 0..nr0 from pk0 and 16..16+nr1 from pk1, added to y when
  // accumulate. Each output sums k in order: bitwise the avx2 GEMM.
  // pf, if not null, takes a line every eight k steps.
  void (*gemm_panels2)(const float* pk0, const float* pk1, int kc, const float* xp, int n, float* y, int ldy, int nr0, int nr1,
                       bool accumulate, LinePrefetch* pf);
  // The panel pack of a full fp8 chunk: rows [0, 16) x columns [0, len) of w0 (row stride ldw,
  // len a multiple of 16, one scale block; s[j] = row j's block scale times 2^120) into dst
  // [len][16], each value code * scale rounded once: the avx2 pack's values. On AVX512-VBMI
  // byte permutes where the CPU has them (always in the emulated table); pack_fp8_chunk_plain
  // is the pack on shuffles alone, the same bits, kept for the test that holds them equal.
  void (*pack_fp8_chunk)(const uint8_t* w0, size_t ldw, int len, const float* s, float* dst);
  void (*pack_fp8_chunk_plain)(const uint8_t* w0, size_t ldw, int len, const float* s, float* dst);
  // The indexer scan of keys [t0, t1) of one contiguous run (indexer_scores' inner kernel):
  // qT [128][hp] for hp a multiple of 16, w [hp]; every score bitwise the avx2 kernel's.
  void (*indexer_lanes)(const float* qT, const float* w, int hp, const uint8_t* k8, const float* k_scale, int t0, int t1, float* out);
  // The same scan on AVX512-BF16 dot products (bf16_dot()): qP [64][hp], lane h of row i
  // holding q[h][2i] (low half) and q[h][2i + 1] as bf16, each 2^-56 times its e4m3 value;
  // the same w. Scores within a few ulps of the f32 scan's.
  void (*indexer_lanes_bf16)(const uint32_t* qP, const float* w, int hp, const uint8_t* k8, const float* k_scale, int t0, int t1,
                             float* out);
  // The sparse attention tile's two products for one group of 16 heads (every sum the avx2
  // kernels' chain, so bitwise theirs): s[j][0:16) = Σ_d k_j[d] qT[d][0:16) for n tokens (a
  // multiple of 4; heads in lanes), and o[h][c] += Σ_j k_j[c] p[j][h] for the 16 heads' rows
  // of o (ldo apart) and columns c < d (a multiple of 16).
  void (*scores16)(const float* qT, size_t ldq, const float* const* k, int n, int d, float* s, size_t lds);
  void (*accumulate16)(const float* p, size_t ldp, const float* const* k, int nj, int d, float* o, size_t ldo);
  // The tile's online-softmax step for those 16 heads (bitwise the avx2 step): s[j][0:16) for
  // cnt tokens become e^(s - new max), the running max m[0:16) and sum l[0:16) are updated,
  // and the head rows o[h][0:L) (ldo apart) are rescaled where the head's max rose.
  void (*softmax16)(float* s, size_t lds, int cnt, float* m, float* l, float* o, size_t ldo, int L);
  // One row of rmsnorm (f32 or bf16 weights): the sum of squares in 16-lane accumulators.
  void (*rmsnorm_row)(const float* x, const Vec& w, int dim, float eps, float* y);
  // silu(gate) * up over elements [b, e): bitwise the avx2 kernel's results.
  void (*silu_mul)(const float* gate, const float* up, size_t b, size_t e, float* out);
  // topk's first level: the top 11 bits of each score's order key counted, even positions
  // into h0 and odd ones into h1 (2048 bins each); and the gather of the keys whose bits
  // under hi_mask equal prefix, in position order, into cand (returns how many; cand has room
  // for 16 past the last).
  void (*topk_bins)(const float* scores, int n, uint32_t* h0, uint32_t* h1);
  int (*topk_gather)(const float* scores, int n, uint32_t hi_mask, uint32_t prefix, uint32_t* cand);
  // topk's last pass: positions (ascending) of the scores whose order key exceeds tau, and
  // of the first `ties` whose key equals it, at most k of them; returns how many.
  int (*topk_emit)(const float* scores, int n, uint32_t tau, int ties, int k, int32_t* out);
  // One 128-point Hadamard transform in place, scaled by 128^-0.5: bitwise the other tiers.
  void (*hadamard128)(float* x);
  // The transposed fp8 product (linear_t_heads' inner kernel) for n <= kTokChunkT tokens, x and y rows
  // ldx and ldy apart, over rows [r0, r0 + nrows) of a weight whose scale blocks are a
  // multiple of 16 columns wide, every x * block scale below 2^60: bitwise the avx2 kernels.
  // Its prefetch runs on into the nrows rows from next_r0 (the next head's), if not negative.
  void (*linear_t_fp8)(const Linear& w, const float* x, size_t ldx, int n, int r0, int nrows, int next_r0, float* y, size_t ldy);
  // A cached latent's fp8 block widened for the attention tile: out[i] = s times p[i]'s e4m3
  // value scaled by 2^-120 (fp8x8_bits' placement), n a multiple of 16; bitwise the avx2 loop.
  void (*widen_fp8)(const uint8_t* p, int n, float s, float* out);
};
// Tokens whose inputs a GEMV call prepares at once: each pass over a weight serves this many
// tokens, so a batch of 64 decode tokens reads the lm_head once a step (529 MB on v32-mini,
// 1.85 GB on V3.2), where 24 read it three times. Costs 4 x 64 x cols floats per thread.
constexpr int kTokBuf = 64;
constexpr int kTokChunkT = 16;  // tokens per call of a transposed fp8 kernel (linear_t_fp8 and the avx2 ones)
bool vbmi_supported();  // the avx512 tier can run and the CPU has AVX512-VBMI
const Avx512Kernels& avx512_native();
// The table the avx512 tier uses: the native one, or the one a test installs with
// emulate_avx512, which also puts the tier in use without asking the CPU (nullptr: back to
// the native table and the best tier).
const Avx512Kernels& avx512_kernels();
void emulate_avx512(const Avx512Kernels* k);
void force_isa(Isa t);  // set_isa without the CPU check (emulate_avx512 only)
void force_bf16_dot(bool on);  // set_bf16_dot without the CPU check (the emulated tier's tests)
// The amx tier's prefill GEMM (amx.cpp), for bf16 weights and fp8 ones whose scale blocks are
// a multiple of 32 columns wide, with the column count a multiple of 32: K in chunks of
// kAmxKc columns (whole scale blocks), weight rows in units of kAmxUnitRows.
constexpr int kAmxKc = 512, kAmxUnitRows = 128;
struct AmxKernels {
  // Tokens [i0, i1) of x[:, k0 : k0 + kc] (rows ldx apart) as three bf16 parts, hi, mid
  // and lo, summing to x within 2^-27 |x|: xs [3][n_pad][kc]; tokens from n on are zeros.
  void (*split_x)(const float* x, size_t ldx, int n, int i0, int i1, int k0, int kc, int n_pad, uint16_t* xs);
  // Output rows [r0, r0 + nr) (nr <= kAmxUnitRows) of y [n, ldy] over the chunk's columns
  // [k0, k0 + kc) (k0 a multiple of the fp8 scale block), from xs (n_pad a multiple of 16):
  // the rows packed exactly into wp (kAmxUnitRows x kAmxKc bf16), then every pair of token
  // tiles times every pair of row panels (a lone last one alone); added to y when accumulate.
  void (*unit)(const Linear& w, int r0, int nr, int k0, int kc, const uint16_t* xs, int n, int n_pad, float* y, size_t ldy,
               bool accumulate, uint16_t* wp);
  // The peak probe: iters rounds of four independent 16 x 16 x 32-pair tile products.
  void (*dot_loop)(long iters);
};
const AmxKernels& amx_native();
// The table the amx tier uses: the native one, or the one emulate_amx installed.
const AmxKernels& amx_kernels();
// Puts the amx tier in use on a's tile kernels (the tests' emulated tile unit) without
// asking the CPU; nullptr: back to the native table. emulate_avx512(nullptr) also resets it.
void emulate_amx(const AmxKernels* a);
// Asks Linux for the tile data state (once per process); false when refused.
bool request_amx_permission();
// Small bf16 and fp8 products on k's tile kernels against f64 sums (the native ones need the
// permission first).
bool amx_self_check(const AmxKernels& k);

// Columns per chunk of the avx512 tier's multi-token bf16 tile (avx512.cpp): 0 leaves it to
// the machine; tests set a short one so that every machine runs the parked accumulators.
void set_bf16_tile_chunk(int cols);
int bf16_tile_chunk_set();

}  // namespace dsa::kernels::cpu
