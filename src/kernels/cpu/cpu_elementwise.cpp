#include <cmath>

#include "kernels/cpu/cpu.h"
#include "kernels/ref/ref.h"

namespace dsa::kernels::cpu {

void rmsnorm(const float* x, const Vec& w, int n, int dim, float eps, float* y) {
  for (int i = 0; i < n; ++i) {
    const float* xi = x + size_t(i) * size_t(dim);
    float ss = 0;
    for (int c = 0; c < dim; ++c) ss += xi[c] * xi[c];
    const float inv = 1.0f / std::sqrt(ss / float(dim) + eps);
    float* yi = y + size_t(i) * size_t(dim);
    for (int c = 0; c < dim; ++c) yi[c] = xi[c] * inv * w.at(c);
  }
}

void silu_mul(const float* gate, const float* up, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void hadamard128(float* x, int n_vec) {
  for (int v = 0; v < n_vec; ++v) {
    float* t = x + size_t(v) * 128;
    for (int h = 1; h < 128; h *= 2)
      for (int i = 0; i < 128; i += 2 * h)
        for (int j = i; j < i + h; ++j) {
          const float a = t[j], b = t[j + h];
          t[j] = a + b;
          t[j + h] = a - b;
        }
    const float s = 0.08838834764831845f;  // 128^-0.5
    for (int i = 0; i < 128; ++i) t[i] *= s;
  }
}

}  // namespace dsa::kernels::cpu
