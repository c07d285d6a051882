// fp8-block / bf16 / f32 matrix products with on-the-fly dequantization.
//
// fp8 e4m3 -> f32 without a table: moving the e4m3 bits into an IEEE half
// (sign << 8, exponent+mantissa << 7) gives the same value scaled by 2^-8 (the exponent
// bias is 15 instead of 7), subnormals included, and F16C converts 8 halves per
// instruction. The 2^8 is folded into the per-block scale, applied once per 128 columns.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/simd.h"
#include "kernels/ref/ref.h"

namespace dsa::kernels::cpu {

bool use_avx2() { return isa() != Isa::Generic; }
bool use_avx512() { return isa() >= Isa::Avx512; }

namespace {
const Avx512Kernels* g_avx512 = nullptr;  // nullptr: the native table
const AmxKernels* g_amx = nullptr;        // nullptr: the native table
Isa best_isa() {
  for (Isa t : {Isa::Amx, Isa::Avx512, Isa::Avx2})
    if (isa_supported(t)) return t;
  return Isa::Generic;
}
}  // namespace
const Avx512Kernels& avx512_kernels() { return g_avx512 ? *g_avx512 : avx512_native(); }
const AmxKernels& amx_kernels() { return g_amx ? *g_amx : amx_native(); }
void emulate_avx512(const Avx512Kernels* k) {
  g_avx512 = k;
  g_amx = nullptr;
  force_isa(k ? Isa::Avx512 : best_isa());
}
void emulate_amx(const AmxKernels* a) {
  g_amx = a;
  force_isa(a ? Isa::Amx : best_isa());
}

int num_threads() { return omp_get_max_threads(); }

namespace {

constexpr float kFp8HalfScale = 256.0f;  // 2^(15-7): see the header comment

// Dequantize `len` weights of row r starting at column c0 (within one scale block for
// fp8) into out, WITHOUT the block scale (fp8 values are 2^-8 too small; callers fold
// kFp8HalfScale into the scale).
__attribute__((target("avx2,fma,f16c"))) inline void load_row_avx2(const Linear& w, int r, int c0, int len, float* out) {
  const size_t base = size_t(r) * size_t(w.cols) + size_t(c0);
  int c = 0;
  if (w.dtype == DType::F8_E4M3) {
    const uint8_t* p = w.data + base;
    const __m256i m7f = _mm256_set1_epi16(0x7f), m80 = _mm256_set1_epi16(0x80);
    for (; c + 16 <= len; c += 16) {
      const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + c)));
      const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(v, m80), 8), _mm256_slli_epi16(_mm256_and_si256(v, m7f), 7));
      _mm256_storeu_ps(out + c, _mm256_cvtph_ps(_mm256_castsi256_si128(h)));
      _mm256_storeu_ps(out + c + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
    }
    for (; c < len; ++c) out[c] = fp8_e4m3_to_f32(p[c]) / kFp8HalfScale;
  } else if (w.dtype == DType::BF16) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(w.data) + base;
    for (; c + 8 <= len; c += 8) {
      const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + c)));
      _mm256_storeu_ps(out + c, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; c < len; ++c) out[c] = bf16_to_f32(p[c]);
  } else if (w.dtype == DType::F16) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(w.data) + base;
    for (; c + 8 <= len; c += 8) _mm256_storeu_ps(out + c, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + c))));
    for (; c < len; ++c) out[c] = f16_to_f32(p[c]);
  } else {
    std::memcpy(out, reinterpret_cast<const float*>(w.data) + base, size_t(len) * 4);
  }
}

inline void load_row_scalar(const Linear& w, int r, int c0, int len, float* out) {
  for (int c = 0; c < len; ++c) {
    const size_t i = size_t(r) * size_t(w.cols) + size_t(c0 + c);
    switch (w.dtype) {
      case DType::F8_E4M3: out[c] = fp8_e4m3_to_f32(w.data[i]) / kFp8HalfScale; break;
      case DType::BF16: { uint16_t h; std::memcpy(&h, w.data + 2 * i, 2); out[c] = bf16_to_f32(h); break; }
      case DType::F16: { uint16_t h; std::memcpy(&h, w.data + 2 * i, 2); out[c] = f16_to_f32(h); break; }
      default: { float v; std::memcpy(&v, w.data + 4 * i, 4); out[c] = v; }
    }
  }
}

inline float block_scale(const Linear& w, int r, int c0) {
  if (w.dtype != DType::F8_E4M3) return 1.0f;
  return w.scale[size_t(r / w.block_rows) * size_t(w.scale_cols()) + size_t(c0 / w.block_cols)] * kFp8HalfScale;
}


// ---- decode: fused dequantize + FMA GEMV, four rows at a time -------------------------

// y[r] for rows [r0, r1) of an fp8 weight, one token. Full 128-column blocks go through
// the vector loop with the block scale applied once per block; a ragged tail block and
// leftover rows use the scalar path.
// e4m3 -> f32 with integer ops only (F16C's conversions, and even one widening shuffle
// per 8 weights, cap a memory-bound GEMV well below the bandwidth on Zen 3, where vector
// shifts and shuffles share few ports). 32 weights are loaded as 16 words; in each 32-bit
// lane the top byte b3 is an e4m3 code whose arithmetic shift right by 4 puts the sign at
// bit 31 and the 7 exponent/mantissa bits at 26..20. Masked, that pattern read as an f32
// is exactly 2^-120 times the e4m3 value, subnormal codes included (they land on f32
// subnormals). A word shift by 8 brings b2 up the same way, and a lane shift by 16 does b1
// and b0 from the same two shifted vectors: five shifts and four ANDs per 32 weights.
// The four vectors hold bytes 3, 2, 1, 0 of every lane, so x is permuted to match
// (prescale_x_into). The caller scales x by 2^64 so products stay far from the subnormal range
// (the FMA forms them exactly), and undoes both factors with the block scale.
struct Fp8x32 {
  __m256 b3, b2, b1, b0;  // weights 4i+3, 4i+2, 4i+1, 4i for lane i
};
__attribute__((target("avx2,fma"))) inline Fp8x32 fp8x32_bits(const uint8_t* p) {
  const __m256i m = _mm256_set1_epi32(int32_t(0x87F00000u));
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i hi = _mm256_srai_epi16(v, 4), lo = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 4);
  return {_mm256_castsi256_ps(_mm256_and_si256(hi, m)), _mm256_castsi256_ps(_mm256_and_si256(lo, m)),
          _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(hi, 16), m)),
          _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(lo, 16), m))};
}
constexpr float kFp8XScale = 0x1p64f;              // applied to x
constexpr float kFp8BitsUndo = 0x1p120f * 0x1p-64f;  // 2^56, applied with the block scale

template <int NT, bool kOneStream = false>
__attribute__((target("avx2,fma"))) void gemv_bf16_tokens_avx2(const Linear& w, const float* x, const float* xp, float* y, size_t ldy, int base, int r0, int r1);

// x * kFp8XScale into a per-thread buffer (grown once, then reused), each full group of
// 32 columns permuted to the lane order of fp8x32_bits: [4i+3 | 4i+2 | 4i+1 | 4i].
// Sized at first use for any input width in use (2 x hidden = 14336 for the MTP's eh_proj,
// 18432 for DeepSeek's dense down_proj) so a decode step never grows it.
// Namespace-scope so that reserve_gemv_scratch can size every thread's copy up front.
constexpr size_t kXBufMin = 32768;
thread_local std::vector<float> t_xscaled, t_xdeint;

// 64-byte aligned: the avx512 GEMVs load x a whole cache line at a time, twelve loads per
// weight pair at six tokens, and a vector's heap storage starts 16 bytes into a line, which
// split every one of them (2048 bf16 rows x six tokens: 117 -> 155 GFLOP/s on one core).
inline float* x_buffer(std::vector<float>& buf, size_t n) {
  constexpr size_t kPad = 64 / sizeof(float);
  if (buf.size() < n + kPad) buf.resize(std::max(kXBufMin, n) + kPad);
  const uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - p % 64) % 64) / sizeof(float);
}

inline void prescale_x_into(const float* x, int n, float* b) {
  int c = 0;
  for (; c + 32 <= n; c += 32)
    for (int k = 0; k < 4; ++k)
      for (int i = 0; i < 8; ++i) b[c + 8 * (3 - k) + i] = x[c + 4 * i + k] * kFp8XScale;
  for (; c < n; ++c) b[c] = x[c] * kFp8XScale;
}

// x split per 16 columns into its even and odd columns, [x0 x2 .. x14 | x1 x3 .. x15], the
// lane order gemv_bf16_avx2 produces.
inline void deinterleave_x_into(const float* x, int n, float* b) {
  int c = 0;
  for (; c + 16 <= n; c += 16)
    for (int i = 0; i < 8; ++i) {
      b[c + i] = x[c + 2 * i];
      b[c + 8 + i] = x[c + 2 * i + 1];
    }
  for (; c < n; ++c) b[c] = x[c];
}

// NT tokens against each row as it streams by (one decode token, or a speculative verify
// step): every weight vector is loaded and widened once and used for all NT tokens. One row
// at a time keeps NT x 2 accumulators in registers and reads the weights in address order
// (one token: 12% faster than four rows side by side on Zen 5, docs/KERNELS.md); the x
// vectors come from L1. Rows are absolute (the scale lookup needs them). x [NT, K] (the
// scalar tails), xp [NT, K]: x times kFp8XScale, permuted per 32 columns to the order of
// Fp8x32 (b3, b2, b1, b0); y [NT, ldy] (row r at y[r - base]).
template <int NT>
__attribute__((target("avx2,fma"))) void gemv_fp8_tokens_avx2(const Linear& w, const float* x, const float* xp, float* y, size_t ldy,
                                                             int base, int r0, int r1) {
  const int K = w.cols, bc = w.block_cols, sc = w.scale_cols();
  const int kfull = bc % 32 == 0 ? (K / bc) * bc : 0;
  const size_t ahead = size_t(4 * K) * size_t((8192 + 4 * K - 1) / (4 * K));
  for (int r = r0; r < r1; ++r) {
    const uint8_t* wr = w.data + size_t(r) * size_t(K);
    const float* srow = w.scale + size_t(r / w.block_rows) * size_t(sc);
    __m256 tot[NT];
    for (int t = 0; t < NT; ++t) tot[t] = _mm256_setzero_ps();
    for (int c0 = 0, blk = 0; c0 < kfull; c0 += bc, ++blk) {
      __m256 a[NT][2];
      for (int t = 0; t < NT; ++t) a[t][0] = a[t][1] = _mm256_setzero_ps();
      for (int c = c0; c < c0 + bc; c += 32) {
        prefetch_stream(wr + c + ahead);
        const Fp8x32 f = fp8x32_bits(wr + c);
        for (int t = 0; t < NT; ++t) {
          const float* xs = xp + size_t(t) * size_t(K) + c;
          a[t][0] = _mm256_fmadd_ps(f.b3, _mm256_loadu_ps(xs), a[t][0]);
          a[t][1] = _mm256_fmadd_ps(f.b2, _mm256_loadu_ps(xs + 8), a[t][1]);
          a[t][0] = _mm256_fmadd_ps(f.b1, _mm256_loadu_ps(xs + 16), a[t][0]);
          a[t][1] = _mm256_fmadd_ps(f.b0, _mm256_loadu_ps(xs + 24), a[t][1]);
        }
      }
      const __m256 sv = _mm256_set1_ps(srow[blk] * kFp8BitsUndo);
      for (int t = 0; t < NT; ++t) tot[t] = _mm256_fmadd_ps(_mm256_add_ps(a[t][0], a[t][1]), sv, tot[t]);
    }
    for (int t = 0; t < NT; ++t) {
      float acc = hsum8(tot[t]);
      const float* xt = x + size_t(t) * size_t(K);
      for (int c = kfull; c < K; ++c) acc += fp8_e4m3_to_f32(wr[c]) * srow[c / bc] * xt[c];
      y[size_t(t) * ldy + size_t(r - base)] = acc;
    }
  }
}

// Row r's NT sums: the accumulators and the columns past the last full group of 16.
template <int NT>
__attribute__((target("avx2,fma"))) inline void bf16_tokens_finish(const Linear& w, const float* x, float* y, size_t ldy, int base,
                                                                  int r, const uint16_t* wr, const __m256 (&a)[NT][2]) {
  const int K = w.cols, k16 = K / 16 * 16;
  for (int t = 0; t < NT; ++t) {
    float acc = hsum8(_mm256_add_ps(a[t][0], a[t][1]));
    const float* xt = x + size_t(t) * size_t(K);
    for (int c = k16; c < K; ++c) acc += bf16_to_f32(wr[c]) * xt[c];
    y[size_t(t) * ldy + size_t(r - base)] = acc;
  }
}

// bf16 rows, 16 weights per 32-byte load: each 32-bit lane holds two bf16 values, the odd
// column in its high half (masking the low half leaves it as an f32) and the even column
// in its low half (one shift up makes it an f32). Two integer ops per 16 weights instead
// of widening shuffles; xp is x deinterleaved to match (deinterleave_x_into). kOneStream
// (one token): one row at a time and no software prefetch, so the weights are read in
// address order as one stream the hardware prefetcher follows alone (the avx512 tier's
// gemv_bf16_tokens has the measurements).
template <int NT, bool kOneStream>
__attribute__((target("avx2,fma"))) void gemv_bf16_tokens_avx2(const Linear& w, const float* x, const float* xp, float* y, size_t ldy,
                                                              int base, int r0, int r1) {
  const int K = w.cols, k16 = K / 16 * 16;
  const size_t ahead = size_t(8 * K) * size_t((8192 + 8 * K - 1) / (8 * K));
  const __m256i hi_mask = _mm256_set1_epi32(int32_t(0xFFFF0000u));
  int r = r0;
  // Two rows at a time share each x load (2 x NT x 2 accumulators), while they fit in the
  // sixteen registers with the four weight vectors (NT <= 2); one row at a time otherwise.
  // The x vectors are pinned in registers: left to itself the compiler folds each into
  // both rows' FMAs as a memory operand, and loads, not FMAs, then bound the loop
  // (1.5x slower with the weights in cache).
  for (; NT <= 2 && !kOneStream && r + 2 <= r1; r += 2) {
    const uint16_t* w0 = reinterpret_cast<const uint16_t*>(w.data) + size_t(r) * size_t(K);
    const uint16_t* w1 = w0 + size_t(K);
    __m256 a[NT][2], b[NT][2];
    for (int t = 0; t < NT; ++t) a[t][0] = a[t][1] = b[t][0] = b[t][1] = _mm256_setzero_ps();
    for (int c = 0; c < k16; c += 16) {
      prefetch_stream(reinterpret_cast<const char*>(w0 + c) + ahead);
      prefetch_stream(reinterpret_cast<const char*>(w1 + c) + ahead);
      const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + c));
      const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w1 + c));
      const __m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)), o0 = _mm256_castsi256_ps(_mm256_and_si256(v0, hi_mask));
      const __m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16)), o1 = _mm256_castsi256_ps(_mm256_and_si256(v1, hi_mask));
      for (int t = 0; t < NT; ++t) {
        const float* xd = xp + size_t(t) * size_t(K) + c;
        __m256 xe = _mm256_loadu_ps(xd), xo = _mm256_loadu_ps(xd + 8);
        in_register(xe);
        in_register(xo);
        a[t][0] = _mm256_fmadd_ps(e0, xe, a[t][0]);
        a[t][1] = _mm256_fmadd_ps(o0, xo, a[t][1]);
        b[t][0] = _mm256_fmadd_ps(e1, xe, b[t][0]);
        b[t][1] = _mm256_fmadd_ps(o1, xo, b[t][1]);
      }
    }
    bf16_tokens_finish<NT>(w, x, y, ldy, base, r, w0, a);
    bf16_tokens_finish<NT>(w, x, y, ldy, base, r + 1, w1, b);
  }
  for (; r < r1; ++r) {
    const uint16_t* wr = reinterpret_cast<const uint16_t*>(w.data) + size_t(r) * size_t(K);
    __m256 a[NT][2];
    for (int t = 0; t < NT; ++t) a[t][0] = a[t][1] = _mm256_setzero_ps();
    for (int c = 0; c < k16; c += 16) {
      if (!kOneStream && (c & 31) == 0) prefetch_stream(reinterpret_cast<const char*>(wr + c) + ahead);  // 64 bytes per 32 columns
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr + c));
      const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), wo = _mm256_castsi256_ps(_mm256_and_si256(v, hi_mask));
      for (int t = 0; t < NT; ++t) {
        const float* xd = xp + size_t(t) * size_t(K) + c;
        a[t][0] = _mm256_fmadd_ps(we, _mm256_loadu_ps(xd), a[t][0]);
        a[t][1] = _mm256_fmadd_ps(wo, _mm256_loadu_ps(xd + 8), a[t][1]);
      }
    }
    bf16_tokens_finish<NT>(w, x, y, ldy, base, r, wr, a);
  }
}

// Rows [r0, r1) for n <= 3 tokens, x already prepared (xb, [n, cols]) in the kernels' lane
// order: x [n, cols] (tails), y [n, ldy] (row r at y[r - base]).
__attribute__((target("avx2,fma"))) void gemv_prepared_avx2(const Linear& w, const float* x, const float* xb, int n, float* y,
                                                           size_t ldy, int base, int r0, int r1) {
  const bool fp8 = w.dtype == DType::F8_E4M3;
  if (n == 1) {
    if (fp8) gemv_fp8_tokens_avx2<1>(w, x, xb, y, 0, base, r0, r1);
    else gemv_bf16_tokens_avx2<1, true>(w, x, xb, y, 0, base, r0, r1);
  } else if (n == 2) {
    if (fp8) gemv_fp8_tokens_avx2<2>(w, x, xb, y, ldy, base, r0, r1);
    else gemv_bf16_tokens_avx2<2>(w, x, xb, y, ldy, base, r0, r1);
  } else {
    if (fp8) gemv_fp8_tokens_avx2<3>(w, x, xb, y, ldy, base, r0, r1);
    else gemv_bf16_tokens_avx2<3>(w, x, xb, y, ldy, base, r0, r1);
  }
}

// Rows [r0, r1) for any number of tokens: x [n, cols], y [n, ldy] (row r at y[r - base]).
// Tokens go in groups of three for fp8 (the registers hold three tokens' accumulators
// beside the widened weights) and of two for bf16 (two rows then share each x vector,
// which three tokens' one-row kernel cannot: 1.4-1.6x the FLOP rate); with more
// than one group the rows go in blocks of kRowBlock, each block's weights read from memory
// once and from cache by the later groups, and the inputs of up to kTokPrepared tokens are
// put in the kernels' lane order once for all row blocks. Every kernel sums a row the same
// way (the one-token order), so the grouping changes no output bit.
constexpr int kTokGroupFp8 = 3, kTokGroupBf16 = 2, kRowBlock = 64, kTokPrepared = kTokBuf;
__attribute__((target("avx2,fma"))) void gemv_tokens_avx2(const Linear& w, const float* x, int n, float* y, size_t ldy, int base,
                                                         int r0, int r1) {
  const bool fp8 = w.dtype == DType::F8_E4M3;
  const size_t cols = size_t(w.cols);
  const int batch = std::min(n, kTokPrepared);
  float* xb = x_buffer(fp8 ? t_xscaled : t_xdeint, size_t(batch) * cols);
  for (int t0 = 0; t0 < n; t0 += kTokPrepared) {
    const int cnt = std::min(kTokPrepared, n - t0);
    for (int i = 0; i < cnt; ++i) {
      const float* xi = x + size_t(t0 + i) * cols;
      if (fp8) prescale_x_into(xi, w.cols, xb + size_t(i) * cols);
      else deinterleave_x_into(xi, w.cols, xb + size_t(i) * cols);
    }
    // Up to three tokens run as one group in either dtype (one pass, nothing to reuse).
    const int group = cnt <= 3 ? cnt : fp8 ? kTokGroupFp8 : kTokGroupBf16;
    const int rb_step = cnt <= group ? r1 - r0 : kRowBlock;
    for (int rb = r0; rb < r1; rb += rb_step) {
      const int re = std::min(r1, rb + rb_step);
        // Groups as even as possible (4 tokens: 2 + 2, not 3 + 1): each pass over the block
      // does about the same work per weight loaded.
      const int groups = (cnt + group - 1) / group;
      for (int gi = 0, g = 0; gi < groups; ++gi) {
        const int k = (cnt - g) / (groups - gi);
        gemv_prepared_avx2(w, x + size_t(t0 + g) * cols, xb + size_t(g) * cols, k, y + size_t(t0 + g) * ldy, ldy, base, rb, re);
        g += k;
      }
    }
  }
}

// The decode-role product of rows [r0, r1) in the tier's kernels.
void gemv_rows(const Linear& w, const float* x, int n, float* y, size_t ldy, int base, int r0, int r1) {
  if (use_avx512()) {
    const bool fp8 = w.dtype == DType::F8_E4M3;
    float* xb = x_buffer(fp8 ? t_xscaled : t_xdeint, size_t(fp8 ? 2 : 1) * size_t(std::min(n, kTokBuf)) * size_t(w.cols));
    avx512_kernels().gemv_rows(w, x, n, y, ldy, base, r0, r1, xb);
  } else {
    gemv_tokens_avx2(w, x, n, y, ldy, base, r0, r1);
  }
}

// ---- prefill: packed GEMM ------------------------------------------------------------
// A block of 16 weight rows is dequantized (scale applied) into a k-major panel
// pk[k][16] that stays in L2, then a 6x16 register-blocked FMA kernel runs every token
// against it: 12 accumulators, two panel loads and six broadcasts per k.
constexpr int kNr = 16, kMr = 6, kKc = 2048;

// 8x8 transpose of rows src[0..7] (stride lds) into dst rows (stride ldd).
__attribute__((target("avx2,fma"))) inline void transpose8x8(const float* src, size_t lds, float* dst, size_t ldd) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + size_t(i) * lds);
  transpose8x8_store(r, dst, ldd);
}

// A full fp8 panel chunk (16 rows x len columns, len a multiple of 8, one scale block):
// each 8 x 8 block of weights is widened (fp8x8_bits), scaled per row and transposed in
// registers straight into the panel, with no row buffer between the two. s[j] is row j's
// block scale times 2^120.
__attribute__((target("avx2,fma"))) void pack_fp8_chunk_avx2(const uint8_t* w0, size_t ldw, int len, const float* s, float* dst) {
  __m256 sv[kNr];
  for (int j = 0; j < kNr; ++j) sv[j] = _mm256_set1_ps(s[j]);
  for (int k = 0; k < len; k += 8)
    for (int h = 0; h < kNr; h += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_mul_ps(fp8x8_bits(w0 + size_t(h + i) * ldw + size_t(k)), sv[h + i]);
      transpose8x8_store(r, dst + size_t(k) * kNr + size_t(h), kNr);
    }
}

// Dequantizes rows [r0, r0 + nr) x columns [k0, k0 + kc) into the k-major panel
// pk[k][16] (rows past nr are zero), 128 columns at a time: full fp8 chunks go through
// pack_fp8_chunk_avx2; otherwise rows are converted contiguously into a row buffer, then
// 8x8 blocks are transposed with shuffles.
// len fp8 weights times their block scale s, for packing: fp8x8_bits and one multiply by
// s * 2^120, exact, instead of a conversion and a second pass.
__attribute__((target("avx2,fma"))) inline void load_fp8_scaled_avx2(const uint8_t* p, int len, float s, float* out) {
  int c = 0;
  if (s < 0x1p7f && s > -0x1p7f) {  // s * 2^120 stays finite
    const __m256 sv = _mm256_set1_ps(s * 0x1p120f);
    for (; c + 8 <= len; c += 8) _mm256_store_ps(out + c, _mm256_mul_ps(fp8x8_bits(p + c), sv));
  }
  for (; c < len; ++c) out[c] = fp8_e4m3_to_f32(p[c]) * s;
}

void pack_panel(const Linear& w, int r0, int nr, int k0, int kc, float* pk, bool avx) {
  alignas(32) float rows[kNr][128];
  for (int c0 = k0; c0 < k0 + kc;) {
    // A chunk never straddles an fp8 scale block, whatever the block width.
    int len = std::min(128, k0 + kc - c0);
    if (w.dtype == DType::F8_E4M3) len = std::min(len, (c0 / w.block_cols + 1) * w.block_cols - c0);
    if (avx && w.dtype == DType::F8_E4M3 && nr == kNr && len % 8 == 0) {
      float sv[kNr];
      bool ok = true;
      for (int j = 0; j < kNr && ok; ++j) {
        const float s = w.scale[size_t((r0 + j) / w.block_rows) * size_t(w.scale_cols()) + size_t(c0 / w.block_cols)];
        ok = s < 0x1p7f && s > -0x1p7f;  // s * 2^120 stays finite (as in load_fp8_scaled_avx2)
        sv[j] = s * 0x1p120f;
      }
      if (ok) {
        const uint8_t* w0 = w.data + size_t(r0) * size_t(w.cols) + size_t(c0);
        if (use_avx512() && len % 16 == 0) avx512_kernels().pack_fp8_chunk(w0, size_t(w.cols), len, sv, pk + size_t(c0 - k0) * kNr);
        else pack_fp8_chunk_avx2(w0, size_t(w.cols), len, sv, pk + size_t(c0 - k0) * kNr);
        c0 += len;
        continue;
      }
    }
    for (int j = 0; j < kNr; ++j) {
      if (j >= nr) {
        std::fill(rows[j], rows[j] + len, 0.0f);
        continue;
      }
      if (avx && w.dtype == DType::F8_E4M3) {
        const float s = w.scale[size_t((r0 + j) / w.block_rows) * size_t(w.scale_cols()) + size_t(c0 / w.block_cols)];
        load_fp8_scaled_avx2(w.data + size_t(r0 + j) * size_t(w.cols) + size_t(c0), len, s, rows[j]);
        continue;
      }
      if (avx) load_row_avx2(w, r0 + j, c0, len, rows[j]); else load_row_scalar(w, r0 + j, c0, len, rows[j]);
      const float s = block_scale(w, r0 + j, c0);
      for (int k = 0; k < len; ++k) rows[j][k] *= s;
    }
    float* dst = pk + size_t(c0 - k0) * kNr;
    int k = 0;
    if (avx)
      for (; k + 8 <= len; k += 8) {
        transpose8x8(&rows[0][k], 128, dst + size_t(k) * kNr, kNr);
        transpose8x8(&rows[8][k], 128, dst + size_t(k) * kNr + 8, kNr);
      }
    for (; k < len; ++k)
      for (int j = 0; j < kNr; ++j) dst[size_t(k) * kNr + size_t(j)] = rows[j][k];
    c0 += len;
  }
}

template <int MR>
__attribute__((target("avx2,fma"))) inline void micro_6x16(const float* pk, int kc, const float* xp, float* y, int ldy, int nr,
                                                          bool accumulate) {
  // Twelve named accumulators: GCC keeps an accumulator array in memory when its
  // address escapes, which halves the FMA rate.
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int k = 0; k < kc; ++k) {
    const __m256 w0 = _mm256_load_ps(pk + k * kNr), w1 = _mm256_load_ps(pk + k * kNr + 8);
    const float* xk = xp + k * MR;
    __m256 b = _mm256_broadcast_ss(xk);
    c00 = _mm256_fmadd_ps(b, w0, c00); c01 = _mm256_fmadd_ps(b, w1, c01);
    if constexpr (MR > 1) { b = _mm256_broadcast_ss(xk + 1); c10 = _mm256_fmadd_ps(b, w0, c10); c11 = _mm256_fmadd_ps(b, w1, c11); }
    if constexpr (MR > 2) { b = _mm256_broadcast_ss(xk + 2); c20 = _mm256_fmadd_ps(b, w0, c20); c21 = _mm256_fmadd_ps(b, w1, c21); }
    if constexpr (MR > 3) { b = _mm256_broadcast_ss(xk + 3); c30 = _mm256_fmadd_ps(b, w0, c30); c31 = _mm256_fmadd_ps(b, w1, c31); }
    if constexpr (MR > 4) { b = _mm256_broadcast_ss(xk + 4); c40 = _mm256_fmadd_ps(b, w0, c40); c41 = _mm256_fmadd_ps(b, w1, c41); }
    if constexpr (MR > 5) { b = _mm256_broadcast_ss(xk + 5); c50 = _mm256_fmadd_ps(b, w0, c50); c51 = _mm256_fmadd_ps(b, w1, c51); }
  }
  alignas(32) float t[kMr][16];
  _mm256_store_ps(t[0], c00); _mm256_store_ps(t[0] + 8, c01);
  _mm256_store_ps(t[1], c10); _mm256_store_ps(t[1] + 8, c11);
  _mm256_store_ps(t[2], c20); _mm256_store_ps(t[2] + 8, c21);
  _mm256_store_ps(t[3], c30); _mm256_store_ps(t[3] + 8, c31);
  _mm256_store_ps(t[4], c40); _mm256_store_ps(t[4] + 8, c41);
  _mm256_store_ps(t[5], c50); _mm256_store_ps(t[5] + 8, c51);
  for (int i = 0; i < MR; ++i) {
    float* yi = y + size_t(i) * size_t(ldy);
    if (nr == kNr) {  // a full panel: two vector stores (the loops below become memmove calls)
      __m256 lo = _mm256_load_ps(t[i]), hi = _mm256_load_ps(t[i] + 8);
      if (accumulate) {
        lo = _mm256_add_ps(lo, _mm256_loadu_ps(yi));
        hi = _mm256_add_ps(hi, _mm256_loadu_ps(yi + 8));
      }
      _mm256_storeu_ps(yi, lo);
      _mm256_storeu_ps(yi + 8, hi);
    } else if (accumulate)
      for (int j = 0; j < nr; ++j) yi[j] += t[i][j];
    else
      for (int j = 0; j < nr; ++j) yi[j] = t[i][j];
  }
}

// A full block of six tokens (rows l apart) k-major, b[6 k + i] = x_i[k]: eight columns at a
// time as an 8 x 8 transpose with two rows of zeros, each transposed row stored whole (8
// floats) over the first two slots of the next, which the next store, in order, rewrites. The
// last eight columns go through a buffer and the rest one by one, so nothing is written past
// the block. Why: copied one float at a time, the pack costs about a quarter of a product with
// few output rows (a 16-head prefill's kv_b: 128 rows from 512 columns).
__attribute__((target("avx2,fma"))) void pack_x_block6_avx2(const float* xi, size_t l, int kc, float* b) {
  static_assert(kMr == 6);
  __m256 r[8];
  r[6] = r[7] = _mm256_setzero_ps();
  int k = 0;
  for (; k + 8 < kc; k += 8) {
    for (int i = 0; i < 6; ++i) r[i] = _mm256_loadu_ps(xi + size_t(i) * l + size_t(k));
    transpose8x8_store(r, b + size_t(k) * 6, 6);
  }
  if (k + 8 == kc) {
    alignas(32) float t[8][8];
    for (int i = 0; i < 6; ++i) r[i] = _mm256_loadu_ps(xi + size_t(i) * l + size_t(k));
    transpose8x8_store(r, &t[0][0], 8);
    for (int q = 0; q < 8; ++q) std::memcpy(b + size_t(k + q) * 6, t[q], 6 * sizeof(float));
    return;
  }
  for (; k < kc; ++k)
    for (int i = 0; i < 6; ++i) b[size_t(k) * 6 + size_t(i)] = xi[size_t(i) * l + size_t(k)];
}

// Packs tokens [0, n) of x[:, k0 : k0 + kc] into blocks of kMr tokens (the last block
// holds the remainder), each k-major.
// Without AVX2 a full block of six is written k by k: contiguous stores fed by six row
// streams (row by row, every store would land 24 bytes after the previous one).
void pack_x_block(const float* x, int n, int ldx, int k0, int kc, float* xp, int i0) {
  const int mr = std::min(kMr, n - i0);
  float* b = xp + size_t(i0) * size_t(kc);
  const float* xi = x + size_t(i0) * size_t(ldx) + size_t(k0);
  if (mr == kMr && use_avx2()) return pack_x_block6_avx2(xi, size_t(ldx), kc, b);
  if (mr == kMr) {
    const size_t l = size_t(ldx);
    for (int k = 0; k < kc; ++k, b += kMr) {
      b[0] = xi[k];
      b[1] = xi[l + size_t(k)];
      b[2] = xi[2 * l + size_t(k)];
      b[3] = xi[3 * l + size_t(k)];
      b[4] = xi[4 * l + size_t(k)];
      b[5] = xi[5 * l + size_t(k)];
    }
    return;
  }
  for (int i = 0; i < mr; ++i)
    for (int k = 0; k < kc; ++k) b[k * mr + i] = xi[size_t(i) * size_t(ldx) + size_t(k)];
}
void pack_x(const float* x, int n, int ldx, int k0, int kc, float* xp) {
  for (int i0 = 0; i0 < n; i0 += kMr) pack_x_block(x, n, ldx, k0, kc, xp, i0);
}

__attribute__((target("avx2,fma"))) void gemm_panel_avx2(const float* pk, int kc, const float* xp, int n, float* y, int ldy,
                                                        int nr, bool accumulate) {
  for (int i0 = 0; i0 < n; i0 += kMr) {
    const float* b = xp + size_t(i0) * size_t(kc);
    float* yr = y + size_t(i0) * size_t(ldy);
    switch (std::min(kMr, n - i0)) {
      case 6: micro_6x16<6>(pk, kc, b, yr, ldy, nr, accumulate); break;
      case 5: micro_6x16<5>(pk, kc, b, yr, ldy, nr, accumulate); break;
      case 4: micro_6x16<4>(pk, kc, b, yr, ldy, nr, accumulate); break;
      case 3: micro_6x16<3>(pk, kc, b, yr, ldy, nr, accumulate); break;
      case 2: micro_6x16<2>(pk, kc, b, yr, ldy, nr, accumulate); break;
      default: micro_6x16<1>(pk, kc, b, yr, ldy, nr, accumulate); break;
    }
  }
}

void gemm_panel_scalar(const float* pk, int kc, const float* xp, int n, float* y, int ldy, int nr, bool accumulate) {
  for (int i = 0; i < n; ++i) {
    const int i0 = i / kMr * kMr, mr = std::min(kMr, n - i0);
    const float* b = xp + size_t(i0) * size_t(kc);
    for (int j = 0; j < nr; ++j) {
      float acc = 0;
      for (int k = 0; k < kc; ++k) acc += pk[k * kNr + j] * b[k * mr + (i - i0)];
      float& out = y[size_t(i) * size_t(ldy) + size_t(j)];
      out = accumulate ? out + acc : acc;
    }
  }
}

// Each thread's dequantized weight panels, k-major [kKc][kNr] (128 KB each, in L2): one
// for the avx2 micro-kernel, two adjacent ones for the avx512 one.
float* panel_scratch() {
  alignas(64) static thread_local float pk[2 * kKc * kNr];
  return pk;
}

// Output rows [16 u, 16 u + 16) of the GEMM's chunk (k0, kc) on the avx2 micro-kernel, or
// [32 u, 32 u + 32) on the avx512 one (the last unit one panel when the count is odd): same
// sums either way.
int gemm_units(int n_panels, bool pairs) { return pairs ? (n_panels + 1) / 2 : n_panels; }
// One unit's product over packed panels: two (pk1 not null) on the avx512 micro-kernel, else
// the one on the avx2 or scalar kernel.
void multiply_panels(const float* pk, const float* pk1, int kc, const float* xp, int n, float* y, int ldy, int nr, int nr1,
                     bool accumulate, bool avx, LinePrefetch* pf) {
  if (pk1) avx512_kernels().gemm_panels2(pk, pk1, kc, xp, n, y, ldy, nr, nr1, accumulate, pf);
  else if (avx) gemm_panel_avx2(pk, kc, xp, n, y, ldy, nr, accumulate);
  else gemm_panel_scalar(pk, kc, xp, n, y, ldy, nr, accumulate);
}
// The weight lines of rows [r, r + 32) over the chunk's columns: the next unit of a thread
// that runs the units in order. An expert's pack otherwise waits on its rows line by line
// from memory (32 streams, more than the hardware prefetchers follow); taken one line per
// eight k steps of the micro-kernel, they arrive while the unit before multiplies. On Zen 5,
// 128 distinct experts from memory, 48 tokens each, one per thread: 512 x 2048 292-298 ->
// 304-334 GFLOP/s, 2048 x 512 271-302 -> 304-334 (calls alternating in one process).
LinePrefetch unit_lines(const Linear& w, int row0, int nrows, int r, int k0, int kc) {
  LinePrefetch pf;
  if (r >= nrows) return pf;
  const size_t es = dtype_size(w.dtype), ld = size_t(w.cols) * es;
  pf.base = reinterpret_cast<const char*>(w.data) + size_t(row0 + r) * ld + size_t(k0) * es;
  pf.ld = ld;
  pf.rows = std::min(2 * kNr, nrows - r);
  pf.row_bytes = int(size_t(kc) * es);
  return pf;
}
// Unit u of the chunk (k0, kc): its panels packed, then multiplied. fetch_next: the calling
// thread runs unit u + 1 next (not under a dynamic schedule), and the avx512 micro-kernel
// fetches its rows meanwhile.
void gemm_unit(const Linear& w, int row0, int nrows, int u, bool pairs, int k0, int kc, const float* xp, int n, float* y,
               size_t ldy, float* pk, bool avx, bool fetch_next) {
  const int p = pairs ? 2 * u : u, r0 = p * kNr, nr = std::min(kNr, nrows - r0);
  pack_panel(w, row0 + r0, nr, k0, kc, pk, avx);
  float* pk1 = nullptr;
  int nr1 = 0;
  if (pairs && r0 + kNr < nrows) {
    pk1 = pk + size_t(kKc) * kNr;
    nr1 = std::min(kNr, nrows - r0 - kNr);
    pack_panel(w, row0 + r0 + kNr, nr1, k0, kc, pk1, avx);
  }
  LinePrefetch next;
  if (pairs && fetch_next) next = unit_lines(w, row0, nrows, r0 + 2 * kNr, k0, kc);
  multiply_panels(pk, pk1, kc, xp, n, y + r0, int(ldy), nr, nr1, k0 > 0, avx, &next);
}

// The amx tier's GEMM takes bf16 weights, and fp8 ones with scale blocks a multiple of 32
// columns wide, when the columns come in whole tile steps of 32.
bool amx_takes(const Linear& w) {
  if (w.cols % 32 != 0) return false;
  if (w.dtype == DType::BF16) return true;
  return w.dtype == DType::F8_E4M3 && w.block_cols % 32 == 0 && w.block_cols <= kAmxKc;
}

// Each thread's packed weight unit (128 KB, in L2).
uint16_t* amx_scratch() {
  alignas(64) static thread_local uint16_t wp[kAmxUnitRows * kAmxKc];
  return wp;
}

// K in chunks of whole scale blocks; per chunk the tokens are split into bf16 parts once
// (shared by the threads), then units of weight rows are packed and multiplied across
// threads. A token's row of the tiles is its own: its outputs do not depend on n.
void linear_amx(const Linear& w, const float* x, size_t ldx, int n, float* y, size_t ldy, int row0, int nrows, bool nested) {
  const AmxKernels& k = amx_kernels();
  const int n_pad = (n + 15) / 16 * 16;
  const int chunk = w.dtype == DType::F8_E4M3 ? kAmxKc / w.block_cols * w.block_cols : kAmxKc;
  static thread_local std::vector<uint16_t> xs_buf;  // grows to the largest prefill chunk, then stays
  const size_t need = size_t(3) * size_t(n_pad) * size_t(std::min(chunk, w.cols));
  if (xs_buf.size() < need) xs_buf.resize(need);
  uint16_t* xs = xs_buf.data();  // a plain pointer: inside the region the name would be each thread's own
  const int units = (nrows + kAmxUnitRows - 1) / kAmxUnitRows;
  for (int k0 = 0; k0 < w.cols; k0 += chunk) {
    const int kc = std::min(chunk, w.cols - k0);
    auto run_unit = [&](int u) {
      const int r = u * kAmxUnitRows;
      k.unit(w, row0 + r, std::min(kAmxUnitRows, nrows - r), k0, kc, xs, n, n_pad, y + r, ldy, k0 > 0, amx_scratch());
    };
    if (nested) {
      k.split_x(x, ldx, n, 0, n_pad, k0, kc, n_pad, xs);
      for (int u = 0; u < units; ++u) run_unit(u);
      continue;
    }
#pragma omp parallel
    {
#pragma omp for schedule(static)
      for (int i0 = 0; i0 < n_pad; i0 += 16) k.split_x(x, ldx, n, i0, i0 + 16, k0, kc, n_pad, xs);
#pragma omp for schedule(dynamic, 1)
      for (int u = 0; u < units; ++u) run_unit(u);
    }
  }
}

// The GEMM of n tokens on the calling thread alone: K in chunks of kKc, the tokens packed
// into the thread's own scratch, then every panel.
void gemm_on_thread(const Linear& w, const float* x, size_t ldx, int n, float* y, size_t ldy, int row0, int nrows, bool avx) {
  static thread_local std::vector<float> own;  // grows to the largest share of a chunk, then stays
  if (own.size() < size_t(n) * size_t(std::min(kKc, w.cols))) own.resize(size_t(n) * size_t(std::min(kKc, w.cols)));
  const bool pairs = use_avx512();
  const int units = gemm_units((nrows + kNr - 1) / kNr, pairs);
  for (int k0 = 0; k0 < w.cols; k0 += kKc) {
    const int kc = std::min(kKc, w.cols - k0);
    pack_x(x, n, int(ldx), k0, kc, own.data());
    for (int u = 0; u < units; ++u) gemm_unit(w, row0, nrows, u, pairs, k0, kc, own.data(), n, y, ldy, panel_scratch(), avx, true);
  }
}

// Whether a GEMM's threads each take a share of the tokens through every panel, packing their
// own tokens and dequantizing every panel, rather than packing the tokens once together and
// splitting the panels. With enough tokens per thread the duplicated panel work is small
// beside what the shared packing costs (each thread waits for the others' packing and reads
// half the packed tokens from another core); with few panels there is little to split. On
// Zen 5 with 2 threads a 512-token chunk ran 5-10% faster through the large products this
// way and 1.2-1.7x through kv_b's per-head slices and the indexer's wk (docs/KERNELS.md).
bool split_by_tokens(int n, int units) {
  constexpr int kSplitTokens = 96;  // tokens per thread from which the split pays for any shape
  const int T = omp_get_max_threads();
  if (T < 2 || n < 2 * kMr * T) return false;
  return n >= kSplitTokens * T || units < 4 * T;
}

// The threads' shares of n tokens for split_by_tokens: whole blocks of kMr.
std::pair<int, int> token_share(int n) {
  const int T = omp_get_num_threads(), t = omp_get_thread_num(), blocks = (n + kMr - 1) / kMr;
  return {std::min(n, blocks * t / T * kMr), std::min(n, blocks * (t + 1) / T * kMr)};
}

}  // namespace

void linear(const Linear& w, const float* x, int n, float* y, int row0, int nrows) {
  if (nrows < 0) nrows = w.rows - row0;
  linear(w, x, size_t(w.cols), n, y, size_t(std::max(nrows, 0)), row0, nrows);
}

void linear(const Linear& w, const float* x, size_t ldx, int n, float* y, size_t ldy, int row0, int nrows) {
  if (nrows < 0) nrows = w.rows - row0;
  if (n <= 0 || nrows <= 0) return;
  const bool avx = use_avx2();
  // Inside a caller's parallel loop (one MoE expert per thread in prefill) the call runs on
  // its own thread: no nested region, per-thread scratch only.
  const bool nested = omp_get_level() > 0;  // any enclosing region, active or not
  if (isa() == Isa::Amx && amx_takes(w)) {
    linear_amx(w, x, ldx, n, y, ldy, row0, nrows, nested);
    return;
  }
  if (nested) return gemm_on_thread(w, x, ldx, n, y, ldy, row0, nrows, avx);
  const bool pairs = use_avx512();
  const int units = gemm_units((nrows + kNr - 1) / kNr, pairs);
  if (split_by_tokens(n, units)) {
#pragma omp parallel
    {
      const auto [i0, i1] = token_share(n);
      if (i1 > i0) gemm_on_thread(w, x + size_t(i0) * ldx, ldx, i1 - i0, y + size_t(i0) * ldy, ldy, row0, nrows, avx);
    }
    return;
  }
  // Otherwise K in chunks of kKc; per chunk the tokens are packed once (shared by the
  // threads), then 16-row weight panels are dequantized and multiplied across threads.
  static thread_local std::vector<float> xpack;  // grows to the largest prefill chunk, then stays
  if (xpack.size() < size_t(n) * size_t(std::min(kKc, w.cols))) xpack.resize(size_t(n) * size_t(std::min(kKc, w.cols)));
  float* xp = xpack.data();  // a plain pointer: inside the region the name would be each thread's own
  for (int k0 = 0; k0 < w.cols; k0 += kKc) {
    const int kc = std::min(kKc, w.cols - k0);
#pragma omp parallel
    {
      // The tokens are packed by all threads (blocks of kMr), then the panels run.
#pragma omp for schedule(static)
      for (int i0 = 0; i0 < n; i0 += kMr) pack_x_block(x, n, int(ldx), k0, kc, xp, i0);
      float* pk = panel_scratch();
#pragma omp for schedule(dynamic, 1)
      for (int u = 0; u < units; ++u) gemm_unit(w, row0, nrows, u, pairs, k0, kc, xp, n, y, ldy, pk, avx, false);
    }
  }
}

void linear_decode(const Linear& w, const float* x, int n, float* y, int row0, int nrows) {
  if (nrows < 0) nrows = w.rows - row0;
  if (n <= 0 || nrows <= 0) return;
  // f32 / f16 weights (and machines without AVX2) have no GEMV: the GEMM's order is
  // batch-invariant too.
  if (!use_avx2() || (w.dtype != DType::F8_E4M3 && w.dtype != DType::BF16)) {
    linear(w, x, n, y, row0, nrows);
    return;
  }
  // Memory-bound GEMV: each thread streams contiguous ranges of rows (multiples of four),
  // enough rows per thread that the fork is worth it.
  auto rows = [&](int t, int T) {
    const int rb = (nrows / 4 * t / T) * 4, re = t == T - 1 ? nrows : (nrows / 4 * (t + 1) / T) * 4;
    gemv_rows(w, x, n, y, size_t(nrows), row0, row0 + rb, row0 + re);
  };
  const int nt = omp_get_level() > 0 ? 1 : std::min(omp_get_max_threads(), std::max(1, nrows / 64));
  if (nt == 1) {
    rows(0, 1);
    return;
  }
  // Four contiguous pieces per thread, taken dynamically (as in linear_multi).
  const int pieces = std::min(4 * nt, std::max(nt, nrows / 256));
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (int p = 0; p < pieces; ++p) rows(p, pieces);
}

// Panel for the transposed direction: output columns [c0, c0 + nc) of W over rows
// [row0 + k0, row0 + k0 + kc), i.e. pk[k][j] = W[row0 + k0 + k][c0 + j] (contiguous in W).
void pack_panel_t(const Linear& w, int row0, int k0, int kc, int c0, int nc, float* pk, bool avx) {
  float row[kNr];
  for (int k = 0; k < kc; ++k) {
    const int r = row0 + k0 + k;
    if (avx) load_row_avx2(w, r, c0, nc, row); else load_row_scalar(w, r, c0, nc, row);
    const float s = block_scale(w, r, c0);  // 16 columns never straddle a 128-column block
    for (int j = 0; j < kNr; ++j) pk[k * kNr + j] = j < nc ? row[j] * s : 0.0f;
  }
}

void linear_t(const Linear& w, const float* x, int n, float* y, int row0, int nrows) {
  linear_t(w, x, size_t(nrows), n, y, size_t(w.cols), row0, nrows);
}

void linear_t(const Linear& w, const float* x, size_t ldx, int n, float* y, size_t ldy, int row0, int nrows) {
  // y[i, :] = Σ_r x[i, r] W[row0 + r, :].
  const bool avx = use_avx2();
  // The form depends on the weight's shape only, never on n (batch invariance, kernels.h).
  if (w.cols % kNr == 0 && (w.dtype != DType::F8_E4M3 || w.block_cols % kNr == 0)) {
    // The packed GEMM with K = nrows (the absorbed path of a prefill chunk).
    // Output columns in units of one 16-column panel, or two on the avx512 tier (its 6x32
    // micro-kernel, as linear's GEMM): the same sums either way.
    const int n_panels = w.cols / kNr;
    const bool pairs = use_avx512();
    const int units = gemm_units(n_panels, pairs);
    auto unit = [&](int u, int k0, int kc, const float* xp, int nn, float* yy, float* pk) {
      const int p = pairs ? 2 * u : u;
      pack_panel_t(w, row0, k0, kc, p * kNr, kNr, pk, avx);
      float* pk1 = nullptr;
      if (pairs && p + 1 < n_panels) {
        pk1 = pk + size_t(kKc) * kNr;
        pack_panel_t(w, row0, k0, kc, (p + 1) * kNr, kNr, pk1, avx);
      }
      multiply_panels(pk, pk1, kc, xp, nn, yy + p * kNr, int(ldy), kNr, kNr, k0 > 0, avx, nullptr);
    };
    if (split_by_tokens(n, units)) {
#pragma omp parallel
      {
        const auto [i0, i1] = token_share(n);
        static thread_local std::vector<float> own;  // grows to the largest share, then stays
        if (own.size() < size_t(i1 - i0) * size_t(std::min(kKc, nrows))) own.resize(size_t(i1 - i0) * size_t(std::min(kKc, nrows)));
        for (int k0 = 0; k0 < nrows && i1 > i0; k0 += kKc) {
          const int kc = std::min(kKc, nrows - k0);
          pack_x(x + size_t(i0) * ldx, i1 - i0, int(ldx), k0, kc, own.data());
          for (int u = 0; u < units; ++u) unit(u, k0, kc, own.data(), i1 - i0, y + size_t(i0) * ldy, panel_scratch());
        }
      }
      return;
    }
    static std::vector<float> xpack;
    if (xpack.size() < size_t(n) * size_t(std::min(kKc, nrows))) xpack.resize(size_t(n) * size_t(std::min(kKc, nrows)));
    for (int k0 = 0; k0 < nrows; k0 += kKc) {
      const int kc = std::min(kKc, nrows - k0);
      pack_x(x, n, int(ldx), k0, kc, xpack.data());
#pragma omp parallel
      {
        float* pk = panel_scratch();
#pragma omp for schedule(dynamic, 1)
        for (int u = 0; u < units; ++u) unit(u, k0, kc, xpack.data(), n, y, pk);
      }
    }
    return;
  }
  // Other shapes: threads split the output columns by scale block so each owns disjoint
  // outputs; each weight element is dequantized once.
  const int bc = w.dtype == DType::F8_E4M3 ? w.block_cols : 128;
  const int nblk = (w.cols + bc - 1) / bc;
  for (int i = 0; i < n; ++i) std::fill(y + size_t(i) * ldy, y + size_t(i) * ldy + size_t(w.cols), 0.0f);
#pragma omp parallel for schedule(static)
  for (int b = 0; b < nblk; ++b) {
    float wbuf[512];
    const int c0 = b * bc, len = std::min(bc, w.cols - c0);
    DSA_CHECK(len <= 512, "weight block wider than 512 columns");
    for (int r = 0; r < nrows; ++r) {
      const int wr = row0 + r;
      if (avx) load_row_avx2(w, wr, c0, len, wbuf); else load_row_scalar(w, wr, c0, len, wbuf);
      const float s = block_scale(w, wr, c0);
      for (int i = 0; i < n; ++i) {
        const float xv = x[size_t(i) * ldx + size_t(r)] * s;
        float* yi = y + size_t(i) * ldy + size_t(c0);
        for (int c = 0; c < len; ++c) yi[c] += xv * wbuf[c];
      }
    }
  }
}

namespace {

// linear_t_one for fp8 weights whose width is a whole number of scale blocks (the block
// width a multiple of 8): rows are streamed in order, eight at a time, each weight placed as f32 bits once (2^-120 times
// its value, as in gemv_fp8_tokens_avx2) and multiplied by x[r] * its block scale * 2^64, y
// accumulating in L1; the sums are scaled by 2^56 at the end. Each column sums its rows in
// row order. Rows are prefetched 16 ahead: one head's block (64 KB for DeepSeek's k_nope
// rows) is too short for the hardware prefetchers to get going, and without the prefetch
// the absorbed-query product read about 9 GB/s from memory (12-15 with it). Rows whose
// x * scale is too large for the 2^64 fall back.
__attribute__((target("avx2,fma"))) bool linear_t_one_fp8_avx2(const Linear& w, const float* x, int r0, int nrows, float* y) {
  const int sc = w.scale_cols(), bc = w.block_cols, K = w.cols;
  for (int r = 0; r < nrows; ++r)
    for (int b = 0; b < sc; ++b)
      if (!(std::fabs(x[r] * w.scale[size_t((r0 + r) / w.block_rows) * size_t(sc) + size_t(b)]) < 0x1p60f)) return false;
  std::fill(y, y + K, 0.0f);
  auto xv = [&](int r, int c0) {
    return x[r] * w.scale[size_t((r0 + r) / w.block_rows) * size_t(sc) + size_t(c0 / bc)] * kFp8XScale;
  };
  int r = 0;
  for (; r + 8 <= nrows; r += 8) {
    const uint8_t* p = w.data + size_t(r0 + r) * size_t(K);
    const size_t ld = size_t(K);
    for (int c0 = 0; c0 < K; c0 += bc) {  // one scale block of columns: one multiplier per row
      const __m256 s0 = _mm256_set1_ps(xv(r, c0)), s1 = _mm256_set1_ps(xv(r + 1, c0));
      const __m256 s2 = _mm256_set1_ps(xv(r + 2, c0)), s3 = _mm256_set1_ps(xv(r + 3, c0));
      const __m256 s4 = _mm256_set1_ps(xv(r + 4, c0)), s5 = _mm256_set1_ps(xv(r + 5, c0));
      const __m256 s6 = _mm256_set1_ps(xv(r + 6, c0)), s7 = _mm256_set1_ps(xv(r + 7, c0));
      for (int c = c0; c < c0 + bc; c += 8) {
        if ((c & 63) == 0 && r + 24 <= nrows)  // the same columns 16 rows ahead (8 KB at 512 columns)
          for (int j = 16; j < 24; ++j) prefetch_stream(p + size_t(j) * ld + size_t(c));
        __m256 acc = _mm256_loadu_ps(y + c);
        acc = _mm256_fmadd_ps(fp8x8_bits(p + c), s0, acc);
        acc = _mm256_fmadd_ps(fp8x8_bits(p + ld + c), s1, acc);
        acc = _mm256_fmadd_ps(fp8x8_bits(p + 2 * ld + c), s2, acc);
        acc = _mm256_fmadd_ps(fp8x8_bits(p + 3 * ld + c), s3, acc);
        acc = _mm256_fmadd_ps(fp8x8_bits(p + 4 * ld + c), s4, acc);
        acc = _mm256_fmadd_ps(fp8x8_bits(p + 5 * ld + c), s5, acc);
        acc = _mm256_fmadd_ps(fp8x8_bits(p + 6 * ld + c), s6, acc);
        acc = _mm256_fmadd_ps(fp8x8_bits(p + 7 * ld + c), s7, acc);
        _mm256_storeu_ps(y + c, acc);
      }
    }
  }
  for (; r < nrows; ++r) {
    const uint8_t* p = w.data + size_t(r0 + r) * size_t(K);
    for (int c0 = 0; c0 < K; c0 += bc) {
      const __m256 s0 = _mm256_set1_ps(xv(r, c0));
      for (int c = c0; c < c0 + bc; c += 8)
        _mm256_storeu_ps(y + c, _mm256_fmadd_ps(fp8x8_bits(p + c), s0, _mm256_loadu_ps(y + c)));
    }
  }
  const __m256 undo = _mm256_set1_ps(kFp8BitsUndo);
  for (int c = 0; c < K; c += 8) _mm256_storeu_ps(y + c, _mm256_mul_ps(_mm256_loadu_ps(y + c), undo));
  return true;
}

// linear_t_one_fp8_avx2 for two tokens (x and y rows ldx and ldy apart; callers checked
// both with fp8_t_takes): each group of eight rows widened once for both, each token's
// columns summed exactly as linear_t_one_fp8_avx2 sums them alone (eight rows per step, in
// row order, through y). The MTP verification's pair: through the strip tiles below, which
// store the widened weights and read them back per token, two tokens took three times one
// token's time, where this takes about 1.3 times.
__attribute__((target("avx2,fma"))) void linear_t_two_fp8_avx2(const Linear& w, const float* x, size_t ldx, int r0, int nrows, float* y,
                                                                size_t ldy) {
  const int sc = w.scale_cols(), bc = w.block_cols, K = w.cols;
  float* y1 = y + ldy;
  std::fill(y, y + K, 0.0f);
  std::fill(y1, y1 + K, 0.0f);
  auto xv = [&](int t, int r, int c0) {
    return x[size_t(t) * ldx + size_t(r)] * w.scale[size_t((r0 + r) / w.block_rows) * size_t(sc) + size_t(c0 / bc)] * kFp8XScale;
  };
  alignas(32) float m[2][8];
  int r = 0;
  for (; r + 8 <= nrows; r += 8) {
    const uint8_t* p = w.data + size_t(r0 + r) * size_t(K);
    const size_t ld = size_t(K);
    for (int c0 = 0; c0 < K; c0 += bc) {  // one scale block of columns: one multiplier per row and token
      for (int t = 0; t < 2; ++t)
        for (int j = 0; j < 8; ++j) m[t][j] = xv(t, r + j, c0);
      for (int c = c0; c < c0 + bc; c += 8) {
        if ((c & 63) == 0 && r + 24 <= nrows)
          for (int j = 16; j < 24; ++j) prefetch_stream(p + size_t(j) * ld + size_t(c));
        __m256 wv[8];
        for (int j = 0; j < 8; ++j) wv[j] = fp8x8_bits(p + size_t(j) * ld + size_t(c));
        __m256 a0 = _mm256_loadu_ps(y + c), a1 = _mm256_loadu_ps(y1 + c);
        for (int j = 0; j < 8; ++j) {
          a0 = _mm256_fmadd_ps(wv[j], _mm256_broadcast_ss(&m[0][j]), a0);
          a1 = _mm256_fmadd_ps(wv[j], _mm256_broadcast_ss(&m[1][j]), a1);
        }
        _mm256_storeu_ps(y + c, a0);
        _mm256_storeu_ps(y1 + c, a1);
      }
    }
  }
  for (; r < nrows; ++r) {
    const uint8_t* p = w.data + size_t(r0 + r) * size_t(K);
    for (int c0 = 0; c0 < K; c0 += bc) {
      const __m256 s0 = _mm256_set1_ps(xv(0, r, c0)), s1 = _mm256_set1_ps(xv(1, r, c0));
      for (int c = c0; c < c0 + bc; c += 8) {
        const __m256 wv = fp8x8_bits(p + c);
        _mm256_storeu_ps(y + c, _mm256_fmadd_ps(wv, s0, _mm256_loadu_ps(y + c)));
        _mm256_storeu_ps(y1 + c, _mm256_fmadd_ps(wv, s1, _mm256_loadu_ps(y1 + c)));
      }
    }
  }
  const __m256 undo = _mm256_set1_ps(kFp8BitsUndo);
  for (int c = 0; c < K; c += 8) {
    _mm256_storeu_ps(y + c, _mm256_mul_ps(_mm256_loadu_ps(y + c), undo));
    _mm256_storeu_ps(y1 + c, _mm256_mul_ps(_mm256_loadu_ps(y1 + c), undo));
  }
}

// y[0:cols] = x[0:nrows] · W[r0 : r0 + nrows], single-threaded (callers parallelize).
// Whether linear_t_one_fp8_avx2 takes this weight's shape.
bool fp8_t_shape(const Linear& w) { return w.dtype == DType::F8_E4M3 && w.cols % w.block_cols == 0 && w.block_cols % 8 == 0; }

void linear_t_one(const Linear& w, const float* x, int r0, int nrows, float* y, bool avx) {
  if (avx && fp8_t_shape(w) && linear_t_one_fp8_avx2(w, x, r0, nrows, y)) return;
  std::fill(y, y + w.cols, 0.0f);
  const int bc = w.dtype == DType::F8_E4M3 ? w.block_cols : 128;
  float wbuf[512];
  DSA_CHECK(bc <= 512, "weight block wider than 512 columns");
  for (int c0 = 0; c0 < w.cols; c0 += bc) {
    const int len = std::min(bc, w.cols - c0);
    for (int r = 0; r < nrows; ++r) {
      if (avx) load_row_avx2(w, r0 + r, c0, len, wbuf); else load_row_scalar(w, r0 + r, c0, len, wbuf);
      const float xv = x[r] * block_scale(w, r0 + r, c0);
      float* yc = y + c0;
      for (int c = 0; c < len; ++c) yc[c] += xv * wbuf[c];
    }
  }
}

// Whether linear_t_one_fp8_avx2 takes every one of n tokens (x rows ldx apart): its 2^64
// multiplier must keep each row's x * scale finite.
bool fp8_t_takes(const Linear& w, const float* x, size_t ldx, int n, int r0, int nrows) {
  const int sc = w.scale_cols();
  for (int t = 0; t < n; ++t)
    for (int r = 0; r < nrows; ++r)
      for (int b = 0; b < sc; ++b)
        if (!(std::fabs(x[size_t(t) * ldx + size_t(r)] * w.scale[size_t((r0 + r) / w.block_rows) * size_t(sc) + size_t(b)]) < 0x1p60f))
          return false;
  return true;
}

// linear_t_one_fp8_avx2 for n tokens (x and y rows ldx and ldy apart; n <= kTokChunkT). A
// strip of up to 32 columns of 64 rows is widened once into wb (f32 bits, 8 KB: L1), then NT
// tokens x NV vectors of it accumulate in registers down the rows, each column summing its
// rows in row order from zero with the one-token kernel's multipliers (x * block scale *
// 2^64), carried through y between row chunks: every token's y is bitwise what the
// one-token kernel gives it. Per row NT broadcasts and NV loads feed NT x NV FMAs, where
// the one-token kernel widens each weight for one FMA.
constexpr int kRowChunkT = 64, kStripT = 32;

template <int NV, int NT>
__attribute__((target("avx2,fma"))) inline void t_tile(const float* wb, int rows, const float* s, float* const* yt) {
  __m256 acc[NT][NV];
  for (int t = 0; t < NT; ++t)
    for (int v = 0; v < NV; ++v) acc[t][v] = _mm256_loadu_ps(yt[t] + 8 * v);
  for (int r = 0; r < rows; ++r) {
    __m256 wv[NV];
    for (int v = 0; v < NV; ++v) wv[v] = _mm256_load_ps(wb + size_t(r) * kStripT + 8 * v);
    for (int t = 0; t < NT; ++t) {
      const __m256 m = _mm256_broadcast_ss(s + size_t(t) * kRowChunkT + size_t(r));
      for (int v = 0; v < NV; ++v) acc[t][v] = _mm256_fmadd_ps(wv[v], m, acc[t][v]);
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(yt[t] + 8 * v, acc[t][v]);
}

// The n tokens over one strip (nv vectors at column c), three at a time.
template <int NV>
__attribute__((target("avx2,fma"))) void t_strip(const float* wb, int rows, const float* s, float* y, size_t ldy, int n, int c) {
  int t = 0;
  for (; t + 3 <= n; t += 3) {
    float* const yt[3] = {y + size_t(t) * ldy + size_t(c), y + size_t(t + 1) * ldy + size_t(c), y + size_t(t + 2) * ldy + size_t(c)};
    t_tile<NV, 3>(wb, rows, s + size_t(t) * kRowChunkT, yt);
  }
  for (; t < n; ++t) {
    float* const yt[1] = {y + size_t(t) * ldy + size_t(c)};
    t_tile<NV, 1>(wb, rows, s + size_t(t) * kRowChunkT, yt);
  }
}

__attribute__((target("avx2,fma"))) void linear_t_tokens_fp8_avx2(const Linear& w, const float* x, size_t ldx, int n, int r0, int nrows,
                                                                   float* y, size_t ldy) {
  const int sc = w.scale_cols(), bc = w.block_cols, K = w.cols;
  for (int t = 0; t < n; ++t) std::fill(y + size_t(t) * ldy, y + size_t(t) * ldy + size_t(K), 0.0f);
  alignas(32) float wb[kRowChunkT * kStripT];
  alignas(32) float s[kTokChunkT * kRowChunkT];
  for (int c0 = 0; c0 < K; c0 += bc) {  // one scale block of columns: one multiplier per row and token
    for (int q0 = 0; q0 < nrows; q0 += kRowChunkT) {
      const int rows = std::min(kRowChunkT, nrows - q0);
      for (int t = 0; t < n; ++t)
        for (int r = 0; r < rows; ++r)
          s[size_t(t) * kRowChunkT + size_t(r)] = x[size_t(t) * ldx + size_t(q0 + r)] *
                                                  w.scale[size_t((r0 + q0 + r) / w.block_rows) * size_t(sc) + size_t(c0 / bc)] * kFp8XScale;
      for (int c = c0; c < c0 + bc; c += kStripT) {
        const int nv = std::min(kStripT, c0 + bc - c) / 8;
        const uint8_t* p = w.data + size_t(r0 + q0) * size_t(K) + size_t(c);
        for (int r = 0; r < rows; ++r)
          for (int v = 0; v < nv; ++v) _mm256_store_ps(wb + size_t(r) * kStripT + 8 * v, fp8x8_bits(p + size_t(r) * size_t(K) + 8 * v));
        if (nv == 4) t_strip<4>(wb, rows, s, y, ldy, n, c);
        else
          for (int v = 0; v < nv; ++v) t_strip<1>(wb + 8 * v, rows, s, y, ldy, n, c + 8 * v);
      }
    }
  }
  const __m256 undo = _mm256_set1_ps(kFp8BitsUndo);
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < K; c += 8) {
      float* yt = y + size_t(t) * ldy + size_t(c);
      _mm256_storeu_ps(yt, _mm256_mul_ps(_mm256_loadu_ps(yt), undo));
    }
}

// n tokens through rows [r0, r0 + nrows) in the transposed direction (x and y rows ldx and
// ldy apart): each token's y bitwise linear_t_one's for it alone, the fp8 weights widened
// once per chunk of tokens when the fp8 kernel takes every token of the chunk.
// On the avx512 tier its own kernel takes the chunk, one token or more: the same bits (next_r0:
// where its prefetch goes on, see Avx512Kernels).
void linear_t_tokens(const Linear& w, const float* x, size_t ldx, int n, int r0, int nrows, int next_r0, float* y, size_t ldy, bool avx) {
  const bool wide = use_avx512() && w.block_cols % 16 == 0;
  for (int t0 = 0; t0 < n; t0 += kTokChunkT) {
    const int cnt = std::min(kTokChunkT, n - t0);
    const float* xt = x + size_t(t0) * ldx;
    float* yt = y + size_t(t0) * ldy;
    if ((cnt > 1 || wide) && avx && fp8_t_shape(w) && fp8_t_takes(w, xt, ldx, cnt, r0, nrows)) {
      if (wide) avx512_kernels().linear_t_fp8(w, xt, ldx, cnt, r0, nrows, next_r0, yt, ldy);
      else if (cnt == 2) linear_t_two_fp8_avx2(w, xt, ldx, r0, nrows, yt, ldy);
      else linear_t_tokens_fp8_avx2(w, xt, ldx, cnt, r0, nrows, yt, ldy);
      continue;
    }
    for (int t = 0; t < cnt; ++t) linear_t_one(w, xt + size_t(t) * ldx, r0, nrows, yt + size_t(t) * ldy, avx);
  }
}
}  // namespace

void linear_multi(const LinearJob* jobs, int n_jobs) {
  DSA_CHECK(n_jobs <= kMaxLinearJobs, "linear_multi: more than 64 jobs");
  bool fast = use_avx2();
  for (int j = 0; j < n_jobs; ++j) DSA_CHECK(jobs[j].n >= 1, "linear_multi: a job without tokens");
  int64_t total = 0;
  int64_t start[65];
  for (int j = 0; j < n_jobs && fast; ++j) {
    const DType dt = jobs[j].w->dtype;
    fast = dt == DType::F8_E4M3 || dt == DType::BF16;
    start[j] = total;
    total += (jobs[j].rows() + 3) / 4;  // in groups of four rows
  }
  if (!fast) {
    for (int j = 0; j < n_jobs; ++j) linear_decode(*jobs[j].w, jobs[j].x, jobs[j].n, jobs[j].y, jobs[j].row0, jobs[j].rows());
    return;
  }
  start[n_jobs] = total;
  // All the jobs' rows (as groups of four) in a few contiguous pieces, taken dynamically:
  // a few pieces per thread keep each stream long enough for the prefetchers and let the
  // faster core of a shared machine take more.
  const int T = omp_get_max_threads();
  const int chunks = int(std::min<int64_t>(total, int64_t(T) * 4));
#pragma omp parallel for schedule(dynamic, 1)
  for (int ch = 0; ch < chunks; ++ch) {
    const int64_t g0 = total * ch / chunks, g1 = total * (ch + 1) / chunks;
    for (int j = 0; j < n_jobs; ++j) {
      const int64_t a = std::max(g0, start[j]), b = std::min(g1, start[j + 1]);
      if (a >= b) continue;
      const int row0 = jobs[j].row0, rows = jobs[j].rows();
      const int r0 = row0 + int(a - start[j]) * 4, r1 = row0 + std::min(rows, int(b - start[j]) * 4);
      gemv_rows(*jobs[j].w, jobs[j].x, jobs[j].n, jobs[j].y, size_t(rows), row0, r0, r1);
    }
  }
}

void linear_t_heads(const Linear& w, const float* x, int x_stride, int n_heads, int head_stride, int row0, int nrows, float* y,
                    int n_tok) {
  const bool avx = use_avx2();
  DSA_CHECK(w.dtype != DType::F8_E4M3 || w.block_cols <= 512, "weight block wider than 512 columns");
  const size_t ldx = size_t(n_heads) * size_t(x_stride), ldy = size_t(n_heads) * size_t(w.cols);
  // One parallel region for all heads instead of one per head; inside a caller's parallel
  // loop (one query per thread) the heads run on its thread.
  auto head = [&](int h) {
    const int next = h + 1 < n_heads ? (h + 1) * head_stride + row0 : -1;
    linear_t_tokens(w, x + size_t(h) * size_t(x_stride), ldx, n_tok, h * head_stride + row0, nrows, next, y + size_t(h) * size_t(w.cols), ldy,
                    avx);
  };
  if (omp_get_level() > 0) {
    for (int h = 0; h < n_heads; ++h) head(h);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int h = 0; h < n_heads; ++h) head(h);
}

// A head's inputs of several tokens gathered into rows for gemv_rows (kTokPrepared at a time).
thread_local std::vector<float> t_xheads;

void linear_heads(const Linear& w, const float* x, int n_heads, int head_stride, int row0, int nrows, float* y, int y_stride,
                  int n_tok) {
  const bool avx = use_avx2();
  const bool fast = avx && (w.dtype == DType::F8_E4M3 || w.dtype == DType::BF16);
  const size_t cols = size_t(w.cols), ldx = size_t(n_heads) * cols, ldy = size_t(n_heads) * size_t(y_stride);
  auto head = [&](int h) {
    const int r0 = h * head_stride + row0;
    float* yh = y + size_t(h) * size_t(y_stride);
    const float* xh = x + size_t(h) * cols;
    if (fast && n_tok == 1) {
      gemv_rows(w, xh, 1, yh, 0, r0, r0, r0 + nrows);
    } else if (fast) {
      // The tokens' rows of this head through the multi-token GEMV: each output in the
      // one-token order (gemv_rows), so each token gets what it gets alone.
      float* xg = x_buffer(t_xheads, size_t(kTokPrepared) * cols);
      for (int t0 = 0; t0 < n_tok; t0 += kTokPrepared) {
        const int cnt = std::min(kTokPrepared, n_tok - t0);
        for (int t = 0; t < cnt; ++t) std::copy_n(xh + size_t(t0 + t) * ldx, cols, xg + size_t(t) * cols);
        gemv_rows(w, xg, cnt, yh + size_t(t0) * ldy, ldy, r0, r0, r0 + nrows);
      }
    } else {
      for (int t = 0; t < n_tok; ++t)
        for (int r = 0; r < nrows; ++r) {
          float acc = 0;
          for (int c = 0; c < w.cols; ++c) acc += ref::weight_at(w, r0 + r, c) * xh[size_t(t) * ldx + size_t(c)];
          yh[size_t(t) * ldy + size_t(r)] = acc;
        }
    }
  };
  if (omp_get_level() > 0) {  // as in linear_t_heads
    for (int h = 0; h < n_heads; ++h) head(h);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int h = 0; h < n_heads; ++h) head(h);
}

void reserve_gemv_scratch(int max_cols) {
  x_buffer(t_xscaled, 2 * size_t(kTokPrepared) * size_t(std::max(max_cols, 1)));  // avx512: two copies (cpu.h)
  x_buffer(t_xdeint, size_t(kTokPrepared) * size_t(std::max(max_cols, 1)));
  x_buffer(t_xheads, size_t(kTokPrepared) * size_t(std::max(max_cols, 1)));
}

}  // namespace dsa::kernels::cpu
