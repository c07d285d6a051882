#pragma once
// Small AVX2 helpers shared by the CPU kernels (callers check use_avx2() first).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace dsa::kernels::cpu {

// Makes v opaque to the optimizer so it stays in a register: a vector several FMAs share
// is otherwise folded into each of them as a memory operand (one load per use).
__attribute__((target("avx2,fma"))) inline void in_register(__m256& v) { __asm__("" : "+x"(v)); }

// Prefetches a line of a stream (a GEMV's weight rows, sparse attention's gathered latents)
// into L2, not L1. On Zen 4 (32 KB L1, two cores) an L1
// prefetch (T0) held the one-token fp8 stream to 22 GB/s of a 33-35 GB/s read bandwidth,
// into L2 (T1) it ran at 27-32 GB/s; the bf16 lm_head and the multi-token tiles gained too
// (docs/KERNELS.md). A line prefetched into L1 holds one of its few miss buffers until it
// arrives; one bound for L2 waits in L2's deeper queue, and the load that follows finds it
// there in time.
inline void prefetch_stream(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1); }

// Sum of the eight lanes.
__attribute__((target("avx2,fma"))) inline float hsum8(__m256 s) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

// Eight e4m3 codes, in their order, as f32 bit patterns equal to 2^-120 times their values:
// sign-extend each byte to 32 bits, shift left by 20 and keep the sign bit and the seven
// exponent/mantissa bits (bits 31 and 26..20). Exact for every code, subnormals included
// (they land on f32 subnormals); callers fold the 2^120 into a block scale or prescale the
// other operand.
__attribute__((target("avx2,fma"))) inline __m256 fp8x8_bits(const uint8_t* p) {
  const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 20), _mm256_set1_epi32(int32_t(0x87F00000u))));
}

// n bf16 (or f16) values as f32, the conversions' exact results: bf16 by a 16-bit shift,
// f16 by F16C. Unaligned sources (checkpoint rows, cache rows) are read bytewise in the tail.
__attribute__((target("avx2,f16c"))) inline void widen16(const uint8_t* src, bool bf16, int n, float* y) {
  int c = 0;
  for (; c + 8 <= n; c += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * c));
    _mm256_storeu_ps(y + c, bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h));
  }
  for (; c < n; ++c) {
    uint16_t h;
    std::memcpy(&h, src + 2 * c, 2);
    y[c] = bf16 ? bf16_to_f32(h) : f16_to_f32(h);
  }
}

// n floats as bf16 into dst (any alignment): f32_to_bf16 on eight lanes, rounding to nearest
// even and keeping a NaN a (quiet) NaN.
__attribute__((target("avx2"))) inline void narrow_bf16(const float* x, int n, uint8_t* dst) {
  const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff), quiet = _mm256_set1_epi32(0x40);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  int c = 0;
  for (; c + 8 <= n; c += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + c));
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(half, _mm256_and_si256(hi, one))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    const __m256i v = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), nan);
    // packus packs within 128-bit halves: lanes 0-3 land in quadword 0, lanes 4-7 in quadword 2.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * c), _mm256_castsi256_si128(packed));
  }
  for (; c < n; ++c) {
    const uint16_t h = f32_to_bf16(x[c]);
    std::memcpy(dst + 2 * c, &h, 2);
  }
}

// A lightning-indexer key's score before its key scale: Σ_h relu(dots[h]) * w[h] over hp
// heads (a multiple of 8) in 8-lane groups, then the lanes: the order of every tier's scan.
__attribute__((target("avx2,fma"))) inline float relu_weighted_sum(const float* dots, const float* w, int hp) {
  const __m256 zero = _mm256_setzero_ps();
  __m256 acc = zero;
  for (int h = 0; h < hp; h += 8) acc = _mm256_fmadd_ps(_mm256_max_ps(_mm256_loadu_ps(dots + h), zero), _mm256_loadu_ps(w + h), acc);
  return hsum8(acc);
}

// exp for 8 lanes (Cephes' expf scheme): x = n ln2 + r with |r| <= ln2/2, a degree-6
// polynomial for e^r, 2^n through the exponent bits. About 1 ulp over the softmax's
// range (x <= 0); below -87.3 it returns ~1e-38 instead of 0, which no softmax notices.
__attribute__((target("avx2,fma"))) inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)), _mm256_set1_ps(-87.3365447504f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// 8x8 transpose of the rows r[0..7] into dst rows (stride ldd).
__attribute__((target("avx2,fma"))) inline void transpose8x8_store(const __m256* r, float* dst, size_t ldd) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  const __m256 u0 = _mm256_shuffle_ps(t[0], t[2], 0x44), u1 = _mm256_shuffle_ps(t[0], t[2], 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t[1], t[3], 0x44), u3 = _mm256_shuffle_ps(t[1], t[3], 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t[4], t[6], 0x44), u5 = _mm256_shuffle_ps(t[4], t[6], 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t[5], t[7], 0x44), u7 = _mm256_shuffle_ps(t[5], t[7], 0xEE);
  _mm256_storeu_ps(dst + 0 * ldd, _mm256_permute2f128_ps(u0, u4, 0x20));
  _mm256_storeu_ps(dst + 1 * ldd, _mm256_permute2f128_ps(u1, u5, 0x20));
  _mm256_storeu_ps(dst + 2 * ldd, _mm256_permute2f128_ps(u2, u6, 0x20));
  _mm256_storeu_ps(dst + 3 * ldd, _mm256_permute2f128_ps(u3, u7, 0x20));
  _mm256_storeu_ps(dst + 4 * ldd, _mm256_permute2f128_ps(u0, u4, 0x31));
  _mm256_storeu_ps(dst + 5 * ldd, _mm256_permute2f128_ps(u1, u5, 0x31));
  _mm256_storeu_ps(dst + 6 * ldd, _mm256_permute2f128_ps(u2, u6, 0x31));
  _mm256_storeu_ps(dst + 7 * ldd, _mm256_permute2f128_ps(u3, u7, 0x31));
}

}  // namespace dsa::kernels::cpu
