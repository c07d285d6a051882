#include <immintrin.h>
#include <omp.h>

#include <algorithm>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/simd.h"
#include "kernels/ref/ref.h"

namespace dsa::kernels::cpu {

namespace {

// Rows (or elements) worth a fork: below this the work is a few microseconds and one
// thread finishes it before a second would have started.
constexpr int64_t kParallelMin = 1 << 15;

bool parallel_worth(int64_t elems) { return elems >= kParallelMin && omp_get_level() == 0 && omp_get_max_threads() > 1; }

// Eight weights of a norm vector as f32: f32 as they are, bf16 by a 16-bit shift (how the
// checkpoints store them; mmapped, never converted).
__attribute__((target("avx2,fma"))) inline __m256 load_weights8(const Vec& w, int c) {
  if (w.dtype == DType::F32) return _mm256_loadu_ps(reinterpret_cast<const float*>(w.data) + c);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.data + 2 * size_t(c)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx2,fma"))) void rmsnorm_row_avx2(const float* x, const Vec& w, int dim, float eps, float* y) {
  // Sum of squares in four 8-lane accumulators (the reference adds in index order; the
  // difference is a few ulp of the sum).
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int c = 0;
  for (; c + 32 <= dim; c += 32) {
    const __m256 a = _mm256_loadu_ps(x + c), b = _mm256_loadu_ps(x + c + 8);
    const __m256 d = _mm256_loadu_ps(x + c + 16), e = _mm256_loadu_ps(x + c + 24);
    s0 = _mm256_fmadd_ps(a, a, s0);
    s1 = _mm256_fmadd_ps(b, b, s1);
    s2 = _mm256_fmadd_ps(d, d, s2);
    s3 = _mm256_fmadd_ps(e, e, s3);
  }
  for (; c + 8 <= dim; c += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + c), _mm256_loadu_ps(x + c), s0);
  float ss = hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; c < dim; ++c) ss += x[c] * x[c];
  const float inv = 1.0f / std::sqrt(ss / float(dim) + eps);
  // y = (x * inv) * w, rounded in the reference's order.
  const __m256 vi = _mm256_set1_ps(inv);
  c = 0;
  for (; c + 8 <= dim; c += 8) _mm256_storeu_ps(y + c, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + c), vi), load_weights8(w, c)));
  for (; c < dim; ++c) y[c] = x[c] * inv * w.at(c);
}

// Four weights of a norm vector (f32 or bf16) as doubles.
__attribute__((target("avx2"))) inline __m256d load_weights4d(const Vec& w, int c) {
  if (w.dtype == DType::F32) return _mm256_cvtps_pd(_mm_loadu_ps(reinterpret_cast<const float*>(w.data) + c));
  const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.data + 2 * size_t(c)));
  return _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16)));
}

__attribute__((target("avx2"))) inline double hsum4d(__m256d s) {
  const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

// One row of layernorm (x and y may be the same row). The mean and the variance are summed in
// four double lanes, where the reference adds in index order: the two differ far below a
// float's ulp. Each output is then the reference's double expression, rounded op by op and
// once to float: this function's target has no FMA, so the compiler cannot fuse it.
__attribute__((target("avx2"))) void layernorm_row_avx2(const float* x, const Vec& w, const Vec& b, int dim, float eps, float* y) {
  __m256d s = _mm256_setzero_pd();
  int c = 0;
  for (; c + 4 <= dim; c += 4) s = _mm256_add_pd(s, _mm256_cvtps_pd(_mm_loadu_ps(x + c)));
  double mean = hsum4d(s);
  for (; c < dim; ++c) mean += x[c];
  mean /= dim;
  const __m256d m = _mm256_set1_pd(mean);
  __m256d v = _mm256_setzero_pd();
  for (c = 0; c + 4 <= dim; c += 4) {
    const __m256d d = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + c)), m);
    v = _mm256_add_pd(v, _mm256_mul_pd(d, d));
  }
  double var = hsum4d(v);
  for (; c < dim; ++c) var += (x[c] - mean) * (x[c] - mean);
  const double inv = 1.0 / std::sqrt(var / dim + eps);
  const __m256d vi = _mm256_set1_pd(inv);
  for (c = 0; c + 4 <= dim; c += 4) {
    const __m256d d = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + c)), m);
    const __m256d r = _mm256_add_pd(_mm256_mul_pd(_mm256_mul_pd(d, vi), load_weights4d(w, c)), load_weights4d(b, c));
    _mm_storeu_ps(y + c, _mm256_cvtpd_ps(r));
  }
  for (; c < dim; ++c) y[c] = float((x[c] - mean) * inv * w.at(c) + b.at(c));
}

__attribute__((target("avx2,fma"))) void silu_mul_avx2(const float* gate, const float* up, size_t b, size_t e, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  size_t i = b;
  for (; i + 8 <= e; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 sig = _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, g)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, sig), _mm256_loadu_ps(up + i)));
  }
  // The last few through the same vector formula (padded): an element's result never
  // depends on where the array ends, so a token's row is the same whatever rows follow it.
  if (i < e) {
    alignas(32) float g8[8] = {}, u8[8] = {}, o8[8];
    std::copy(gate + i, gate + e, g8);
    std::copy(up + i, up + e, u8);
    const __m256 g = _mm256_load_ps(g8);
    const __m256 sig = _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, g)));
    _mm256_store_ps(o8, _mm256_mul_ps(_mm256_div_ps(g, sig), _mm256_load_ps(u8)));
    std::copy(o8, o8 + (e - i), out + i);
  }
}

// RoPE on four pairs at a time in double, as the reference computes it: each product of two
// floats is exact in a double, so x0 c - x1 s rounds once (to double, then to float) whether
// the reference's compiler contracts it into an FMA or not: every value is the reference's.
__attribute__((target("avx2,fma"))) inline void rope4(const __m128 x0f, const __m128 x1f, const float* cos, const float* sin, __m128& y0,
                                                      __m128& y1) {
  const __m256d x0 = _mm256_cvtps_pd(x0f), x1 = _mm256_cvtps_pd(x1f);
  const __m256d c = _mm256_cvtps_pd(_mm_loadu_ps(cos)), s = _mm256_cvtps_pd(_mm_loadu_ps(sin));
  y0 = _mm256_cvtpd_ps(_mm256_fmsub_pd(x0, c, _mm256_mul_pd(x1, s)));
  y1 = _mm256_cvtpd_ps(_mm256_fmadd_pd(x0, s, _mm256_mul_pd(x1, c)));
}

__attribute__((target("avx2,fma"))) void rope_avx2(float* x, int dim, const float* cos, const float* sin, bool interleaved) {
  const int half = dim / 2;
  int i = 0;
  for (; i + 4 <= half; i += 4) {
    __m128 y0, y1;
    if (!interleaved) {
      rope4(_mm_loadu_ps(x + i), _mm_loadu_ps(x + half + i), cos + i, sin + i, y0, y1);
      _mm_storeu_ps(x + i, y0);
      _mm_storeu_ps(x + half + i, y1);
      continue;
    }
    // Pairs (x[2i], x[2i + 1]): the even and the odd elements of eight, and back.
    const __m128 a = _mm_loadu_ps(x + 2 * i), b = _mm_loadu_ps(x + 2 * i + 4);
    rope4(_mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)), _mm_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)), cos + i, sin + i, y0, y1);
    _mm_storeu_ps(x + 2 * i, _mm_unpacklo_ps(y0, y1));
    _mm_storeu_ps(x + 2 * i + 4, _mm_unpackhi_ps(y0, y1));
  }
  if (i == half) return;
  // The last pairs: interleaved ones are a shorter vector of their own; halves half apart
  // are not, so those go one by one, as the reference computes them.
  if (interleaved) return ref::rope(x + 2 * i, dim - 2 * i, cos + i, sin + i, true);
  for (; i < half; ++i) {
    const double x0 = x[i], x1 = x[i + half];
    x[i] = float(x0 * cos[i] - x1 * sin[i]);
    x[i + half] = float(x0 * sin[i] + x1 * cos[i]);
  }
}

// f32_to_fp8_e4m3 on eight values at once (|q| <= 448): the subnormal steps by rounding
// |q| * 512 to nearest even (the MXCSR default, as nearbyint), the normal range by rounding
// the 20 dropped mantissa bits to nearest even and rebiasing the exponent; the sign on top.
__attribute__((target("avx2,fma"))) inline void fp8_codes8(__m256 q, uint8_t* out) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256 a = _mm256_andnot_ps(sign_bit, q);
  const __m256i sub = _mm256_cvtps_epi32(_mm256_mul_ps(a, _mm256_set1_ps(512.0f)));
  const __m256i u = _mm256_castps_si256(a);
  const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFFF), _mm256_and_si256(_mm256_srli_epi32(u, 20), _mm256_set1_epi32(1))));
  const __m256i normal = _mm256_sub_epi32(_mm256_srli_epi32(rounded, 20), _mm256_set1_epi32(120 << 3));
  const __m256i is_sub = _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(0.015625f), _CMP_LT_OQ));
  __m256i code = _mm256_blendv_epi8(normal, sub, is_sub);
  code = _mm256_or_si256(code, _mm256_srli_epi32(_mm256_castps_si256(_mm256_and_ps(q, sign_bit)), 24));
  const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm_packus_epi16(w, w));
}

// One block of act_quant_fp8 (the reference's scale, then its codes eight at a time).
__attribute__((target("avx2,fma"))) void act_quant_block_avx2(const float* x, int len, bool ue8m0, uint8_t* codes, float* scale) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 m = _mm256_setzero_ps();
  int i = 0;
  // max(|x|, m): a NaN input is skipped, as std::max(amax, |x|) skips it.
  for (; i + 8 <= len; i += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask), m);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float amax = 0;
  for (float v : lanes) amax = std::max(amax, v);
  for (; i < len; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float s = ref::act_quant_scale(amax, ue8m0);
  *scale = s;
  const __m256 vs = _mm256_set1_ps(s), lo = _mm256_set1_ps(-448.0f), hi = _mm256_set1_ps(448.0f);
  i = 0;
  for (; i + 8 <= len; i += 8) fp8_codes8(_mm256_min_ps(_mm256_max_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), vs), lo), hi), codes + i);
  for (; i < len; ++i) codes[i] = f32_to_fp8_e4m3(std::min(448.0f, std::max(-448.0f, x[i] / s)));
}

}  // namespace

void rope(float* x, int dim, const float* cos, const float* sin, bool interleaved) {
  if (!use_avx2()) return ref::rope(x, dim, cos, sin, interleaved);
  rope_avx2(x, dim, cos, sin, interleaved);
}

void act_quant_fp8(const float* x, int n, int block, bool ue8m0, uint8_t* codes, float* scales) {
  if (!use_avx2()) return ref::act_quant_fp8(x, n, block, ue8m0, codes, scales);
  for (int b0 = 0, bi = 0; b0 < n; b0 += block, ++bi)
    act_quant_block_avx2(x + b0, std::min(block, n - b0), ue8m0, codes + b0, scales + bi);
}

void gather_rows(const float* x, size_t ldx, const int32_t* rows, int n, int width, float* y) {
  for (int i = 0; i < n; ++i) std::copy_n(x + size_t(rows[i]) * ldx, width, y + size_t(i) * size_t(width));
}

namespace {
// One token's combine, 16 columns at a time held in registers across the slots (the
// reference's order per column; each product exact in double, so the FMA rounds as its add).
__attribute__((target("avx2,fma"))) void combine_row_avx2(const float* d, int width, const int32_t* pos, const float* w, int k,
                                                         double* a) {
  int c = 0;
  for (; c + 16 <= width; c += 16) {
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    for (int j = 0; j < k; ++j) {
      if (pos[j] < 0) continue;
      const float* r = d + size_t(pos[j]) * size_t(width) + size_t(c);
      const __m256d wt = _mm256_set1_pd(double(w[j]));
      s0 = _mm256_fmadd_pd(wt, _mm256_cvtps_pd(_mm_loadu_ps(r)), s0);
      s1 = _mm256_fmadd_pd(wt, _mm256_cvtps_pd(_mm_loadu_ps(r + 4)), s1);
      s2 = _mm256_fmadd_pd(wt, _mm256_cvtps_pd(_mm_loadu_ps(r + 8)), s2);
      s3 = _mm256_fmadd_pd(wt, _mm256_cvtps_pd(_mm_loadu_ps(r + 12)), s3);
    }
    _mm256_storeu_pd(a + c, s0);
    _mm256_storeu_pd(a + c + 4, s1);
    _mm256_storeu_pd(a + c + 8, s2);
    _mm256_storeu_pd(a + c + 12, s3);
  }
  for (; c < width; ++c) {
    double s = 0.0;
    for (int j = 0; j < k; ++j)
      if (pos[j] >= 0) s += double(w[j]) * double(d[size_t(pos[j]) * size_t(width) + size_t(c)]);
    a[c] = s;
  }
}
}  // namespace

void moe_combine(const float* d, int width, const int32_t* pos, const float* w, int n, int k, double* acc) {
  if (!use_avx2()) return ref::moe_combine(d, width, pos, w, n, k, acc);
#pragma omp parallel for schedule(static) if (n > 1 && parallel_worth(int64_t(n) * k * width))
  for (int t = 0; t < n; ++t)
    combine_row_avx2(d, width, pos + size_t(t) * size_t(k), w + size_t(t) * size_t(k), k, acc + size_t(t) * size_t(width));
}

void embed(const Linear& table, const int32_t* ids, int n, float* y) {
  const DType dt = table.dtype;
  if (!use_avx2() || (dt != DType::BF16 && dt != DType::F16 && dt != DType::F32)) return ref::embed(table, ids, n, y);
  const size_t cols = size_t(table.cols), row_bytes = cols * dtype_size(dt);
  for (int i = 0; i < n; ++i) {
    DSA_CHECK(ids[i] >= 0 && ids[i] < table.rows, "token id out of range");
    const uint8_t* row = table.data + size_t(ids[i]) * row_bytes;
    float* yi = y + size_t(i) * cols;
    if (dt == DType::F32) std::memcpy(yi, row, row_bytes);
    else widen16(row, dt == DType::BF16, table.cols, yi);
  }
}

void rmsnorm(const float* x, const Vec& w, int n, int dim, float eps, float* y) {
  const bool avx = use_avx2() && (w.dtype == DType::F32 || w.dtype == DType::BF16);
  const bool wide = avx && use_avx512();
  auto row = [&](int i) {
    const float* xi = x + size_t(i) * size_t(dim);
    float* yi = y + size_t(i) * size_t(dim);
    if (wide) return avx512_kernels().rmsnorm_row(xi, w, dim, eps, yi);
    if (avx) return rmsnorm_row_avx2(xi, w, dim, eps, yi);
    ref::rmsnorm(xi, w, 1, dim, eps, yi);
  };
#pragma omp parallel for schedule(static) if (n > 1 && parallel_worth(int64_t(n) * dim))
  for (int i = 0; i < n; ++i) row(i);
}

void layernorm(const float* x, const Vec& w, const Vec& b, int n, int dim, float eps, float* y) {
  auto norm_vec = [](const Vec& v) { return v.dtype == DType::F32 || v.dtype == DType::BF16; };
  if (!use_avx2() || !norm_vec(w) || !norm_vec(b)) return ref::layernorm(x, w, b, n, dim, eps, y);
#pragma omp parallel for schedule(static) if (n > 1 && parallel_worth(int64_t(n) * dim))
  for (int i = 0; i < n; ++i) layernorm_row_avx2(x + size_t(i) * size_t(dim), w, b, dim, eps, y + size_t(i) * size_t(dim));
}

void silu_mul(const float* gate, const float* up, size_t n, float* out) {
  if (!use_avx2()) return ref::silu_mul(gate, up, n, out);
  // Both tiers give every element the same bits; the avx512 one 16 at a time.
  const auto part = use_avx512() ? avx512_kernels().silu_mul : &silu_mul_avx2;
  if (!parallel_worth(int64_t(n))) return part(gate, up, 0, n, out);
#pragma omp parallel
  {
    const size_t T = size_t(omp_get_num_threads()), t = size_t(omp_get_thread_num());
    part(gate, up, n / 16 * t / T * 16, t + 1 == T ? n : n / 16 * (t + 1) / T * 16, out);
  }
}

void hadamard128(float* x, int n_vec) {
  // The butterflies of one vector in the reference's order (identical results); vectors
  // split across the threads when there are enough of them (prefill: tokens x heads).
  auto one = [](float* t) {
    for (int h = 1; h < 128; h *= 2)
      for (int i = 0; i < 128; i += 2 * h)
        for (int j = i; j < i + h; ++j) {
          const float a = t[j], b = t[j + h];
          t[j] = a + b;
          t[j + h] = a - b;
        }
    const float s = 0.08838834764831845f;  // 128^-0.5
    for (int i = 0; i < 128; ++i) t[i] *= s;
  };
  const auto vec = use_avx512() ? avx512_kernels().hadamard128 : nullptr;
#pragma omp parallel for schedule(static) if (parallel_worth(int64_t(n_vec) * 128))
  for (int v = 0; v < n_vec; ++v) vec ? vec(x + size_t(v) * 128) : one(x + size_t(v) * 128);
}

}  // namespace dsa::kernels::cpu
