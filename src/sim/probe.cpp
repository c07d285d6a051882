#include "sim/probe.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DSA_SIM_X86 1
#endif

namespace dsa::sim {
namespace {

using Clock = std::chrono::steady_clock;

int resolve_threads(int threads) { return threads > 0 ? threads : std::max(1, omp_get_max_threads()); }

// Reads the buffer once, each thread a contiguous share. The loaded values are folded
// with XOR (one cheap op per load, no floating-point dependency chain) into a sink so
// the loads cannot be dropped; with AVX2 four 32-byte loads per step keep enough
// misses in flight that the memory system, not the core, sets the rate.
#ifdef DSA_SIM_X86
__attribute__((target("avx2"))) uint64_t read_share_avx2(const uint8_t* p, size_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 128 <= bytes; i += 128) {
    a0 = _mm256_xor_si256(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_xor_si256(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_xor_si256(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_xor_si256(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i a = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
  return uint64_t(_mm256_extract_epi64(a, 0) ^ _mm256_extract_epi64(a, 3));
}
#endif

uint64_t read_share_scalar(const uint8_t* p, size_t bytes) {
  const uint64_t* q = reinterpret_cast<const uint64_t*>(p);
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (size_t i = 0; i + 4 <= bytes / 8; i += 4) {
    a0 ^= q[i]; a1 ^= q[i + 1]; a2 ^= q[i + 2]; a3 ^= q[i + 3];
  }
  return a0 ^ a1 ^ a2 ^ a3;
}

uint64_t read_pass(const uint8_t* buf, size_t bytes, int threads, bool avx2) {
  uint64_t total = 0;
#pragma omp parallel num_threads(threads) reduction(^ : total)
  {
    const size_t t = size_t(omp_get_thread_num()), T = size_t(omp_get_num_threads());
    const size_t share = bytes / T / 128 * 128;
    const uint8_t* p = buf + t * share;
#ifdef DSA_SIM_X86
    total ^= avx2 ? read_share_avx2(p, share) : read_share_scalar(p, share);
#else
    (void)avx2;
    total ^= read_share_scalar(p, share);
#endif
  }
  return total;
}

#ifdef DSA_SIM_X86
__attribute__((target("avx2,fma"))) double fma_kernel_avx2(int64_t iters) {
  // 10 independent chains: enough to cover FMA latency (4-5 cycles) x 2 ports.
  __m256 a0 = _mm256_set1_ps(1.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0;
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = _mm256_fmadd_ps(a0, m, c); a1 = _mm256_fmadd_ps(a1, m, c);
    a2 = _mm256_fmadd_ps(a2, m, c); a3 = _mm256_fmadd_ps(a3, m, c);
    a4 = _mm256_fmadd_ps(a4, m, c); a5 = _mm256_fmadd_ps(a5, m, c);
    a6 = _mm256_fmadd_ps(a6, m, c); a7 = _mm256_fmadd_ps(a7, m, c);
    a8 = _mm256_fmadd_ps(a8, m, c); a9 = _mm256_fmadd_ps(a9, m, c);
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                           _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(_mm256_add_ps(a6, a7), _mm256_add_ps(a8, a9))));
  float out[8];
  _mm256_storeu_ps(out, s);
  return double(out[0]) + out[7];
}
constexpr double kAvx2FlopsPerIter = 10 * 8 * 2;
#endif

double fma_kernel_scalar(int64_t iters) {
  float a[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  const float m = 0.999999f, c = 1e-7f;
  for (int64_t i = 0; i < iters; ++i)
    for (float& x : a) x = x * m + c;
  return double(a[0]) + a[7];
}
constexpr double kScalarFlopsPerIter = 8 * 2;

volatile uint64_t g_sink = 0;

}  // namespace

double measure_read_bandwidth_gbps(int threads) {
  threads = resolve_threads(threads);
  bool avx2 = false;
#ifdef DSA_SIM_X86
  __builtin_cpu_init();
  avx2 = __builtin_cpu_supports("avx2");
#endif
  // 512 MiB: far beyond any LLC we expect, small enough for test machines.
  const size_t bytes = size_t(512) << 20;
  std::unique_ptr<uint8_t[]> owner(new uint8_t[bytes + 64]);
  uint8_t* buf = owner.get() + (64 - reinterpret_cast<uintptr_t>(owner.get()) % 64) % 64;  // 32-byte aligned loads
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t i = 0; i < bytes; i += 4096) std::memset(buf + i, int(i >> 12), 4096);  // first touch by the reading thread
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    g_sink = g_sink ^ read_pass(buf, bytes, threads, avx2);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return double(bytes / size_t(threads) / 128 * 128 * size_t(threads)) / best / 1e9;
}

double measure_peak_gflops(int threads) {
  threads = resolve_threads(threads);
  bool avx2 = false;
#ifdef DSA_SIM_X86
  __builtin_cpu_init();
  avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  const int64_t iters = avx2 ? 20'000'000 : 5'000'000;
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    double acc = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : acc)
    {
#ifdef DSA_SIM_X86
      if (avx2) acc += fma_kernel_avx2(iters);
      else acc += fma_kernel_scalar(iters);
#else
      acc += fma_kernel_scalar(iters);
#endif
    }
    g_sink = g_sink + uint64_t(acc > 0);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
#ifdef DSA_SIM_X86
  const double per_iter = avx2 ? kAvx2FlopsPerIter : kScalarFlopsPerIter;
#else
  const double per_iter = kScalarFlopsPerIter;
#endif
  return double(threads) * double(iters) * per_iter / best / 1e9;
}

namespace {

// The q-quantile of the seconds of `reps` calls of f (after one untimed warm-up call).
template <class F>
double quantile_seconds(int reps, double q, F&& f) {
  f();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[size_t(q * double(t.size() - 1) + 0.5)];
}
template <class F>
double median_seconds(int reps, F&& f) {
  return quantile_seconds(reps, 0.5, f);
}

void fill_floats(float* p, size_t n, uint64_t seed) {
  uint64_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = float(int64_t(x >> 40) % 2001 - 1000) / 1000.0f;
  }
}

}  // namespace

KernelRates measure_kernel_rates(int threads) {
  using namespace dsa::kernels;
  const int saved = omp_get_max_threads();
  if (threads > 0) omp_set_num_threads(threads);
  const Backend backend_before = backend();
  set_backend(Backend::Cpu);  // the optimized kernels, whatever DSA_KERNELS says
  KernelRates r;

  // Weight streaming: one-token GEMVs over matrices that come from DRAM as the decode weights
  // do. Each call reads a different part of a 192 MiB buffer, so that no part read again is
  // still in a last-level cache of up to 64 MiB (AMD's victim L3 keeps some lines of a
  // buffer just twice its size). The bytes are one repeated code that reads as an ordinary
  // number as e4m3 (1.25) and as bf16 (about 7e-4): the kernels' work does not depend on
  // the values.
  const size_t wbytes = size_t(192) << 20, region = size_t(64) << 20;
  std::vector<uint8_t> wbuf(wbytes);
  std::memset(wbuf.data(), 0x3A, wbytes);
  std::vector<float> x(8192), y(8192);
  fill_floats(x.data(), x.size(), 1);
  {
    Linear w;
    w.dtype = DType::BF16;
    w.rows = 8192;
    w.cols = 4096;
    size_t call = 0;
    const double s = median_seconds(41, [&] {
      w.data = wbuf.data() + (call++ % 3) * region;
      linear(w, x.data(), 1, y.data());
    });
    r.gemv_bf16_gbps = double(w.bytes()) / s / 1e9;
  }
  std::vector<float> scales(64 * 64, 1.0f);
  // fp8 GEMVs as decode runs them: one linear_multi over sixteen [512 x 2048] fp8 matrices
  // (a token's routed and shared experts' gate and up projections are such a call), 16 MiB
  // per call, rotating over twelve such groups.
  {
    const int jobs_n = 16, groups = 12;
    std::vector<Linear> ws(size_t(jobs_n) * groups);
    std::vector<float> ym(size_t(jobs_n) * 512);
    std::vector<LinearJob> jobs(ws.size());
    for (size_t j = 0; j < ws.size(); ++j) {
      ws[j].dtype = DType::F8_E4M3;
      ws[j].data = wbuf.data() + j * (size_t(1) << 20);
      ws[j].rows = 512;
      ws[j].cols = 2048;
      ws[j].scale = scales.data();
      jobs[j] = {&ws[j], x.data(), &ym[(j % size_t(jobs_n)) * 512]};
    }
    size_t call = 0;
    const double s = median_seconds(41, [&] { linear_multi(&jobs[(call++ % groups) * size_t(jobs_n)], jobs_n); });
    r.gemv_fp8_gbps = double(jobs_n) * double(ws[0].bytes()) / s / 1e9;
  }
  // Packed GEMMs on fp8 [1024 x 2048] weights (2 MiB each: compute-bound at these row
  // counts). 512 rows: one GEMM split across the threads (a dense prefill projection). 48
  // rows: eight experts' GEMMs in a parallel loop, each on one thread, as the engine's MoE
  // prefill runs them (kernels called inside a parallel region run single-threaded).
  {
    const int experts = 8;
    std::vector<Linear> ws(experts);
    for (int e = 0; e < experts; ++e) {
      ws[size_t(e)].dtype = DType::F8_E4M3;
      ws[size_t(e)].data = wbuf.data() + size_t(e) * (size_t(2) << 20);
      ws[size_t(e)].rows = 1024;
      ws[size_t(e)].cols = 2048;
      ws[size_t(e)].scale = scales.data();
    }
    const Linear& w = ws[0];
    std::vector<float> xs(size_t(kGemmLargeRows) * 2048), ys(size_t(std::max(kGemmLargeRows, experts * kGemmSmallRows)) * 1024);
    fill_floats(xs.data(), xs.size(), 2);
    const double s_large = median_seconds(7, [&] { linear(w, xs.data(), kGemmLargeRows, ys.data()); });
    r.gemm_large_gflops = 2.0 * kGemmLargeRows * w.rows * w.cols / s_large / 1e9;
    const double s_small = median_seconds(7, [&] {
#pragma omp parallel for schedule(dynamic, 1)
      for (int e = 0; e < experts; ++e)
        linear(ws[size_t(e)], xs.data() + size_t(e) * kGemmSmallRows * 2048, kGemmSmallRows,
               ys.data() + size_t(e) * kGemmSmallRows * 1024);
    });
    r.gemm_small_gflops = 2.0 * experts * kGemmSmallRows * w.rows * w.cols / s_small / 1e9;
  }
  // Lightning indexer scan: 16 heads over 16,384 cached fp8 keys (2 MiB), each call on a
  // different slice of the weight buffer: at depth the engine's keys come from DRAM, the
  // weights streamed since the previous token having pushed them out of the cache.
  {
    const int heads = 16, keys = 16384;
    const size_t slice = size_t(keys) * 128, slices = wbytes / slice;
    std::vector<float> wh(heads), ks(keys), out(keys);
    fill_floats(wh.data(), wh.size(), 3);
    fill_floats(ks.data(), ks.size(), 4);
    for (float& v : ks) v = 0.01f + std::abs(v);
    size_t call = 0;
    const double s = median_seconds(31, [&] {
      const uint8_t* k8 = wbuf.data() + (call++ % slices) * slice;
      indexer_scores(k8 + slice - 4096, wh.data(), heads, k8, ks.data(), keys, out.data());
    });
    r.indexer_gflops = 2.0 * heads * 128.0 * keys / s / 1e9;
    // Top-k over 16,384 distinct scores (the indexer's output at that depth).
    std::vector<float> sc(16384);
    fill_floats(sc.data(), sc.size(), 5);
    std::vector<int32_t> sel(2048);
    const double st = median_seconds(15, [&] { topk(sc.data(), int(sc.size()), 2048, sel.data()); });
    r.topk_keys_per_s = double(sc.size()) / st;
  }
  // Absorbed sparse decode: 16 heads over 2,048 latents selected in position order from a
  // 16,384-token fp8 cache (the engine's 784-byte layout), alternating between four such
  // caches (51 MiB in all) so each call gathers from DRAM, as a decode step at depth does.
  {
    const int heads = 16, L = 512, R = 64, n = 2048, ctx = 16384, copies = 4;
    MlaCacheView c;
    c.type = CacheType::FP8;
    c.kv_lora = L;
    c.rope = R;
    const size_t tb = c.token_bytes();
    std::vector<uint8_t> cache(tb * size_t(ctx) * copies);
    std::vector<float> lat(L), kr(R);
    c.data = cache.data();
    for (int t = 0; t < 64; ++t) {  // 64 distinct tokens, repeated: values do not change the work
      fill_floats(lat.data(), lat.size(), 10 + uint64_t(t));
      fill_floats(kr.data(), kr.size(), 90000 + uint64_t(t));
      mla_cache_write(c, t, lat.data(), kr.data());
    }
    for (size_t t = 64; t < size_t(ctx) * copies; ++t) std::memcpy(cache.data() + t * tb, cache.data() + (t % 64) * tb, tb);
    std::vector<float> ql(size_t(heads) * L), qr(size_t(heads) * R), o(size_t(heads) * L);
    fill_floats(ql.data(), ql.size(), 6);
    fill_floats(qr.data(), qr.size(), 7);
    // 2,048 of 16,384 positions, ascending (the top-k's order), spread by a fixed stride
    // with a small pseudo-random jitter.
    std::vector<int32_t> idx(n);
    uint64_t x = 12345;
    for (int j = 0; j < n; ++j) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      idx[size_t(j)] = j * (ctx / n) + int32_t((x >> 40) % uint64_t(ctx / n));
    }
    size_t call = 0;
    const double s = median_seconds(31, [&] {
      c.data = cache.data() + (call++ % copies) * tb * size_t(ctx);
      mla_sparse_decode(c, ql.data(), qr.data(), heads, idx.data(), n, 0.05f, o.data());
    });
    r.sparse_decode_gflops = 2.0 * heads * n * (2.0 * L + R) / s / 1e9;
  }
  // Prefill attention in the expanded (MHA) form: queries in parallel as the engine runs
  // them, each over 512 keys of 16 heads x (128 nope + 64 rope | 128 v).
  {
    const int heads = 16, nope = 128, R = 64, vd = 128, n = 512, queries = 32;
    std::vector<float> kv(size_t(n) * heads * (nope + vd)), kr(size_t(n) * R), q(size_t(queries) * heads * (nope + R)),
        o(size_t(queries) * heads * vd);
    fill_floats(kv.data(), kv.size(), 8);
    fill_floats(kr.data(), kr.size(), 9);
    fill_floats(q.data(), q.size(), 11);
    std::vector<int32_t> idx(n);
    for (int t = 0; t < n; ++t) idx[size_t(t)] = t;
    const double s = median_seconds(5, [&] {
#pragma omp parallel for schedule(dynamic, 1)
      for (int i = 0; i < queries; ++i)
        mha_sparse_prefill(&q[size_t(i) * heads * (nope + R)], kv.data(), kr.data(), heads, nope, R, vd, idx.data(), n, 0.07f,
                           &o[size_t(i) * heads * vd]);
    });
    r.sparse_prefill_gflops = 2.0 * queries * heads * n * double(nope + R + vd) / s / 1e9;
  }
  // One kernel call with almost no work, large enough to be split across the threads. The
  // fastest of 101: on a shared machine a fork or join that waits for a descheduled thread
  // costs a scheduler time slice (milliseconds), a property of the machine's load, not of
  // the call.
  {
    Linear w;
    w.dtype = DType::BF16;
    w.data = wbuf.data();
    w.rows = 256;
    w.cols = 64;
    const double s = quantile_seconds(101, 0.0, [&] { linear(w, x.data(), 1, y.data()); });
    r.call_overhead_us = s * 1e6;
  }
  set_backend(backend_before);
  if (threads > 0) omp_set_num_threads(saved);
  g_sink = g_sink + uint64_t(y[0] > 0);
  return r;
}

double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page) : 0.0;
}

}  // namespace dsa::sim
