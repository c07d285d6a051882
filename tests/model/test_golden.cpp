// Every case under the golden directory (all of them, not a fixed list) through the
// teacher-forced runner, with both the optimized kernels and their naive twins, compared
// as the golden README prescribes.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "fixtures.h"
#include "io/safetensors.h"
#include "model/teacher_forcing.h"

namespace fs = std::filesystem;
using namespace dsa;

namespace {

std::vector<std::string> list_cases() {
  std::vector<std::string> cases;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(test::golden_dir(), ec))
    if (fs::exists(e.path() / "case.json")) cases.push_back(e.path().filename().string());
  std::sort(cases.begin(), cases.end());
  if (cases.empty()) cases.push_back("none");
  return cases;
}

std::vector<float> floats(const TensorInfo& t) {
  std::vector<float> v(size_t(t.numel()));
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}
std::vector<int32_t> ints(const TensorInfo& t) {
  std::vector<int32_t> v(size_t(t.numel()));
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}

// max|a - b| / max|golden| over finite golden entries; worst row through *row.
double rel_err(const std::vector<float>& got, const std::vector<float>& want, int64_t width, int64_t* row) {
  double mx = 0, err = 0;
  for (float w : want)
    if (std::isfinite(w)) mx = std::max(mx, double(std::fabs(w)));
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(want[i])) {
      EXPECT_FALSE(std::isfinite(got[i])) << "entry " << i << " should be -inf";
      continue;
    }
    const double d = std::fabs(double(got[i]) - want[i]);
    if (d > err) { err = d; *row = int64_t(i) / width; }
  }
  return err / std::max(mx, 1e-30);
}

void expect_row_sets(const std::string& name, const std::vector<int32_t>& got, const std::vector<int32_t>& want, int64_t width) {
  ASSERT_EQ(got.size(), want.size()) << name;
  for (size_t r = 0; r * size_t(width) < want.size(); ++r) {
    std::multiset<int32_t> g(got.begin() + ptrdiff_t(r * size_t(width)), got.begin() + ptrdiff_t((r + 1) * size_t(width)));
    std::multiset<int32_t> w(want.begin() + ptrdiff_t(r * size_t(width)), want.begin() + ptrdiff_t((r + 1) * size_t(width)));
    EXPECT_EQ(g, w) << name << " row " << r << " selects a different set";
  }
}

class Golden : public ::testing::TestWithParam<std::tuple<std::string, Backend>> {};

TEST_P(Golden, MatchesReference) {
  const auto [name, backend] = GetParam();
  const std::string dir = test::golden_dir() + "/" + name;
  DSA_REQUIRE_FIXTURE(dir + "/case.json");
  std::ifstream in(dir + "/case.json");
  const auto cj = nlohmann::json::parse(in);
  const std::vector<int32_t> ids = cj.at("ids").get<std::vector<int32_t>>();
  const int prompt_len = cj.at("prompt_len").get<int>();
  const bool fp8_cache = cj.at("kv_cache").get<std::string>() == "fp8";

  kernels::set_backend(backend);
  auto model = Model::load(dir + "/model", true);
  const bool mtp = model->weights.mtp.has_value();
  const auto r = run_teacher_forced(*model, ids, prompt_len, fp8_cache ? CacheType::FP8 : CacheType::F32, mtp, true);
  kernels::set_backend(Backend::Cpu);
  const SafeTensors exp = SafeTensors::open(dir + "/expected.safetensors");

  const double tol = fp8_cache ? 3e-2 : 1e-4;
  for (const auto& [tname, t] : exp.tensors()) {
    SCOPED_TRACE(tname);
    const int64_t width = t.shape.size() > 1 ? t.shape[1] : 1;
    if (tname == "logits" || tname == "mtp.logits" || (!fp8_cache && tname.rfind("hidden.", 0) == 0)) {
      const std::vector<float>& got = tname == "logits" ? r.logits : tname == "mtp.logits" ? r.mtp_logits : r.floats.at(tname).v;
      const std::vector<float> want = floats(t);
      ASSERT_EQ(got.size(), want.size());
      int64_t row = -1;
      const double e = rel_err(got, want, width, &row);
      EXPECT_LE(e, tol) << name << " " << tname << ": worst relative error " << e << " at row " << row;
      std::printf("[ golden ] %-24s %-16s rel err %.2e (worst row %lld)\n", name.c_str(), tname.c_str(), e, (long long)row);
      if (fp8_cache && tname == "logits") {
        // Same argmax wherever the golden top-2 gap is clear of the fp8 knife edges.
        double mx = 0;
        for (float w : want) mx = std::max(mx, double(std::fabs(w)));
        for (int64_t rr = 0; rr < t.shape[0]; ++rr) {
          const float* w = &want[size_t(rr * width)];
          const float* g = &got[size_t(rr * width)];
          const int64_t wa = std::max_element(w, w + width) - w, ga = std::max_element(g, g + width) - g;
          std::vector<float> sorted(w, w + width);
          std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
          if (sorted[0] - sorted[1] > 3e-2 * mx) {
            EXPECT_EQ(ga, wa) << "argmax differs at row " << rr;
          }
        }
      }
    } else if (!fp8_cache && (tname.rfind("indexer.topk.", 0) == 0 || tname.rfind("moe.experts.", 0) == 0)) {
      ASSERT_TRUE(r.ints.count(tname)) << "engine produced no " << tname;
      expect_row_sets(tname, r.ints.at(tname).v, ints(t), width);
    } else if (!fp8_cache && tname.rfind("indexer.scores.", 0) == 0) {
      // Diagnostic strength: fp8 codes may differ at a few knife edges (README: ~1e-3).
      ASSERT_TRUE(r.floats.count(tname)) << "engine produced no " << tname;
      int64_t row = -1;
      const double e = rel_err(r.floats.at(tname).v, floats(t), width, &row);
      EXPECT_LE(e, 1e-2) << tname << " worst row " << row;
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<Golden::ParamType>& info) {
  std::string s = std::get<0>(info.param) + (std::get<1>(info.param) == Backend::Ref ? "_ref" : "_cpu");
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Cases, Golden, ::testing::Combine(::testing::ValuesIn(list_cases()), ::testing::Values(Backend::Cpu, Backend::Ref)),
                         case_name);

// Logits of every row of the v32-fp8-sparse-kvexact prompt with the given cache, the
// prompt in one forward call (split = 0) or split at `split` into two calls.
std::vector<float> prompt_logits(const Model& model, const std::vector<int32_t>& ids, CacheType cache, int split) {
  const int T = int(ids.size()), V = model.config.vocab_size;
  StateOptions so;
  so.max_ctx = T;
  so.max_tokens = T;
  so.max_logit_rows = T;
  so.cache = cache;
  ForwardOptions fo;
  fo.all_logits = true;
  State st(model.config, so);
  std::vector<float> got(size_t(T) * size_t(V));
  int done = 0;
  for (const int n : split > 0 ? std::vector<int>{split, T - split} : std::vector<int>{T}) {
    const float* l = forward(model, st, ids.data() + done, n, fo);
    std::copy_n(l, size_t(n) * size_t(V), got.data() + size_t(done) * size_t(V));
    done += n;
  }
  return got;
}

// Chunked prefill: the prompt split in two calls runs the second chunk through the
// absorbed path on a non-empty cache; its logits must match the reference rows too.
TEST(GoldenChunked, SplitPrefillMatchesReference) {
  const std::string dir = test::golden_dir() + "/v32-fp8-sparse-kvexact";
  DSA_REQUIRE_FIXTURE(dir + "/case.json");
  std::ifstream in(dir + "/case.json");
  const auto ids = nlohmann::json::parse(in).at("ids").get<std::vector<int32_t>>();
  auto model = Model::load(dir + "/model", false);
  const std::vector<float> got = prompt_logits(*model, ids, CacheType::F32, int(ids.size()) / 3);
  const SafeTensors exp = SafeTensors::open(dir + "/expected.safetensors");
  int64_t row = -1;
  const double e = rel_err(got, floats(exp.get("logits")), model->config.vocab_size, &row);
  EXPECT_LE(e, 1e-4) << "worst row " << row;
}

// With a quantized cache the second chunk dequantizes the layer's cache once and runs its
// queries in parallel; it must agree with the whole prompt in one call, which reads the same
// dequantized latents through the expanded (MHA) form.
TEST(GoldenChunked, SplitPrefillWithFp8CacheMatchesOneCall) {
  const std::string dir = test::golden_dir() + "/v32-fp8-sparse-kvexact";
  DSA_REQUIRE_FIXTURE(dir + "/case.json");
  std::ifstream in(dir + "/case.json");
  const auto ids = nlohmann::json::parse(in).at("ids").get<std::vector<int32_t>>();
  auto model = Model::load(dir + "/model", false);
  const std::vector<float> whole = prompt_logits(*model, ids, CacheType::FP8, 0);
  const std::vector<float> got = prompt_logits(*model, ids, CacheType::FP8, int(ids.size()) / 3);
  int64_t row = -1;
  const double e = rel_err(got, whole, model->config.vocab_size, &row);
  EXPECT_LE(e, 1e-4) << "worst row " << row;
}

}  // namespace
