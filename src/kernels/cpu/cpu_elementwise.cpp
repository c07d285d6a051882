#include <immintrin.h>
#include <omp.h>

#include <algorithm>

#include <cmath>
#include <cstdint>

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

}  // namespace

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
