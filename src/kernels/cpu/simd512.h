#pragma once
// Small AVX-512 helpers shared by the files compiled for AVX-512 (avx512.cpp, amx.cpp):
// each includes this after its target pragma and its intrinsics (native or SIMDe's), and
// `static` gives each file its own copy built for that target.
#include <bit>
#include <cstddef>
#include <cstdint>

namespace dsa::kernels::cpu {

// Row k of dst (16 floats, k = 0..15) gets lane k of r[0..15]. Rows interleaved in pairs,
// then in fours: u[4g + o] holds, in its 128-bit lane L, rows 4g .. 4g + 3 of column 4L + o.
// Column c = 4L + o then gathers lane L of u[o], u[4 + o], u[8 + o], u[12 + o]: a 4 x 4
// transpose of 128-bit lanes.
static inline void transpose16_store(const __m512 (&r)[16], float* dst) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int o = 0; o < 4; ++o) {
    const __m512 v0 = _mm512_shuffle_f32x4(u[o], u[4 + o], 0x44), v1 = _mm512_shuffle_f32x4(u[o], u[4 + o], 0xEE);
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + o], u[12 + o], 0x44), v3 = _mm512_shuffle_f32x4(u[8 + o], u[12 + o], 0xEE);
    _mm512_storeu_ps(dst + size_t(o) * 16, _mm512_shuffle_f32x4(v0, v2, 0x88));
    _mm512_storeu_ps(dst + size_t(4 + o) * 16, _mm512_shuffle_f32x4(v0, v2, 0xDD));
    _mm512_storeu_ps(dst + size_t(8 + o) * 16, _mm512_shuffle_f32x4(v1, v3, 0x88));
    _mm512_storeu_ps(dst + size_t(12 + o) * 16, _mm512_shuffle_f32x4(v1, v3, 0xDD));
  }
}

// The bf16 bits of m * 2^-9, the value of the subnormal e4m3 code m, at every index whose
// low three bits are m (vpermw reads five). Constant-initialized: no AVX-512 code runs before
// a tier is chosen.
struct alignas(64) Fp8SubnormalBf16 {
  uint16_t v[32];
};
constexpr Fp8SubnormalBf16 make_fp8_subnormal_bf16() {
  Fp8SubnormalBf16 t{};
  for (int i = 0; i < 32; ++i) t.v[i] = uint16_t(std::bit_cast<uint32_t>(float(i & 7) * 0x1p-9f) >> 16);  // exact
  return t;
}
constexpr Fp8SubnormalBf16 kFp8SubnormalBf16 = make_fp8_subnormal_bf16();

// 32 e4m3 codes as bf16 bits, in order: the magnitude's bits moved under bf16's exponent
// bias (code << 4 plus 120 << 7) for normal codes, kFp8SubnormalBf16 (loaded into
// `subnormals`) for the eight subnormal ones, then the sign. Code 0x7F (NaN in e4m3fn)
// becomes 480, as the f32 kernels' bit trick reads it.
static inline __m512i bf16x32_from_fp8(const uint8_t* p, __m512i subnormals) {
  const __m512i v = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));  // bit 7 kept
  const __m512i m = _mm512_and_si512(v, _mm512_set1_epi16(0x7F));
  const __m512i normal = _mm512_add_epi16(_mm512_slli_epi16(m, 4), _mm512_set1_epi16(0x3C00));
  const __mmask32 is_normal = _mm512_test_epi16_mask(m, _mm512_set1_epi16(0x78));  // exponent bits set
  const __m512i b = _mm512_mask_blend_epi16(is_normal, _mm512_permutexvar_epi16(m, subnormals), normal);
  return _mm512_or_si512(b, _mm512_slli_epi16(_mm512_and_si512(v, _mm512_set1_epi16(0x80)), 8));
}

}  // namespace dsa::kernels::cpu
