// The avx512 tier's kernels: the decode GEMV (fp8 and bf16, one to many tokens), the
// prefill GEMM's micro-kernel and fp8 panel pack, the lightning indexer's scan and the sparse
// attention tile's products, in 512-bit registers. The numerics are the avx2 kernels'
// (cpu_linear.cpp): weights placed exactly as f32 bits, f32 FMAs; only the GEMV's order
// differs (64 weights per fp8 load instead of 32, the fp8 block scale applied to x instead
// of to each block's partial sum), and the GEMM sums every output in the same k order, so
// its results are bitwise the avx2 GEMM's.
//
// Built twice: natively (this file's functions carry the AVX-512 target, the rest of the
// binary does not), and for the tests with DSA_AVX512_EMULATED on an emulation of the
// intrinsics, so that the tier is checked on machines without AVX-512.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <unistd.h>

#include "core/dtype.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/simd.h"

#ifdef DSA_AVX512_EMULATED
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
// SIMDe has this one without the alias; GCC's header makes it a macro at -O0.
#undef _mm512_shuffle_f32x4
#define _mm512_shuffle_f32x4(a, b, imm8) simde_mm512_shuffle_f32x4(a, b, imm8)
#define DSA_AVX512_NS avx512_emulated
#else
#include <immintrin.h>
// After the includes: only the functions defined below are compiled for AVX-512, never an
// inline function of a header that other files share (the linker keeps one copy of those).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
// GCC 12's AVX-512 headers build some vectors from a self-initialized "undefined" one
// (_mm512_undefined_ps), which -Wmaybe-uninitialized (or -Wuninitialized, depending on
// where they are inlined) reports.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#define DSA_AVX512_NS avx512
#endif

#include "kernels/cpu/simd512.h"

namespace dsa::kernels::cpu::DSA_AVX512_NS {
namespace {

// Sum of the sixteen lanes: the halves added, then the avx2 kernels' eight-lane order.
inline float hsum16(__m512 v) {
  const __m256 s = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

// Keeps a vector several FMAs share in a register: left alone, the compiler folds it into each
// FMA as a memory operand, and the loads then bound the multi-token loops. (SIMDe's vectors
// are not register operands; its build only checks logic, not speed.)
#ifdef DSA_AVX512_EMULATED
inline void pin(__m512&) {}
#else
inline void pin(__m512& v) { __asm__("" : "+v"(v)); }
#endif

// 64 weight bytes as two 32-byte loads. Checkpoint tensors sit wherever the safetensors
// header ends (8 bytes past a cache line in the files seen so far), so a 64-byte load of a
// row splits two lines every time, where of two 32-byte loads only one does: on Zen 5 the
// one-token fp8 stream ran at 36-38 GB/s with single loads against 50-53 GB/s aligned.
inline __m512i load_weights64(const void* p) {
  const __m256i lo = _mm256_loadu_si256(static_cast<const __m256i*>(p));
  const __m256i hi = _mm256_loadu_si256(static_cast<const __m256i*>(p) + 1);
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// ---- fp8: e4m3 codes as f32 bits ----------------------------------------------------
// The avx2 trick at twice the width: 64 codes are loaded as 32 words; in each 32-bit lane
// the byte b3 shifted arithmetically right by 4 puts the sign at bit 31 and the 7
// exponent/mantissa bits at 26..20, which masked and read as an f32 is exactly 2^-120 times
// the e4m3 value (subnormal codes land on f32 subnormals). A word shift by 8 brings b2 up,
// a lane shift by 16 does b1 and b0. x is permuted per 64 columns to the lanes' order and
// scaled by 2^64 times the block scale of the rows' 128-row block (scale_x_blocks), so a
// row sums all its columns in one pair of accumulators with no per-block step; the sum
// times 2^56 undoes both powers of two exactly.
struct Fp8x64 {
  __m512 b3, b2, b1, b0;  // weights 4i+3, 4i+2, 4i+1, 4i for lane i
};
inline Fp8x64 fp8x64_bits(const uint8_t* p) {
  const __m512i m = _mm512_set1_epi32(int32_t(0x87F00000u));
  const __m512i v = load_weights64(p);
  const __m512i hi = _mm512_srai_epi16(v, 4), lo = _mm512_srai_epi16(_mm512_slli_epi16(v, 8), 4);
  return {_mm512_castsi512_ps(_mm512_and_si512(hi, m)), _mm512_castsi512_ps(_mm512_and_si512(lo, m)),
          _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(hi, 16), m)),
          _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(lo, 16), m))};
}
constexpr float kFp8XScale = 0x1p64f;
constexpr float kFp8BitsUndo = 0x1p120f * 0x1p-64f;

// x * 2^64, each full group of 64 columns in the order of Fp8x64: [4i+3 | 4i+2 | 4i+1 | 4i].
// Per group, columns k, k + 4, ... are picked from each half by a two-source permute and the
// halves' first eights joined (a batch-16 step prepares its x this way some forty times a layer).
void prescale_x(const float* x, int n, float* b) {
  const __m512 s = _mm512_set1_ps(kFp8XScale);
  int c = 0;
  for (; c + 64 <= n; c += 64) {
    const __m512 x0 = _mm512_loadu_ps(x + c), x1 = _mm512_loadu_ps(x + c + 16);
    const __m512 x2 = _mm512_loadu_ps(x + c + 32), x3 = _mm512_loadu_ps(x + c + 48);
    for (int k = 0; k < 4; ++k) {
      const __m512i idx = _mm512_add_epi32(_mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0), _mm512_set1_epi32(k));
      const __m512 lo = _mm512_permutex2var_ps(x0, idx, x1), hi = _mm512_permutex2var_ps(x2, idx, x3);
      _mm512_storeu_ps(b + c + 16 * (3 - k), _mm512_mul_ps(_mm512_shuffle_f32x4(lo, hi, 0x44), s));
    }
  }
  for (; c < n; ++c) b[c] = x[c] * kFp8XScale;
}

// The columns of full 64-wide groups inside whole scale blocks; the rest is the scalar tail.
inline int fp8_vector_cols(const Linear& w) { return w.block_cols % 64 == 0 ? (w.cols / w.block_cols) * w.block_cols : 0; }
inline size_t prefetch_ahead(size_t row_bytes) { return 4 * row_bytes * ((8192 + 4 * row_bytes - 1) / (4 * row_bytes)); }

// The next row block of a multi-group product, prefetched into L2 by the token groups after
// the first: the first group of a block then finds its weights in L2 instead of streaming
// them from memory at one core's read rate while the later groups, which re-read the block
// from L2, leave the memory idle. A tile step consumes 64 bytes of each of its NR rows, and
// the later groups together take at least that many lines of the next block per step (share
// groups, NR / share lines each, rounded up), so the next block is in L2 before they finish.
struct NextBlock {
  const char* p = nullptr;
  const char* end = nullptr;
  int lines[5] = {};  // lines per step of a tile of 1, 2 or 4 rows
  NextBlock() = default;
  NextBlock(const char* begin, const char* stop, int share) : p(begin), end(stop) {
    for (int nr : {1, 2, 4}) lines[nr] = (nr + share - 1) / share;
  }
  template <int NR>
  void step() {
    if (p >= end) return;
    for (int i = 0; i < lines[NR]; ++i) prefetch_stream(p + 64 * i);
    p += 64 * lines[NR];
  }
  bool later() const { return p != nullptr; }  // a group after the block's first
};

// A tile step's prefetch of one weight row. The block's first group streams it from memory
// into L2, `ahead` bytes on; a later group finds it in L2 and pulls it into L1 eight 64-byte
// steps ahead, which the L1 prefetcher alone left short: with it the lm_head for 64 tokens
// (bf16, 2 threads) ran 2-6% faster, an fp8 2048 x 2048 or 512 x 2048 product of 8 to 64
// tokens 2-5% (the two alternating call by call in one process, bitwise the same).
inline void prefetch_row(const void* row_at, size_t ahead, const NextBlock& nb) {
  const char* p = static_cast<const char*>(row_at);
  if (nb.later()) _mm_prefetch(p + 512, _MM_HINT_T0);
  else prefetch_stream(p + ahead);
}

// A prescaled x (prescale_x) times the block scales of one 128-row block (srow), over the
// vector columns: what every fp8 kernel below multiplies that block's rows with.
void scale_x_blocks(const Linear& w, const float* xp, const float* srow, float* xs) {
  const int kfull = fp8_vector_cols(w), bc = w.block_cols;
  for (int c0 = 0, blk = 0; c0 < kfull; c0 += bc, ++blk) {
    const __m512 s = _mm512_set1_ps(srow[blk]);
    for (int c = c0; c < c0 + bc; c += 16) _mm512_storeu_ps(xs + c, _mm512_mul_ps(_mm512_loadu_ps(xp + c), s));
  }
}

// A row's sum as every fp8 kernel here finishes it: the lanes, unscaled, then the tail in order.
inline float fp8_finish(__m512 a0, __m512 a1, const uint8_t* wr, const float* srow, const float* x, int kfull, int K, int bc) {
  float acc = hsum16(_mm512_add_ps(a0, a1)) * kFp8BitsUndo;
  for (int c = kfull; c < K; ++c) acc += fp8_e4m3_to_f32(wr[c]) * srow[c / bc] * x[c];
  return acc;
}

// One row's 64 widened weights against one token's x into its two accumulators, in the
// one-token order: b3 and b1 into the first, b2 and b0 into the second.
inline void fp8_fma4(const Fp8x64& f, const __m512 (&xv)[4], __m512 (&a)[2]) {
  a[0] = _mm512_fmadd_ps(f.b3, xv[0], a[0]);
  a[1] = _mm512_fmadd_ps(f.b2, xv[1], a[1]);
  a[0] = _mm512_fmadd_ps(f.b1, xv[2], a[0]);
  a[1] = _mm512_fmadd_ps(f.b0, xv[3], a[1]);
}

// NT tokens against each row as it streams by: every weight vector is widened once for all
// NT tokens. One token runs here for rows of up to 512 columns (gemv_fp8_one takes longer
// ones): one row at a time reads the weights in address order, which on Zen 5 streamed 14-16%
// faster than four adjacent rows side by side sharing the x loads (docs/KERNELS.md). Rows
// [r0, r1) lie in one 128-row block, whose scaled x xs is (scale_x_blocks), as in every fp8
// kernel below.
template <int NT>
void gemv_fp8_tokens(const Linear& w, const float* x, const float* xs, float* y, size_t ldy, int base, int r0, int r1) {
  const int K = w.cols, bc = w.block_cols, sc = w.scale_cols(), kfull = fp8_vector_cols(w);
  const size_t ahead = prefetch_ahead(size_t(K));
  for (int r = r0; r < r1; ++r) {
    const uint8_t* wr = w.data + size_t(r) * size_t(K);
    const float* srow = w.scale + size_t(r / w.block_rows) * size_t(sc);
    __m512 a[NT][2];
    for (int t = 0; t < NT; ++t) a[t][0] = a[t][1] = _mm512_setzero_ps();
    for (int c = 0; c < kfull; c += 64) {
      prefetch_stream(wr + c + ahead);
      const Fp8x64 f = fp8x64_bits(wr + c);
      for (int t = 0; t < NT; ++t) {
        const float* xt = xs + size_t(t) * size_t(K) + c;
        const __m512 xv[4] = {_mm512_loadu_ps(xt), _mm512_loadu_ps(xt + 16), _mm512_loadu_ps(xt + 32), _mm512_loadu_ps(xt + 48)};
        fp8_fma4(f, xv, a[t]);
      }
    }
    for (int t = 0; t < NT; ++t)
      y[size_t(t) * ldy + size_t(r - base)] = fp8_finish(a[t][0], a[t][1], wr, srow, x + size_t(t) * size_t(K), kfull, K, bc);
  }
}

// One or two tokens: the first and the second half of the rows side by side, row r0 + i
// beside row r0 + h + i. A row's sum is a chain of dependent FMAs (two per 64 codes into each
// of its two accumulators) that one row at a time leaves the core waiting on; two rows in
// flight run two chains and share each x load, and each half is still one sequential stream.
// Every row sums its columns in order into its own pair of accumulators: the one-token order,
// bit for bit. On Zen 5, 256 x 2048 in L2, one core: 85-86 -> 104-109 GFLOP/s. (Two adjacent
// rows skewed by half a row ran as fast in L2 but lost half the rate streaming from memory.)
// Two tokens (an MTP verification step) share each pair's widened weights; over rows longer
// than 512 columns this streams faster than the four-row tile's four streams (the step's
// dense fp8 products 3.21-3.69 against 3.65-4.19 ms, docs/KERNELS.md).
template <int NT>
void gemv_fp8_halves(const Linear& w, const float* x, const float* xs, float* y, size_t ldy, int base, int r0, int r1) {
  const int K = w.cols, bc = w.block_cols, kfull = fp8_vector_cols(w);
  const size_t ahead = prefetch_ahead(size_t(K));
  const float* srow = w.scale + size_t(r0 / w.block_rows) * size_t(w.scale_cols());
  const int h = (r1 - r0) / 2;
  for (int i = 0; i < h; ++i) {
    const uint8_t* p = w.data + size_t(r0 + i) * size_t(K);
    const uint8_t* q = w.data + size_t(r0 + h + i) * size_t(K);
    __m512 a[NT][2], b[NT][2];
    for (int t = 0; t < NT; ++t) a[t][0] = a[t][1] = b[t][0] = b[t][1] = _mm512_setzero_ps();
    for (int c = 0; c < kfull; c += 64) {
      prefetch_stream(p + c + ahead);
      prefetch_stream(q + c + ahead);
      const Fp8x64 fp = fp8x64_bits(p + c), fq = fp8x64_bits(q + c);
      for (int t = 0; t < NT; ++t) {
        const float* xt = xs + size_t(t) * size_t(K) + c;
        const __m512 xv[4] = {_mm512_loadu_ps(xt), _mm512_loadu_ps(xt + 16), _mm512_loadu_ps(xt + 32), _mm512_loadu_ps(xt + 48)};
        fp8_fma4(fp, xv, a[t]);
        fp8_fma4(fq, xv, b[t]);
      }
    }
    for (int t = 0; t < NT; ++t) {
      const float* xt = x + size_t(t) * size_t(K);
      y[size_t(t) * ldy + size_t(r0 + i - base)] = fp8_finish(a[t][0], a[t][1], p, srow, xt, kfull, K, bc);
      y[size_t(t) * ldy + size_t(r0 + h + i - base)] = fp8_finish(b[t][0], b[t][1], q, srow, xt, kfull, K, bc);
    }
  }
  if (r0 + 2 * h < r1) gemv_fp8_tokens<NT>(w, x, xs, y, ldy, base, r0 + 2 * h, r1);
}

// NT tokens against NR rows at a time: each x vector loaded once for all NR rows (half the x
// loads per FMA of the one-row loop or fewer, which the loads bound once x no longer fits in
// L1). Two rows for up to four tokens, four rows for two over short rows (two rows leave too
// few loads in flight; longer rows go to gemv_fp8_halves). Every (row, token) sum runs the
// one-token order: per 64 columns b3 and b1 into the first accumulator, b2 and b0 into the
// second. Rows left over go to the next smaller tile.
template <int NR, int NT>
void gemv_fp8_tile(const Linear& w, const float* x, const float* xs, float* y, size_t ldy, int base, int r0, int r1, NextBlock& nb) {
  const int K = w.cols, bc = w.block_cols, sc = w.scale_cols(), kfull = fp8_vector_cols(w);
  const size_t ahead = prefetch_ahead(size_t(K));
  int r = r0;
  for (; r + NR <= r1; r += NR) {
    const uint8_t* wr[NR];
    __m512 a[NR][NT][2];
    for (int j = 0; j < NR; ++j) {
      wr[j] = w.data + size_t(r + j) * size_t(K);
      for (int t = 0; t < NT; ++t) a[j][t][0] = a[j][t][1] = _mm512_setzero_ps();
    }
    for (int c = 0; c < kfull; c += 64) {
      nb.step<NR>();
      // Registers decide the loop order (the sums are the same either way): two rows keep
      // their widened weights and load each token's x in turn; four rows keep both
      // tokens' x and widen each row in turn.
      if constexpr (NR == 2) {
        Fp8x64 f[NR];
        for (int j = 0; j < NR; ++j) {
          prefetch_row(wr[j] + c, ahead, nb);
          f[j] = fp8x64_bits(wr[j] + c);
        }
        for (int t = 0; t < NT; ++t) {
          __m512 xv[4];
          for (int q = 0; q < 4; ++q) {
            xv[q] = _mm512_loadu_ps(xs + size_t(t) * size_t(K) + c + 16 * q);
            pin(xv[q]);
          }
          for (int j = 0; j < NR; ++j) fp8_fma4(f[j], xv, a[j][t]);
        }
      } else {
        __m512 xv[NT][4];
        for (int t = 0; t < NT; ++t)
          for (int q = 0; q < 4; ++q) {
            xv[t][q] = _mm512_loadu_ps(xs + size_t(t) * size_t(K) + c + 16 * q);
            pin(xv[t][q]);
          }
        for (int j = 0; j < NR; ++j) {
          prefetch_stream(wr[j] + c + ahead);
          const Fp8x64 f = fp8x64_bits(wr[j] + c);
          for (int t = 0; t < NT; ++t) fp8_fma4(f, xv[t], a[j][t]);
        }
      }
    }
    for (int j = 0; j < NR; ++j) {
      const float* srow = w.scale + size_t((r + j) / w.block_rows) * size_t(sc);
      for (int t = 0; t < NT; ++t)
        y[size_t(t) * ldy + size_t(r + j - base)] =
            fp8_finish(a[j][t][0], a[j][t][1], wr[j], srow, x + size_t(t) * size_t(K), kfull, K, bc);
    }
  }
  if (r == r1) return;
  if constexpr (NR > 2) gemv_fp8_tile<NR / 2, NT>(w, x, xs, y, ldy, base, r, r1, nb);
  else gemv_fp8_tokens<NT>(w, x, xs, y, ldy, base, r, r1);
}

// ---- bf16: two weights per 32-bit lane ----------------------------------------------
// The odd column sits in a lane's high half (masked, it is an f32), the even one in its low
// half (shifted up by 16); x is split per 32 columns into its even and odd columns to match.
// Every bf16 kernel sums a (row, token) pair in one 16-lane accumulator, per 32 columns the
// even columns then the odd ones: one register per pair lets a tile hold 4 rows x 6 tokens
// (24 sums), where two per pair held 2 x 6, and the x loads per FMA halve.
void deinterleave_x(const float* x, int n, float* b) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  int c = 0;
  for (; c + 32 <= n; c += 32) {
    const __m512 x0 = _mm512_loadu_ps(x + c), x1 = _mm512_loadu_ps(x + c + 16);
    _mm512_storeu_ps(b + c, _mm512_permutex2var_ps(x0, even, x1));
    _mm512_storeu_ps(b + c + 16, _mm512_permutex2var_ps(x0, odd, x1));
  }
  for (; c < n; ++c) b[c] = x[c];
}

inline float bf16_finish(__m512 a, const uint16_t* wr, const float* x, int K) {
  float acc = hsum16(a);
  for (int c = K / 32 * 32; c < K; ++c) acc += bf16_to_f32(wr[c]) * x[c];
  return acc;
}

// NT tokens against one row at a time: for one token and rows of up to 512 columns the whole
// product, else the rows a tile or the halves leave over. One row at a time reads
// the weights as one sequential stream, where four rows side by side are four streams a row
// (4 KB at 2048 columns) apart: on Zen 4, 2 threads, 129280 x 2048 (the lm_head), in the
// read probe's fast state (55-62 GB/s) one token took 10.1-10.2 ms against 12.3-12.9 with four
// rows, two tokens 10.1-11.7 against 11.8-13.7; in its slow state (33-35 GB/s) all within
// 1-5% of each other. The hardware prefetcher keeps up with one token's stream alone
// (software prefetches took it to 11.1-11.5 ms); two tokens need them.
template <int NT, bool kPrefetch>
void gemv_bf16_tokens(const Linear& w, const float* x, const float* xp, float* y, size_t ldy, int base, int r0, int r1) {
  const int K = w.cols, k32 = K / 32 * 32;
  const size_t ahead = prefetch_ahead(2 * size_t(K));
  const __m512i hi_mask = _mm512_set1_epi32(int32_t(0xFFFF0000u));
  for (int r = r0; r < r1; ++r) {
    const uint16_t* wr = reinterpret_cast<const uint16_t*>(w.data) + size_t(r) * size_t(K);
    __m512 a[NT];
    for (int t = 0; t < NT; ++t) a[t] = _mm512_setzero_ps();
    for (int c = 0; c < k32; c += 32) {
      if (kPrefetch) prefetch_stream(reinterpret_cast<const char*>(wr + c) + ahead);
      const __m512i v = load_weights64(wr + c);
      const __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), wo = _mm512_castsi512_ps(_mm512_and_si512(v, hi_mask));
      for (int t = 0; t < NT; ++t) {
        const float* xd = xp + size_t(t) * size_t(K) + c;
        a[t] = _mm512_fmadd_ps(we, _mm512_loadu_ps(xd), a[t]);
        a[t] = _mm512_fmadd_ps(wo, _mm512_loadu_ps(xd + 16), a[t]);
      }
    }
    for (int t = 0; t < NT; ++t) y[size_t(t) * ldy + size_t(r - base)] = bf16_finish(a[t], wr, x + size_t(t) * size_t(K), K);
  }
}

// One or two tokens: the two halves of the rows side by side, as gemv_fp8_one does, each
// (row, token) pair one accumulator in the one-token order; each half prefetched into L2 (the
// hardware prefetcher alone kept one stream a core fed, not two). On Zen 5, 2 threads, the
// lm_head (129280 x 2048) for one token took 10.9-12.4 ms against 13.4-13.6 one row at a
// time in a slow state of the machine, 9.90-9.95 against 10.18-10.35 in a fast one; a
// verification step (two tokens, mostly this product) 19.3-23.5 ms against 23.6-26.2.
template <int NT>
void gemv_bf16_halves(const Linear& w, const float* x, const float* xp, float* y, size_t ldy, int base, int r0, int r1) {
  const int K = w.cols, k32 = K / 32 * 32;
  const size_t ahead = prefetch_ahead(2 * size_t(K));
  const __m512i hi_mask = _mm512_set1_epi32(int32_t(0xFFFF0000u));
  const int h = (r1 - r0) / 2;
  for (int i = 0; i < h; ++i) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(w.data) + size_t(r0 + i) * size_t(K);
    const uint16_t* q = p + size_t(h) * size_t(K);
    __m512 a[NT], b[NT];
    for (int t = 0; t < NT; ++t) a[t] = b[t] = _mm512_setzero_ps();
    for (int c = 0; c < k32; c += 32) {
      prefetch_stream(reinterpret_cast<const char*>(p + c) + ahead);
      prefetch_stream(reinterpret_cast<const char*>(q + c) + ahead);
      const __m512i u = load_weights64(p + c), v = load_weights64(q + c);
      const __m512 ue = _mm512_castsi512_ps(_mm512_slli_epi32(u, 16)), uo = _mm512_castsi512_ps(_mm512_and_si512(u, hi_mask));
      const __m512 ve = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), vo = _mm512_castsi512_ps(_mm512_and_si512(v, hi_mask));
      for (int t = 0; t < NT; ++t) {
        const __m512 xe = _mm512_loadu_ps(xp + size_t(t) * size_t(K) + c), xo = _mm512_loadu_ps(xp + size_t(t) * size_t(K) + c + 16);
        a[t] = _mm512_fmadd_ps(ue, xe, a[t]);
        b[t] = _mm512_fmadd_ps(ve, xe, b[t]);
        a[t] = _mm512_fmadd_ps(uo, xo, a[t]);
        b[t] = _mm512_fmadd_ps(vo, xo, b[t]);
      }
    }
    for (int t = 0; t < NT; ++t) {
      const float* xt = x + size_t(t) * size_t(K);
      y[size_t(t) * ldy + size_t(r0 + i - base)] = bf16_finish(a[t], p, xt, K);
      y[size_t(t) * ldy + size_t(r0 + h + i - base)] = bf16_finish(b[t], q, xt, K);
    }
  }
  if (r0 + 2 * h < r1) gemv_bf16_tokens<NT, NT != 1>(w, x, xp, y, ldy, base, r0 + 2 * h, r1);
}

// NT tokens against NR rows at a time, each x vector loaded once for all NR rows; every
// (row, token) sum in the one-token order (one accumulator, even columns then odd ones per
// 32). NR x NT accumulators: four rows for up to six tokens.
// The columns go in chunks of kBf16Chunk. A token's whole x is 8 KB at 2048 columns, so six
// tokens' x does not stay in L1 beside the weight stream, and the row pair's sweep over all
// columns reloaded it from L2; one chunk of it (up to 24 KB) does stay while a sub-block of
// kBf16SubRows rows runs through it, each row group's accumulators parked between chunks.
// Parking moves no FMA, so every sum keeps the one-token order. Rows left over go to the
// next smaller tile.
constexpr int kBf16SubRows = 16;

// 1024 columns for a row block's first token group, which streams the rows from memory: on
// Zen 5 (two cores, 48 KB L1) the lm_head for 2, 4 and 6 tokens took 9.2-10.2, 12.7-14.9 and
// 16.7-17.1 ms with it against 12.1-12.3 (512), 17.2-17.6 and 22.7 (256); shorter chunks
// park the accumulators more often than the reloads they save are worth.
// On Zen 4 (32 KB L1, its weight streams prefetched into L2) whole rows beat 1024-column chunks
// for every token count: 129280x2048 for 2, 4 and 6 tokens, 2 threads, 25 interleaved calls
// each, medians 16.1 / 16.9 / 18.2 ms against 17.3 / 17.8 / 20.6 (512: 18.1 / 21.0 / 24.1).
// So the chunks go by the L1 size, the one difference between the two machines measured.
// The later groups, re-reading the rows from L2, run whole rows on either machine: on Zen 5,
// 2 threads, the lm_head for 8 / 12 / 16 / 64 tokens took 25.1-27.4 / 28.8-34.1 / 44.5-49.5
// / 146-151 ms with 1024-column chunks against 22.0-24.2 / 26.6-31.8 / 42.8-47.7 / 142-144
// (the two alternating call by call in one process).
constexpr int kBf16Chunk = 1024, kWholeRows = 1 << 24;  // wider than any row
int bf16_chunk(const NextBlock& nb) {
  static const int machine = [] {
    const long l1 = ::sysconf(_SC_LEVEL1_DCACHE_SIZE);
    return l1 > 0 && l1 < 48 * 1024 ? kWholeRows : kBf16Chunk;
  }();
  const int set = bf16_tile_chunk_set();
  return set > 0 ? set : nb.later() ? kWholeRows : machine;
}

template <int NR, int NT>
void bf16_tile_chunk(const uint16_t* const (&wr)[NR], const float* xp, int K, int c0, int c1, __m512 (&acc)[NR][NT], NextBlock& nb) {
  const size_t ahead = prefetch_ahead(2 * size_t(K));
  const __m512i hi_mask = _mm512_set1_epi32(int32_t(0xFFFF0000u));
  // Local accumulators: through the reference, a compiler that does not inline this
  // function cannot rule out that the x loads alias them, and stores all 24 every step.
  __m512 a[NR][NT];
  std::memcpy(a, acc, sizeof a);
  for (int c = c0; c < c1; c += 32) {
    nb.step<NR>();
    __m512 we[NR], wo[NR];
    for (int j = 0; j < NR; ++j) {
      prefetch_row(wr[j] + c, ahead, nb);
      const __m512i v = load_weights64(wr[j] + c);
      we[j] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      wo[j] = _mm512_castsi512_ps(_mm512_and_si512(v, hi_mask));
    }
    for (int t = 0; t < NT; ++t) {
      const float* xd = xp + size_t(t) * size_t(K) + c;
      __m512 xe = _mm512_loadu_ps(xd), xo = _mm512_loadu_ps(xd + 16);
      pin(xe);
      pin(xo);
      for (int j = 0; j < NR; ++j) {
        a[j][t] = _mm512_fmadd_ps(we[j], xe, a[j][t]);
        a[j][t] = _mm512_fmadd_ps(wo[j], xo, a[j][t]);
      }
    }
  }
  std::memcpy(acc, a, sizeof a);
}

template <int NR, int NT>
void gemv_bf16_tile(const Linear& w, const float* x, const float* xp, float* y, size_t ldy, int base, int r0, int r1, NextBlock& nb) {
  const int chunk = bf16_chunk(nb);
  static_assert(kBf16SubRows % NR == 0);
  const int K = w.cols, k32 = K / 32 * 32, rfull = r0 + (r1 - r0) / NR * NR;
  alignas(64) float park[kBf16SubRows / NR][NR][NT][16];
  for (int rs = r0; rs < rfull; rs += kBf16SubRows) {
    const int re = std::min(rfull, rs + kBf16SubRows);
    for (int c0 = 0; c0 < std::max(k32, 1); c0 += chunk) {
      const int c1 = std::min(k32, c0 + chunk);
      const bool last = c1 >= k32;
      for (int r = rs; r < re; r += NR) {
        auto& pk = park[(r - rs) / NR];
        const uint16_t* wr[NR];
        __m512 a[NR][NT];
        for (int j = 0; j < NR; ++j) {
          wr[j] = reinterpret_cast<const uint16_t*>(w.data) + size_t(r + j) * size_t(K);
          for (int t = 0; t < NT; ++t) a[j][t] = c0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(pk[j][t]);
        }
        bf16_tile_chunk<NR, NT>(wr, xp, K, c0, c1, a, nb);
        for (int j = 0; j < NR; ++j)
          for (int t = 0; t < NT; ++t) {
            if (last) y[size_t(t) * ldy + size_t(r + j - base)] = bf16_finish(a[j][t], wr[j], x + size_t(t) * size_t(K), K);
            else _mm512_store_ps(pk[j][t], a[j][t]);
          }
      }
    }
  }
  if (rfull == r1) return;
  if constexpr (NR > 2) gemv_bf16_tile<NR / 2, NT>(w, x, xp, y, ldy, base, rfull, r1, nb);
  else gemv_bf16_tokens<NT, true>(w, x, xp, y, ldy, base, rfull, r1);
}

// ---- many tokens ----------------------------------------------------------------------
// Tokens in groups: up to four for fp8 against two rows (16 accumulators beside 8 widened
// weight vectors, 4 x vectors and the mask) and six for bf16 against four (24). With more
// than one group the rows go in blocks of 64, each block's weights read from memory once and
// from cache by the later groups. Every kernel sums a row in the one-token order, so the
// grouping changes no output bit.
constexpr int kTokGroupFp8 = 4, kTokGroupBf16 = 6, kRowBlock = 64;

// The kernel for n prepared tokens. fp8: one and two tokens two rows at a time from the two
// halves of the range (short rows: one token one row at a time, two against four rows, as two
// rows keep too few loads in flight), more against two. bf16: one and two tokens two rows at
// a time from the halves (gemv_bf16_halves), more against four rows (one row at a time loads
// each x vector once per row, which from three tokens on costs more than the four streams do).
void gemv_prepared(const Linear& w, const float* x, const float* xb, int n, float* y, size_t ldy, int base, int r0, int r1, NextBlock& nb) {
  const bool fp8 = w.dtype == DType::F8_E4M3;
  switch (n) {
    case 1:
      // Rows of 512 columns or fewer are short enough for the core to overlap consecutive
      // rows' chains by itself: there the second stream cost more than it gave (the experts'
      // 2048 x 512 down projections in a decode step 1.23-1.36 -> 1.42-1.49 ms).
      if (w.cols <= 512) {
        if (fp8) gemv_fp8_tokens<1>(w, x, xb, y, 0, base, r0, r1);
        else gemv_bf16_tokens<1, false>(w, x, xb, y, 0, base, r0, r1);
      } else if (fp8) {
        gemv_fp8_halves<1>(w, x, xb, y, 0, base, r0, r1);
      } else {
        gemv_bf16_halves<1>(w, x, xb, y, 0, base, r0, r1);
      }
      break;
    case 2:
      if (fp8 && w.cols > 512) gemv_fp8_halves<2>(w, x, xb, y, ldy, base, r0, r1);
      else if (fp8) gemv_fp8_tile<4, 2>(w, x, xb, y, ldy, base, r0, r1, nb);
      else gemv_bf16_halves<2>(w, x, xb, y, ldy, base, r0, r1);
      break;
    case 3:
      if (fp8) gemv_fp8_tile<2, 3>(w, x, xb, y, ldy, base, r0, r1, nb);
      else gemv_bf16_tile<4, 3>(w, x, xb, y, ldy, base, r0, r1, nb);
      break;
    case 4:
      if (fp8) gemv_fp8_tile<2, 4>(w, x, xb, y, ldy, base, r0, r1, nb);
      else gemv_bf16_tile<4, 4>(w, x, xb, y, ldy, base, r0, r1, nb);
      break;
    case 5: gemv_bf16_tile<4, 5>(w, x, xb, y, ldy, base, r0, r1, nb); break;  // bf16 only: fp8 groups stop at four
    default: gemv_bf16_tile<4, 6>(w, x, xb, y, ldy, base, r0, r1, nb); break;
  }
}

// The token groups of one prepared set of tokens over rows [r0, r1); the later groups
// prefetch the next row block up to row r_end (NextBlock).
void gemv_groups(const Linear& w, const float* x, const float* xb, int cnt, float* y, size_t ldy, int base, int r0, int r1, int r_end) {
  const bool fp8 = w.dtype == DType::F8_E4M3;
  const size_t cols = size_t(w.cols);
  const int group = fp8 ? kTokGroupFp8 : kTokGroupBf16;
  const int rb_step = cnt <= group ? r1 - r0 : kRowBlock;
  const size_t row_bytes = cols * dtype_size(w.dtype);
  const char* data = reinterpret_cast<const char*>(w.data);
  // Groups as even as possible (bf16, 8 tokens: 4 + 4, not 6 + 2).
  const int groups = (cnt + group - 1) / group;
  for (int rb = r0; rb < r1; rb += rb_step) {
    const int re = std::min(r1, rb + rb_step);
    NextBlock next;  // none for the first group of a block
    for (int gi = 0, g = 0; gi < groups; ++gi) {
      if (gi == 1) next = NextBlock(data + size_t(re) * row_bytes, data + size_t(std::min(r_end, re + rb_step)) * row_bytes, groups - 1);
      const int k = (cnt - g) / (groups - gi);
      gemv_prepared(w, x + size_t(g) * cols, xb + size_t(g) * cols, k, y + size_t(g) * ldy, ldy, base, rb, re, next);
      g += k;
    }
  }
}

void gemv_rows(const Linear& w, const float* x, int n, float* y, size_t ldy, int base, int r0, int r1, float* xbuf) {
  const bool fp8 = w.dtype == DType::F8_E4M3;
  const size_t cols = size_t(w.cols);
  for (int t0 = 0; t0 < n; t0 += kTokBuf) {
    const int cnt = std::min(kTokBuf, n - t0);
    const float* xt = x + size_t(t0) * cols;
    float* yt = y + size_t(t0) * ldy;
    for (int i = 0; i < cnt; ++i) {
      if (fp8) prescale_x(xt + size_t(i) * cols, w.cols, xbuf + size_t(i) * cols);
      else deinterleave_x(xt + size_t(i) * cols, w.cols, xbuf + size_t(i) * cols);
    }
    if (!fp8) {
      gemv_groups(w, xt, xbuf, cnt, yt, ldy, base, r0, r1, r1);
      continue;
    }
    // fp8: each 128-row block of the range with x scaled by that block's scales.
    float* xs = xbuf + size_t(cnt) * cols;
    for (int s0 = r0; s0 < r1;) {
      const int s1 = std::min(r1, (s0 / w.block_rows + 1) * w.block_rows);
      const float* srow = w.scale + size_t(s0 / w.block_rows) * size_t(w.scale_cols());
      for (int i = 0; i < cnt; ++i) scale_x_blocks(w, xbuf + size_t(i) * cols, srow, xs + size_t(i) * cols);
      gemv_groups(w, xt, xs, cnt, yt, ldy, base, s0, s1, r1);
      s0 = s1;
    }
  }
}

// ---- the transposed direction: absorbed queries through kv_b's k rows -----------------
// y[t][0:K) = Σ_r m[t][r] w[r][0:K) with m = x * block scale * 2^64 (the avx2 kernels'
// multiplier, cpu_linear.cpp), each column summing its rows in row order from zero and scaled
// by 2^56 at the end: every lane does the avx2 kernels' FMAs in their order, so the results are
// theirs bit for bit. Rows go kTRows at a time (8 KB at 512 columns, in L1), each step's
// columns in tiles of up to four tokens (y carried through memory between steps); a tile
// widens its weights itself, 16 codes per 3 instructions against 8 per 3 in the avx2 kernels,
// and later token groups re-read them from L1.
constexpr int kTRows = 16;

inline __m512 fp8x16_bits(const uint8_t* p) {  // fp8x8_bits at twice the width, the codes in order
#ifdef DSA_AVX512_EMULATED  // SIMDe has no 16-byte sign extension to 32-bit lanes: two halves
  const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))),
                                       _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8))), 1);
#else
  const __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#endif
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(v, 20), _mm512_set1_epi32(int32_t(0x87F00000u))));
}

// NT tokens x V vectors of columns from p (rows ld apart) down `rows` rows; m[t][r] at m + t * kTRows + r.
// The first npf rows also prefetch the same columns of the rows from pf on (two steps down):
// spread over the rows, where a burst of a step's 128 lines at once left the stream at two
// thirds of the avx2 kernel's.
template <int NT, int V>
void t_tile(const uint8_t* p, size_t ld, int rows, const float* m, float* y, size_t ldy, const uint8_t* pf, int npf) {
  __m512 a[NT][V];
  for (int t = 0; t < NT; ++t)
    for (int v = 0; v < V; ++v) a[t][v] = _mm512_loadu_ps(y + size_t(t) * ldy + 16 * v);
  for (int r = 0; r < rows; ++r) {
    if (r < npf)
      for (int v = 0; v < V; v += 4) prefetch_stream(pf + size_t(r) * ld + 16 * v);
    __m512 wv[V];
    for (int v = 0; v < V; ++v) wv[v] = fp8x16_bits(p + size_t(r) * ld + 16 * v);
    for (int t = 0; t < NT; ++t) {
      const __m512 mv = _mm512_set1_ps(m[t * kTRows + r]);
      for (int v = 0; v < V; ++v) a[t][v] = _mm512_fmadd_ps(wv[v], mv, a[t][v]);
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(y + size_t(t) * ldy + 16 * v, a[t][v]);
}

// NT tokens over columns [c0, c1) (whole vectors): tiles of V vectors, then single ones.
template <int NT, int V>
void t_tokens(const uint8_t* p, size_t ld, int rows, const float* m, float* y, size_t ldy, int c0, int c1, const uint8_t* pf, int npf) {
  int c = c0;
  for (; c + 16 * V <= c1; c += 16 * V) t_tile<NT, V>(p + c, ld, rows, m, y + c, ldy, pf + c, npf);
  for (; c < c1; c += 16) t_tile<NT, 1>(p + c, ld, rows, m, y + c, ldy, pf + c, c % 64 == 0 ? npf : 0);
}

// n tokens (at most kTokChunkT; x and y rows ldx and ldy apart) through rows [r0, r0 + nrows)
// of an fp8 weight whose scale blocks are a multiple of 16 columns wide; the caller checked
// that every multiplier is below 2^60 (fp8_t_takes). The prefetch runs on into the nrows rows
// from next_r0 (the next head's; none when negative).
void linear_t_fp8(const Linear& w, const float* x, size_t ldx, int n, int r0, int nrows, int next_r0, float* y, size_t ldy) {
  const int sc = w.scale_cols(), bc = w.block_cols, K = w.cols;
  const size_t ld = size_t(K);
  for (int t = 0; t < n; ++t) std::fill(y + size_t(t) * ldy, y + size_t(t) * ldy + ld, 0.0f);
  alignas(64) float m[kTokChunkT * kTRows];
  for (int q0 = 0; q0 < nrows; q0 += kTRows) {
    const int rows = std::min(kTRows, nrows - q0);
    const uint8_t* p = w.data + size_t(r0 + q0) * ld;
    // The rows two steps ahead, by the first token group (a head's block is too short for the
    // hardware prefetchers to get going): this block's, then the next one's.
    const int here = q0 + 2 * kTRows, next = here - nrows;  // that row of this block, of the next
    const uint8_t* pf = p;
    int ahead = 0;
    if (here < nrows) {
      pf = p + 2 * kTRows * ld;
      ahead = std::min(kTRows, nrows - here);
    } else if (next_r0 >= 0 && next < nrows) {
      pf = w.data + size_t(next_r0 + next) * ld;
      ahead = std::min(kTRows, nrows - next);
    }
    const float* srow[kTRows];  // each row's block scales (a division per row, once per step)
    for (int r = 0; r < rows; ++r) srow[r] = w.scale + size_t((r0 + q0 + r) / w.block_rows) * size_t(sc);
    for (int c0 = 0, b = 0; c0 < K; c0 += bc, ++b) {
      for (int t = 0; t < n; ++t)
        for (int r = 0; r < rows; ++r) m[t * kTRows + r] = x[size_t(t) * ldx + size_t(q0 + r)] * srow[r][b] * kFp8XScale;
      for (int t = 0, g; t < n; t += g) {  // token groups of up to four; the first one prefetches
        g = std::min(4, n - t);
        const float* mt = m + t * kTRows;
        float* yt = y + size_t(t) * ldy;
        const int npf = t == 0 ? ahead : 0;
        switch (g) {
          case 4: t_tokens<4, 4>(p, ld, rows, mt, yt, ldy, c0, c0 + bc, pf, npf); break;
          case 3: t_tokens<3, 4>(p, ld, rows, mt, yt, ldy, c0, c0 + bc, pf, npf); break;
          case 2: t_tokens<2, 8>(p, ld, rows, mt, yt, ldy, c0, c0 + bc, pf, npf); break;
          default: t_tokens<1, 8>(p, ld, rows, mt, yt, ldy, c0, c0 + bc, pf, npf); break;
        }
      }
    }
  }
  const __m512 undo = _mm512_set1_ps(kFp8BitsUndo);
  for (int t = 0; t < n; ++t)
    for (size_t c = 0; c < ld; c += 16) {
      float* yc = y + size_t(t) * ldy + c;
      _mm512_storeu_ps(yc, _mm512_mul_ps(_mm512_loadu_ps(yc), undo));
    }
}

// ---- prefill GEMM micro-kernel ----------------------------------------------------------
// MR tokens x 32 outputs (two 16-row panels): per k two panel loads, MR broadcasts and
// 2 x MR FMAs into 2 x MR accumulators, each output summing k in order from zero as the
// avx2 6x16 kernel does.
template <int MR>
void micro_6x32(const float* pk0, const float* pk1, int kc, const float* xp, float* y, int ldy, int nr0, int nr1, bool accumulate,
                LinePrefetch& pf) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) c0[i] = c1[i] = _mm512_setzero_ps();
  for (int k = 0; k < kc; ++k) {
    if ((k & 7) == 0) pf.next();
    const __m512 w0 = _mm512_loadu_ps(pk0 + size_t(k) * 16), w1 = _mm512_loadu_ps(pk1 + size_t(k) * 16);
    const float* xk = xp + size_t(k) * MR;
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m512 b = _mm512_set1_ps(xk[i]);
      c0[i] = _mm512_fmadd_ps(b, w0, c0[i]);
      c1[i] = _mm512_fmadd_ps(b, w1, c1[i]);
    }
  }
  auto put = [&](float* yi, __m512 v, int nr) {
    if (nr == 16) {
      if (accumulate) v = _mm512_add_ps(v, _mm512_loadu_ps(yi));
      _mm512_storeu_ps(yi, v);
      return;
    }
    float t[16];
    _mm512_storeu_ps(t, v);
    for (int j = 0; j < nr; ++j) yi[j] = accumulate ? yi[j] + t[j] : t[j];
  };
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    float* yi = y + size_t(i) * size_t(ldy);
    put(yi, c0[i], nr0);
    put(yi + 16, c1[i], nr1);
  }
}

// Sixteen bytes sign-extended to 32-bit lanes. SIMDe has no 512-bit form of the widening, so
// its build joins two 256-bit ones (the same lanes).
inline __m512i widen_i8x16(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
#ifdef DSA_AVX512_EMULATED
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepi8_epi32(v)), _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)), 1);
#else
  return _mm512_cvtepi8_epi32(v);
#endif
}

// The panel pack of a full fp8 chunk (16 rows x len columns of one scale block, len a
// multiple of 16; s[j] is row j's block scale times 2^120): each row's 16 codes widened to
// 2^-120 times their values (the avx2 fp8x8_bits trick on 16 lanes) and scaled, then a 16 x 16
// transpose in registers, so every k of the panel is one 64-byte store. The same values as
// the avx2 pack (one rounding of code * scale), half the shuffles per weight.
void pack_fp8_chunk(const uint8_t* w0, size_t ldw, int len, const float* s, float* dst) {
  const __m512i mask = _mm512_set1_epi32(int32_t(0x87F00000u));
  __m512 sv[16];
  for (int j = 0; j < 16; ++j) sv[j] = _mm512_set1_ps(s[j]);
  for (int k = 0; k < len; k += 16) {
    __m512 r[16];
    for (int j = 0; j < 16; ++j) {
      const __m512i v = widen_i8x16(w0 + size_t(j) * ldw + size_t(k));
      r[j] = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(v, 20), mask)), sv[j]);
    }
    transpose16_store(r, dst + size_t(k) * 16);
  }
}

// The same pack on AVX512-VBMI byte permutes. The 16 x 16 codes of a step are transposed as
// bytes (four permutes pair rows 0-7 and 8-15 into eight-column halves, four more join the
// halves into four-column quarters), then each column's 16 codes go to the top bytes of the
// 32-bit lanes with one zero-masking permute; an arithmetic shift of the lanes' high halves
// by 4 then places sign, exponent and mantissa where the shift by 20 of the sign-extended
// code puts them. The same bits as pack_fp8_chunk with a quarter of its shuffles (the 16 x 16
// f32 transpose was most of them).
#ifdef DSA_AVX512_EMULATED
#define DSA_VBMI_TARGET
#else
#define DSA_VBMI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi")))
#endif
struct VbmiPackIndex {
  alignas(64) uint8_t pair[2][64]{};     // rows 0-7 of two four-row vectors: [8 c + r] = column 8 x + c of row r
  alignas(64) uint8_t quarter[2][64]{};  // the two row halves: [16 c + j] = column 4 h + c of row j
  alignas(64) uint8_t lanes[4][64]{};    // column c of a quarter into byte 4 j + 3
  constexpr VbmiPackIndex() {
    for (int x = 0; x < 2; ++x)
      for (int c = 0; c < 8; ++c)
        for (int r = 0; r < 8; ++r) pair[x][8 * c + r] = uint8_t(64 * (r / 4) + 16 * (r % 4) + 8 * x + c);
    for (int h = 0; h < 2; ++h)
      for (int c = 0; c < 4; ++c)
        for (int j = 0; j < 16; ++j) quarter[h][16 * c + j] = uint8_t(64 * (j / 8) + 8 * (4 * h + c) + j % 8);
    for (int c = 0; c < 4; ++c)
      for (int i = 0; i < 64; ++i) lanes[c][i] = uint8_t(i % 4 == 3 ? 16 * c + i / 4 : 0);
  }
};
constexpr VbmiPackIndex kVbmiPack;

DSA_VBMI_TARGET void pack_fp8_chunk_vbmi(const uint8_t* w0, size_t ldw, int len, const float* s, float* dst) {
  const __m512i mask = _mm512_set1_epi32(int32_t(0x87F00000u));
  const __m512 sv = _mm512_loadu_ps(s);
  const __mmask64 top = 0x8888888888888888ull;
  __m512i pair[2], quarter[2], lanes[4];
  for (int i = 0; i < 2; ++i) {
    pair[i] = _mm512_load_si512(kVbmiPack.pair[i]);
    quarter[i] = _mm512_load_si512(kVbmiPack.quarter[i]);
  }
  for (int c = 0; c < 4; ++c) lanes[c] = _mm512_load_si512(kVbmiPack.lanes[c]);
  for (int k = 0; k < len; k += 16) {
    __m512i a[4];
    for (int q = 0; q < 4; ++q) {
      const uint8_t* r = w0 + size_t(4 * q) * ldw + size_t(k);
      __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r)));
      v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + ldw)), 1);
      v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 2 * ldw)), 2);
      a[q] = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 3 * ldw)), 3);
    }
    for (int x = 0; x < 2; ++x) {
      const __m512i lo = _mm512_permutex2var_epi8(a[0], pair[x], a[1]), hi = _mm512_permutex2var_epi8(a[2], pair[x], a[3]);
      for (int h = 0; h < 2; ++h) {
        const __m512i cols = _mm512_permutex2var_epi8(lo, quarter[h], hi);  // columns 8 x + 4 h .. + 3
        for (int c = 0; c < 4; ++c) {
          const __m512i v = _mm512_maskz_permutexvar_epi8(top, lanes[c], cols);
          const __m512 f = _mm512_castsi512_ps(_mm512_and_si512(_mm512_srai_epi16(v, 4), mask));
          _mm512_storeu_ps(dst + size_t(k + 8 * x + 4 * h + c) * 16, _mm512_mul_ps(f, sv));
        }
      }
    }
  }
}

void gemm_panels2(const float* pk0, const float* pk1, int kc, const float* xp, int n, float* y, int ldy, int nr0, int nr1,
                  bool accumulate, LinePrefetch* pf) {
  LinePrefetch none;
  LinePrefetch& p = pf ? *pf : none;
  for (int i0 = 0; i0 < n; i0 += 6) {
    const float* b = xp + size_t(i0) * size_t(kc);
    float* yr = y + size_t(i0) * size_t(ldy);
    switch (std::min(6, n - i0)) {
      case 6: micro_6x32<6>(pk0, pk1, kc, b, yr, ldy, nr0, nr1, accumulate, p); break;
      case 5: micro_6x32<5>(pk0, pk1, kc, b, yr, ldy, nr0, nr1, accumulate, p); break;
      case 4: micro_6x32<4>(pk0, pk1, kc, b, yr, ldy, nr0, nr1, accumulate, p); break;
      case 3: micro_6x32<3>(pk0, pk1, kc, b, yr, ldy, nr0, nr1, accumulate, p); break;
      case 2: micro_6x32<2>(pk0, pk1, kc, b, yr, ldy, nr0, nr1, accumulate, p); break;
      default: micro_6x32<1>(pk0, pk1, kc, b, yr, ldy, nr0, nr1, accumulate, p); break;
    }
  }
}

// ---- sparse MLA attention: sixteen heads per register -------------------------------
// The avx2 tile kernels (cpu_attention.cpp) keep the heads in lanes, two 8-lane groups for 16
// heads; here one 16-lane group. Every lane does the avx2 lane's FMAs in the same order (one
// chain over d per (token, head) score, one chain over the tile's tokens per (column, head)
// output), so the results are bitwise the avx2 tier's.

// s[j][0:16) = Σ_d k_j[d] qT[d][0:16) for NT tokens: one q load and NT broadcasts per d.
template <int NT>
void scores_ntok(const float* qT, size_t ldq, const float* const* k, int d, float* s, size_t lds) {
  __m512 a[NT];
  for (int t = 0; t < NT; ++t) a[t] = _mm512_setzero_ps();
  for (int i = 0; i < d; ++i, qT += ldq) {
    const __m512 q = _mm512_loadu_ps(qT);
    for (int t = 0; t < NT; ++t) a[t] = _mm512_fmadd_ps(q, _mm512_set1_ps(k[t][i]), a[t]);
  }
  for (int t = 0; t < NT; ++t) _mm512_storeu_ps(s + size_t(t) * lds, a[t]);
}

// n tokens (a multiple of 4; the caller pads the rows): twelve at a time (twelve chains in
// flight hide the FMA latency), then fours.
void scores16(const float* qT, size_t ldq, const float* const* k, int n, int d, float* s, size_t lds) {
  int j = 0;
  for (; j + 12 <= n; j += 12) scores_ntok<12>(qT, ldq, k + j, d, s + size_t(j) * lds, lds);
  for (; j < n; j += 4) scores_ntok<4>(qT, ldq, k + j, d, s + size_t(j) * lds, lds);
}

// o[h][c] += Σ_j k_j[c] p[j][h] for 16 heads (o holds a row of ldo values per head) with
// the columns in lanes: NV column vectors x NH heads in registers across the tokens, so a
// token costs NV loads and NH broadcasts for NV x NH FMAs, where heads in lanes need a
// broadcast for every FMA (on Zen 5, 143 -> 188 GFLOP/s on one core, tile in L2). Every
// (head, column) value is still one chain over the tokens in order from o's value, the avx2
// kernel's sum.
template <int NV, int NH>
void accumulate_block(const float* p, size_t ldp, const float* const* k, int nj, int c, float* o, size_t ldo) {
  __m512 a[NV][NH];
#pragma GCC unroll 8
  for (int h = 0; h < NH; ++h)
    for (int v = 0; v < NV; ++v) a[v][h] = _mm512_loadu_ps(o + size_t(h) * ldo + size_t(c + 16 * v));
  for (int j = 0; j < nj; ++j) {
    __m512 kv[NV];
    for (int v = 0; v < NV; ++v) kv[v] = _mm512_loadu_ps(k[j] + c + 16 * v);
    const float* pj = p + size_t(j) * ldp;
#pragma GCC unroll 8
    for (int h = 0; h < NH; ++h) {
      const __m512 pb = _mm512_set1_ps(pj[h]);
      for (int v = 0; v < NV; ++v) a[v][h] = _mm512_fmadd_ps(kv[v], pb, a[v][h]);
    }
  }
#pragma GCC unroll 8
  for (int h = 0; h < NH; ++h)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(o + size_t(h) * ldo + size_t(c + 16 * v), a[v][h]);
}

// d a multiple of 16: 32 columns at a time for each half of the heads (16 accumulators).
void accumulate16(const float* p, size_t ldp, const float* const* k, int nj, int d, float* o, size_t ldo) {
  for (int c = 0; c < d;) {
    const int step = c + 32 <= d ? 32 : 16;
    for (int h = 0; h < 16; h += 8) {
      if (step == 32) accumulate_block<2, 8>(p + h, ldp, k, nj, c, o + size_t(h) * ldo, ldo);
      else accumulate_block<1, 8>(p + h, ldp, k, nj, c, o + size_t(h) * ldo, ldo);
    }
    c += step;
  }
}

// ---- lightning indexer scan ---------------------------------------------------------
// The avx2 scan (cpu_attention.cpp) with 16 heads per register: dot_j[h] = Σ_d qT[d][h] *
// k_j[d] as one FMA chain per (key, head) in d order, keys widened to 2^-120 times their
// values with integer ops (fp8x8_bits), then each key's ReLU-weighted head sum
// in the avx2 kernel's 8-lane order: every score is bitwise the avx2 tier's, so both tiers
// select the same keys. Twelve keys per block (12 x NG accumulators in flight); a run's last
// four or fewer (a 64-token cache block is five blocks and four keys) in a block of four.
constexpr int kIndexKeys = 12;

template <int NG, int NK>
void index_dots(const float* qT, size_t ldq, const float (*kb)[128], float* s, size_t lds) {
  __m512 a[NK][NG];
#pragma GCC unroll 12
  for (int j = 0; j < NK; ++j)
    for (int g = 0; g < NG; ++g) a[j][g] = _mm512_setzero_ps();
  for (int d = 0; d < 128; ++d, qT += ldq) {
    __m512 q[NG];
    for (int g = 0; g < NG; ++g) q[g] = _mm512_loadu_ps(qT + 16 * g);
#pragma GCC unroll 12
    for (int j = 0; j < NK; ++j) {
      const __m512 kv = _mm512_set1_ps(kb[j][d]);
      for (int g = 0; g < NG; ++g) a[j][g] = _mm512_fmadd_ps(q[g], kv, a[j][g]);
    }
  }
#pragma GCC unroll 12
  for (int j = 0; j < NK; ++j)
    for (int g = 0; g < NG; ++g) _mm512_storeu_ps(s + size_t(j) * lds + 16 * size_t(g), a[j][g]);
}

template <int NK>
void index_dots_heads(const float* qT, int hp, const float (*kb)[128], float* dots) {
  int g = 0;
  for (; g + 32 <= hp; g += 32) index_dots<2, NK>(qT + g, size_t(hp), kb, dots + g, size_t(hp));
  if (g < hp) index_dots<1, NK>(qT + g, size_t(hp), kb, dots + g, size_t(hp));
}

// Keys [t0, t1) of one contiguous run: qT [128][hp] (2^64 times q's e4m3 values, hp a
// multiple of 16, padded heads zero), w [hp] (the head weights times 2^56), out[t].
void indexer_lanes(const float* qT, const float* w, int hp, const uint8_t* k8, const float* k_scale, int t0, int t1, float* out) {
  alignas(64) float kb[kIndexKeys][128];
  alignas(64) float dots[kIndexKeys * 64];  // [key][hp]
  for (int t = t0; t < t1; t += kIndexKeys) {
    const int cnt = std::min(kIndexKeys, t1 - t);
    const int nk = cnt <= 4 ? 4 : kIndexKeys;
    for (int j = 0; j < nk; ++j) {
      const uint8_t* src = k8 + size_t(j < cnt ? t + j : t) * 128;  // padding keys repeat the first, unused
      for (int c = 0; c < 128; c += 8) _mm256_storeu_ps(&kb[j][c], fp8x8_bits(src + c));
    }
    if (nk == 4) index_dots_heads<4>(qT, hp, kb, dots);
    else index_dots_heads<kIndexKeys>(qT, hp, kb, dots);
    for (int j = 0; j < cnt; ++j) out[t + j] = relu_weighted_sum(dots + j * hp, w, hp) * k_scale[t + j];
  }
}


// ---- lightning indexer scan on AVX512-BF16 ------------------------------------------
// Only the functions that issue vdpbf16ps are compiled for AVX512-BF16 (the tier does not
// require it; bf16_dot() says when these run).
#ifdef DSA_AVX512_EMULATED
#define DSA_BF16_TARGET
#else
#define DSA_BF16_TARGET __attribute__((target("avx512bf16")))
#endif

// q and the keys are e4m3 codes: exact in bf16 (3 mantissa bits of 7), and the product of
// two is exact in f32, so vdpbf16ps takes two products per lane per instruction where an f32
// FMA takes one. q comes as 2^-56 times its values (the f32 scan's 2^64 * 2^-120, so the
// same w applies) and the keys at their values: every operand and product is a normal
// number, which the instruction's flush of denormals never touches. Each instruction adds a
// pair of products to the running sum, so the scores differ from the f32 chain's in the last
// bits.

inline __m512bh as_bh(__m512i v) {
  __m512bh b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// Sixteen keys per block (a 64-token cache block is four whole ones): sixteen chains of
// vdpbf16ps in flight, q and a broadcast beside them in the 32 registers.
constexpr int kIndexKeysBf16 = 16;

// a[j] = the dots of key j against one group of 16 heads: per row pair i, one q load and one
// broadcast of each key's pair (kb [key][128] bf16 bits). With `next`, each step also widens
// one of the 64 quarter rows of the next sixteen keys into kb_next, so that their loads and
// integer work run beside the dot products instead of after them.
DSA_BF16_TARGET inline void index_dots16_bf16(const uint32_t* qP, size_t ldq, const uint16_t (*kb)[128], __m512 (&a)[kIndexKeysBf16],
                                              const uint8_t* const* next, uint16_t (*kb_next)[128], __m512i sub) {
#pragma GCC unroll 16
  for (int j = 0; j < kIndexKeysBf16; ++j) a[j] = _mm512_setzero_ps();
  for (int i = 0; i < 64; ++i, qP += ldq) {
    if (next) _mm512_store_si512(&kb_next[i / 4][32 * (i % 4)], bf16x32_from_fp8(next[i / 4] + 32 * (i % 4), sub));
    const __m512bh q = as_bh(_mm512_loadu_si512(qP));
#pragma GCC unroll 16
    for (int j = 0; j < kIndexKeysBf16; ++j) {
      uint32_t pair;
      std::memcpy(&pair, &kb[j][2 * i], sizeof pair);
      a[j] = _mm512_dpbf16_ps(a[j], q, as_bh(_mm512_set1_epi32(int32_t(pair))));
    }
  }
}

// Lane j of the result is the sum of the 16 lanes of key j's vector, where slot s of x holds
// key 4 (s % 4) + s / 4: four rounds of shuffles pair 128-bit lanes, then halves of them,
// then elements, and each round's adds leave the keys in an order that the slot layout undoes
// (the last round puts slot L + 4p at element 4L + p). Each key's sum is one fixed tree over
// its own lanes, whatever the other keys hold.
inline __m512 key_sums16(const __m512 (&x)[16]) {
  __m512 s[8], t[4], u[2];
  for (int k = 0; k < 8; ++k)
    s[k] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * k], x[2 * k + 1], 0x44), _mm512_shuffle_f32x4(x[2 * k], x[2 * k + 1], 0xEE));
  for (int m = 0; m < 4; ++m)
    t[m] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * m], s[2 * m + 1], 0x88), _mm512_shuffle_f32x4(s[2 * m], s[2 * m + 1], 0xDD));
  for (int n = 0; n < 2; ++n)
    u[n] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * n], t[2 * n + 1], 0x44), _mm512_shuffle_ps(t[2 * n], t[2 * n + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0x88), _mm512_shuffle_ps(u[0], u[1], 0xDD));
}

// Keys [t0, t1) of one contiguous run against hp heads (a multiple of 16): sixteen keys at a
// time widened to bf16, their dots per group of 16 heads, ReLU times the head weights summed
// over the groups in lanes, then each key's 16 lanes by key_sums16, times its scale.
DSA_BF16_TARGET void indexer_lanes_bf16(const uint32_t* qP, const float* w, int hp, const uint8_t* k8, const float* k_scale, int t0, int t1,
                        float* out) {
  const __m512i sub = _mm512_load_si512(kFp8SubnormalBf16.v);
  const __m512 zero = _mm512_setzero_ps();
  alignas(64) uint16_t kb[2][kIndexKeysBf16][128];  // this block's keys, the next block's
  // Rows of the keys t .. t + 15 (padding keys repeat the first: computed, never used).
  auto rows = [&](int t, const uint8_t** src) {
    for (int j = 0; j < kIndexKeysBf16; ++j) src[j] = k8 + size_t(t + j < t1 ? t + j : t) * 128;
  };
  const uint8_t* src[kIndexKeysBf16];
  rows(t0, src);
  for (int j = 0; j < kIndexKeysBf16; ++j)
    for (int c = 0; c < 128; c += 32) _mm512_store_si512(&kb[0][j][c], bf16x32_from_fp8(src[j] + c, sub));
  for (int t = t0, cur = 0; t < t1; t += kIndexKeysBf16, cur ^= 1) {
    const int cnt = std::min(kIndexKeysBf16, t1 - t);
    const bool more = t + kIndexKeysBf16 < t1;
    if (more) rows(t + kIndexKeysBf16, src);
    __m512 r[kIndexKeysBf16];
    for (int g = 0; g < hp; g += 16) {
      __m512 a[kIndexKeysBf16];
      // The next block's keys are widened during the first group of heads.
      index_dots16_bf16(qP + g, size_t(hp), kb[cur], a, more && g == 0 ? src : nullptr, kb[cur ^ 1], sub);
      const __m512 wv = _mm512_loadu_ps(w + g);
      for (int j = 0; j < kIndexKeysBf16; ++j)
        r[j] = g == 0 ? _mm512_mul_ps(_mm512_max_ps(a[j], zero), wv) : _mm512_fmadd_ps(_mm512_max_ps(a[j], zero), wv, r[j]);
    }
    __m512 x[16];
    for (int s = 0; s < 16; ++s) x[s] = r[4 * (s % 4) + s / 4];
    const __m512 sums = key_sums16(x);
    if (cnt == kIndexKeysBf16) {
      _mm512_storeu_ps(out + t, _mm512_mul_ps(sums, _mm512_loadu_ps(k_scale + t)));
    } else {  // the run's last keys: the same products, one at a time
      alignas(64) float part[kIndexKeysBf16];
      _mm512_store_ps(part, sums);
      for (int j = 0; j < cnt; ++j) out[t + j] = part[j] * k_scale[t + j];
    }
  }
}


// ---- element-wise and top-k --------------------------------------------------------
// exp on 16 lanes: the avx2 exp8's range reduction and polynomial step for step, so each
// lane is bitwise exp8's. 2^n is built from the integral n by the 1.5 * 2^23 rounding trick
// (exact for |n| < 2^22) where exp8 converts to int: the same exponent bits.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)), _mm512_set1_ps(-87.3365447504f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i biased = _mm512_castps_si512(_mm512_add_ps(n, _mm512_set1_ps(0x1.8p23f + 127.0f)));
  return _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32(biased, 23)));
}

// Sixteen weights of a norm vector as f32 (f32 as stored, bf16 shifted up by 16).
inline __m512 load_norm_weights16(const Vec& w, int c) {
  if (w.dtype == DType::F32) return _mm512_loadu_ps(reinterpret_cast<const float*>(w.data) + c);
  const uint8_t* p = w.data + 2 * size_t(c);
#ifdef DSA_AVX512_EMULATED
  const __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
  const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
#else
  const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#endif
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

// One row of rmsnorm: the sum of squares in four 16-lane accumulators (a few ulp from the
// reference's index order, as the avx2 row's eight-lane ones are), then (x * inv) * w in the
// reference's rounding order.
void rmsnorm_row(const float* x, const Vec& w, int dim, float eps, float* y) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int c = 0;
  for (; c + 64 <= dim; c += 64) {
    const __m512 a = _mm512_loadu_ps(x + c), b = _mm512_loadu_ps(x + c + 16);
    const __m512 d = _mm512_loadu_ps(x + c + 32), e = _mm512_loadu_ps(x + c + 48);
    s0 = _mm512_fmadd_ps(a, a, s0);
    s1 = _mm512_fmadd_ps(b, b, s1);
    s2 = _mm512_fmadd_ps(d, d, s2);
    s3 = _mm512_fmadd_ps(e, e, s3);
  }
  for (; c + 16 <= dim; c += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + c), _mm512_loadu_ps(x + c), s0);
  float ss = hsum16(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
  for (; c < dim; ++c) ss += x[c] * x[c];
  const float inv = 1.0f / std::sqrt(ss / float(dim) + eps);
  const __m512 vi = _mm512_set1_ps(inv);
  c = 0;
  for (; c + 16 <= dim; c += 16) _mm512_storeu_ps(y + c, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + c), vi), load_norm_weights16(w, c)));
  for (; c < dim; ++c) y[c] = x[c] * inv * w.at(c);
}

// silu(gate) * up over [b, e): the avx2 formula on 16 lanes (bitwise its results), the last
// few elements padded through the same vector formula so that no element's result depends
// on where the array ends.
void silu_mul(const float* gate, const float* up, size_t b, size_t e, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
  auto f = [&](__m512 g, __m512 u) { return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, exp16(_mm512_sub_ps(zero, g)))), u); };
  size_t i = b;
  for (; i + 16 <= e; i += 16) _mm512_storeu_ps(out + i, f(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
  if (i < e) {
    alignas(64) float g16[16] = {}, u16[16] = {}, o16[16];
    std::copy(gate + i, gate + e, g16);
    std::copy(up + i, up + e, u16);
    _mm512_store_ps(o16, f(_mm512_load_ps(g16), _mm512_load_ps(u16)));
    std::copy(o16, o16 + (e - i), out + i);
  }
}

// One 128-point Walsh-Hadamard transform in eight registers. Each butterfly is the other
// tiers' f32 (a + b, a - b) on the same two values, so the bits are theirs whatever the
// order: stages 1, 2, 4 and 8 pair lanes of one register (the partner lane
// brought over by a permute, the upper lane of each pair taking partner - self), 16, 32
// and 64 pair whole registers.
void hadamard128_one(float* t) {
  __m512 v[8];
  for (int i = 0; i < 8; ++i) v[i] = _mm512_loadu_ps(t + 16 * i);
  const __mmask16 upper1 = 0xAAAA, upper2 = 0xCCCC, upper4 = 0xF0F0, upper8 = 0xFF00;
  for (auto& x : v) {
    __m512 p = _mm512_shuffle_ps(x, x, 0xB1);  // lanes i ^ 1
    x = _mm512_mask_sub_ps(_mm512_add_ps(x, p), upper1, p, x);
    p = _mm512_shuffle_ps(x, x, 0x4E);  // lanes i ^ 2
    x = _mm512_mask_sub_ps(_mm512_add_ps(x, p), upper2, p, x);
    p = _mm512_shuffle_f32x4(x, x, 0xB1);  // lanes i ^ 4
    x = _mm512_mask_sub_ps(_mm512_add_ps(x, p), upper4, p, x);
    p = _mm512_shuffle_f32x4(x, x, 0x4E);  // lanes i ^ 8
    x = _mm512_mask_sub_ps(_mm512_add_ps(x, p), upper8, p, x);
  }
  for (int h = 1; h < 8; h *= 2)
    for (int i = 0; i < 8; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const __m512 a = v[j], b = v[j + h];
        v[j] = _mm512_add_ps(a, b);
        v[j + h] = _mm512_sub_ps(a, b);
      }
  const __m512 s = _mm512_set1_ps(0.08838834764831845f);  // 128^-0.5
  for (int i = 0; i < 8; ++i) _mm512_storeu_ps(t + 16 * i, _mm512_mul_ps(v[i], s));
}

// out[i] = p[i]'s e4m3 value times 2^-120 (its bits placed as fp8x8_bits places them) times
// s, for n a multiple of 16: bitwise the avx2 widening, sixteen values per instruction.
void widen_fp8(const uint8_t* p, int n, float s, float* out) {
  const __m512 sv = _mm512_set1_ps(s);
  for (int i = 0; i < n; i += 16) _mm512_storeu_ps(out + i, _mm512_mul_ps(fp8x16_bits(p + i), sv));
}

// The sparse attention tile's online-softmax step for 16 heads in lanes, lane for lane the
// avx2 step on its two 8-lane groups (exp16 is bitwise exp8): the tile's scores s[j][0:16)
// (cnt tokens, row stride lds) become e^(s - new max) in place; where a head's running max
// rose, its running sum l and its output row o[h][0:L) (rows ldo apart) are scaled by
// e^(old - new max) (the other heads' factor is exactly 1, so leaving them is the same);
// then the tile's values are added to l in token order.
void softmax16(float* s, size_t lds, int cnt, float* m, float* l, float* o, size_t ldo, int L) {
  const __m512 mx = _mm512_loadu_ps(m);
  __m512 tmax = mx;
  for (int j = 0; j < cnt; ++j) tmax = _mm512_max_ps(tmax, _mm512_loadu_ps(s + size_t(j) * lds));
  const __m512 alpha = exp16(_mm512_sub_ps(mx, tmax));
  _mm512_storeu_ps(m, tmax);
  for (int j = 0; j < cnt; ++j) {
    float* sj = s + size_t(j) * lds;
    _mm512_storeu_ps(sj, exp16(_mm512_sub_ps(_mm512_loadu_ps(sj), tmax)));
  }
  __m512 sum = _mm512_loadu_ps(l);
  if (const __mmask16 rose = _mm512_cmp_ps_mask(alpha, _mm512_set1_ps(1.0f), _CMP_NEQ_OQ)) {
    alignas(64) float al[16];
    _mm512_store_ps(al, alpha);
    for (int h = 0; h < 16; ++h) {
      if (!((rose >> h) & 1)) continue;
      const __m512 ah = _mm512_set1_ps(al[h]);
      float* oh = o + size_t(h) * ldo;
      for (int c = 0; c < L; c += 16) _mm512_storeu_ps(oh + c, _mm512_mul_ps(_mm512_loadu_ps(oh + c), ah));
    }
    sum = _mm512_mul_ps(sum, alpha);
  }
  for (int j = 0; j < cnt; ++j) sum = _mm512_add_ps(sum, _mm512_loadu_ps(s + size_t(j) * lds));
  _mm512_storeu_ps(l, sum);
}

// topk's order keys of 16 scores (order_key in cpu_attention.cpp), as signed integers with
// the top bit flipped (SIMDe has no unsigned 512-bit compare): + 0.0f turns -0 into +0 (they
// tie), negative scores have their magnitude bits inverted.
inline __m512i topk_keys16(const float* p) {
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF), zero = _mm512_setzero_si512();
  const __m512i u = _mm512_castps_si512(_mm512_add_ps(_mm512_loadu_ps(p), _mm512_setzero_ps()));
  return _mm512_mask_xor_epi32(u, _mm512_cmpgt_epi32_mask(zero, u), u, magnitude);
}
inline uint32_t topk_key(float f) {
  f += 0.0f;
  uint32_t key;
  std::memcpy(&key, &f, 4);
  return key ^ (uint32_t(int32_t(key) >> 31) | 0x80000000u);
}

// The keys of positions [j, min(n, j + 16)) in the first lanes; a partial last group is
// copied into a zero-padded buffer first, so nothing past n is read.
inline __m512i topk_group_keys(const float* scores, int j, int n) {
  if (n - j >= 16) return topk_keys16(scores + j);
  alignas(64) float t[16] = {};
  std::memcpy(t, scores + j, sizeof(float) * size_t(n - j));
  return topk_keys16(t);
}
inline __mmask16 topk_lanes(int j, int n) { return n - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - j)) - 1); }

// topk's first level: the top 11 bits of every order key counted into two histograms taken
// alternately (h0 for even positions, h1 for odd), the keys 16 at a time.
void topk_bins(const float* scores, int n, uint32_t* h0, uint32_t* h1) {
  alignas(64) uint32_t b[16];
  for (int j = 0; j < n; j += 16) {
    // The signed key's top bit is flipped back before the shift: the bins of the unsigned key.
    const __m512i key = _mm512_xor_si512(topk_group_keys(scores, j, n), _mm512_set1_epi32(int32_t(0x80000000u)));
    _mm512_store_si512(b, _mm512_srli_epi32(key, 21));
    for (int i = 0; i < std::min(16, n - j); ++i) ++(i % 2 ? h1 : h0)[b[i]];
  }
}

// The order keys whose bits under hi_mask equal prefix, in position order, compressed into
// cand (with room for 16 past the last); returns how many. Compression goes through a
// register and a whole store: on Zen 4 the store form of vpcompressd is microcoded, and it
// held the 16384-key selection to 63 us where the avx2 tier's scalar loops took 42.
int topk_gather(const float* scores, int n, uint32_t hi_mask, uint32_t prefix, uint32_t* cand) {
  const __m512i flip = _mm512_set1_epi32(int32_t(0x80000000u));
  const __m512i mask = _mm512_set1_epi32(int32_t(hi_mask)), want = _mm512_set1_epi32(int32_t(prefix));
  int m = 0;
  for (int j = 0; j < n; j += 16) {
    const __mmask16 valid = topk_lanes(j, n);
    const __m512i key = _mm512_xor_si512(topk_group_keys(scores, j, n), flip);
    const __mmask16 hit = _mm512_mask_cmpeq_epi32_mask(valid, _mm512_and_si512(key, mask), want);
    _mm512_storeu_si512(cand + m, _mm512_maskz_compress_epi32(hit, key));
    m += __builtin_popcount(uint32_t(hit));
  }
  return m;
}

// The last pass of topk's radix select: in position order, every score whose order key is
// above tau and the first `ties` equal to it, 16 positions per step, the chosen lanes
// compressed into out. Keys compare as signed integers here (the order key with its top bit
// flipped: SIMDe has no unsigned 512-bit compare), which orders them the same way.
int topk_emit(const float* scores, int n, uint32_t tau, int ties, int k, int32_t* out) {
  const __m512i t = _mm512_set1_epi32(int32_t(tau ^ 0x80000000u));
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int cnt = 0, j = 0;
  for (; j + 16 <= n && cnt < k; j += 16) {
    const __m512i key = topk_keys16(scores + j);
    uint32_t take = _mm512_cmpgt_epi32_mask(key, t);
    for (uint32_t eq = _mm512_cmpeq_epi32_mask(key, t); eq && ties > 0; eq &= eq - 1, --ties) take |= eq & (~eq + 1);
    // Compressed through a register (topk_gather says why); a whole store while 16 slots of
    // out remain (the lanes past the chosen ones are overwritten next), else only the chosen.
    const __m512i chosen = _mm512_maskz_compress_epi32(__mmask16(take), _mm512_add_epi32(lanes, _mm512_set1_epi32(j)));
    const int got = __builtin_popcount(take);
    if (cnt + 16 <= k) {
      _mm512_storeu_si512(out + cnt, chosen);
    } else {
      alignas(64) int32_t t16[16];
      _mm512_store_si512(t16, chosen);
      std::memcpy(out + cnt, t16, sizeof(int32_t) * size_t(got));
    }
    cnt += got;
  }
  for (; j < n && cnt < k; ++j) {
    const uint32_t key = topk_key(scores[j]);
    if (key > tau || (key == tau && ties-- > 0)) out[cnt++] = j;
  }
  return cnt;
}

}  // namespace
}  // namespace dsa::kernels::cpu::DSA_AVX512_NS

#if !defined(DSA_AVX512_EMULATED) && defined(__clang__)
#pragma clang attribute pop
#elif !defined(DSA_AVX512_EMULATED)
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

namespace dsa::kernels::cpu {
#ifdef DSA_AVX512_EMULATED
const Avx512Kernels& avx512_emulated_kernels() {
  static const Avx512Kernels k{avx512_emulated::gemv_rows, avx512_emulated::gemm_panels2, avx512_emulated::pack_fp8_chunk_vbmi, avx512_emulated::pack_fp8_chunk, avx512_emulated::indexer_lanes, avx512_emulated::indexer_lanes_bf16, avx512_emulated::scores16, avx512_emulated::accumulate16,
                                 avx512_emulated::softmax16, avx512_emulated::rmsnorm_row, avx512_emulated::silu_mul,
                                 avx512_emulated::topk_bins, avx512_emulated::topk_gather, avx512_emulated::topk_emit,
                                 avx512_emulated::hadamard128_one, avx512_emulated::linear_t_fp8, avx512_emulated::widen_fp8};
  return k;
}
#else
const Avx512Kernels& avx512_native() {
  static const Avx512Kernels k{avx512::gemv_rows, avx512::gemm_panels2, vbmi_supported() ? avx512::pack_fp8_chunk_vbmi : avx512::pack_fp8_chunk, avx512::pack_fp8_chunk, avx512::indexer_lanes, avx512::indexer_lanes_bf16, avx512::scores16, avx512::accumulate16,
                                 avx512::softmax16, avx512::rmsnorm_row, avx512::silu_mul, avx512::topk_bins, avx512::topk_gather,
                                 avx512::topk_emit, avx512::hadamard128_one, avx512::linear_t_fp8, avx512::widen_fp8};
  return k;
}
#endif
}  // namespace dsa::kernels::cpu
