#pragma once
// A 16 x 16 transpose of 32-bit lanes in 512-bit registers, for the files compiled for
// AVX-512 (avx512.cpp, amx.cpp): each includes it after its target pragma and its intrinsics
// (native or SIMDe's), and `static` gives each file its own copy built for that target.
#include <cstddef>

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

}  // namespace dsa::kernels::cpu
