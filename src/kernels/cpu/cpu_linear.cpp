// fp8-block / bf16 / f32 matrix products with on-the-fly dequantization.
//
// fp8 e4m3 -> f32 without a table: moving the e4m3 bits into an IEEE half
// (sign << 8, exponent+mantissa << 7) gives the same value scaled by 2^-8 (the exponent
// bias is 15 instead of 7), subnormals included, and F16C converts 8 halves per
// instruction. The 2^8 is folded into the per-block scale, applied once per 128 columns.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/ref/ref.h"

namespace dsa::kernels::cpu {

bool has_avx2_fma() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return ok;
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

__attribute__((target("avx2,fma"))) inline float dot_avx2(const float* a, const float* b, int n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  float r = _mm_cvtss_f32(h);
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

inline float dot_scalar(const float* a, const float* b, int n) {
  float r = 0;
  for (int i = 0; i < n; ++i) r += a[i] * b[i];
  return r;
}

// y[:, r] for rows [r_begin, r_end): each weight row is dequantized once (one scale
// block at a time) and applied to every token, so a row is read from memory once per call.
template <bool kAvx>
void linear_rows(const Linear& w, const float* x, int n, float* y, int row0, int nrows, int r_begin, int r_end, float* wbuf) {
  const int bc = w.dtype == DType::F8_E4M3 ? w.block_cols : w.cols;
  for (int r = r_begin; r < r_end; ++r) {
    const int wr = row0 + r;
    if (n == 1) {
      float acc = 0;
      for (int c0 = 0; c0 < w.cols; c0 += bc) {
        const int len = std::min(bc, w.cols - c0);
        if constexpr (kAvx) load_row_avx2(w, wr, c0, len, wbuf); else load_row_scalar(w, wr, c0, len, wbuf);
        acc += block_scale(w, wr, c0) * (kAvx ? dot_avx2(wbuf, x + c0, len) : dot_scalar(wbuf, x + c0, len));
      }
      y[r] = acc;
      continue;
    }
    for (int c0 = 0; c0 < w.cols; c0 += bc) {
      const int len = std::min(bc, w.cols - c0);
      if constexpr (kAvx) load_row_avx2(w, wr, c0, len, wbuf + c0); else load_row_scalar(w, wr, c0, len, wbuf + c0);
      const float s = block_scale(w, wr, c0);
      for (int c = 0; c < len; ++c) wbuf[c0 + c] *= s;
    }
    for (int i = 0; i < n; ++i) {
      const float* xi = x + size_t(i) * size_t(w.cols);
      y[size_t(i) * size_t(nrows) + size_t(r)] = kAvx ? dot_avx2(wbuf, xi, w.cols) : dot_scalar(wbuf, xi, w.cols);
    }
  }
}

}  // namespace

void linear(const Linear& w, const float* x, int n, float* y, int row0, int nrows) {
  if (nrows < 0) nrows = w.rows - row0;
  if (n <= 0 || nrows <= 0) return;
  const bool avx = has_avx2_fma();
  // Split rows across threads; each thread has a row buffer on its stack-sized scratch.
  const int grain = std::max(1, nrows / (8 * omp_get_max_threads()));
#pragma omp parallel
  {
    thread_local std::vector<float> wbuf;
    if (wbuf.size() < size_t(w.cols)) wbuf.resize(size_t(w.cols));
#pragma omp for schedule(dynamic, 1)
    for (int rb = 0; rb < nrows; rb += grain) {
      const int re = std::min(nrows, rb + grain);
      if (avx) linear_rows<true>(w, x, n, y, row0, nrows, rb, re, wbuf.data());
      else linear_rows<false>(w, x, n, y, row0, nrows, rb, re, wbuf.data());
    }
  }
}

void linear_t(const Linear& w, const float* x, int n, float* y, int row0, int nrows) {
  // y[i, :] = Σ_r x[i, r] W[row0 + r, :]. Threads split the output columns by scale
  // block so each owns disjoint outputs; each weight element is dequantized once.
  const bool avx = has_avx2_fma();
  const int bc = w.dtype == DType::F8_E4M3 ? w.block_cols : 128;
  const int nblk = (w.cols + bc - 1) / bc;
  for (int i = 0; i < n; ++i) std::fill(y + size_t(i) * size_t(w.cols), y + size_t(i + 1) * size_t(w.cols), 0.0f);
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
        const float xv = x[size_t(i) * size_t(nrows) + size_t(r)] * s;
        float* yi = y + size_t(i) * size_t(w.cols) + size_t(c0);
        for (int c = 0; c < len; ++c) yi[c] += xv * wbuf[c];
      }
    }
  }
}

}  // namespace dsa::kernels::cpu
