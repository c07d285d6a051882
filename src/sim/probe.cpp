#include "sim/probe.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/kernels.h"
#include "sim/cost.h"

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
  // 10 independent chains: enough to cover FMA latency (4-5 cycles) x 2 ports. Each starts
  // from its own value: chains that start equal stay equal, and the compiler then computes
  // one of them (a latency-bound loop reported as ten times the work).
  __m256 a0 = _mm256_set1_ps(1.0f), a1 = _mm256_set1_ps(1.1f), a2 = _mm256_set1_ps(1.2f), a3 = _mm256_set1_ps(1.3f),
         a4 = _mm256_set1_ps(1.4f), a5 = _mm256_set1_ps(1.5f), a6 = _mm256_set1_ps(1.6f), a7 = _mm256_set1_ps(1.7f),
         a8 = _mm256_set1_ps(1.8f), a9 = _mm256_set1_ps(1.9f);
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

// The same in 512-bit registers (the avx512 tier's peak): 12 chains, as two FMA ports with
// up to 6 cycles of latency need. GCC 12's headers trip -Wmaybe-uninitialized on AVX-512
// intrinsics (see avx512.cpp).
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// The body of a 512-bit peak probe: twelve chains from distinct values (see the avx2 probe),
// each advanced by STEP(a) per iteration, then summed into the returned value. A macro, not a
// template: the intrinsics inside need the target of the function they expand in.
#define DSA_PROBE_TWELVE_CHAINS(STEP)                                                                                      \
  __m512 a0 = _mm512_set1_ps(1.0f), a1 = _mm512_set1_ps(1.1f), a2 = _mm512_set1_ps(1.2f), a3 = _mm512_set1_ps(1.3f),        \
         a4 = _mm512_set1_ps(1.4f), a5 = _mm512_set1_ps(1.5f), a6 = _mm512_set1_ps(1.6f), a7 = _mm512_set1_ps(1.7f),        \
         a8 = _mm512_set1_ps(1.8f), a9 = _mm512_set1_ps(1.9f), a10 = _mm512_set1_ps(2.0f), a11 = _mm512_set1_ps(2.1f);     \
  for (int64_t i = 0; i < iters; ++i) {                                                                                     \
    a0 = STEP(a0); a1 = STEP(a1); a2 = STEP(a2); a3 = STEP(a3); a4 = STEP(a4); a5 = STEP(a5);                               \
    a6 = STEP(a6); a7 = STEP(a7); a8 = STEP(a8); a9 = STEP(a9); a10 = STEP(a10); a11 = STEP(a11);                           \
  }                                                                                                                         \
  const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),                \
                                               _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))),               \
                                 _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));                            \
  float out[16];                                                                                                            \
  _mm512_storeu_ps(out, s);                                                                                                 \
  return double(out[0]) + out[15]

__attribute__((target("avx512f"))) double fma_kernel_avx512(int64_t iters) {
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
#define DSA_FMA_STEP(a) _mm512_fmadd_ps(a, m, c)
  DSA_PROBE_TWELVE_CHAINS(DSA_FMA_STEP);
#undef DSA_FMA_STEP
}
constexpr double kAvx512FlopsPerIter = 12 * 16 * 2;

// AVX512-BF16's dot product (vdpbf16ps: 32 bf16 products summed pairwise into 16 f32 lanes,
// 64 FLOPs): the peak of the kernels that run on it (the indexer scan, bf16_dot()).
__attribute__((target("avx512f,avx512bf16"))) double bf16_dot_kernel(int64_t iters) {
  const __m512i xi = _mm512_set1_epi32(0x3F803F80), yi = _mm512_set1_epi32(0x33D633D6);  // bf16 pairs of 1.0 and 1e-7
  __m512bh x, y;
  std::memcpy(&x, &xi, sizeof x);
  std::memcpy(&y, &yi, sizeof y);
#define DSA_DOT_STEP(a) _mm512_dpbf16_ps(a, x, y)
  DSA_PROBE_TWELVE_CHAINS(DSA_DOT_STEP);
#undef DSA_DOT_STEP
}
#undef DSA_PROBE_TWELVE_CHAINS
#pragma GCC diagnostic pop
constexpr double kBf16DotFlopsPerIter = 12 * 32 * 2;
#endif

double fma_kernel_scalar(int64_t iters) {
  float a[8] = {1.0f, 1.1f, 1.2f, 1.3f, 1.4f, 1.5f, 1.6f, 1.7f};  // distinct, as above
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

namespace {
// GFLOP/s of `kernel(iters)` (per_iter FLOPs an iteration) on every thread at once, best of three.
template <class K>
double peak_of(int threads, int64_t iters, double per_iter, K kernel) {
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    double acc = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : acc)
    acc += kernel(iters);
    g_sink = g_sink + uint64_t(acc > 0);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return double(threads) * double(iters) * per_iter / best / 1e9;
}
}  // namespace

double measure_peak_gflops(int threads) {
  threads = resolve_threads(threads);
  // The FMA width of the kernels' tier: what the GEMM part of prefill is measured against.
  const kernels::Isa tier = kernels::isa();
#ifdef DSA_SIM_X86
  if (tier == kernels::Isa::Avx512) return peak_of(threads, 20'000'000, kAvx512FlopsPerIter, fma_kernel_avx512);
  if (tier == kernels::Isa::Avx2) return peak_of(threads, 20'000'000, kAvx2FlopsPerIter, fma_kernel_avx2);
#endif
  return peak_of(threads, 5'000'000, kScalarFlopsPerIter, fma_kernel_scalar);
}

double measure_bf16_dot_peak_gflops(int threads) {
#ifdef DSA_SIM_X86
  if (kernels::bf16_dot_supported()) return peak_of(resolve_threads(threads), 20'000'000, kBf16DotFlopsPerIter, bf16_dot_kernel);
#else
  (void)threads;
#endif
  return 0.0;
}

double measure_amx_peak_gflops(int threads) {
  if (kernels::isa() != kernels::Isa::Amx) return 0.0;
  constexpr double kFlopsPerIter = 4 * 16 * 16 * 32 * 2;  // four tile products
  return peak_of(resolve_threads(threads), 2'000'000, kFlopsPerIter, [](int64_t iters) {
    kernels::amx_probe_loop(iters);
    return 1.0;
  });
}

namespace {

void fill_floats(float* p, size_t n, uint64_t seed) {
  uint64_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = float(int64_t(x >> 40) % 2001 - 1000) / 1000.0f;
  }
}


// One engine-kernel probe: a call, how many timed calls it makes per round, the work of one
// call in the unit its rate is reported in (bytes, FLOPs or keys), and the mean seconds per
// call of each round. The call's buffers live in the lambda's captures.
struct Probe {
  Probe(std::function<void()> c, int n, double w) : call(std::move(c)), calls_per_round(n), work(w) {}
  std::function<void()> call;
  int calls_per_round;
  double work;
  std::vector<double> round_means;
  double fastest = 1e30;
};

// Runs every probe for one round each, `rounds` times over (one untimed warm-up call per
// probe and round). Interleaving spreads each probe over the whole few seconds instead of
// one short burst: on a shared machine the rate moves from second to second, and a probe
// that sees only one second would carry that second's speed into every prediction.
void run_rounds(std::vector<Probe*>& probes, int rounds) {
  for (int r = 0; r < rounds; ++r)
    for (Probe* p : probes) {
      p->call();
      double sum = 0;
      for (int i = 0; i < p->calls_per_round; ++i) {
        const auto t0 = Clock::now();
        p->call();
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        sum += s;
        p->fastest = std::min(p->fastest, s);
      }
      p->round_means.push_back(sum / p->calls_per_round);
    }
}

// Work per second as `dsa bench` reports its own rates: the mean of each round (every stall
// inside a round counts, as inside one benchmark repeat), then the median of the rounds (one
// slow or fast round does not move it).
double rate(const Probe& p) {
  std::vector<double> m = p.round_means;
  std::sort(m.begin(), m.end());
  const size_t n = m.size();
  return p.work / (n % 2 ? m[n / 2] : 0.5 * (m[n / 2 - 1] + m[n / 2]));
}

std::vector<float> floats(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  fill_floats(v.data(), n, seed);
  return v;
}

// The bytes the weight-streaming probes read: each call reads a different part of 192 MiB,
// so that no part read again is still in a last-level cache of up to 64 MiB (AMD's victim
// L3 keeps some lines of a buffer just twice its size). The bytes are one repeated code that
// reads as an ordinary number as e4m3 (1.25) and as bf16 (about 7e-4): the kernels' work
// does not depend on the values.
struct WeightBuffer {
  static constexpr size_t kBytes = size_t(192) << 20, kRegion = size_t(64) << 20;
  std::vector<uint8_t> bytes = std::vector<uint8_t>(kBytes, 0x3A);
  std::vector<float> scales = std::vector<float>(64 * 64, 1.0f);  // fp8 block scales of any matrix here
};
using Weights = std::shared_ptr<const WeightBuffer>;

// Weight streaming: GEMVs over a 64 MiB bf16 matrix that comes from DRAM as the decode
// weights do. One token: a decode token's product, bandwidth-bound (the rate is in bytes).
// More tokens per call (a batched decode step's lm_head): the decode-role bf16 tile,
// compute-bound (the rate is in FLOPs).
Probe gemv_bf16_probe(const Weights& wb, int cols, int tokens, int calls_per_round) {
  struct State {
    Linear w;
    std::vector<float> x, y;
    size_t call = 0;
  };
  auto st = std::make_shared<State>();
  st->w.dtype = DType::BF16;
  st->w.rows = int(WeightBuffer::kRegion / 2 / size_t(cols));
  st->w.cols = cols;
  st->x = floats(size_t(tokens) * size_t(cols), 1);
  st->y.resize(size_t(tokens) * size_t(st->w.rows));
  const double work = tokens == 1 ? double(st->w.bytes()) : 2.0 * tokens * double(st->w.rows) * double(cols);
  return {[wb, st, tokens] {
            st->w.data = wb->bytes.data() + (st->call++ % 3) * WeightBuffer::kRegion;
            kernels::linear_decode(st->w, st->x.data(), tokens, st->y.data());
          },
          calls_per_round, work};
}

// fp8 GEMVs as decode runs a MoE layer's experts: one linear_multi over sixteen [512 x 2048]
// matrices (gate and up projections: 2 KB rows), then one over eight [2048 x 512] (down
// projections: 512-byte rows, which stream about a sixth slower), the two-to-one byte mix of
// the expert weights; 24 MiB per call, rotating over eight such sets so every call reads
// from DRAM. With `tokens` > 1 per job (a batched decode step) the products are
// compute-bound, and the rate is in FLOPs instead of bytes.
Probe expert_gemv_probe(const Weights& wb, int tokens, int calls_per_round) {
  constexpr int kUp = 16, kDown = 8, kSets = 8, kPerSet = kUp + kDown;
  struct State {
    std::vector<Linear> w = std::vector<Linear>(size_t(kPerSet) * kSets);
    std::vector<kernels::LinearJob> jobs = std::vector<kernels::LinearJob>(size_t(kPerSet) * kSets);
    std::vector<float> x, y;
    size_t call = 0;
  };
  auto st = std::make_shared<State>();
  st->x = floats(size_t(tokens) * 2048, tokens == 1 ? 1 : 3);
  st->y.resize(size_t(tokens) * (size_t(kUp) * 512 + size_t(kDown) * 2048));
  for (size_t j = 0; j < st->w.size(); ++j) {
    const size_t k = j % kPerSet;
    const bool down = k >= size_t(kUp);
    Linear& w = st->w[j];
    w.dtype = DType::F8_E4M3;
    w.data = wb->bytes.data() + j * (size_t(1) << 20);
    w.rows = down ? 2048 : 512;
    w.cols = down ? 512 : 2048;
    w.scale = wb->scales.data();
    const size_t y_at = down ? size_t(kUp) * 512 + (k - size_t(kUp)) * 2048 : k * 512;
    st->jobs[j] = {&w, st->x.data(), st->y.data() + y_at * size_t(tokens), tokens};
  }
  const double work = tokens == 1 ? double(kPerSet) * double(st->w[0].bytes()) : 2.0 * tokens * double(kPerSet) * 512.0 * 2048.0;
  return {[wb, st] {
            // One expert layer's products: the next of the sets, up projections then down.
            kernels::LinearJob* set = &st->jobs[(st->call++ % kSets) * kPerSet];
            kernels::linear_multi(set, kUp);
            kernels::linear_multi(set + kUp, kDown);
          },
          calls_per_round, work};
}

// One packed GEMM of kGemmLargeRows rows on an fp8 [1024 x 2048] weight (2 MiB), split
// across the threads: a dense prefill projection (compute-bound at this row count).
Probe gemm_probe(const Weights& wb) {
  struct State {
    Linear w;
    std::vector<float> x = floats(size_t(kGemmLargeRows) * 2048, 2), y = std::vector<float>(size_t(kGemmLargeRows) * 1024);
  };
  auto st = std::make_shared<State>();
  st->w.dtype = DType::F8_E4M3;
  st->w.data = wb->bytes.data();
  st->w.rows = 1024;
  st->w.cols = 2048;
  st->w.scale = wb->scales.data();
  return {[wb, st] { kernels::linear(st->w, st->x.data(), kGemmLargeRows, st->y.data()); }, 2, 2.0 * kGemmLargeRows * 1024.0 * 2048.0};
}

// kv_b's per-head products in a prompt's absorbed attention (model/mla.cpp,
// prefill_attention): 16 heads, each its [128 x 512] fp8 slice of the k half through
// linear_t and of the v half through linear, one call per head over kGemmLargeRows tokens
// whose rows interleave the heads as the engine's workspace holds them ([tokens][heads][...]).
// Small products over strided rows run well below the large GEMM's rate (on Zen 5, two
// threads: 330-350 against 430-440 GFLOP/s for one [2048 x 512] product of the same FLOPs).
Probe heads_probe(const Weights& wb) {
  static constexpr int H = 16, nope = 128, rope = 64, vd = 128, L = 512, T = kGemmLargeRows;
  struct State {
    Linear w;
    std::vector<float> q = floats(size_t(T) * H * (nope + rope), 3), o_lat = floats(size_t(T) * H * L, 4),
                       q_lat = std::vector<float>(size_t(T) * H * L), attn = std::vector<float>(size_t(T) * H * vd);
  };
  auto st = std::make_shared<State>();
  st->w.dtype = DType::F8_E4M3;
  st->w.data = wb->bytes.data();
  st->w.rows = H * (nope + vd);
  st->w.cols = L;
  st->w.scale = wb->scales.data();
  return {[wb, st] {
            State& s = *st;
            const size_t qk = nope + rope;
            for (int h = 0; h < H; ++h)
              kernels::linear_t(s.w, &s.q[size_t(h) * qk], H * qk, T, &s.q_lat[size_t(h) * L], size_t(H) * L, h * (nope + vd), nope);
            for (int h = 0; h < H; ++h)
              kernels::linear(s.w, &s.o_lat[size_t(h) * L], size_t(H) * L, T, &s.attn[size_t(h) * vd], size_t(H) * vd, h * (nope + vd) + nope,
                              vd);
          },
          2, 2.0 * 2.0 * T * H * 128.0 * L};
}

// A prefill chunk's routed experts as the engine's MoE runs them (model/moe.cpp,
// experts_prefill): eight experts of kGemmSmallRows rows each in a parallel loop, one per
// thread at a time, each its gate and up GEMMs ([512 x 2048] fp8), silu * up and its down
// GEMM ([2048 x 512]) on its own thread (kernels called inside a parallel region run
// single-threaded). 24 MiB of weights per call, eight such sets in turn, so that every call
// reads them from DRAM as a layer's experts do.
Probe expert_gemm_probe(const Weights& wb) {
  static constexpr int kExperts = 8, kSets = 8, M = kGemmSmallRows;
  struct State {
    std::vector<Linear> w = std::vector<Linear>(size_t(kExperts) * 3 * kSets);
    std::vector<float> x = floats(size_t(kExperts) * M * 2048, 2), g = std::vector<float>(size_t(kExperts) * M * 512),
                       u = std::vector<float>(size_t(kExperts) * M * 512), d = std::vector<float>(size_t(kExperts) * M * 2048);
    size_t call = 0;
  };
  auto st = std::make_shared<State>();
  for (size_t i = 0; i < st->w.size(); ++i) {
    Linear& w = st->w[i];
    const bool down = i % 3 == 2;
    w.dtype = DType::F8_E4M3;
    w.data = wb->bytes.data() + i * (size_t(1) << 20);
    w.rows = down ? 2048 : 512;
    w.cols = down ? 512 : 2048;
    w.scale = wb->scales.data();
  }
  return {[wb, st] {
            const Linear* set = &st->w[(st->call++ % kSets) * kExperts * 3];
#pragma omp parallel for schedule(dynamic, 1)
            for (int e = 0; e < kExperts; ++e) {
              const Linear* ex = set + size_t(e) * 3;
              const size_t r = size_t(e) * M;
              float* g = &st->g[r * 512];
              float* u = &st->u[r * 512];
              kernels::linear(ex[0], &st->x[r * 2048], M, g);
              kernels::linear(ex[1], &st->x[r * 2048], M, u);
              kernels::silu_mul(g, u, size_t(M) * 512, g);
              kernels::linear(ex[2], g, M, &st->d[r * 2048]);
            }
          },
          2, 2.0 * kExperts * M * 3.0 * 512.0 * 2048.0};
}

// Lightning indexer scan: 16 heads over 16,384 cached fp8 keys (2 MiB), each call on a
// different slice of the weight buffer: at depth the engine's keys come from DRAM, the
// weights streamed since the previous token having pushed them out of the cache.
Probe indexer_probe(const Weights& wb) {
  constexpr int kHeads = 16, kKeys = 16384;
  constexpr size_t kSlice = size_t(kKeys) * 128, kSlices = WeightBuffer::kBytes / kSlice;
  struct State {
    std::vector<float> w = floats(kHeads, 3), k_scale = floats(kKeys, 4), out = std::vector<float>(kKeys);
    size_t call = 0;
  };
  auto st = std::make_shared<State>();
  for (float& v : st->k_scale) v = 0.01f + std::abs(v);
  return {[wb, st] {
            const uint8_t* k8 = wb->bytes.data() + (st->call++ % kSlices) * kSlice;
            kernels::IndexKeyView keys;
            keys.k8 = k8;
            keys.k_scale = st->k_scale.data();
            kernels::indexer_scores(k8 + kSlice - 4096, st->w.data(), kHeads, keys, kKeys, st->out.data());
          },
          6, 2.0 * kHeads * 128.0 * kKeys};
}

// Top-k of 2,048 among 16,384 distinct scores (the indexer's output at that depth).
Probe topk_probe() {
  auto scores = std::make_shared<std::vector<float>>(floats(16384, 5));
  auto sel = std::make_shared<std::vector<int32_t>>(2048);
  return {[scores, sel] { kernels::topk(scores->data(), int(scores->size()), 2048, sel->data()); }, 4, double(scores->size())};
}

// An fp8 latent cache (the engine's layout) of `tokens` rows: 64 distinct tokens, repeated
// (the values do not change the work).
struct LatentCache {
  static constexpr int kLatent = 512, kRope = 64;
  MlaCacheView view;
  std::vector<uint8_t> bytes;
  explicit LatentCache(size_t tokens) {
    view.type = CacheType::FP8;
    view.kv_lora = kLatent;
    view.rope = kRope;
    const size_t tb = view.token_bytes();
    bytes.resize(tb * std::max<size_t>(tokens, 64));
    view.data = bytes.data();
    std::vector<float> lat(kLatent), kr(kRope);
    for (int t = 0; t < 64; ++t) {
      fill_floats(lat.data(), lat.size(), 10 + uint64_t(t));
      fill_floats(kr.data(), kr.size(), 90000 + uint64_t(t));
      kernels::mla_cache_write(view, t, lat.data(), kr.data());
    }
    for (size_t t = 64; t < tokens; ++t) std::memcpy(bytes.data() + t * tb, bytes.data() + (t % 64) * tb, tb);
  }
};

// Absorbed sparse decode: 16 heads over 2,048 latents selected in position order from a
// 16,384-token fp8 cache, alternating between four such caches (51 MiB in all) so each call
// gathers from DRAM, as a decode step at depth does.
Probe sparse_decode_probe() {
  constexpr int kHeads = 16, kSelected = 2048, kContext = 16384, kCopies = 4, L = LatentCache::kLatent, R = LatentCache::kRope;
  struct State {
    LatentCache cache{size_t(kContext) * kCopies};
    std::vector<float> q_lat = floats(size_t(kHeads) * L, 6), q_rope = floats(size_t(kHeads) * R, 7), out = std::vector<float>(size_t(kHeads) * L);
    std::vector<int32_t> idx = std::vector<int32_t>(kSelected);
    size_t call = 0;
  };
  auto st = std::make_shared<State>();
  // 2,048 of 16,384 positions, ascending (the top-k's order), spread by a fixed stride with a
  // small pseudo-random jitter.
  uint64_t s = 12345;
  for (int j = 0; j < kSelected; ++j) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    st->idx[size_t(j)] = j * (kContext / kSelected) + int32_t((s >> 40) % uint64_t(kContext / kSelected));
  }
  return {[st] {
            MlaCacheView c = st->cache.view;
            c.data = st->cache.bytes.data() + (st->call++ % kCopies) * c.token_bytes() * size_t(kContext);
            kernels::mla_sparse_decode(c, st->q_lat.data(), st->q_rope.data(), kHeads, st->idx.data(), kSelected, 0.05f, st->out.data());
          },
          6, 2.0 * kHeads * kSelected * (2.0 * L + R)};
}

// Prefill attention as the engine runs it (model/mla.cpp, prefill_attention): the layer's
// cache dequantized once into an f32 view of 1,024 tokens, then 32 queries in a parallel
// loop, each through mla_sparse_decode over 512 selected keys, 16 heads (the absorbed form
// at every prompt length). The view stays in the caches, as the engine's does for a chunk.
Probe prefill_attention_probe() {
  static constexpr int kHeads = 16, kContext = 1024, kKeys = 512, kQueries = 32, L = LatentCache::kLatent, R = LatentCache::kRope;
  struct State {
    std::vector<float> lat = floats(size_t(kContext) * (L + R), 8);
    std::vector<float> q_lat = floats(size_t(kQueries) * kHeads * L, 9), q_rope = floats(size_t(kQueries) * kHeads * R, 11);
    std::vector<float> out = std::vector<float>(size_t(kQueries) * kHeads * L);
    std::vector<int32_t> idx = std::vector<int32_t>(kKeys);
    MlaCacheView view;
  };
  auto st = std::make_shared<State>();
  st->view.type = CacheType::F32;
  st->view.kv_lora = L;
  st->view.rope = R;
  st->view.data = reinterpret_cast<uint8_t*>(st->lat.data());
  for (int j = 0; j < kKeys; ++j) st->idx[size_t(j)] = 2 * j + (j % 2);  // ascending, every other key
  return {[st] {
#pragma omp parallel for schedule(dynamic, 1)
            for (int i = 0; i < kQueries; ++i)
              kernels::mla_sparse_decode(st->view, &st->q_lat[size_t(i) * kHeads * L], &st->q_rope[size_t(i) * kHeads * R], kHeads,
                                         st->idx.data(), kKeys, 0.05f, &st->out[size_t(i) * kHeads * L]);
          },
          1, 2.0 * kQueries * kHeads * kKeys * (2.0 * L + R)};
}

// The operator table's bytes for the element-wise work of elementwise_probe: one MoE layer's
// share of a kEltTokens-token prefill chunk of the benchmark model.
double elementwise_plan_bytes() {
  const SimModel mini = load_model("v32-mini");
  double bytes = 0;
  for (const Op& op : op_plan(mini, Step{Phase::Prefill, 1, kEltTokens, 0}, Layout{}, Options{}))
    if (op.name == "layer.norms" || op.name == "attn.rope" || op.name == "indexer.quant" || op.name == "moe.act" ||
        op.name == "attn.cache_write" || op.name == "moe.gather_tokens" || op.name == "moe.sum_outputs")
      bytes += op.bytes / op.count;
  return bytes;
}

// Element-wise work of one MoE layer with an indexer, called as the engine's forward pass
// calls it for a chunk of kEltTokens prompt tokens with the benchmark model's shapes (hidden
// 2048, 16 heads, latent 512, rope 64, indexer 16 x 128, 6 + 1 experts of 512): RMSNorms,
// per-vector RoPE, the indexer's Hadamard rotation and fp8 quantization, the experts' input
// gather (one expert per thread, 64 experts), silu * up and weighted combine, and the fp8
// cache write. Its rate is expressed in the operator table's own
// bytes for that work, so that the plan charges the same kernels at the speed they ran here.
Probe elementwise_probe() {
  constexpr int T = kEltTokens, Hd = 2048, Hq = 16, QL = 512, KL = 512, RR = 64, IH = 16, MI = 512, EX = 7, K = 6, kExperts = 64;
  struct State {
    std::vector<float> x = floats(size_t(T) * Hd, 21), y = std::vector<float>(size_t(T) * Hd), q = floats(size_t(T) * Hq * 192, 22);
    std::vector<float> k_rope = floats(size_t(T) * RR, 23), iq = std::vector<float>(size_t(T) * IH * 128), ik = std::vector<float>(size_t(T) * 128);
    std::vector<float> g = floats(size_t(T) * EX * MI, 24), u = floats(size_t(T) * EX * MI, 25);
    std::vector<float> cos = std::vector<float>(RR / 2), sin = std::vector<float>(RR / 2);
    std::vector<float> iscale = std::vector<float>(size_t(T) * IH), kscale = std::vector<float>(T);
    std::vector<uint8_t> iq8 = std::vector<uint8_t>(size_t(T) * IH * 128), ik8 = std::vector<uint8_t>(size_t(T) * 128);
    std::vector<uint8_t> norm_bf16 = std::vector<uint8_t>(size_t(Hd) * 2);
    std::vector<float> ln_w = std::vector<float>(128, 1.0f), ln_b = std::vector<float>(128, 0.0f);
    LatentCache cache{size_t(T)};
    // Token t's slot j went to expert (7t + j) % 64: its rows in expert order, and back.
    std::vector<int32_t> tok = std::vector<int32_t>(size_t(T) * K), pos = std::vector<int32_t>(size_t(T) * K);
    std::vector<int32_t> first = std::vector<int32_t>(kExperts + 1);
    std::vector<float> xg = std::vector<float>(size_t(T) * K * Hd), d = floats(size_t(T) * K * Hd, 26), wt = floats(size_t(T) * K, 27);
    std::vector<double> acc = std::vector<double>(size_t(T) * Hd);
  };
  auto st = std::make_shared<State>();
  for (int i = 0; i < RR / 2; ++i) {
    st->cos[size_t(i)] = std::cos(0.1f * float(i));
    st->sin[size_t(i)] = std::sin(0.1f * float(i));
  }
  {
    int g = 0;
    for (int e = 0; e < kExperts; ++e) {
      st->first[size_t(e)] = g;
      for (int r = 0; r < T * K; ++r)
        if ((7 * (r / K) + r % K) % kExperts == e) {
          st->tok[size_t(g)] = r / K;
          st->pos[size_t(r)] = g++;
        }
    }
    st->first[kExperts] = g;
  }
  for (int i = 0; i < Hd; ++i) {  // bf16 norm weights (1.0), as the checkpoints store them
    st->norm_bf16[size_t(2 * i)] = 0x80;
    st->norm_bf16[size_t(2 * i + 1)] = 0x3F;
  }
  return {[st] {
            using namespace kernels;
            State& e = *st;
            const Vec w{DType::BF16, e.norm_bf16.data(), Hd};
            const Vec lw{DType::F32, reinterpret_cast<const uint8_t*>(e.ln_w.data()), 128};
            const Vec lb{DType::F32, reinterpret_cast<const uint8_t*>(e.ln_b.data()), 128};
            rmsnorm(e.x.data(), w, T, Hd, 1e-6f, e.y.data());  // input norm
            rmsnorm(e.y.data(), w, T, QL, 1e-6f, e.y.data());  // q latent norm
            rmsnorm(e.x.data(), w, T, KL, 1e-6f, e.x.data());  // kv latent norm
            for (int i = 0; i < T; ++i) {
              for (int h = 0; h < Hq; ++h) rope(&e.q[(size_t(i) * Hq + size_t(h)) * 192 + 128], RR, e.cos.data(), e.sin.data(), true);
              rope(&e.k_rope[size_t(i) * RR], RR, e.cos.data(), e.sin.data(), true);
            }
            for (int i = 0; i < T; ++i)
              for (int h = 0; h < IH; ++h) rope(&e.iq[(size_t(i) * IH + size_t(h)) * 128], RR, e.cos.data(), e.sin.data(), false);
            hadamard128(e.iq.data(), T * IH);
            for (int r = 0; r < T * IH; ++r) act_quant_fp8(&e.iq[size_t(r) * 128], 128, 128, true, &e.iq8[size_t(r) * 128], &e.iscale[size_t(r)]);
            layernorm(e.ik.data(), lw, lb, T, 128, 1e-6f, e.ik.data());
            for (int i = 0; i < T; ++i) rope(&e.ik[size_t(i) * 128], RR, e.cos.data(), e.sin.data(), false);
            hadamard128(e.ik.data(), T);
            for (int i = 0; i < T; ++i) act_quant_fp8(&e.ik[size_t(i) * 128], 128, 128, true, &e.ik8[size_t(i) * 128], &e.kscale[size_t(i)]);
            for (int i = 0; i < T; ++i) mla_cache_write(e.cache.view, i, &e.x[size_t(i) * Hd], &e.k_rope[size_t(i) * RR]);
#pragma omp parallel for schedule(dynamic, 1)
            for (int x = 0; x < kExperts; ++x) {
              const int g0 = e.first[size_t(x)], cnt = e.first[size_t(x) + 1] - g0;
              gather_rows(e.y.data(), Hd, &e.tok[size_t(g0)], cnt, Hd, &e.xg[size_t(g0) * Hd]);
            }
            silu_mul(e.g.data(), e.u.data(), e.g.size(), e.g.data());  // in place, as the experts run it
            moe_combine(e.d.data(), Hd, e.pos.data(), e.wt.data(), T, K, e.acc.data());
            rmsnorm(e.x.data(), w, T, Hd, 1e-6f, e.y.data());           // post-attention norm
          },
          2, elementwise_plan_bytes()};
}

// One kernel call with almost no work, large enough to be split across the threads. Its
// fastest call of all rounds counts: on a shared machine a fork or join that waits for a
// descheduled thread costs a scheduler time slice (milliseconds), a property of the
// machine's load, not of the call.
Probe call_probe(const Weights& wb) {
  struct State {
    Linear w;
    std::vector<float> x = floats(64, 1), y = std::vector<float>(256);
  };
  auto st = std::make_shared<State>();
  st->w.dtype = DType::BF16;
  st->w.data = wb->bytes.data();
  st->w.rows = 256;
  st->w.cols = 64;
  return {[wb, st] { kernels::linear_decode(st->w, st->x.data(), 1, st->y.data()); }, 20, 1.0};
}

}  // namespace

KernelRates measure_kernel_rates(int threads, int gemv_bf16_cols) {
  const int saved = omp_get_max_threads();
  if (threads > 0) omp_set_num_threads(threads);
  const Backend backend_before = kernels::backend();
  kernels::set_backend(Backend::Cpu);  // the optimized kernels, whatever DSA_KERNELS says
  KernelRates r;
  r.gemv_bf16_cols = std::clamp(gemv_bf16_cols, 256, 65536);
  const Weights wb = std::make_shared<WeightBuffer>();
  Probe gemv_bf16 = gemv_bf16_probe(wb, r.gemv_bf16_cols, 1, 8), gemv_bf16_tokens = gemv_bf16_probe(wb, r.gemv_bf16_cols, kGemvTokens, 2),
        gemv_bf16_many = gemv_bf16_probe(wb, r.gemv_bf16_cols, kGemvTokensMany, 1), gemv_fp8 = expert_gemv_probe(wb, 1, 6),
        gemv_tokens = expert_gemv_probe(wb, kGemvTokens, 2), gemv_many = expert_gemv_probe(wb, kGemvTokensMany, 1), gemm_large = gemm_probe(wb),
        gemm_heads = heads_probe(wb), gemm_small = expert_gemm_probe(wb), indexer = indexer_probe(wb), top = topk_probe(), sparse_decode = sparse_decode_probe(),
        prefill_attention = prefill_attention_probe(), elementwise = elementwise_probe(), call = call_probe(wb);
  std::vector<Probe*> probes = {&gemv_bf16,  &gemv_bf16_tokens, &gemv_bf16_many,    &gemv_fp8,    &gemv_tokens, &gemv_many, &gemm_large,
                                &gemm_heads, &gemm_small, &indexer,          &top,               &sparse_decode, &prefill_attention, &elementwise, &call};
  run_rounds(probes, 15);
  r.gemv_bf16_gbps = rate(gemv_bf16) / 1e9;
  r.gemv_fp8_gbps = rate(gemv_fp8) / 1e9;
  r.gemv_fp8_tokens_gflops = rate(gemv_tokens) / 1e9;
  r.gemv_bf16_tokens_gflops = rate(gemv_bf16_tokens) / 1e9;
  r.gemv_fp8_many_gflops = rate(gemv_many) / 1e9;
  r.gemv_bf16_many_gflops = rate(gemv_bf16_many) / 1e9;
  r.gemm_large_gflops = rate(gemm_large) / 1e9;
  r.gemm_small_gflops = rate(gemm_small) / 1e9;
  r.gemm_heads_gflops = rate(gemm_heads) / 1e9;
  r.indexer_gflops = rate(indexer) / 1e9;
  r.topk_keys_per_s = rate(top);
  r.sparse_decode_gflops = rate(sparse_decode) / 1e9;
  r.prefill_attention_gflops = rate(prefill_attention) / 1e9;
  r.elementwise_gbps = rate(elementwise) / 1e9;
  r.call_overhead_us = call.fastest * 1e6;
  kernels::set_backend(backend_before);
  if (threads > 0) omp_set_num_threads(saved);
  return r;
}

}  // namespace dsa::sim
