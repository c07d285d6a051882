#include "sim/probe.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

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

double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page) : 0.0;
}

}  // namespace dsa::sim
