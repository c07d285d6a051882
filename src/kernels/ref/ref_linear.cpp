#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/ref/ref.h"

namespace dsa::kernels::ref {

float weight_at(const Linear& w, int r, int c) {
  const size_t i = size_t(r) * size_t(w.cols) + size_t(c);
  switch (w.dtype) {
    case DType::F32: { float v; std::memcpy(&v, w.data + 4 * i, 4); return v; }
    case DType::BF16: { uint16_t h; std::memcpy(&h, w.data + 2 * i, 2); return bf16_to_f32(h); }
    case DType::F16: { uint16_t h; std::memcpy(&h, w.data + 2 * i, 2); return f16_to_f32(h); }
    case DType::F8_E4M3:
      return fp8_e4m3_to_f32(w.data[i]) * w.scale[size_t(r / w.block_rows) * size_t(w.scale_cols()) + size_t(c / w.block_cols)];
    default: DSA_CHECK(false, "unsupported weight dtype");
  }
  return 0;
}

void linear(const Linear& w, const float* x, size_t ldx, int n, float* y, size_t ldy, int row0, int nrows) {
  if (nrows < 0) nrows = w.rows - row0;
  for (int i = 0; i < n; ++i)
    for (int r = 0; r < nrows; ++r) {
      double acc = 0;
      for (int c = 0; c < w.cols; ++c) acc += double(weight_at(w, row0 + r, c)) * x[size_t(i) * ldx + size_t(c)];
      y[size_t(i) * ldy + size_t(r)] = float(acc);
    }
}
void linear(const Linear& w, const float* x, int n, float* y, int row0, int nrows) {
  if (nrows < 0) nrows = w.rows - row0;
  linear(w, x, size_t(w.cols), n, y, size_t(std::max(nrows, 0)), row0, nrows);
}

void linear_t(const Linear& w, const float* x, size_t ldx, int n, float* y, size_t ldy, int row0, int nrows) {
  std::vector<double> acc(static_cast<size_t>(w.cols));
  for (int i = 0; i < n; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int r = 0; r < nrows; ++r) {
      const double xv = x[size_t(i) * ldx + size_t(r)];
      for (int c = 0; c < w.cols; ++c) acc[size_t(c)] += xv * weight_at(w, row0 + r, c);
    }
    for (int c = 0; c < w.cols; ++c) y[size_t(i) * ldy + size_t(c)] = float(acc[size_t(c)]);
  }
}
void linear_t(const Linear& w, const float* x, int n, float* y, int row0, int nrows) {
  linear_t(w, x, size_t(nrows), n, y, size_t(w.cols), row0, nrows);
}

// The naive product is batch-invariant in any role: one f64 sum per output.
void linear_decode(const Linear& w, const float* x, int n, float* y, int row0, int nrows) { linear(w, x, n, y, row0, nrows); }

void linear_multi(const LinearJob* jobs, int n_jobs) {
  for (int j = 0; j < n_jobs; ++j) linear(*jobs[j].w, jobs[j].x, jobs[j].n, jobs[j].y, jobs[j].row0, jobs[j].rows());
}

void linear_t_heads(const Linear& w, const float* x, int x_stride, int n_heads, int head_stride, int row0, int nrows, float* y,
                    int n_tok) {
  for (int t = 0; t < n_tok; ++t)
    for (int h = 0; h < n_heads; ++h)
      linear_t(w, x + (size_t(t) * size_t(n_heads) + size_t(h)) * size_t(x_stride), 1,
               y + (size_t(t) * size_t(n_heads) + size_t(h)) * size_t(w.cols), h * head_stride + row0, nrows);
}

void linear_heads(const Linear& w, const float* x, int n_heads, int head_stride, int row0, int nrows, float* y, int y_stride,
                  int n_tok) {
  for (int t = 0; t < n_tok; ++t)
    for (int h = 0; h < n_heads; ++h)
      linear(w, x + (size_t(t) * size_t(n_heads) + size_t(h)) * size_t(w.cols), 1,
             y + (size_t(t) * size_t(n_heads) + size_t(h)) * size_t(y_stride), h * head_stride + row0, nrows);
}

void embed(const Linear& table, const int32_t* ids, int n, float* y) {
  for (int i = 0; i < n; ++i) {
    DSA_CHECK(ids[i] >= 0 && ids[i] < table.rows, "token id out of range");
    for (int c = 0; c < table.cols; ++c) y[size_t(i) * size_t(table.cols) + size_t(c)] = weight_at(table, ids[i], c);
  }
}

}  // namespace dsa::kernels::ref
