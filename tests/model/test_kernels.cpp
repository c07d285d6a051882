// Each optimized CPU kernel against its naive twin, on odd shapes, ragged fp8 edge
// blocks, every weight dtype and every cache layout, on every instruction-set tier
// (tiers.h).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "kernels/cpu/cpu.h"
#include "kernels/kernels.h"
#include "kernels/ref/ref.h"
#include "tiers.h"

using namespace dsa;

using test::Tier;
using test::kTiers;
using test::leave_tier;

namespace {

class KernelTwins : public ::testing::TestWithParam<Tier> {
 protected:
  void SetUp() override { DSA_ENTER_TIER(GetParam()); }
  void TearDown() override { leave_tier(); }
};

struct OwnedLinear {
  std::vector<uint8_t> data;
  std::vector<float> scale;
  Linear l;
};

OwnedLinear make_linear(DType dt, int rows, int cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  OwnedLinear o;
  o.l.dtype = dt;
  o.l.rows = rows;
  o.l.cols = cols;
  const size_t n = size_t(rows) * size_t(cols);
  o.data.resize(n * dtype_size(dt));
  for (size_t i = 0; i < n; ++i) {
    const float v = u(rng);
    switch (dt) {
      case DType::F8_E4M3: o.data[i] = f32_to_fp8_e4m3(v * 448.0f); break;
      case DType::BF16: { const uint16_t h = f32_to_bf16(v); std::memcpy(&o.data[2 * i], &h, 2); break; }
      case DType::F16: { const uint16_t h = f32_to_f16(v); std::memcpy(&o.data[2 * i], &h, 2); break; }
      default: std::memcpy(&o.data[4 * i], &v, 4);
    }
  }
  if (dt == DType::F8_E4M3) {
    o.scale.resize(size_t((rows + 127) / 128) * size_t((cols + 127) / 128));
    // Mostly small power-of-two scales; every fifth block takes a large, non-power-of-two
    // one (the packing path folds 2^120 into the scale and must fall back for these).
    for (size_t i = 0; i < o.scale.size(); ++i) o.scale[i] = i % 5 == 4 ? 300.5f : std::ldexp(1.0f, int(rng() % 8) - 12);
    o.l.scale = o.scale.data();
  }
  o.l.data = o.data.data();
  return o;
}

// An fp8 weight on another block grid (br x bc), its block scales 2^(lowest + i % period).
OwnedLinear fp8_blocked(int rows, int cols, int br, int bc, int period, int lowest, uint32_t seed) {
  auto w = make_linear(DType::F8_E4M3, rows, cols, seed);
  w.l.block_rows = br;
  w.l.block_cols = bc;
  w.scale.assign(size_t((rows + br - 1) / br) * size_t((cols + bc - 1) / bc), 0.0f);
  for (size_t i = 0; i < w.scale.size(); ++i) w.scale[i] = std::ldexp(1.0f, lowest + int(i % size_t(period)));
  w.l.scale = w.scale.data();
  return w;
}

std::vector<float> randv(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double mx = 0, err = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    mx = std::max(mx, double(std::fabs(b[i])));
    err = std::max(err, double(std::fabs(a[i] - b[i])));
  }
  return err / std::max(mx, 1e-30);
}

// On an avx512 tier (native or emulated): what `run` writes into a vector the size of `got`
// on the avx2 tier must be got's bits; then `tier` is in use again.
template <class F>
void expect_avx2_bits(const Tier& tier, const std::vector<float>& got, F run, const char* what) {
  if (tier.isa < kernels::Isa::Avx512) return;
  ASSERT_TRUE(test::enter_tier(Tier{"avx2", kernels::Isa::Avx2, false}));
  std::vector<float> ref(got.size());
  run(ref);
  ASSERT_TRUE(test::enter_tier(tier));
  EXPECT_TRUE(std::equal(got.begin(), got.end(), ref.begin())) << what << " differs from the avx2 one";
}

class LinearTwin : public ::testing::TestWithParam<std::tuple<Tier, int, int, int>> {
 protected:
  void SetUp() override { DSA_ENTER_TIER(std::get<0>(GetParam())); }
  void TearDown() override { leave_tier(); }
};

std::string linear_case_name(const ::testing::TestParamInfo<std::tuple<Tier, int, int, int>>& i) {
  return std::string(std::get<0>(i.param).name) + "_" + std::to_string(std::get<1>(i.param)) + "x" +
         std::to_string(std::get<2>(i.param)) + "_n" + std::to_string(std::get<3>(i.param));
}

TEST_P(LinearTwin, CpuMatchesRef) {
  const auto [tier, rows, cols, n] = GetParam();
  for (DType dt : {DType::F8_E4M3, DType::BF16, DType::F16, DType::F32}) {
  SCOPED_TRACE(dtype_name(dt));
  const auto w = make_linear(dt, rows, cols, 7);
  const auto x = randv(size_t(n) * size_t(cols), 3);
  std::vector<float> a(size_t(n) * size_t(rows)), b(a.size());
  kernels::cpu::linear(w.l, x.data(), n, a.data(), 0, rows);
  kernels::ref::linear(w.l, x.data(), n, b.data(), 0, rows);
  EXPECT_LE(max_rel(a, b), 2e-6);
  // The avx512 GEMM sums in the avx2 GEMM's order: the same bits (amx's rounds differently).
  if (tier.isa == kernels::Isa::Avx512) {
    expect_avx2_bits(tier, a, [&](std::vector<float>& out) { kernels::cpu::linear(w.l, x.data(), n, out.data(), 0, rows); }, "avx512 GEMM");
  }
  // A row range (the MLA per-head slices of kv_b).
  const int r0 = rows / 3, nr = rows / 2;
  std::vector<float> c(size_t(n) * size_t(nr)), d(c.size());
  kernels::cpu::linear(w.l, x.data(), n, c.data(), r0, nr);
  kernels::ref::linear(w.l, x.data(), n, d.data(), r0, nr);
  EXPECT_LE(max_rel(c, d), 2e-6);
  // The transposed direction over the same range.
  const auto xt = randv(size_t(n) * size_t(nr), 5);
  std::vector<float> e(size_t(n) * size_t(cols)), f(e.size());
  kernels::cpu::linear_t(w.l, xt.data(), n, e.data(), r0, nr);
  kernels::ref::linear_t(w.l, xt.data(), n, f.data(), r0, nr);
  EXPECT_LE(max_rel(e, f), 2e-6);
  // Its avx512 panel pairs (176 columns: eleven panels, the last one alone) sum in the avx2
  // order too.
  expect_avx2_bits(tier, e, [&](std::vector<float>& out) { kernels::cpu::linear_t(w.l, xt.data(), n, out.data(), r0, nr); },
                   "avx512 transposed GEMM");
  }
}

TEST_P(KernelTwins, Fp8WithOtherBlockSizes) {
  // Checkpoints may use blocks other than 128x128: scales must follow the block grid in
  // every path (GEMV, GEMM panels, the transposed direction).
  for (auto [br, bc] : {std::pair{64, 64}, std::pair{32, 96}, std::pair{128, 48}}) {
    const auto w = fp8_blocked(150, 300, br, bc, 7, -10, 17);
    for (int n : {1, 9}) {
      const auto x = randv(size_t(n) * 300, 5);
      std::vector<float> a(size_t(n) * 150), b(a.size());
      kernels::cpu::linear(w.l, x.data(), n, a.data(), 0, 150);
      kernels::ref::linear(w.l, x.data(), n, b.data(), 0, 150);
      EXPECT_LE(max_rel(a, b), 2e-6) << br << "x" << bc << " n=" << n;
      const auto xt = randv(size_t(n) * 150, 6);
      std::vector<float> c(size_t(n) * 300), d(c.size());
      kernels::cpu::linear_t(w.l, xt.data(), n, c.data(), 0, 150);
      kernels::ref::linear_t(w.l, xt.data(), n, d.data(), 0, 150);
      EXPECT_LE(max_rel(c, d), 2e-6) << br << "x" << bc << " n=" << n;
    }
  }
}

TEST_P(KernelTwins, LinearMulti) {
  // Jobs of 1, 2 and 3 tokens (a speculative step's experts); a has more rows than one
  // 64 KB block of the multi-token path, so blocks and the thread split both show.
  const auto a = make_linear(DType::F8_E4M3, 300, 256, 1), b = make_linear(DType::BF16, 37, 200, 2), c = make_linear(DType::F8_E4M3, 5, 517, 3);
  for (int n : {1, 2, 3}) {
    const auto xa = randv(size_t(n) * 256, 7), xb = randv(size_t(n) * 200, 8), xc = randv(size_t(n) * 517, 9);
    std::vector<float> ya(size_t(n) * 300), yb(size_t(n) * 37), yc(size_t(n) * 5), ra(ya.size()), rb(yb.size()), rc(yc.size());
    const kernels::LinearJob jobs[] = {{&a.l, xa.data(), ya.data(), n}, {&b.l, xb.data(), yb.data(), n}, {&c.l, xc.data(), yc.data(), 1}};
    const kernels::LinearJob refs[] = {{&a.l, xa.data(), ra.data(), n}, {&b.l, xb.data(), rb.data(), n}, {&c.l, xc.data(), rc.data(), 1}};
    kernels::cpu::linear_multi(jobs, 3);
    kernels::ref::linear_multi(refs, 3);
    EXPECT_LE(max_rel(ya, ra), 2e-6) << n;
    EXPECT_LE(max_rel(yb, rb), 2e-6) << n;
    yc.resize(5);
    rc.resize(5);
    EXPECT_LE(max_rel(yc, rc), 2e-6) << n;
  }
}

// A job over a range of W's rows (a tensor-parallel rank's part): its outputs are bitwise
// those rows of the whole product, in both tiers, starting inside a 128-row scale block and
// at a row that is not a multiple of four.
TEST_P(KernelTwins, LinearMultiRowRanges) {
  for (DType dt : {DType::F8_E4M3, DType::BF16}) {
    const auto w = make_linear(dt, 300, 256, 4);
    for (int n : {1, 3, 7}) {
      const auto x = randv(size_t(n) * 256, 11);
      std::vector<float> whole(size_t(n) * 300);
      kernels::cpu::linear_decode(w.l, x.data(), n, whole.data(), 0, -1);
      for (const auto& [row0, rows] : {std::pair{150, 150}, std::pair{10, 17}, std::pair{0, 64}}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " rows " + std::to_string(row0) + "+" + std::to_string(rows) + " n=" + std::to_string(n));
        std::vector<float> y(size_t(n) * size_t(rows)), r(y.size()), want(y.size());
        for (int t = 0; t < n; ++t)
          std::copy_n(&whole[size_t(t) * 300 + size_t(row0)], rows, &want[size_t(t) * size_t(rows)]);
        const kernels::LinearJob job{&w.l, x.data(), y.data(), n, row0, rows}, ref{&w.l, x.data(), r.data(), n, row0, rows};
        kernels::cpu::linear_multi(&job, 1);
        kernels::ref::linear_multi(&ref, 1);
        EXPECT_TRUE(std::equal(y.begin(), y.end(), want.begin()));
        EXPECT_LE(max_rel(y, r), 2e-6);
      }
    }
  }
}

// Batch invariance of the decode-role product: n tokens in one call give every token
// bitwise what it gets alone, whatever n (token groups, row blocks, the thread split, more
// tokens than one call prepares at once), with rows that are not a multiple of four, ragged
// columns (800: column chunks of unequal size; 2100: wider than the machine's chunk, which
// later token groups do not use) and a call through linear_multi; and they agree with the
// naive product. The bf16 tile runs its columns in the machine's chunks (whole rows on
// some) and in 256-column ones.
TEST_P(KernelTwins, DecodeProductIsBitwiseTheOneTokenProduct) {
  for (const int chunk : {0, 256})
  for (DType dt : {DType::F8_E4M3, DType::BF16}) {
    kernels::cpu::set_bf16_tile_chunk(chunk);
    for (const auto& [rows, cols] :
         {std::pair{203, 256}, std::pair{130, 200}, std::pair{67, 517}, std::pair{45, 800}, std::pair{70, 2100}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(rows) + "x" + std::to_string(cols) + " chunk " + std::to_string(chunk));
      const auto w = make_linear(dt, rows, cols, 23);
      const int n_max = kernels::cpu::kTokBuf + 6;
      const auto x = randv(size_t(n_max) * size_t(cols), 29);
      std::vector<float> alone(size_t(n_max) * size_t(rows));
      for (int t = 0; t < n_max; ++t) kernels::cpu::linear_decode(w.l, &x[size_t(t) * size_t(cols)], 1, &alone[size_t(t) * size_t(rows)], 0, -1);
      std::vector<float> ref(alone.size());
      kernels::ref::linear(w.l, x.data(), n_max, ref.data(), 0, -1);
      EXPECT_LE(max_rel(alone, ref), 2e-6);
      for (int n : {2, 3, 4, 5, 7, 8, 9, 16, 25, 30, kernels::cpu::kTokBuf, n_max}) {
        std::vector<float> y(size_t(n) * size_t(rows));
        kernels::cpu::linear_decode(w.l, x.data(), n, y.data(), 0, -1);
        EXPECT_TRUE(std::equal(y.begin(), y.end(), alone.begin())) << n << " tokens in one call";
        std::fill(y.begin(), y.end(), 0.0f);
        const kernels::LinearJob job{&w.l, x.data(), y.data(), n};
        kernels::cpu::linear_multi(&job, 1);
        EXPECT_TRUE(std::equal(y.begin(), y.end(), alone.begin())) << n << " tokens through linear_multi";
      }
    }
  }
  kernels::cpu::set_bf16_tile_chunk(0);
}

TEST_P(KernelTwins, PerHeadSlices) {
  // kv_b-like: 5 heads of [nope | v 20] rows over 256 columns, fp8 with ragged blocks; nope
  // 24 is whole groups of eight rows, 27 and 45 leave single rows, 45 reaches the prefetch.
  for (DType dt : {DType::F8_E4M3, DType::BF16, DType::F32})
  for (int nope : {24, 27, 45}) {
    const int heads = 5, vd = 20, cols = 256;
    const auto w = make_linear(dt, heads * (nope + vd), cols, 9);
    const auto x = randv(size_t(heads) * 48, 4);  // x_stride 48 >= nope
    std::vector<float> a(size_t(heads) * cols), b(a.size());
    kernels::cpu::linear_t_heads(w.l, x.data(), 48, heads, nope + vd, 0, nope, a.data(), 1);
    kernels::ref::linear_t_heads(w.l, x.data(), 48, heads, nope + vd, 0, nope, b.data(), 1);
    EXPECT_LE(max_rel(a, b), 2e-6);
    const auto o = randv(size_t(heads) * cols, 6);
    std::vector<float> c(size_t(heads) * vd), d(c.size());
    kernels::cpu::linear_heads(w.l, o.data(), heads, nope + vd, nope, vd, c.data(), vd, 1);
    kernels::ref::linear_heads(w.l, o.data(), heads, nope + vd, nope, vd, d.data(), vd, 1);
    EXPECT_LE(max_rel(c, d), 2e-6);
    // Several tokens in one call (17: a chunk of the fp8 kernel and a single one; 30 more than
    // one gather of the multi-token GEMV), each bitwise its own call's result; one token's x
    // scaled past the fp8 transposed kernel's range takes its fallback in either call.
    for (int n : {2, 17, 30}) {
      auto xs = randv(size_t(n) * heads * 48, 11);
      if (n == 17) xs[size_t(5) * heads * 48 + 48 + 3] = 1e30f;
      const auto os = randv(size_t(n) * heads * cols, 12);
      std::vector<float> yt(size_t(n) * heads * cols), yh(size_t(n) * heads * vd), rt(yt.size()), rh(yh.size());
      kernels::cpu::linear_t_heads(w.l, xs.data(), 48, heads, nope + vd, 0, nope, yt.data(), n);
      kernels::cpu::linear_heads(w.l, os.data(), heads, nope + vd, nope, vd, yh.data(), vd, n);
      kernels::ref::linear_t_heads(w.l, xs.data(), 48, heads, nope + vd, 0, nope, rt.data(), n);
      kernels::ref::linear_heads(w.l, os.data(), heads, nope + vd, nope, vd, rh.data(), vd, n);
      for (int i = 0; i < n; ++i) {
        std::vector<float> at(size_t(heads) * cols), ah(size_t(heads) * vd);
        kernels::cpu::linear_t_heads(w.l, &xs[size_t(i) * heads * 48], 48, heads, nope + vd, 0, nope, at.data(), 1);
        kernels::cpu::linear_heads(w.l, &os[size_t(i) * heads * cols], heads, nope + vd, nope, vd, ah.data(), vd, 1);
        EXPECT_TRUE(std::equal(at.begin(), at.end(), yt.begin() + std::ptrdiff_t(size_t(i) * at.size())))
            << dtype_name(dt) << " nope " << nope << ": token " << i << " of " << n << " through linear_t_heads";
        EXPECT_TRUE(std::equal(ah.begin(), ah.end(), yh.begin() + std::ptrdiff_t(size_t(i) * ah.size())))
            << dtype_name(dt) << " nope " << nope << ": token " << i << " of " << n << " through linear_heads";
      }
      EXPECT_LE(max_rel(yh, rh), 2e-6);
      if (n != 17) {
        EXPECT_LE(max_rel(yt, rt), 2e-6);
      }
      expect_avx2_bits(GetParam(), yt,
                       [&](std::vector<float>& out) { kernels::cpu::linear_t_heads(w.l, xs.data(), 48, heads, nope + vd, 0, nope, out.data(), n); },
                       "avx512 linear_t_heads");
    }
  }
  // fp8 scale blocks 80 columns wide (the avx512 kernel's single-vector tiles) and 40 rows per
  // head (a step and a half of its rows), 1 to 16 tokens: bitwise the avx2 kernels.
  {
    const auto w = fp8_blocked(3 * 50, 240, 128, 80, 5, -8, 15);
    for (int n : {1, 2, 3, 4, 5, 16}) {
      const auto xs = randv(size_t(n) * 3 * 40, 16);
      std::vector<float> yt(size_t(n) * 3 * 240), rt(yt.size());
      kernels::cpu::linear_t_heads(w.l, xs.data(), 40, 3, 50, 0, 40, yt.data(), n);
      kernels::ref::linear_t_heads(w.l, xs.data(), 40, 3, 50, 0, 40, rt.data(), n);
      EXPECT_LE(max_rel(yt, rt), 2e-6) << n << " tokens";
      expect_avx2_bits(GetParam(), yt, [&](std::vector<float>& out) { kernels::cpu::linear_t_heads(w.l, xs.data(), 40, 3, 50, 0, 40, out.data(), n); },
                       "avx512 linear_t_heads, 80-column blocks,");
    }
  }
  // fp8 scale blocks 72 columns wide (strips of 32, 32 and 8) and 80 rows per head (past a
  // 64-row chunk): seven tokens in one call, each bitwise its own.
  const auto w = fp8_blocked(2 * 100, 216, 128, 72, 4, -9, 13);
  const int n = 7, heads = 2, nope = 80;
  const auto xs = randv(size_t(n) * heads * nope, 14);
  std::vector<float> yt(size_t(n) * heads * 216), at(size_t(heads) * 216), rt(yt.size());
  kernels::cpu::linear_t_heads(w.l, xs.data(), nope, heads, 100, 0, nope, yt.data(), n);
  kernels::ref::linear_t_heads(w.l, xs.data(), nope, heads, 100, 0, nope, rt.data(), n);
  EXPECT_LE(max_rel(yt, rt), 2e-6);
  for (int i = 0; i < n; ++i) {
    kernels::cpu::linear_t_heads(w.l, &xs[size_t(i) * heads * nope], nope, heads, 100, 0, nope, at.data(), 1);
    EXPECT_TRUE(std::equal(at.begin(), at.end(), yt.begin() + std::ptrdiff_t(size_t(i) * at.size()))) << "token " << i;
  }
}

// The prefill GEMM on shapes in whole tile steps of 32 columns (the amx tier's; other tiers
// run their own): the naive product's values, and each token's outputs bitwise the same
// whatever the number of tokens in the call (1 to 70: partial tiles and several pairs of
// them), with rows that leave partial units and panels, K in more than one chunk, fp8 on
// blocks of 32 to 128 columns and of rows that cut panels, and bf16.
TEST_P(KernelTwins, PrefillGemmIsTokenCountInvariant) {
  struct Case {
    DType dt;
    int rows, cols, block_rows, block_cols;
  };
  for (const Case c : {Case{DType::F8_E4M3, 300, 384, 128, 128}, Case{DType::F8_E4M3, 90, 640, 48, 64}, Case{DType::F8_E4M3, 70, 480, 100, 96},
                       Case{DType::F8_E4M3, 33, 96, 128, 32}, Case{DType::BF16, 200, 576, 0, 0}}) {
    SCOPED_TRACE(std::string(dtype_name(c.dt)) + " " + std::to_string(c.rows) + "x" + std::to_string(c.cols) + " blocks " +
                 std::to_string(c.block_rows) + "x" + std::to_string(c.block_cols));
    const auto w = c.block_cols ? fp8_blocked(c.rows, c.cols, c.block_rows, c.block_cols, 6, -9, 31) : make_linear(c.dt, c.rows, c.cols, 31);
    // 200 tokens on 2 or 3 threads take the GEMM split by tokens, 70 on 2 only for the
    // narrow weights, one thread never.
    const int n_max = 200;
    const auto x = randv(size_t(n_max) * size_t(c.cols), 37);
    std::vector<float> all(size_t(n_max) * size_t(c.rows)), ref(all.size());
    kernels::cpu::linear(w.l, x.data(), n_max, all.data(), 0, c.rows);
    kernels::ref::linear(w.l, x.data(), n_max, ref.data(), 0, c.rows);
    EXPECT_LE(max_rel(all, ref), 2e-6);
    const int threads = omp_get_max_threads();
    for (int t : {1, 2, 3}) {
      omp_set_num_threads(t);
      std::vector<float> y(all.size());
      kernels::cpu::linear(w.l, x.data(), n_max, y.data(), 0, c.rows);
      EXPECT_TRUE(y == all) << t << " threads";
    }
    omp_set_num_threads(threads);
    for (int n : {1, 31, 33, 70}) {
      std::vector<float> y(size_t(n) * size_t(c.rows));
      kernels::cpu::linear(w.l, x.data(), n, y.data(), 0, c.rows);
      EXPECT_TRUE(std::equal(y.begin(), y.end(), all.begin())) << n << " tokens in one call";
    }
    // A row range starting inside a scale block and a panel.
    const int r0 = 7, nr = std::min(50, c.rows - r0);
    std::vector<float> part(size_t(n_max) * size_t(nr)), want(part.size());
    kernels::cpu::linear(w.l, x.data(), n_max, part.data(), r0, nr);
    for (int t = 0; t < n_max; ++t) std::copy_n(&all[size_t(t) * size_t(c.rows) + size_t(r0)], nr, &want[size_t(t) * size_t(nr)]);
    EXPECT_TRUE(part == want) << "rows from " << r0;
    // The transposed direction (K = the rows taken), split by tokens or not.
    const int kr = std::min(c.rows, 150);
    const auto xt = randv(size_t(n_max) * size_t(kr), 41);
    std::vector<float> t_all(size_t(n_max) * size_t(c.cols));
    kernels::cpu::linear_t(w.l, xt.data(), n_max, t_all.data(), 0, kr);
    for (int t : {1, 2, 3}) {
      omp_set_num_threads(t);
      for (int n : {1, 33, n_max}) {
        std::vector<float> y(size_t(n) * size_t(c.cols));
        kernels::cpu::linear_t(w.l, xt.data(), n, y.data(), 0, kr);
        EXPECT_TRUE(std::equal(y.begin(), y.end(), t_all.begin())) << "linear_t, " << n << " tokens, " << t << " threads";
      }
    }
    omp_set_num_threads(threads);
  }
}

// The GEMMs over rows of wider matrices (one head's slice of a prefill chunk's per-head
// rows): each output the packed call's bits, nothing written between the rows, and the
// naive twins agree with themselves the same way.
TEST_P(KernelTwins, StridedGemmsAreThePackedBits) {
  struct Case {
    DType dt;
    int rows, cols;
  };
  // 176 and 384 columns take linear_t's panel GEMM, 200 its column-block path.
  for (const Case c : {Case{DType::F8_E4M3, 144, 384}, Case{DType::F8_E4M3, 300, 200}, Case{DType::BF16, 96, 176}, Case{DType::F32, 40, 128}}) {
    SCOPED_TRACE(std::string(dtype_name(c.dt)) + " " + std::to_string(c.rows) + "x" + std::to_string(c.cols));
    const auto w = make_linear(c.dt, c.rows, c.cols, 41);
    const int n = 13, r0 = 16, nr = std::min(64, c.rows - r0);
    const float kGap = -7.25f;
    for (auto fwd : {true, false}) {
      SCOPED_TRACE(fwd ? "linear" : "linear_t");
      const size_t in = size_t(fwd ? c.cols : nr), out = size_t(fwd ? nr : c.cols);
      const size_t ldx = in * 3 + 5, ldy = out * 2 + 3;
      auto x = randv(size_t(n) * ldx, 43);
      std::vector<float> xp(size_t(n) * in);
      for (int i = 0; i < n; ++i) std::copy_n(&x[size_t(i) * ldx + 2], in, &xp[size_t(i) * in]);
      for (bool naive : {false, true}) {
        SCOPED_TRACE(naive ? "ref" : "cpu");
        std::vector<float> packed(size_t(n) * out), wide(size_t(n) * ldy, kGap);
        using Packed = void (*)(const Linear&, const float*, int, float*, int, int);
        using Strided = void (*)(const Linear&, const float*, size_t, int, float*, size_t, int, int);
        const Packed packed_fn = fwd ? (naive ? Packed(kernels::ref::linear) : Packed(kernels::cpu::linear))
                                     : (naive ? Packed(kernels::ref::linear_t) : Packed(kernels::cpu::linear_t));
        const Strided strided_fn = fwd ? (naive ? Strided(kernels::ref::linear) : Strided(kernels::cpu::linear))
                                       : (naive ? Strided(kernels::ref::linear_t) : Strided(kernels::cpu::linear_t));
        packed_fn(w.l, xp.data(), n, packed.data(), r0, nr);
        strided_fn(w.l, x.data() + 2, ldx, n, wide.data() + 1, ldy, r0, nr);
        for (int i = 0; i < n; ++i) {
          const float* row = &wide[size_t(i) * ldy];
          EXPECT_TRUE(std::equal(row + 1, row + 1 + out, &packed[size_t(i) * out])) << "token " << i;
          EXPECT_EQ(row[0], kGap) << "token " << i;
          EXPECT_TRUE(std::all_of(row + 1 + out, row + ldy, [&](float v) { return v == kGap; })) << "token " << i;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearTwin,
                         ::testing::Combine(::testing::ValuesIn(kTiers), ::testing::Values(1, 144, 300), ::testing::Values(128, 176, 200, 384, 517),
                                            ::testing::Values(1, 2, 3, 17)),
                         linear_case_name);

// The avx512 tier's two fp8 panel packs write the same bits: every e4m3 code in every row
// (zeros of both signs, subnormals, the NaN codes) at every column position, row scales of
// both signs; each value the one rounding of code times scale.
TEST_P(KernelTwins, PanelPacksAreTheSameBits) {
  if (!kernels::cpu::use_avx512()) GTEST_SKIP() << "tier " << GetParam().name << " has no avx512 panel pack";
  const auto& k = kernels::cpu::avx512_kernels();
  if (k.pack_fp8_chunk == k.pack_fp8_chunk_plain) GTEST_SKIP() << "the VBMI pack: this CPU has no AVX512-VBMI (it has " << kernels::cpu_features() << ")";
  constexpr int kLen = 256;
  constexpr size_t kLd = kLen + 24;
  std::vector<uint8_t> w(16 * kLd + 3);
  for (int j = 0; j < 16; ++j)
    for (size_t c = 0; c < kLd; ++c) w[3 + size_t(j) * kLd + c] = uint8_t(c + 17 * size_t(j));
  float scale[16], s[16];
  for (int j = 0; j < 16; ++j) {
    scale[j] = std::ldexp((j % 3 == 1 ? -1.0f : 1.0f) * (1.0f + float(j) / 7.0f), j - 9);
    s[j] = scale[j] * 0x1p120f;
  }
  std::vector<float> plain(size_t(kLen) * 16, 1.5f), vbmi(size_t(kLen) * 16, -2.5f);
  k.pack_fp8_chunk_plain(w.data() + 3, kLd, kLen, s, plain.data());
  k.pack_fp8_chunk(w.data() + 3, kLd, kLen, s, vbmi.data());
  EXPECT_EQ(std::memcmp(plain.data(), vbmi.data(), plain.size() * sizeof(float)), 0);
  int checked = 0;
  for (int c = 0; c < kLen; ++c)
    for (int j = 0; j < 16; ++j) {
      const uint8_t code = w[3 + size_t(j) * kLd + size_t(c)];
      if ((code & 0x7F) == 0x7F) continue;  // NaN: no value to compare
      const float want = fp8_e4m3_to_f32(code) * scale[j];
      uint32_t a, b;
      std::memcpy(&a, &vbmi[size_t(c) * 16 + size_t(j)], 4);
      std::memcpy(&b, &want, 4);
      EXPECT_EQ(a, b) << "row " << j << " column " << c << " code " << int(code);
      ++checked;
    }
  EXPECT_EQ(checked, 16 * 254);
}

TEST_P(KernelTwins, IndexerScores) {
  // 1 head (one padded lane group), 16 (a pair), 24 (a pair and an odd group), 64; key counts
  // that leave partial blocks of every size the kernels take apart (1, 6, 8 and 4 keys past
  // whole blocks of twelve; 600 runs as chunks of 256).
  for (int heads : {1, 16, 24, 64})
    for (int keys : {1, 18, 20, 37, 600}) {
      std::mt19937 rng(heads * 1000 + keys);
      std::vector<uint8_t> q8(size_t(heads) * 128), k8(size_t(keys) * 128);
      for (auto& v : q8) { v = uint8_t(rng()); if ((v & 0x7f) == 0x7f) v = 0; }
      for (auto& v : k8) { v = uint8_t(rng()); if ((v & 0x7f) == 0x7f) v = 0; }
      const auto w = randv(size_t(heads), 11), ks = randv(size_t(keys), 12);
      std::vector<float> a(static_cast<size_t>(keys)), b(static_cast<size_t>(keys));
      kernels::IndexKeyView view;
      view.k8 = k8.data();
      view.k_scale = ks.data();
      kernels::ref::indexer_scores(q8.data(), w.data(), heads, view, keys, b.data());
      if (GetParam().isa < kernels::Isa::Avx512) {
        kernels::cpu::indexer_scores(q8.data(), w.data(), heads, view, keys, a.data());
        EXPECT_LE(max_rel(a, b), 1e-5) << heads << " heads, " << keys << " keys";
        continue;
      }
      // The avx512 tier's f32 scan gives the avx2 scan's scores bit for bit; its AVX512-BF16
      // scan (where the CPU has it, and always on the emulation) is within the same bound of
      // the reference.
      const bool bf16_before = kernels::bf16_dot();
      kernels::cpu::force_bf16_dot(false);
      kernels::cpu::indexer_scores(q8.data(), w.data(), heads, view, keys, a.data());
      EXPECT_LE(max_rel(a, b), 1e-5) << heads << " heads, " << keys << " keys";
      const Tier avx2{"avx2", kernels::Isa::Avx2, false};
      ASSERT_TRUE(test::enter_tier(avx2));
      std::vector<float> c(a.size());
      kernels::cpu::indexer_scores(q8.data(), w.data(), heads, view, keys, c.data());
      ASSERT_TRUE(test::enter_tier(GetParam()));
      EXPECT_TRUE(std::equal(a.begin(), a.end(), c.begin())) << heads << " heads, " << keys << " keys";
      if (GetParam().emulated || kernels::bf16_dot_supported()) {
        kernels::cpu::force_bf16_dot(true);
        kernels::cpu::indexer_scores(q8.data(), w.data(), heads, view, keys, c.data());
        EXPECT_LE(max_rel(c, b), 1e-5) << "bf16 scan, " << heads << " heads, " << keys << " keys";
      } else if (heads == 1 && keys == 1) {
        std::printf("[ SKIPPED ] the AVX512-BF16 indexer scan: this CPU has no AVX512-BF16\n");
      }
      kernels::cpu::force_bf16_dot(bf16_before);
    }
}

TEST_P(KernelTwins, IndexerScoresThroughBlockTable) {
  // The keys in 64-token blocks placed out of order in a larger pool: every score is the one
  // the contiguous scan gives, bit for bit (a score depends on its key and the query only),
  // on the tier's f32 scan and, where it runs, its bf16 one.
  constexpr int kBlock = 64, kHeads = 16, kKeys = 1000;
  const int n_blocks = (kKeys + kBlock - 1) / kBlock;
  std::mt19937 rng(7);
  std::vector<uint8_t> q8(size_t(kHeads) * 128), k8(size_t(kKeys) * 128);
  for (auto& v : q8) { v = uint8_t(rng()); if ((v & 0x7f) == 0x7f) v = 0; }
  for (auto& v : k8) { v = uint8_t(rng()); if ((v & 0x7f) == 0x7f) v = 0; }
  const auto w = randv(size_t(kHeads), 21), ks = randv(size_t(kKeys), 22);
  std::vector<int32_t> blocks(static_cast<size_t>(n_blocks));
  for (int b = 0; b < n_blocks; ++b) blocks[size_t(b)] = 2 * b + 1;  // every other block of the pool
  std::shuffle(blocks.begin(), blocks.end(), rng);
  const size_t pool_slots = size_t(2 * n_blocks + 1) * kBlock;
  std::vector<uint8_t> pool_k(pool_slots * 128, 0x7e);  // unused slots hold the largest code
  std::vector<float> pool_s(pool_slots, 1e30f);
  for (int t = 0; t < kKeys; ++t) {
    const size_t slot = size_t(blocks[size_t(t / kBlock)]) * kBlock + size_t(t % kBlock);
    std::copy_n(&k8[size_t(t) * 128], 128, &pool_k[slot * 128]);
    pool_s[slot] = ks[size_t(t)];
  }
  kernels::IndexKeyView flat, paged;
  flat.k8 = k8.data();
  flat.k_scale = ks.data();
  paged.k8 = pool_k.data();
  paged.k_scale = pool_s.data();
  paged.blocks = blocks.data();
  paged.block_size = kBlock;
  const bool bf16_before = kernels::bf16_dot();
  for (bool bf16 : {false, true}) {
    if (bf16 && !(GetParam().emulated || kernels::bf16_dot_supported())) continue;
    if (GetParam().isa >= kernels::Isa::Avx512) kernels::cpu::force_bf16_dot(bf16);
    for (int n : {kKeys, 130, 64, 17}) {
      std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
      kernels::cpu::indexer_scores(q8.data(), w.data(), kHeads, flat, n, a.data());
      kernels::cpu::indexer_scores(q8.data(), w.data(), kHeads, paged, n, b.data());
      EXPECT_TRUE(a == b) << n << " keys, bf16 " << bf16;
    }
  }
  kernels::cpu::force_bf16_dot(bf16_before);
}

TEST_P(KernelTwins, TopkWithTiesGoesToLowerIndex) {
  std::mt19937 rng(1);
  for (int n : {1, 5, 64, 1000, 5000})
    for (int k : {1, 3, 64, 2048}) {
      if (k > n) continue;
      std::vector<float> s(static_cast<size_t>(n));
      // Many ties, negative scores and both zeros (-0 ties with +0, as in the reference).
      for (auto& v : s) v = rng() % 7 == 0 ? -0.0f : float(int(rng() % 50) - 20) * 0.5f;
      std::vector<int32_t> a(static_cast<size_t>(k)), b(static_cast<size_t>(k));
      kernels::cpu::topk(s.data(), n, k, a.data());
      kernels::ref::topk(s.data(), n, k, b.data());
      EXPECT_EQ(a, b) << "n=" << n << " k=" << k;
    }
  // Continuous scores (the selection's boundary bin small enough to be gathered) and scores
  // packed into one top-level bin (more keys there than the gather buffer holds), with ties.
  for (int packed : {0, 1}) {
    const int n = 20000, k = 2048;
    std::vector<float> s(static_cast<size_t>(n));
    std::normal_distribution<float> nd(0.0f, 3.0f);
    for (auto& v : s) v = packed ? 1.0f + float(rng() % 4000) * 1e-5f : nd(rng);
    std::vector<int32_t> a(static_cast<size_t>(k)), b(static_cast<size_t>(k));
    kernels::cpu::topk(s.data(), n, k, a.data());
    kernels::ref::topk(s.data(), n, k, b.data());
    EXPECT_EQ(a, b) << "packed=" << packed;
  }
  // A boundary bin of exactly as many keys as the gather buffer holds (4096), after ten keys
  // outside it: the gather's last whole-register store runs past the buffer's 4096 slots.
  {
    const int n = 4106, k = 2048;
    std::vector<float> s(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) s[size_t(i)] = i < 10 ? 0.5f : 1.0f + float(rng() % 1000) * 1e-4f;
    std::vector<int32_t> a(static_cast<size_t>(k)), b(static_cast<size_t>(k));
    kernels::cpu::topk(s.data(), n, k, a.data());
    kernels::ref::topk(s.data(), n, k, b.data());
    EXPECT_EQ(a, b) << "a full gather buffer";
  }
  // Hand-computed cases: ties at the boundary keep the lower positions; the result lists
  // positions in ascending order.
  const std::vector<float> s = {1, 3, 2, 3, 2, 0};
  std::vector<int32_t> out(3);
  kernels::topk(s.data(), 6, 3, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 3}));
  const std::vector<float> neg = {-1.5f, -0.0f, 0.0f, -3.0f, 2.0f};
  std::vector<int32_t> two(2);
  kernels::topk(neg.data(), 5, 2, two.data());
  EXPECT_EQ(two, (std::vector<int32_t>{1, 4}));  // 2.0, then -0 (ties with +0, lower position)
}

class CacheTwin : public ::testing::TestWithParam<std::tuple<Tier, CacheType>> {
 protected:
  void SetUp() override { DSA_ENTER_TIER(std::get<0>(GetParam())); }
  void TearDown() override { leave_tier(); }
};

std::string cache_case_name(const ::testing::TestParamInfo<std::tuple<Tier, CacheType>>& i) {
  static const char* kNames[] = {"f32", "bf16", "fp8", "fp8_656"};
  return std::string(std::get<0>(i.param).name) + "_" + kNames[int(std::get<1>(i.param))];
}

TEST_P(CacheTwin, SparseDecodeMatchesRef) {
  const CacheType type = std::get<1>(GetParam());
  const int L = 160, R = 16, heads = 16, ctx = 300;
  MlaCacheView c;
  c.type = type;
  c.kv_lora = L;
  c.rope = R;
  c.ue8m0 = true;
  std::vector<uint8_t> buf(c.token_bytes() * ctx);
  c.data = buf.data();
  const auto lat = randv(size_t(ctx) * L, 21), kr = randv(size_t(ctx) * R, 22);
  for (int t = 0; t < ctx; ++t) kernels::mla_cache_write(c, t, &lat[size_t(t) * L], &kr[size_t(t) * R]);
  // Round trip: exact for f32, within the format's precision otherwise.
  std::vector<float> l2(L), r2(R);
  kernels::mla_cache_read(c, 7, l2.data(), r2.data());
  const double tol = type == CacheType::F32 ? 0 : type == CacheType::BF16 ? 4e-3 : 7e-2;
  for (int i = 0; i < L; ++i) EXPECT_NEAR(l2[size_t(i)], lat[size_t(7 * L + i)], tol * 1.0001 + 1e-7);
  for (int i = 0; i < R; ++i)
    EXPECT_NEAR(r2[size_t(i)], kr[size_t(7 * R + i)], (type == CacheType::F32 || type == CacheType::FP8) ? 0 : 4e-3);

  const auto ql = randv(size_t(heads) * L, 23), qr = randv(size_t(heads) * R, 24);
  const std::vector<int32_t> idx = {3, 39, 0, 17, 22, 5, 11};
  std::vector<float> a(size_t(heads) * L), b(a.size());
  kernels::cpu::mla_sparse_decode(c, ql.data(), qr.data(), heads, idx.data(), int(idx.size()), 0.3f, a.data());
  kernels::ref::mla_sparse_decode(c, ql.data(), qr.data(), heads, idx.data(), int(idx.size()), 0.3f, b.data());
  EXPECT_LE(max_rel(a, b), 1e-5);
  // A long selection: split across threads and tiles, partials merged.
  std::vector<int32_t> many;
  for (int t = ctx - 1; t >= 0; t -= 3) many.push_back(t);
  kernels::cpu::mla_sparse_decode(c, ql.data(), qr.data(), heads, many.data(), int(many.size()), 0.3f, a.data());
  kernels::ref::mla_sparse_decode(c, ql.data(), qr.data(), heads, many.data(), int(many.size()), 0.3f, b.data());
  EXPECT_LE(max_rel(a, b), 1e-5);
  // 2, 3 and 5 heads (a tensor-parallel rank's share of a small model), 8 (one lane group),
  // 12 (the last group half padding), 24 (a pair of groups and an odd one), from a query with
  // more heads than the test's 16.
  const auto qlw = randv(size_t(24) * L, 27), qrw = randv(size_t(24) * R, 28);
  std::vector<std::vector<float>> by_count;
  for (int hh : {2, 3, 5, 8, 12, 24}) {
    std::vector<float> aw(size_t(hh) * L), bw(aw.size());
    kernels::cpu::mla_sparse_decode(c, qlw.data(), qrw.data(), hh, many.data(), int(many.size()), 0.3f, aw.data());
    kernels::ref::mla_sparse_decode(c, qlw.data(), qrw.data(), hh, many.data(), int(many.size()), 0.3f, bw.data());
    EXPECT_LE(max_rel(aw, bw), 1e-5) << hh << " heads";
    by_count.push_back(aw);
  }
  // A head's output does not depend on how many heads share the call: tensor parallelism
  // gives each rank a slice of the heads and must reproduce one process's bits.
  for (size_t i = 0; i + 1 < by_count.size(); ++i)
    for (size_t v = 0; v < by_count[i].size(); ++v)
      ASSERT_EQ(by_count[i][v], by_count.back()[v]) << by_count[i].size() / L << " heads, value " << v;
  // DeepSeek-sized head count over a long selection (indices may repeat): eight partials
  // per call, merged across the threads.
  {
    const int hh = 128;
    std::vector<int32_t> longsel(1024);
    for (size_t i = 0; i < longsel.size(); ++i) longsel[i] = int32_t((i * 7) % size_t(ctx));
    const auto qlb = randv(size_t(hh) * L, 29), qrb = randv(size_t(hh) * R, 30);
    std::vector<float> ab(size_t(hh) * L), bb(ab.size());
    kernels::cpu::mla_sparse_decode(c, qlb.data(), qrb.data(), hh, longsel.data(), int(longsel.size()), 0.3f, ab.data());
    kernels::ref::mla_sparse_decode(c, qlb.data(), qrb.data(), hh, longsel.data(), int(longsel.size()), 0.3f, bb.data());
    EXPECT_LE(max_rel(ab, bb), 1e-5);
    // The avx512 tile products keep every lane's order: the avx2 tier's bits (16 and 128 heads).
    const Tier tier = std::get<0>(GetParam());
    if (tier.isa >= kernels::Isa::Avx512) {
      std::vector<float> a16(size_t(heads) * L), a16_avx2(a16.size()), ab_avx2(ab.size());
      kernels::cpu::mla_sparse_decode(c, ql.data(), qr.data(), heads, many.data(), int(many.size()), 0.3f, a16.data());
      ASSERT_TRUE(test::enter_tier(Tier{"avx2", kernels::Isa::Avx2, false}));
      kernels::cpu::mla_sparse_decode(c, ql.data(), qr.data(), heads, many.data(), int(many.size()), 0.3f, a16_avx2.data());
      kernels::cpu::mla_sparse_decode(c, qlb.data(), qrb.data(), hh, longsel.data(), int(longsel.size()), 0.3f, ab_avx2.data());
      ASSERT_TRUE(test::enter_tier(tier));
      EXPECT_TRUE(a16 == a16_avx2) << "16 heads: avx512 sparse decode differs from the avx2 one";
      EXPECT_TRUE(ab == ab_avx2) << "128 heads: avx512 sparse decode differs from the avx2 one";
    }
  }
  // Odd head counts take the portable path; it must agree too.
  kernels::cpu::mla_sparse_decode(c, ql.data(), qr.data(), 5, many.data(), int(many.size()), 0.3f, a.data());
  kernels::ref::mla_sparse_decode(c, ql.data(), qr.data(), 5, many.data(), int(many.size()), 0.3f, b.data());
  EXPECT_LE(max_rel(std::vector<float>(a.begin(), a.begin() + 5 * L), std::vector<float>(b.begin(), b.begin() + 5 * L)), 1e-5);

}

INSTANTIATE_TEST_SUITE_P(Layouts, CacheTwin,
                         ::testing::Combine(::testing::ValuesIn(kTiers),
                                            ::testing::Values(CacheType::F32, CacheType::BF16, CacheType::FP8, CacheType::FP8_656)),
                         cache_case_name);

// One-hot by construction: key t's latent (and value) is the unit vector e_t, and head h's
// query is aligned with key 3 + 4h at a large scale, so the result is e_{3+4h} when that key
// is selected and has no trace of it when it is not. Eight heads and more than eight keys,
// so the SIMD paths run (a head count that is not a multiple of 4 takes the reference), and
// the reference twin is checked the same way.
using SparseDecodeFn = void (*)(const MlaCacheView&, const float*, const float*, int, const int32_t*, int, float, float*);
constexpr int kSparseHeads = 8, kSparseCtx = 40;
int aligned_key(int h) { return 3 + 4 * h; }

std::vector<int32_t> sparse_selection(bool with_aligned) {
  std::vector<int32_t> idx = {0, 1, 2, 36, 38, 39};
  for (int h = 0; h < kSparseHeads && with_aligned; ++h) idx.push_back(aligned_key(h));
  return idx;
}

// Rows of o [heads, width]: with the aligned keys, e_{aligned}; without, weight only on the
// other selected keys (summing to 1) and none elsewhere.
void expect_one_hot_rows(const std::vector<float>& o, int width, bool with_aligned) {
  const auto sel = sparse_selection(false);
  for (int h = 0; h < kSparseHeads; ++h) {
    const float* row = &o[size_t(h) * size_t(width)];
    if (with_aligned) {
      EXPECT_NEAR(row[aligned_key(h)], 1.0f, 1e-6) << "head " << h;
      continue;
    }
    double on = 0;
    for (int32_t t : sel) on += row[t];
    EXPECT_NEAR(on, 1.0, 1e-6) << "head " << h;
    for (int t = 0; t < width; ++t)
      if (std::find(sel.begin(), sel.end(), t) == sel.end()) {
        EXPECT_EQ(row[t], 0.0f) << "head " << h << " key " << t;
      }
  }
}

TEST_P(KernelTwins, SparseDecodeReadsOnlySelectedKeys) {
  const int L = 128, R = 8;
  for (const CacheType type : {CacheType::F32, CacheType::BF16, CacheType::FP8}) {
    MlaCacheView c;
    c.type = type;
    c.kv_lora = L;
    c.rope = R;
    std::vector<uint8_t> buf(c.token_bytes() * kSparseCtx);
    c.data = buf.data();
    for (int t = 0; t < kSparseCtx; ++t) {
      std::vector<float> lat(L, 0.0f), kr(R, 0.0f);
      lat[size_t(t)] = 1.0f;
      kernels::mla_cache_write(c, t, lat.data(), kr.data());
    }
    std::vector<float> q(size_t(kSparseHeads) * L, 0.0f), qr(size_t(kSparseHeads) * R, 0.0f);
    for (int h = 0; h < kSparseHeads; ++h) q[size_t(h) * L + size_t(aligned_key(h))] = 1e4f;
    for (const SparseDecodeFn fn : {SparseDecodeFn(&kernels::cpu::mla_sparse_decode), SparseDecodeFn(&kernels::ref::mla_sparse_decode)})
      for (const bool with : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "cache " << int(type) << (fn == &kernels::ref::mla_sparse_decode ? " ref" : " cpu") << (with ? " with" : " without"));
        const auto idx = sparse_selection(with);
        std::vector<float> o(size_t(kSparseHeads) * L, -1.0f);
        fn(c, q.data(), qr.data(), kSparseHeads, idx.data(), int(idx.size()), 1.0f, o.data());
        expect_one_hot_rows(o, L, with);
      }
  }
}

TEST_P(KernelTwins, ElementwiseAndHadamard) {
  const auto x = randv(3 * 300, 31), g = randv(300, 32);
  std::vector<uint8_t> wb(600);
  for (int i = 0; i < 300; ++i) { const uint16_t h = f32_to_bf16(g[size_t(i)]); std::memcpy(&wb[size_t(2 * i)], &h, 2); }
  const Vec w{DType::BF16, wb.data(), 300};
  std::vector<float> a(x.size()), b(x.size());
  kernels::cpu::rmsnorm(x.data(), w, 3, 300, 1e-6f, a.data());
  kernels::ref::rmsnorm(x.data(), w, 3, 300, 1e-6f, b.data());
  EXPECT_LE(max_rel(a, b), 1e-6);
  kernels::cpu::silu_mul(x.data(), x.data(), x.size(), a.data());
  kernels::ref::silu_mul(x.data(), x.data(), x.size(), b.data());
  EXPECT_LE(max_rel(a, b), 1e-6);
  auto h1 = randv(5 * 128, 33), h2 = h1;
  kernels::cpu::hadamard128(h1.data(), 5);
  kernels::ref::hadamard128(h2.data(), 5);
  EXPECT_LE(max_rel(h1, h2), 1e-6);
  // Every tier runs the same f32 butterflies (the reference's in double), so all tiers agree
  // bitwise with them whatever their order.
  auto h5 = randv(5 * 128, 33);
  for (int v = 0; v < 5; ++v) {
    float* t = h5.data() + 128 * v;
    for (int h = 1; h < 128; h *= 2)
      for (int i = 0; i < 128; i += 2 * h)
        for (int j = i; j < i + h; ++j) {
          const float a = t[j], b = t[j + h];
          t[j] = a + b;
          t[j + h] = a - b;
        }
    for (int i = 0; i < 128; ++i) t[i] *= 0.08838834764831845f;
  }
  EXPECT_EQ(h1, h5);
  // Orthonormal: applying it twice gives the input back.
  auto h3 = randv(128, 34), h4 = h3;
  kernels::hadamard128(h4.data(), 1);
  kernels::hadamard128(h4.data(), 1);
  EXPECT_LE(max_rel(h4, h3), 1e-6);
}

// RoPE and the fp8 activation quantization give the reference's bits on every tier: both
// layouts of the pairs, lengths with a tail past the vector width, magnitudes from the e4m3
// subnormal steps to the clamp, an all-zero block, ue8m0 and plain scales.
TEST_P(KernelTwins, RopeAndActQuantAreTheReferenceBits) {
  std::mt19937 rng(35);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int dim : {64, 128, 6, 22})
    for (bool interleaved : {false, true}) {
      auto x = randv(size_t(dim), uint32_t(36 + dim)), c = randv(size_t(dim / 2), 37), sn = randv(size_t(dim / 2), 38);
      for (float& v : x) v *= std::ldexp(1.0f, int(rng() % 40) - 20);
      auto y = x;
      kernels::cpu::rope(x.data(), dim, c.data(), sn.data(), interleaved);
      kernels::ref::rope(y.data(), dim, c.data(), sn.data(), interleaved);
      EXPECT_EQ(x, y) << "dim " << dim << (interleaved ? " interleaved" : "");
    }
  const int n = 5 * 128 + 44;
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[size_t(i)] = u(rng) * std::ldexp(1.0f, int(rng() % 24) - 12);
  std::fill(x.begin() + 256, x.begin() + 384, 0.0f);      // amax below the 1e-4 floor
  for (int i = 384; i < 512; ++i) x[size_t(i)] *= 1e-3f;   // many codes in the subnormal steps
  x[5] = 0.0f;
  x[6] = -0.0f;
  // Ties of the e4m3 rounding (block 1 holds 28, so its ue8m0 scale is exactly 2^-4): halfway
  // between normal codes both ways, between subnormal steps, and one ulp under a tie.
  const float ties[] = {28.0f, 1.0625f, 1.1875f, -1.0625f, 0x1p-10f, 0x1.8p-9f, -0x1.8p-9f, 0x1.5p-8f, std::nextafter(1.1875f, 0.0f)};
  for (int i = 128; i < 256; ++i) {
    const size_t t = size_t(i - 128) % std::size(ties);
    x[size_t(i)] = ties[t] * (t == 0 ? 1.0f : 0x1p-4f);
  }
  for (bool ue8m0 : {true, false}) {
    std::vector<uint8_t> a(n), b(n);
    std::vector<float> sa(6), sb(6);
    kernels::cpu::act_quant_fp8(x.data(), n, 128, ue8m0, a.data(), sa.data());
    kernels::ref::act_quant_fp8(x.data(), n, 128, ue8m0, b.data(), sb.data());
    EXPECT_EQ(sa, sb) << (ue8m0 ? "ue8m0" : "f32 scales");
    EXPECT_EQ(a, b) << (ue8m0 ? "ue8m0" : "f32 scales");
  }
}

// The MoE glue: gathered rows are the rows, and the combine is the reference's bits (each
// product exact in double, the slots in order), left-out slots included, on every tier.
TEST_P(KernelTwins, MoeGatherAndCombineAreTheReferenceBits) {
  std::mt19937 rng(47);
  for (const int width : {2048, 40, 7}) {
    for (const int n : {1, 37}) {
      SCOPED_TRACE("width " + std::to_string(width) + ", " + std::to_string(n) + " tokens");
      const int k = 6, rows = n * k;
      const auto d = randv(size_t(rows) * size_t(width), 53);
      std::vector<int32_t> pos(static_cast<size_t>(rows));
      std::vector<float> w(static_cast<size_t>(rows));
      for (int r = 0; r < rows; ++r) {
        pos[size_t(r)] = rng() % 5 == 0 ? -1 : int32_t(rng() % uint32_t(rows));
        w[size_t(r)] = std::ldexp(float(rng() % 1000 + 1), -10) * (r % 2 ? 1.0f : -1.0f) + 1e-7f * float(r);
      }
      std::vector<double> got(size_t(n) * size_t(width), -1.0), want(got.size(), -2.0);
      kernels::cpu::moe_combine(d.data(), width, pos.data(), w.data(), n, k, got.data());
      kernels::ref::moe_combine(d.data(), width, pos.data(), w.data(), n, k, want.data());
      EXPECT_TRUE(got == want);
      const size_t ldx = size_t(width) + 3;
      const auto x = randv(size_t(rows) * ldx, 59);
      std::vector<float> g(size_t(n) * size_t(width)), r(g.size());
      std::vector<int32_t> pick(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) pick[size_t(i)] = int32_t(rng() % uint32_t(rows));
      kernels::cpu::gather_rows(x.data(), ldx, pick.data(), n, width, g.data());
      kernels::ref::gather_rows(x.data(), ldx, pick.data(), n, width, r.data());
      EXPECT_TRUE(g == r);
      EXPECT_TRUE(std::equal(g.begin(), g.begin() + width, x.begin() + std::ptrdiff_t(size_t(pick[0]) * ldx)));
    }
  }
}

// The embedding gather: bf16, f16 and f32 rows (a row length with a tail, rows at an odd
// byte offset as a safetensors file may place them) are the reference's bits.
TEST_P(KernelTwins, EmbedIsTheReferenceBits) {
  std::mt19937 rng(61);
  const int rows = 7, cols = 300;
  for (const DType dt : {DType::BF16, DType::F16, DType::F32}) {
    SCOPED_TRACE(std::string("dtype ") + dtype_name(dt));
    const size_t es = dtype_size(dt);
    std::vector<uint8_t> buf(1 + size_t(rows) * size_t(cols) * es);
    for (size_t i = 1; i < buf.size(); i += es) {
      uint32_t bits = rng();
      if (dt == DType::F16 && (bits & 0x7C00u) == 0x7C00u) bits &= ~0x4000u;  // finite halves
      if (dt == DType::F32) bits &= ~0x40000000u;                            // finite floats
      std::memcpy(&buf[i], &bits, es);
    }
    Linear t;
    t.dtype = dt;
    t.rows = rows;
    t.cols = cols;
    t.data = buf.data() + 1;
    const std::vector<int32_t> ids{3, 0, 6, 3, 5};
    std::vector<float> got(ids.size() * size_t(cols), -1.0f), want(got.size(), -2.0f);
    kernels::cpu::embed(t, ids.data(), int(ids.size()), got.data());
    kernels::ref::embed(t, ids.data(), int(ids.size()), want.data());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
  }
}

// layernorm with f32 and bf16 weights: within a few ulp of the reference (its sums run in
// another order); with inputs whose sums are exact in any order (multiples of 1/64 over 128
// columns) the reference's bits, in place too.
TEST_P(KernelTwins, LayernormMatchesTheReference) {
  for (const DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(std::string("weights ") + dtype_name(dt));
    const int dim = 130;
    const auto gw = randv(size_t(dim), 62), gb = randv(size_t(dim), 63);
    std::vector<uint8_t> wb(size_t(dim) * 4), bb(size_t(dim) * 4);
    for (int i = 0; i < dim; ++i) {
      if (dt == DType::F32) {
        std::memcpy(&wb[4 * size_t(i)], &gw[size_t(i)], 4);
        std::memcpy(&bb[4 * size_t(i)], &gb[size_t(i)], 4);
      } else {
        const uint16_t hw = f32_to_bf16(gw[size_t(i)]), hb = f32_to_bf16(gb[size_t(i)]);
        std::memcpy(&wb[2 * size_t(i)], &hw, 2);
        std::memcpy(&bb[2 * size_t(i)], &hb, 2);
      }
    }
    const Vec w{dt, wb.data(), dim}, b{dt, bb.data(), dim};
    const auto x = randv(5 * size_t(dim), 64);
    std::vector<float> got(x.size()), want(x.size());
    kernels::cpu::layernorm(x.data(), w, b, 5, dim, 1e-6f, got.data());
    kernels::ref::layernorm(x.data(), w, b, 5, dim, 1e-6f, want.data());
    EXPECT_LE(max_rel(got, want), 1e-6);
    std::mt19937 rng(65);
    std::vector<float> e(3 * 128);
    for (float& v : e) v = float(int(rng() % 257) - 128) / 64.0f;
    std::vector<float> e_want(e.size());
    kernels::ref::layernorm(e.data(), w, b, 3, 128, 1e-6f, e_want.data());
    kernels::cpu::layernorm(e.data(), w, b, 3, 128, 1e-6f, e.data());
    EXPECT_EQ(e, e_want);
  }
}

// A token's MLA cache row in every layout: the bytes written and the values read back are
// the reference's, for latent and rope widths with tails, ue8m0 and plain fp8 scales, bf16
// rounding ties, infinities and NaNs where the layout stores floats or bf16.
TEST_P(KernelTwins, CacheRowsAreTheReferenceBits) {
  std::mt19937 rng(66);
  for (const CacheType type : {CacheType::F32, CacheType::BF16, CacheType::FP8, CacheType::FP8_656})
    for (const bool ue8m0 : {true, false})
      for (const auto& [L, R] : {std::pair{512, 64}, std::pair{200, 22}}) {
        SCOPED_TRACE(::testing::Message() << "cache " << int(type) << (ue8m0 ? " ue8m0" : "") << " " << L << "+" << R);
        auto lat = randv(size_t(L), uint32_t(67 + L)), kr = randv(size_t(R), uint32_t(68 + R));
        for (float& v : lat) v *= std::ldexp(1.0f, int(rng() % 20) - 10);
        kr[1] = 1.0f + 0x1p-8f;  // halfway between two bf16 values: to even
        kr[2] = 1.0f + 0x1.8p-7f;  // halfway, to even upwards
        kr[3] = -std::numeric_limits<float>::infinity();
        kr[4] = std::numeric_limits<float>::quiet_NaN();
        if (type == CacheType::F32 || type == CacheType::BF16) {
          lat[7] = 1.0f + 0x1.8p-7f;
          lat[9] = std::numeric_limits<float>::quiet_NaN();
        }
        MlaCacheView c;
        c.type = type;
        c.kv_lora = L;
        c.rope = R;
        c.ue8m0 = ue8m0;
        std::vector<uint8_t> a(c.token_bytes() * 3, 0xAB), bref(a.size(), 0xAB);
        c.data = a.data();
        kernels::cpu::mla_cache_write(c, 1, lat.data(), kr.data());
        c.data = bref.data();
        kernels::ref::mla_cache_write(c, 1, lat.data(), kr.data());
        EXPECT_TRUE(a == bref);  // the neighbouring rows untouched as well
        std::vector<float> la(static_cast<size_t>(L)), lb(la.size()), ra(static_cast<size_t>(R)), rb(ra.size());
        kernels::cpu::mla_cache_read(c, 1, la.data(), ra.data());
        kernels::ref::mla_cache_read(c, 1, lb.data(), rb.data());
        EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)));
        EXPECT_EQ(0, std::memcmp(ra.data(), rb.data(), ra.size() * sizeof(float)));
      }
}

INSTANTIATE_TEST_SUITE_P(Tiers, KernelTwins, ::testing::ValuesIn(kTiers), test::tier_name);

// The amx tier's start-up self-check passes on a correct tile unit (the model), so that on an
// AMX machine only a tile unit that computes wrong turns the tier off; and it fails on tiles
// that compute nothing.
TEST(AmxSelfCheck, PassesOnTheTileModelAndFailsOnBrokenTiles) {
  if (!kernels::isa_supported(kernels::Isa::Avx512)) GTEST_SKIP() << "the tile model's AVX-512 code needs AVX-512";
  const kernels::cpu::AmxKernels& model = kernels::cpu::amx_emulated_kernels();
  EXPECT_TRUE(kernels::cpu::amx_self_check(model));
  kernels::cpu::AmxKernels broken = model;
  broken.unit = [](const Linear&, int, int nr, int, int, const uint16_t*, int n, int, float* y, size_t ldy, bool, uint16_t*) {
    for (int i = 0; i < n; ++i) std::fill_n(y + size_t(i) * ldy, nr, 0.0f);
  };
  EXPECT_FALSE(kernels::cpu::amx_self_check(broken));
}

// The kernel profile counts every call: those of the calling thread and those made inside a
// caller's parallel loop on each of its threads, whose work is summed over the threads; a
// reset clears both, and nothing is counted while the profile is off.
TEST(KernelProfile, CountsCallsInsideAndOutsideParallelLoops) {
  constexpr int kDim = 64, kVectors = 1000;
  std::vector<float> x(size_t(kVectors) * kDim, 0.5f), c(kDim / 2, 1.0f), s(kDim / 2, 0.0f);
  auto rope_all = [&](bool parallel) {
#pragma omp parallel for num_threads(2) if (parallel)
    for (int i = 0; i < kVectors; ++i) kernels::rope(&x[size_t(i) * kDim], kDim, c.data(), s.data(), false);
  };
  const kernels::KernelStat before = kernels::profile_stat(kernels::KernelId::Other);
  rope_all(true);  // profile off
  kernels::KernelStat st = kernels::profile_stat(kernels::KernelId::Other);
  EXPECT_EQ(st.calls, before.calls);
  kernels::profile_reset();
  kernels::profile_enable(true);
  rope_all(true);
  rope_all(false);
  kernels::profile_enable(false);
  st = kernels::profile_stat(kernels::KernelId::Other);
  EXPECT_EQ(st.calls, 2 * kVectors);
  EXPECT_DOUBLE_EQ(st.flops, 2.0 * kVectors * 3.0 * kDim);
  EXPECT_GT(st.seconds, 0.0);         // the calling thread's calls
  EXPECT_GT(st.thread_seconds, 0.0);  // the loop's, over its threads
  kernels::profile_reset();
  st = kernels::profile_stat(kernels::KernelId::Other);
  EXPECT_EQ(st.calls, 0);
  EXPECT_EQ(st.flops, 0.0);
  EXPECT_EQ(st.thread_seconds, 0.0);
}

}  // namespace
