// Backend dispatch: the optimized CPU kernels by default, the naive references on request
// (tests, and `DSA_KERNELS=ref` in the environment for debugging).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/kernels.h"
#include "kernels/ref/ref.h"

namespace dsa::kernels {
namespace {
Backend initial_backend() {
  const char* e = std::getenv("DSA_KERNELS");
  return (e && std::strcmp(e, "ref") == 0) ? Backend::Ref : Backend::Cpu;
}
Backend g_backend = initial_backend();
}  // namespace

void set_backend(Backend b) { g_backend = b; }
Backend backend() { return g_backend; }

void amx_probe_loop(int64_t iters) {
  DSA_CHECK(isa() == Isa::Amx, "the AMX probe needs the amx tier");
  cpu::amx_kernels().dot_loop(long(iters));
}

void reserve_scratch(int max_cols, int n_heads, int latent_dim, int kv_lora, int max_selected) {
  // Every thread of the team the kernels' own parallel regions use (same size, same pool).
#pragma omp parallel
  {
    cpu::reserve_gemv_scratch(max_cols);
    cpu::reserve_decode_scratch(n_heads, latent_dim, kv_lora, max_selected);
  }
}

namespace {
bool g_profile = false;
KernelStat g_stats[int(KernelId::kCount)];
// Calls made by the threads of a caller's parallel loop (one query or one MoE expert per
// thread in prefill, a RoPE or quantization per vector): their time summed over the threads.
// Each thread adds into a slot of its own, summed when the profile is read (outside any
// parallel region). Atomic sums shared by the threads made every such call wait for one
// cache line, tens of thousands of calls per prompt; threads past the slots fall back to them.
struct NestedStat {
  std::atomic<double> thread_seconds{0}, flops{0}, bytes{0};
  std::atomic<long> calls{0};
};
NestedStat g_nested_shared[int(KernelId::kCount)];
struct alignas(64) NestedSlot {
  double thread_seconds[int(KernelId::kCount)], flops[int(KernelId::kCount)], bytes[int(KernelId::kCount)];
  long calls[int(KernelId::kCount)];
};
constexpr int kNestedSlots = 256;
NestedSlot g_nested[kNestedSlots];
std::atomic<int> g_nested_used{0};

// The calling thread's slot, claimed on its first nested call; null past kNestedSlots.
NestedSlot* nested_slot() {
  thread_local NestedSlot* mine = nullptr;
  thread_local bool claimed = false;
  if (!claimed) {
    const int i = g_nested_used.fetch_add(1);
    mine = i < kNestedSlots ? &g_nested[i] : nullptr;
    claimed = true;
  }
  return mine;
}

// Per-weight profile: a fixed table (a decode step holds a few dozen distinct weight shapes),
// so recording allocates nothing; shapes past its end are not listed.
constexpr int kMaxWeightStats = 128;
WeightStat g_weights[kMaxWeightStats];
int g_n_weights = 0;

// Adds one call of a matrix product to its weight's row of the table.
void record_weight(KernelId kernel, const Linear& w, int jobs, double dt, double bytes, double flops) {
  const WeightStat call{kernel, w.rows, w.cols, jobs, w.dtype, dt, bytes, flops, 1};
  int i = 0;
  while (i < g_n_weights && !g_weights[i].same_row(call)) ++i;
  if (i < g_n_weights) g_weights[i].add(call);
  else if (g_n_weights < kMaxWeightStats) g_weights[g_n_weights++] = call;
}

// Times one kernel call when profiling is on; a matrix product also names its weight (the
// first of a multi-weight call, with the job count) for the per-weight table.
struct Timed {
  KernelId id;
  double flops, bytes;
  const Linear* weight;
  int jobs;
  std::chrono::steady_clock::time_point t0;
  Timed(KernelId k, double f, double b, const Linear* w = nullptr, int n_jobs = 1) : id(k), flops(f), bytes(b), weight(w), jobs(n_jobs) {
    if (g_profile) t0 = std::chrono::steady_clock::now();
  }
  ~Timed() {
    if (!g_profile) return;
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (omp_in_parallel()) {
      if (NestedSlot* slot = nested_slot()) {
        const int k = int(id);
        slot->thread_seconds[k] += dt;
        slot->flops[k] += flops;
        slot->bytes[k] += bytes;
        ++slot->calls[k];
        return;
      }
      NestedStat& ns = g_nested_shared[int(id)];
      ns.thread_seconds.fetch_add(dt, std::memory_order_relaxed);
      ns.flops.fetch_add(flops, std::memory_order_relaxed);
      ns.bytes.fetch_add(bytes, std::memory_order_relaxed);
      ns.calls.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    KernelStat& st = g_stats[int(id)];
    st.seconds += dt;
    st.flops += flops;
    st.bytes += bytes;
    ++st.calls;
    if (weight) record_weight(id, *weight, jobs, dt, bytes, flops);
  }
};
}  // namespace

const char* kernel_name(KernelId k) {
  static const char* kNames[] = {"linear", "linear_t", "indexer_scores", "topk", "sparse_decode", "other"};
  return kNames[int(k)];
}
void profile_enable(bool on) { g_profile = on; }
void profile_reset() {
  g_n_weights = 0;
  for (auto& st : g_stats) st = KernelStat{};
  for (auto& ns : g_nested_shared) {
    ns.thread_seconds = 0;
    ns.flops = 0;
    ns.bytes = 0;
    ns.calls = 0;
  }
  for (auto& slot : g_nested) slot = NestedSlot{};
}
KernelStat profile_stat(KernelId k) {
  KernelStat st = g_stats[int(k)];
  const NestedStat& ns = g_nested_shared[int(k)];
  st.thread_seconds = ns.thread_seconds.load();
  st.flops += ns.flops.load();
  st.bytes += ns.bytes.load();
  st.calls += ns.calls.load();
  const int used = std::min(g_nested_used.load(), kNestedSlots);
  for (int i = 0; i < used; ++i) {
    st.thread_seconds += g_nested[i].thread_seconds[int(k)];
    st.flops += g_nested[i].flops[int(k)];
    st.bytes += g_nested[i].bytes[int(k)];
    st.calls += g_nested[i].calls[int(k)];
  }
  return st;
}
std::vector<WeightStat> profile_weights() { return std::vector<WeightStat>(g_weights, g_weights + g_n_weights); }

#define DSA_DISPATCH(fn, ...) \
  (g_backend == Backend::Ref ? ref::fn(__VA_ARGS__) : cpu::fn(__VA_ARGS__))

void linear(const Linear& w, const float* x, int n, float* y, int row0, int nrows) {
  const double r = nrows < 0 ? w.rows - row0 : nrows;
  Timed t(KernelId::Linear, 2.0 * n * r * w.cols, double(w.bytes()) * r / w.rows, &w);
  DSA_DISPATCH(linear, w, x, n, y, row0, nrows);
}
void linear_decode(const Linear& w, const float* x, int n, float* y, int row0, int nrows) {
  const double r = nrows < 0 ? w.rows - row0 : nrows;
  Timed t(KernelId::Linear, 2.0 * n * r * w.cols, double(w.bytes()) * r / w.rows, &w);
  DSA_DISPATCH(linear_decode, w, x, n, y, row0, nrows);
}
void linear_t(const Linear& w, const float* x, int n, float* y, int row0, int nrows) {
  Timed t(KernelId::LinearT, 2.0 * n * nrows * w.cols, double(w.bytes()) * nrows / w.rows, &w);
  DSA_DISPATCH(linear_t, w, x, n, y, row0, nrows);
}
void linear(const Linear& w, const float* x, size_t ldx, int n, float* y, size_t ldy, int row0, int nrows) {
  const double r = nrows < 0 ? w.rows - row0 : nrows;
  DSA_CHECK(ldx >= size_t(w.cols) && ldy >= size_t(r), "linear: row strides narrower than the rows");
  Timed t(KernelId::Linear, 2.0 * n * r * w.cols, double(w.bytes()) * r / w.rows, &w);
  DSA_DISPATCH(linear, w, x, ldx, n, y, ldy, row0, nrows);
}
void linear_t(const Linear& w, const float* x, size_t ldx, int n, float* y, size_t ldy, int row0, int nrows) {
  DSA_CHECK(ldx >= size_t(nrows) && ldy >= size_t(w.cols), "linear_t: row strides narrower than the rows");
  Timed t(KernelId::LinearT, 2.0 * n * nrows * w.cols, double(w.bytes()) * nrows / w.rows, &w);
  DSA_DISPATCH(linear_t, w, x, ldx, n, y, ldy, row0, nrows);
}
void linear_multi(const LinearJob* jobs, int n_jobs) {
  if (n_jobs <= 0) return;
  double flops = 0, bytes = 0;
  for (int j = 0; j < n_jobs; ++j) {
    DSA_CHECK(jobs[j].row0 >= 0 && jobs[j].row0 + jobs[j].rows() <= jobs[j].w->rows, "linear_multi: rows outside the weight");
    flops += 2.0 * jobs[j].n * jobs[j].rows() * jobs[j].w->cols;
    bytes += double(jobs[j].w->bytes()) * jobs[j].rows() / jobs[j].w->rows;
  }
  Timed t(KernelId::Linear, flops, bytes, jobs[0].w, n_jobs);
  DSA_DISPATCH(linear_multi, jobs, n_jobs);
}
void linear_t_heads(const Linear& w, const float* x, int x_stride, int n_heads, int head_stride, int row0, int nrows, float* y,
                    int n_tok) {
  DSA_CHECK(n_tok >= 1, "linear_t_heads: no tokens");
  Timed t(KernelId::LinearT, 2.0 * n_tok * n_heads * nrows * w.cols, double(w.bytes()) * n_heads * nrows / w.rows, &w);
  DSA_DISPATCH(linear_t_heads, w, x, x_stride, n_heads, head_stride, row0, nrows, y, n_tok);
}
void linear_heads(const Linear& w, const float* x, int n_heads, int head_stride, int row0, int nrows, float* y, int y_stride,
                  int n_tok) {
  DSA_CHECK(n_tok >= 1, "linear_heads: no tokens");
  Timed t(KernelId::Linear, 2.0 * n_tok * n_heads * nrows * w.cols, double(w.bytes()) * n_heads * nrows / w.rows, &w);
  DSA_DISPATCH(linear_heads, w, x, n_heads, head_stride, row0, nrows, y, y_stride, n_tok);
}
void embed(const Linear& table, const int32_t* ids, int n, float* y) {
  Timed t(KernelId::Other, 0, double(table.bytes()) / table.rows * n);
  DSA_DISPATCH(embed, table, ids, n, y);
}
void rmsnorm(const float* x, const Vec& w, int n, int dim, float eps, float* y) {
  Timed t(KernelId::Other, 4.0 * n * dim, 8.0 * n * dim);
  DSA_DISPATCH(rmsnorm, x, w, n, dim, eps, y);
}
void layernorm(const float* x, const Vec& w, const Vec& b, int n, int dim, float eps, float* y) {
  Timed t(KernelId::Other, 7.0 * n * dim, 8.0 * n * dim);
  DSA_DISPATCH(layernorm, x, w, b, n, dim, eps, y);
}
void silu_mul(const float* gate, const float* up, size_t n, float* out) {
  Timed t(KernelId::Other, 4.0 * double(n), 12.0 * double(n));
  DSA_DISPATCH(silu_mul, gate, up, n, out);
}
void rope(float* x, int dim, const float* cos, const float* sin, bool interleaved) {
  Timed t(KernelId::Other, 3.0 * dim, 12.0 * dim);
  DSA_DISPATCH(rope, x, dim, cos, sin, interleaved);
}
void hadamard128(float* x, int n_vec) {
  Timed t(KernelId::Other, 7.0 * 128 * n_vec, 8.0 * 128 * n_vec);
  DSA_DISPATCH(hadamard128, x, n_vec);
}
void act_quant_fp8(const float* x, int n, int block, bool ue8m0, uint8_t* codes, float* scales) {
  Timed t(KernelId::Other, 2.0 * n, 5.0 * n);
  DSA_DISPATCH(act_quant_fp8, x, n, block, ue8m0, codes, scales);
}
void gather_rows(const float* x, size_t ldx, const int32_t* rows, int n, int width, float* y) {
  Timed t(KernelId::Other, 0, 8.0 * n * width);
  DSA_DISPATCH(gather_rows, x, ldx, rows, n, width, y);
}
void moe_combine(const float* d, int width, const int32_t* pos, const float* w, int n, int k, double* acc) {
  Timed t(KernelId::Other, 2.0 * n * k * width, (4.0 * k + 8.0) * n * width);
  DSA_DISPATCH(moe_combine, d, width, pos, w, n, k, acc);
}
void indexer_scores(const uint8_t* q8, const float* w, int n_heads, const IndexKeyView& keys, int n_keys, float* out) {
  Timed t(KernelId::IndexerScores, 2.0 * n_heads * 128.0 * n_keys, 132.0 * n_keys);
  DSA_DISPATCH(indexer_scores, q8, w, n_heads, keys, n_keys, out);
}
void topk(const float* scores, int n, int k, int32_t* out) {
  Timed t(KernelId::Topk, 0, 4.0 * n);
  DSA_DISPATCH(topk, scores, n, k, out);
}
void mla_cache_write(const MlaCacheView& c, int64_t t, const float* latent, const float* k_rope) {
  Timed timed(KernelId::Other, 0, double(c.token_bytes()));
  DSA_DISPATCH(mla_cache_write, c, t, latent, k_rope);
}
void mla_cache_read(const MlaCacheView& c, int64_t t, float* latent, float* k_rope) { DSA_DISPATCH(mla_cache_read, c, t, latent, k_rope); }
void mla_sparse_decode(const MlaCacheView& c, const float* q_lat, const float* q_rope, int n_heads,
                       const int32_t* idx, int n_idx, float scale, float* o_lat) {
  Timed t(KernelId::SparseDecode, 2.0 * n_heads * n_idx * (2.0 * c.kv_lora + c.rope), double(c.token_bytes()) * n_idx);
  DSA_DISPATCH(mla_sparse_decode, c, q_lat, q_rope, n_heads, idx, n_idx, scale, o_lat);
}

}  // namespace dsa::kernels
