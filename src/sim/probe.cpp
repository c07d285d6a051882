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
__attribute__((target("avx512f"))) double fma_kernel_avx512(int64_t iters) {
  // Distinct starting values, as in the avx2 probe.
  __m512 a0 = _mm512_set1_ps(1.0f), a1 = _mm512_set1_ps(1.1f), a2 = _mm512_set1_ps(1.2f), a3 = _mm512_set1_ps(1.3f),
         a4 = _mm512_set1_ps(1.4f), a5 = _mm512_set1_ps(1.5f), a6 = _mm512_set1_ps(1.6f), a7 = _mm512_set1_ps(1.7f),
         a8 = _mm512_set1_ps(1.8f), a9 = _mm512_set1_ps(1.9f), a10 = _mm512_set1_ps(2.0f), a11 = _mm512_set1_ps(2.1f);
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = _mm512_fmadd_ps(a0, m, c); a1 = _mm512_fmadd_ps(a1, m, c);
    a2 = _mm512_fmadd_ps(a2, m, c); a3 = _mm512_fmadd_ps(a3, m, c);
    a4 = _mm512_fmadd_ps(a4, m, c); a5 = _mm512_fmadd_ps(a5, m, c);
    a6 = _mm512_fmadd_ps(a6, m, c); a7 = _mm512_fmadd_ps(a7, m, c);
    a8 = _mm512_fmadd_ps(a8, m, c); a9 = _mm512_fmadd_ps(a9, m, c);
    a10 = _mm512_fmadd_ps(a10, m, c); a11 = _mm512_fmadd_ps(a11, m, c);
  }
  const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                               _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))),
                                 _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
  float out[16];
  _mm512_storeu_ps(out, s);
  return double(out[0]) + out[15];
}
#pragma GCC diagnostic pop
constexpr double kAvx512FlopsPerIter = 12 * 16 * 2;
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

double measure_peak_gflops(int threads) {
  threads = resolve_threads(threads);
  // The FMA width of the kernels' tier: what the GEMM part of prefill is measured against.
  const kernels::Isa tier = kernels::isa();
  const int64_t iters = tier == kernels::Isa::Generic ? 5'000'000 : 20'000'000;
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    double acc = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : acc)
    {
#ifdef DSA_SIM_X86
      if (tier == kernels::Isa::Avx512) acc += fma_kernel_avx512(iters);
      else if (tier == kernels::Isa::Avx2) acc += fma_kernel_avx2(iters);
      else acc += fma_kernel_scalar(iters);
#else
      acc += fma_kernel_scalar(iters);
#endif
    }
    g_sink = g_sink + uint64_t(acc > 0);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
#ifdef DSA_SIM_X86
  const double per_iter = tier == kernels::Isa::Avx512 ? kAvx512FlopsPerIter : tier == kernels::Isa::Avx2 ? kAvx2FlopsPerIter : kScalarFlopsPerIter;
#else
  const double per_iter = kScalarFlopsPerIter;
#endif
  return double(threads) * double(iters) * per_iter / best / 1e9;
}

namespace {

void fill_floats(float* p, size_t n, uint64_t seed) {
  uint64_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = float(int64_t(x >> 40) % 2001 - 1000) / 1000.0f;
  }
}

}  // namespace

namespace {

// One engine-kernel probe: a call, how many timed calls it makes per round, and the mean
// seconds per call of each round.
struct Probe {
  std::function<void()> call;
  int calls_per_round;
  std::vector<double> round_means;
  double fastest = 1e30;
};

// Runs every probe for one round each, `rounds` times over (one untimed warm-up call per
// probe and round). Interleaving spreads each probe over the whole few seconds instead of
// one short burst: on a shared machine the rate moves from second to second, and a probe
// that sees only one second would carry that second's speed into every prediction.
void run_rounds(std::vector<Probe>& probes, int rounds) {
  for (int r = 0; r < rounds; ++r)
    for (Probe& p : probes) {
      p.call();
      double sum = 0;
      for (int i = 0; i < p.calls_per_round; ++i) {
        const auto t0 = Clock::now();
        p.call();
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        sum += s;
        p.fastest = std::min(p.fastest, s);
      }
      p.round_means.push_back(sum / p.calls_per_round);
    }
}

// Seconds per call as `dsa bench` reports its own rates: the mean of each round (every
// stall inside a round counts, as inside one benchmark repeat), then the median of the
// rounds (one slow or fast round does not move it).
double median_of_round_means(const Probe& p) {
  std::vector<double> m = p.round_means;
  std::sort(m.begin(), m.end());
  const size_t n = m.size();
  return n % 2 ? m[n / 2] : 0.5 * (m[n / 2 - 1] + m[n / 2]);
}

}  // namespace

KernelRates measure_kernel_rates(int threads, int gemv_bf16_cols) {
  using namespace dsa::kernels;
  const int saved = omp_get_max_threads();
  if (threads > 0) omp_set_num_threads(threads);
  const Backend backend_before = backend();
  set_backend(Backend::Cpu);  // the optimized kernels, whatever DSA_KERNELS says
  KernelRates r;
  std::vector<Probe> probes;

  // Weight streaming: one-token GEMVs over matrices that come from DRAM as the decode weights
  // do. Each call reads a different part of a 192 MiB buffer, so that no part read again is
  // still in a last-level cache of up to 64 MiB (AMD's victim L3 keeps some lines of a
  // buffer just twice its size). The bytes are one repeated code that reads as an ordinary
  // number as e4m3 (1.25) and as bf16 (about 7e-4): the kernels' work does not depend on
  // the values.
  const size_t wbytes = size_t(192) << 20, region = size_t(64) << 20;
  std::vector<uint8_t> wbuf(wbytes);
  std::memset(wbuf.data(), 0x3A, wbytes);
  const int bf16_cols = std::clamp(gemv_bf16_cols, 256, 65536);
  r.gemv_bf16_cols = bf16_cols;
  std::vector<float> x(size_t(std::max(8192, bf16_cols))), y(size_t(std::max<size_t>(8192, region / 2 / size_t(bf16_cols))));
  fill_floats(x.data(), x.size(), 1);
  Linear gemv_bf16;
  gemv_bf16.dtype = DType::BF16;
  gemv_bf16.rows = int(region / 2 / size_t(bf16_cols));
  gemv_bf16.cols = bf16_cols;
  size_t gemv_bf16_call = 0;
  probes.push_back({[&] {
                      gemv_bf16.data = wbuf.data() + (gemv_bf16_call++ % 3) * region;
                      linear_decode(gemv_bf16, x.data(), 1, y.data());  // a decode token's product
                    },
                    8, {}});
  const size_t p_gemv_bf16 = probes.size() - 1;

  // fp8 GEMVs as decode runs a MoE layer's experts: one linear_multi over sixteen
  // [512 x 2048] matrices (gate and up projections: 2 KB rows), then one over eight
  // [2048 x 512] (down projections: 512-byte rows, which stream about a sixth slower), the
  // two-to-one byte mix of the expert weights; 24 MiB per call, rotating over eight such
  // sets so every call reads from DRAM.
  std::vector<float> scales(64 * 64, 1.0f);
  const int fp8_up = 16, fp8_down = 8, fp8_sets = 8;
  const size_t fp8_per_set = size_t(fp8_up + fp8_down);
  std::vector<Linear> fp8_ws(fp8_per_set * fp8_sets);
  std::vector<float> fp8_y(size_t(fp8_up) * 512 + size_t(fp8_down) * 2048);
  std::vector<LinearJob> fp8_calls(fp8_ws.size());
  for (size_t j = 0; j < fp8_ws.size(); ++j) {
    const bool down = j % fp8_per_set >= size_t(fp8_up);
    const size_t k = j % fp8_per_set;
    fp8_ws[j].dtype = DType::F8_E4M3;
    fp8_ws[j].data = wbuf.data() + j * (size_t(1) << 20);
    fp8_ws[j].rows = down ? 2048 : 512;
    fp8_ws[j].cols = down ? 512 : 2048;
    fp8_ws[j].scale = scales.data();
    fp8_calls[j] = {&fp8_ws[j], x.data(), &fp8_y[down ? size_t(fp8_up) * 512 + (k - size_t(fp8_up)) * 2048 : k * 512]};
  }
  // One expert layer's products: the next of the sets of calls, up projections then down.
  auto expert_layer = [&](std::vector<LinearJob>& calls, size_t& next) {
    LinearJob* set = &calls[(next++ % fp8_sets) * fp8_per_set];
    linear_multi(set, fp8_up);
    linear_multi(set + fp8_up, fp8_down);
  };
  size_t gemv_fp8_call = 0;
  probes.push_back({[&] { expert_layer(fp8_calls, gemv_fp8_call); }, 6, {}});
  const size_t p_gemv_fp8 = probes.size() - 1;
  // The same products for kGemvTokens tokens per job (a batched decode step): compute-bound,
  // so with the one-token probe it gives the decode-role kernels' cost per weight and token.
  std::vector<float> xt(size_t(kGemvTokens) * 2048), yt(size_t(kGemvTokens) * fp8_y.size());
  fill_floats(xt.data(), xt.size(), 3);
  std::vector<LinearJob> fp8_token_calls(fp8_calls);
  for (size_t j = 0; j < fp8_token_calls.size(); ++j) {
    fp8_token_calls[j].x = xt.data();
    fp8_token_calls[j].y = yt.data() + size_t(fp8_calls[j].y - fp8_y.data()) * kGemvTokens;
    fp8_token_calls[j].n = kGemvTokens;
  }
  size_t gemv_tokens_call = 0;
  probes.push_back({[&] { expert_layer(fp8_token_calls, gemv_tokens_call); }, 2, {}});
  const size_t p_gemv_tokens = probes.size() - 1;

  // Packed GEMMs on fp8 [1024 x 2048] weights (2 MiB each: compute-bound at these row
  // counts). 512 rows: one GEMM split across the threads (a dense prefill projection). 48
  // rows: eight experts' GEMMs in a parallel loop, each on one thread, as the engine's MoE
  // prefill runs them (kernels called inside a parallel region run single-threaded).
  const int experts = 8;
  std::vector<Linear> gemm_ws(experts);
  for (int e = 0; e < experts; ++e) {
    gemm_ws[size_t(e)].dtype = DType::F8_E4M3;
    gemm_ws[size_t(e)].data = wbuf.data() + size_t(e) * (size_t(2) << 20);
    gemm_ws[size_t(e)].rows = 1024;
    gemm_ws[size_t(e)].cols = 2048;
    gemm_ws[size_t(e)].scale = scales.data();
  }
  std::vector<float> xs(size_t(kGemmLargeRows) * 2048), ys(size_t(std::max(kGemmLargeRows, experts * kGemmSmallRows)) * 1024);
  fill_floats(xs.data(), xs.size(), 2);
  probes.push_back({[&] { linear(gemm_ws[0], xs.data(), kGemmLargeRows, ys.data()); }, 2, {}});
  const size_t p_gemm_large = probes.size() - 1;
  probes.push_back({[&] {
#pragma omp parallel for schedule(dynamic, 1)
                      for (int e = 0; e < experts; ++e)
                        linear(gemm_ws[size_t(e)], xs.data() + size_t(e) * kGemmSmallRows * 2048, kGemmSmallRows,
                               ys.data() + size_t(e) * kGemmSmallRows * 1024);
                    },
                    2, {}});
  const size_t p_gemm_small = probes.size() - 1;

  // Lightning indexer scan: 16 heads over 16,384 cached fp8 keys (2 MiB), each call on a
  // different slice of the weight buffer: at depth the engine's keys come from DRAM, the
  // weights streamed since the previous token having pushed them out of the cache.
  const int ix_heads = 16, ix_keys = 16384;
  const size_t ix_slice = size_t(ix_keys) * 128, ix_slices = wbytes / ix_slice;
  std::vector<float> ix_w(ix_heads), ix_ks(ix_keys), ix_out(ix_keys);
  fill_floats(ix_w.data(), ix_w.size(), 3);
  fill_floats(ix_ks.data(), ix_ks.size(), 4);
  for (float& v : ix_ks) v = 0.01f + std::abs(v);
  size_t ix_call = 0;
  probes.push_back({[&] {
                      const uint8_t* k8 = wbuf.data() + (ix_call++ % ix_slices) * ix_slice;
                      kernels::IndexKeyView keys;
                      keys.k8 = k8;
                      keys.k_scale = ix_ks.data();
                      indexer_scores(k8 + ix_slice - 4096, ix_w.data(), ix_heads, keys, ix_keys, ix_out.data());
                    },
                    6, {}});
  const size_t p_indexer = probes.size() - 1;
  // Top-k over 16,384 distinct scores (the indexer's output at that depth).
  std::vector<float> tk_scores(16384);
  fill_floats(tk_scores.data(), tk_scores.size(), 5);
  std::vector<int32_t> tk_sel(2048);
  probes.push_back({[&] { topk(tk_scores.data(), int(tk_scores.size()), 2048, tk_sel.data()); }, 4, {}});
  const size_t p_topk = probes.size() - 1;

  // Absorbed sparse decode: 16 heads over 2,048 latents selected in position order from a
  // 16,384-token fp8 cache (the engine's 784-byte layout), alternating between four such
  // caches (51 MiB in all) so each call gathers from DRAM, as a decode step at depth does.
  const int sd_heads = 16, L = 512, R = 64, sd_n = 2048, sd_ctx = 16384, sd_copies = 4;
  MlaCacheView sd_cache;
  sd_cache.type = CacheType::FP8;
  sd_cache.kv_lora = L;
  sd_cache.rope = R;
  const size_t tb = sd_cache.token_bytes();
  std::vector<uint8_t> sd_bytes(tb * size_t(sd_ctx) * sd_copies);
  {
    std::vector<float> lat(L), kr(R);
    sd_cache.data = sd_bytes.data();
    for (int t = 0; t < 64; ++t) {  // 64 distinct tokens, repeated: values do not change the work
      fill_floats(lat.data(), lat.size(), 10 + uint64_t(t));
      fill_floats(kr.data(), kr.size(), 90000 + uint64_t(t));
      mla_cache_write(sd_cache, t, lat.data(), kr.data());
    }
    for (size_t t = 64; t < size_t(sd_ctx) * sd_copies; ++t) std::memcpy(sd_bytes.data() + t * tb, sd_bytes.data() + (t % 64) * tb, tb);
  }
  std::vector<float> sd_ql(size_t(sd_heads) * L), sd_qr(size_t(sd_heads) * R), sd_o(size_t(sd_heads) * L);
  fill_floats(sd_ql.data(), sd_ql.size(), 6);
  fill_floats(sd_qr.data(), sd_qr.size(), 7);
  // 2,048 of 16,384 positions, ascending (the top-k's order), spread by a fixed stride
  // with a small pseudo-random jitter.
  std::vector<int32_t> sd_idx(sd_n);
  {
    uint64_t s = 12345;
    for (int j = 0; j < sd_n; ++j) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      sd_idx[size_t(j)] = j * (sd_ctx / sd_n) + int32_t((s >> 40) % uint64_t(sd_ctx / sd_n));
    }
  }
  size_t sd_call = 0;
  probes.push_back({[&] {
                      sd_cache.data = sd_bytes.data() + (sd_call++ % sd_copies) * tb * size_t(sd_ctx);
                      mla_sparse_decode(sd_cache, sd_ql.data(), sd_qr.data(), sd_heads, sd_idx.data(), sd_n, 0.05f, sd_o.data());
                    },
                    6, {}});
  const size_t p_sparse_decode = probes.size() - 1;

  // Prefill attention in the expanded (MHA) form: queries in parallel as the engine runs
  // them, each over 512 keys of 16 heads x (128 nope + 64 rope | 128 v).
  const int sp_heads = 16, nope = 128, vd = 128, sp_n = 512, queries = 32;
  std::vector<float> sp_kv(size_t(sp_n) * sp_heads * (nope + vd)), sp_kr(size_t(sp_n) * R),
      sp_q(size_t(queries) * sp_heads * (nope + R)), sp_o(size_t(queries) * sp_heads * vd);
  fill_floats(sp_kv.data(), sp_kv.size(), 8);
  fill_floats(sp_kr.data(), sp_kr.size(), 9);
  fill_floats(sp_q.data(), sp_q.size(), 11);
  std::vector<int32_t> sp_idx(sp_n);
  for (int t = 0; t < sp_n; ++t) sp_idx[size_t(t)] = t;
  probes.push_back({[&] {
#pragma omp parallel for schedule(dynamic, 1)
                      for (int i = 0; i < queries; ++i)
                        mha_sparse_prefill(&sp_q[size_t(i) * sp_heads * (nope + R)], sp_kv.data(), sp_kr.data(), sp_heads, nope,
                                           R, vd, sp_idx.data(), sp_n, 0.07f, &sp_o[size_t(i) * sp_heads * vd]);
                    },
                    1, {}});
  const size_t p_sparse_prefill = probes.size() - 1;

  // A fresh prompt's causal attention in the expanded (MHA) form, as the engine runs it while
  // the prompt is no longer than index_topk: blocks of 16 queries per head in a parallel
  // loop over blocks and heads, each query over every key up to its position (256 tokens).
  const int cp_tokens = 256, cp_heads = 16;
  std::vector<float> cp_kv(size_t(cp_tokens) * cp_heads * (nope + vd)), cp_kr(size_t(cp_tokens) * R),
      cp_q(size_t(cp_tokens) * cp_heads * (nope + R)), cp_o(size_t(cp_tokens) * cp_heads * vd);
  fill_floats(cp_kv.data(), cp_kv.size(), 12);
  fill_floats(cp_kr.data(), cp_kr.size(), 13);
  fill_floats(cp_q.data(), cp_q.size(), 14);
  probes.push_back({[&] {
                      const int blocks = cp_tokens / 16;
                      const size_t q_row = size_t(cp_heads) * (nope + R), o_row = size_t(cp_heads) * vd;
#pragma omp parallel for schedule(dynamic, 1)
                      for (int t = 0; t < blocks * cp_heads; ++t) {
                        const int blk = blocks - 1 - t / cp_heads, h = t % cp_heads;
                        mha_causal_prefill_head(&cp_q[size_t(blk) * 16 * q_row + size_t(h) * (nope + R)], q_row, 16, blk * 16,
                                                cp_kv.data(), cp_kr.data(), cp_heads, h, nope, R, vd, 0.07f,
                                                &cp_o[size_t(blk) * 16 * o_row + size_t(h) * vd], o_row);
                      }
                    },
                    1, {}});
  const size_t p_causal_prefill = probes.size() - 1;

  // Element-wise work of one MoE layer with an indexer, called as the engine's forward pass
  // calls it for a chunk of kEltTokens prompt tokens with the benchmark model's shapes
  // (hidden 2048, 16 heads, latent 512, rope 64, indexer 16 x 128, 6 + 1 experts of 512):
  // RMSNorms, per-vector RoPE, the indexer's Hadamard rotation and fp8 quantization, the
  // experts' silu * up and the fp8 cache write. Its rate is expressed in the operator
  // table's own bytes for that work (op_plan below), so that the plan charges the same
  // kernels at the speed they ran here.
  constexpr int T = kEltTokens, Hd = 2048, Hq = 16, QL = 512, KL = 512, RR = 64, IH = 16, MI = 512, EX = 7;
  std::vector<float> e_x(size_t(T) * Hd), e_y(size_t(T) * Hd), e_q(size_t(T) * Hq * 192), e_kr(size_t(T) * RR),
      e_iq(size_t(T) * IH * 128), e_ik(size_t(T) * 128), e_g(size_t(T) * EX * MI), e_u(size_t(T) * EX * MI),
      e_cos(RR / 2), e_sin(RR / 2), e_iscale(size_t(T) * IH), e_kscale(T);
  std::vector<uint8_t> e_iq8(size_t(T) * IH * 128), e_ik8(size_t(T) * 128), e_wbf16(size_t(Hd) * 2);
  fill_floats(e_x.data(), e_x.size(), 21);
  fill_floats(e_q.data(), e_q.size(), 22);
  fill_floats(e_kr.data(), e_kr.size(), 23);
  fill_floats(e_g.data(), e_g.size(), 24);
  fill_floats(e_u.data(), e_u.size(), 25);
  for (int i = 0; i < RR / 2; ++i) {
    e_cos[size_t(i)] = std::cos(0.1f * float(i));
    e_sin[size_t(i)] = std::sin(0.1f * float(i));
  }
  for (int i = 0; i < Hd; ++i) {  // bf16 norm weights (1.0), as the checkpoints store them
    e_wbf16[size_t(2 * i)] = 0x80;
    e_wbf16[size_t(2 * i + 1)] = 0x3F;
  }
  std::vector<float> e_lnw(128, 1.0f), e_lnb(128, 0.0f);
  const Vec e_w{DType::BF16, e_wbf16.data(), Hd};
  const Vec e_lw{DType::F32, reinterpret_cast<const uint8_t*>(e_lnw.data()), 128};
  const Vec e_lb{DType::F32, reinterpret_cast<const uint8_t*>(e_lnb.data()), 128};
  MlaCacheView e_cache = sd_cache;  // the fp8 cache of the sparse-decode probe: T rows of it
  e_cache.data = sd_bytes.data();
  probes.push_back({[&] {
                      rmsnorm(e_x.data(), e_w, T, Hd, 1e-6f, e_y.data());  // input norm
                      rmsnorm(e_y.data(), e_w, T, QL, 1e-6f, e_y.data());  // q latent norm
                      rmsnorm(e_x.data(), e_w, T, KL, 1e-6f, e_x.data());  // kv latent norm
                      for (int i = 0; i < T; ++i) {
                        for (int h = 0; h < Hq; ++h) rope(&e_q[(size_t(i) * Hq + size_t(h)) * 192 + 128], RR, e_cos.data(), e_sin.data(), true);
                        rope(&e_kr[size_t(i) * RR], RR, e_cos.data(), e_sin.data(), true);
                      }
                      for (int i = 0; i < T; ++i)
                        for (int h = 0; h < IH; ++h) rope(&e_iq[(size_t(i) * IH + size_t(h)) * 128], RR, e_cos.data(), e_sin.data(), false);
                      hadamard128(e_iq.data(), T * IH);
                      for (int r = 0; r < T * IH; ++r)
                        act_quant_fp8(&e_iq[size_t(r) * 128], 128, 128, true, &e_iq8[size_t(r) * 128], &e_iscale[size_t(r)]);
                      layernorm(e_ik.data(), e_lw, e_lb, T, 128, 1e-6f, e_ik.data());
                      for (int i = 0; i < T; ++i) rope(&e_ik[size_t(i) * 128], RR, e_cos.data(), e_sin.data(), false);
                      hadamard128(e_ik.data(), T);
                      for (int i = 0; i < T; ++i)
                        act_quant_fp8(&e_ik[size_t(i) * 128], 128, 128, true, &e_ik8[size_t(i) * 128], &e_kscale[size_t(i)]);
                      for (int i = 0; i < T; ++i) mla_cache_write(e_cache, i, &e_x[size_t(i) * Hd], &e_kr[size_t(i) * RR]);
                      silu_mul(e_g.data(), e_u.data(), e_g.size(), e_g.data());  // in place, as the experts run it
                      rmsnorm(e_x.data(), e_w, T, Hd, 1e-6f, e_y.data());  // post-attention norm
                    },
                    2, {}});
  const size_t p_elementwise = probes.size() - 1;

  // One kernel call with almost no work, large enough to be split across the threads. The
  // fastest call of all rounds: on a shared machine a fork or join that waits for a
  // descheduled thread costs a scheduler time slice (milliseconds), a property of the
  // machine's load, not of the call.
  Linear tiny;
  tiny.dtype = DType::BF16;
  tiny.data = wbuf.data();
  tiny.rows = 256;
  tiny.cols = 64;
  probes.push_back({[&] { linear_decode(tiny, x.data(), 1, y.data()); }, 20, {}});
  const size_t p_call = probes.size() - 1;

  run_rounds(probes, 15);

  auto sec = [&](size_t i) { return median_of_round_means(probes[i]); };
  r.gemv_bf16_gbps = double(gemv_bf16.bytes()) / sec(p_gemv_bf16) / 1e9;
  r.gemv_fp8_gbps = double(fp8_per_set) * double(fp8_ws[0].bytes()) / sec(p_gemv_fp8) / 1e9;
  r.gemv_fp8_tokens_gflops = 2.0 * kGemvTokens * double(fp8_per_set) * 512.0 * 2048.0 / sec(p_gemv_tokens) / 1e9;
  r.gemm_large_gflops = 2.0 * kGemmLargeRows * 1024.0 * 2048.0 / sec(p_gemm_large) / 1e9;
  r.gemm_small_gflops = 2.0 * experts * kGemmSmallRows * 1024.0 * 2048.0 / sec(p_gemm_small) / 1e9;
  r.indexer_gflops = 2.0 * ix_heads * 128.0 * ix_keys / sec(p_indexer) / 1e9;
  r.topk_keys_per_s = double(tk_scores.size()) / sec(p_topk);
  r.sparse_decode_gflops = 2.0 * sd_heads * sd_n * (2.0 * L + R) / sec(p_sparse_decode) / 1e9;
  r.sparse_prefill_gflops = 2.0 * queries * sp_heads * sp_n * double(nope + R + vd) / sec(p_sparse_prefill) / 1e9;
  r.causal_prefill_gflops =
      2.0 * (double(cp_tokens) * (cp_tokens + 1) / 2) * cp_heads * double(nope + R + vd) / sec(p_causal_prefill) / 1e9;
  r.call_overhead_us = probes[p_call].fastest * 1e6;
  {
    // The operator table's bytes for the element-wise work above: one MoE layer's share.
    const SimModel mini = load_model("v32-mini");
    double bytes = 0;
    for (const Op& op : op_plan(mini, Step{Phase::Prefill, 1, T, 0}, Layout{}, Options{}))
      if (op.name == "layer.norms" || op.name == "attn.rope" || op.name == "indexer.quant" || op.name == "moe.act" ||
          op.name == "attn.cache_write")
        bytes += op.bytes / op.count;
    r.elementwise_gbps = bytes / sec(p_elementwise) / 1e9;
  }
  set_backend(backend_before);
  if (threads > 0) omp_set_num_threads(saved);
  g_sink = g_sink + uint64_t(y[0] > 0);
  return r;
}

}  // namespace dsa::sim
