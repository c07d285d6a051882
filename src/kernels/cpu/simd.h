#pragma once
// Small AVX2 helpers shared by the CPU kernels (callers check has_avx2_fma() first).
#include <immintrin.h>

#include <cstdint>

namespace dsa::kernels::cpu {

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

}  // namespace dsa::kernels::cpu
