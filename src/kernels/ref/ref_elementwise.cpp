#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/ref/ref.h"

namespace dsa::kernels::ref {

void rmsnorm(const float* x, const Vec& w, int n, int dim, float eps, float* y) {
  for (int i = 0; i < n; ++i) {
    const float* xi = x + size_t(i) * size_t(dim);
    double ss = 0;
    for (int c = 0; c < dim; ++c) ss += double(xi[c]) * xi[c];
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int c = 0; c < dim; ++c) y[size_t(i) * size_t(dim) + size_t(c)] = float(xi[c] * inv * w.at(c));
  }
}

void layernorm(const float* x, const Vec& w, const Vec& b, int n, int dim, float eps, float* y) {
  for (int i = 0; i < n; ++i) {
    const float* xi = x + size_t(i) * size_t(dim);
    double mean = 0, var = 0;
    for (int c = 0; c < dim; ++c) mean += xi[c];
    mean /= dim;
    for (int c = 0; c < dim; ++c) var += (xi[c] - mean) * (xi[c] - mean);
    const double inv = 1.0 / std::sqrt(var / dim + eps);
    for (int c = 0; c < dim; ++c)
      y[size_t(i) * size_t(dim) + size_t(c)] = float((xi[c] - mean) * inv * w.at(c) + b.at(c));
  }
}

void silu_mul(const float* gate, const float* up, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = float(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void rope(float* x, int dim, const float* cos, const float* sin, bool interleaved) {
  const int half = dim / 2;
  for (int i = 0; i < half; ++i) {
    float* a = interleaved ? &x[2 * i] : &x[i];
    float* b = interleaved ? &x[2 * i + 1] : &x[i + half];
    const double x0 = *a, x1 = *b;
    *a = float(x0 * cos[i] - x1 * sin[i]);
    *b = float(x0 * sin[i] + x1 * cos[i]);
  }
}

void hadamard128(float* x, int n_vec) {
  // Sylvester order H_2n = [[H, H], [H, -H]]: the in-place butterfly in natural order.
  for (int v = 0; v < n_vec; ++v) {
    double t[128];
    for (int i = 0; i < 128; ++i) t[i] = x[size_t(v) * 128 + size_t(i)];
    for (int h = 1; h < 128; h *= 2)
      for (int i = 0; i < 128; i += 2 * h)
        for (int j = i; j < i + h; ++j) {
          const double a = t[j], b = t[j + h];
          t[j] = a + b;
          t[j + h] = a - b;
        }
    const double s = 1.0 / std::sqrt(128.0);
    for (int i = 0; i < 128; ++i) x[size_t(v) * 128 + size_t(i)] = float(t[i] * s);
  }
}

float act_quant_scale(float amax, bool ue8m0) {
  amax = std::max(amax, 1e-4f);
  // DeepSeek's kernel multiplies by the f32 constant 1/448 (dividing differs in the
  // last bit for about half the scales).
  float s = amax * (1.0f / 448.0f);
  if (ue8m0) {
    // 2^ceil(log2(s)) exactly from the bits: round the exponent up unless s is a power of two.
    uint32_t u;
    std::memcpy(&u, &s, 4);
    const uint32_t exp = (u >> 23) & 0xff, man = u & 0x7fffff;
    uint32_t e2 = exp + (man != 0 ? 1u : 0u);
    u = e2 << 23;
    std::memcpy(&s, &u, 4);
  }
  return s;
}

void act_quant_fp8(const float* x, int n, int block, bool ue8m0, uint8_t* codes, float* scales) {
  for (int b0 = 0, bi = 0; b0 < n; b0 += block, ++bi) {
    const int b1 = std::min(n, b0 + block);
    float amax = 0;
    for (int i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float s = act_quant_scale(amax, ue8m0);
    scales[bi] = s;
    for (int i = b0; i < b1; ++i) {
      const float q = std::min(448.0f, std::max(-448.0f, x[i] / s));
      codes[i] = f32_to_fp8_e4m3(q);
    }
  }
}

void gather_rows(const float* x, size_t ldx, const int32_t* rows, int n, int width, float* y) {
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < width; ++c) y[size_t(i) * size_t(width) + size_t(c)] = x[size_t(rows[i]) * ldx + size_t(c)];
}

void moe_combine(const float* d, int width, const int32_t* pos, const float* w, int n, int k, double* acc) {
  for (int t = 0; t < n; ++t) {
    double* a = acc + size_t(t) * size_t(width);
    for (int c = 0; c < width; ++c) a[c] = 0.0;
    for (int j = 0; j < k; ++j) {
      const int32_t p = pos[size_t(t) * size_t(k) + size_t(j)];
      if (p < 0) continue;
      const double wt = w[size_t(t) * size_t(k) + size_t(j)];
      for (int c = 0; c < width; ++c) a[c] += wt * double(d[size_t(p) * size_t(width) + size_t(c)]);
    }
  }
}

}  // namespace dsa::kernels::ref
