// The `dsa logits` / `dsa inspect` / `dsa make-model` contracts, through the binary.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "io/safetensors.h"
#include "kernels/kernels.h"

namespace fs = std::filesystem;
using namespace dsa;

namespace {

using Result = test::ShellResult;
Result sh(const std::string& cmd) { return test::shell(cmd + " 2>&1"); }

std::string tmp(const std::string& name) { return test::scratch(name); }

// `dsa bench ARGS --json` with stdout only: a subshell keeps the progress lines on stderr out of
// the JSON. (The parentheses go in by insert: GCC 12 misreads "(" + string as an overlapping copy.)
Result bench_json(const std::string& args) {
  std::string cmd = test::dsa_binary() + " bench " + args + " --json 2>/dev/null";
  cmd.insert(cmd.begin(), '(');
  cmd.push_back(')');
  return sh(cmd);
}

TEST(Cli, LogitsOnGoldenCaseMatches) {
  const std::string dir = test::golden_dir() + "/glm-fp8-shared";
  DSA_REQUIRE_FIXTURE(dir + "/case.json");
  std::ifstream in(dir + "/case.json");
  const auto cj = nlohmann::json::parse(in);
  std::string ids;
  for (int v : cj["ids"]) {
    if (!ids.empty()) ids += ",";
    ids += std::to_string(v);
  }
  const std::string out = tmp("glm.safetensors");
  const auto r = sh(test::dsa_binary() + " logits --model " + dir + "/model --ids " + ids + " --prompt-len " +
                    std::to_string(cj["prompt_len"].get<int>()) + " --kv-cache f32 --mtp --out " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto got = SafeTensors::open(out), want = SafeTensors::open(dir + "/expected.safetensors");
  for (const char* name : {"logits", "mtp.logits"}) {
    const auto& g = got.get(name);
    const auto& w = want.get(name);
    ASSERT_EQ(g.shape, w.shape) << name;
    const float* gp = reinterpret_cast<const float*>(g.data);
    const float* wp = reinterpret_cast<const float*>(w.data);
    double mx = 0, err = 0;
    for (int64_t i = 0; i < w.numel(); ++i) {
      mx = std::max(mx, double(std::fabs(wp[i])));
      err = std::max(err, double(std::fabs(gp[i] - wp[i])));
    }
    EXPECT_LE(err / mx, 1e-4) << name;
  }
  fs::remove(out);
}

// One by-weight table of `dsa bench --json` (calls and ms per `per`: a token or a step):
// every row with calls and a compute rate; returns the rows' milliseconds and how many rows
// are the weight `head`, each of which must run once per `per`.
std::pair<double, int> weight_rows_ms(const nlohmann::json& rows, const std::string& per, const std::string& head) {
  double ms = 0;
  int heads = 0;
  EXPECT_FALSE(rows.empty());
  for (const auto& w : rows) {
    ms += w.at("ms_per_" + per).get<double>();
    EXPECT_GT(w.at("calls_per_" + per).get<double>(), 0.0) << w.dump();
    EXPECT_GT(w.at("gflops").get<double>(), 0.0) << w.dump();
    if (w.at("weight") == head) {
      ++heads;
      EXPECT_EQ(w.at("calls_per_" + per).get<double>(), 1.0) << w.dump();
    }
  }
  return {ms, heads};
}

// The `dsa bench --json` contract external checks read, on the tiny model: every field, and
// the derived ones consistent with the measured ones; the decode step's products by weight
// add up to the linear kernels' time and include the lm_head once per token.
TEST(Cli, BenchJsonContract) {
  const std::string model = tmp("bench_tiny");
  ASSERT_EQ(sh(test::dsa_binary() + " make-model --preset tiny --force --out " + model).code, 0);
  const auto r = bench_json("--model " + model + " -p 8 -n 4 --depth 3 --repeat 2 --verify");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  for (const char* f : {"prefill_tokens_per_s", "decode_tokens_per_s", "decode_bytes_per_token", "read_bandwidth_gbps",
                        "prefill_flops_per_token", "peak_gflops"})
    EXPECT_GT(j.at(f).get<double>(), 0.0) << f;
  EXPECT_EQ(j.at("depth").get<int>(), 3);
  EXPECT_GE(j.at("threads").get<int>(), 1);
  EXPECT_EQ(j.at("isa").get<std::string>(), kernels::isa_name(kernels::isa()));
  EXPECT_FALSE(j.at("cpu_features").get<std::string>().empty());
  EXPECT_EQ(j.at("bf16_dot_peak_gflops").get<double>() > 0, kernels::bf16_dot_supported());
  const bool amx = kernels::isa() == kernels::Isa::Amx;
  EXPECT_EQ(j.at("amx_peak_gflops").get<double>() > 0, amx);
  EXPECT_EQ(j.at("prefill_gemm_amx_peak_fraction").get<double>() > 0, amx);
  const double tg = j["decode_tokens_per_s"], bytes = j["decode_bytes_per_token"], bw = j["read_bandwidth_gbps"];
  EXPECT_NEAR(j.at("decode_roofline_fraction").get<double>(), tg * bytes / (bw * 1e9), 1e-9 * tg * bytes / (bw * 1e9) + 1e-12);
  // --verify: the two-token step's time against the one-token step's.
  const double one = j.at("decode_step_ms"), two = j.at("verify_step_ms");
  EXPECT_NEAR(one, 1e3 / tg, 1e-9 * one);
  EXPECT_GT(two, 0.0);
  EXPECT_NEAR(j.at("verify_over_decode_step").get<double>(), two / one, 1e-9 * two / one);
  // Its ceiling, the two steps' rooflines: the draft adds at most a token's work, and its
  // attention one key more than the token's (mid + 2 keys against mid + 1, at the decode
  // run's average context mid = depth + n / 2).
  const double ceiling = j.at("verify_roofline_over_decode"), mid = 3 + 4 / 2;
  EXPECT_GE(ceiling, 1.0);
  EXPECT_LE(ceiling, 2.0 + 1.0 / (mid + 1));
  const double pp = j["prefill_tokens_per_s"], flops = j["prefill_flops_per_token"], peak = j["peak_gflops"];
  EXPECT_NEAR(j.at("prefill_peak_fraction").get<double>(), pp * flops / (peak * 1e9), 1e-9 * pp * flops / (peak * 1e9) + 1e-12);
  const auto cfg = nlohmann::json::parse(std::ifstream(model + "/config.json"));
  std::string head = std::to_string(cfg["vocab_size"].get<int>());
  head += 'x';
  head += std::to_string(cfg["hidden_size"].get<int>());
  const auto [by_weight_ms, heads_seen] = weight_rows_ms(j.at("decode_weights"), "token", head);
  EXPECT_EQ(heads_seen, 1) << j["decode_weights"].dump();
  const auto& k = j.at("decode_kernels");
  const double linear_ms = k.at("linear").at("ms_per_token").get<double>() +
                           (k.contains("linear_t") ? k["linear_t"]["ms_per_token"].get<double>() : 0.0);
  EXPECT_LE(by_weight_ms, linear_ms * 1.0001 + 1e-6);
  EXPECT_GE(by_weight_ms, linear_ms * 0.8) << "products missing from the by-weight list";
  // The prefill's products by weight: compute rates, within the linear kernels' prefill time
  // (the experts' calls inside their parallel loop are not listed).
  const auto& pk = j.at("prefill_kernels");
  const double prefill_linear_ms = pk.at("linear").at("ms_per_token").get<double>() +
                                   (pk.contains("linear_t") ? pk["linear_t"]["ms_per_token"].get<double>() : 0.0);
  // (The prompt runs the lm_head for its last token only: not counted as a head here.)
  const double prefill_rows_ms = weight_rows_ms(j.at("prefill_weights"), "token", "").first;
  EXPECT_LE(prefill_rows_ms, prefill_linear_ms * 1.0001 + 1e-6);
  // The verification step's: the lm_head once per step (both rows of logits in one call).
  EXPECT_EQ(weight_rows_ms(j.at("verify_weights"), "step", head).second, 1) << j["verify_weights"].dump();
  // --batch: the batched report, its derived figures consistent with the measured ones.
  const auto rb = bench_json("--model " + model + " --batch 2 -p 2 -n 2 --repeat 1");
  ASSERT_EQ(rb.code, 0) << rb.out;
  const auto b = nlohmann::json::parse(rb.out);
  EXPECT_EQ(b.at("batch").get<int>(), 2);
  const double per_seq = b.at("decode_per_seq_tokens_per_s"), step_ms = b.at("decode_step_ms");
  EXPECT_NEAR(b.at("decode_aggregate_tokens_per_s").get<double>(), 2 * per_seq, 1e-9 * per_seq);
  EXPECT_NEAR(step_ms, 1e3 / per_seq, 1e-9 * step_ms);
  EXPECT_NEAR(b.at("decode_roofline_fraction").get<double>(), b.at("decode_step_roofline_ms").get<double>() / step_ms, 1e-9);
  EXPECT_GT(b.at("mixed_step_ms").get<double>(), 0.0);
  // The step's products by weight: the lm_head once per step for all the sequences, every
  // row within the step's time.
  const auto [batch_rows_ms, batch_heads] = weight_rows_ms(b.at("decode_step_weights"), "step", head);
  EXPECT_EQ(batch_heads, 1) << b["decode_step_weights"].dump();
  EXPECT_LE(batch_rows_ms, step_ms);
  EXPECT_EQ(b.at("bf16_dot_peak_gflops").get<double>() > 0, kernels::bf16_dot_supported());
  EXPECT_EQ(b.at("amx_peak_gflops").get<double>() > 0, kernels::isa() == kernels::Isa::Amx);
  fs::remove_all(model);
}

// DSA_ISA picks a lower tier by name (inspect and bench say which runs); a name that is not
// a tier, or a tier this CPU lacks, is one clear error before any work.
TEST(Cli, IsaFromTheEnvironment) {
  const std::string model = tmp("isa_tiny");
  ASSERT_EQ(sh(test::dsa_binary() + " make-model --preset tiny --force --out " + model).code, 0);
  const auto best = sh(test::dsa_binary() + " inspect --model " + model);
  ASSERT_EQ(best.code, 0);
  EXPECT_NE(best.out.find(std::string("kernels:      ") + kernels::isa_name(kernels::isa()) + " tier"), std::string::npos) << best.out;
  const auto generic = sh("DSA_ISA=generic " + test::dsa_binary() + " inspect --model " + model);
  ASSERT_EQ(generic.code, 0);
  EXPECT_NE(generic.out.find("kernels:      generic tier"), std::string::npos) << generic.out;
  const auto bad = sh("DSA_ISA=sse9 " + test::dsa_binary() + " inspect --model " + model);
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("DSA_ISA=sse9: expected generic, avx2, avx512 or amx"), std::string::npos) << bad.out;
  EXPECT_EQ(bad.out.find("family:"), std::string::npos) << "work done despite the bad tier";
  for (kernels::Isa t : {kernels::Isa::Avx2, kernels::Isa::Avx512, kernels::Isa::Amx}) {
    if (kernels::isa_supported(t)) continue;
    const auto r = sh(std::string("DSA_ISA=") + kernels::isa_name(t) + " " + test::dsa_binary() + " inspect --model " + model);
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.out.find("this CPU cannot run the"), std::string::npos) << r.out;
  }
  fs::remove_all(model);
}

TEST(Cli, LogitsErrorsLeaveNoOutput) {
  const std::string model = tmp("tiny");
  ASSERT_EQ(sh(test::dsa_binary() + " make-model --preset tiny --out " + model).code, 0);
  const std::string out = tmp("bad.safetensors");
  const struct { std::string args, needle; } cases[] = {
      {"--ids 1,2,x --prompt-len 2", "--ids"},
      {"--ids 1,2,3 --prompt-len 4", "--prompt-len"},
      {"--ids 1,2,99999 --prompt-len 2", "out of range"},
      {"--ids 1,2,3 --prompt-len 2 --kv-cache fp16", "--kv-cache"},
  };
  for (const auto& c : cases) {
    const auto r = sh(test::dsa_binary() + " logits --model " + model + " " + c.args + " --out " + out);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(out)) << c.args;
  }
  const auto r = sh(test::dsa_binary() + " logits --model " + model + "/missing --ids 1 --prompt-len 1 --out " + out);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("does not exist"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out));

  const auto ins = sh(test::dsa_binary() + " inspect --model " + model);
  ASSERT_EQ(ins.code, 0) << ins.out;
  for (const char* s : {"DeepSeek-V3.2", "schedule:", "cache/token:", "F8_E4M3"}) EXPECT_NE(ins.out.find(s), std::string::npos) << ins.out;
  const auto ok = sh(test::dsa_binary() + " logits --model " + model + " --ids 1,2,3,4 --prompt-len 2 --mtp --dump-internals --out " + out);
  ASSERT_EQ(ok.code, 0) << ok.out;
  const auto st = SafeTensors::open(out);
  EXPECT_EQ(st.get("logits").shape, (std::vector<int64_t>{4, 1024}));
  EXPECT_EQ(st.get("mtp.logits").shape, (std::vector<int64_t>{3, 1024}));
  EXPECT_EQ(st.get("indexer.topk.3").shape, (std::vector<int64_t>{3, 8}));
  // make-model never overwrites a checkpoint unasked, and --force replaces every file of
  // the old one (no stale shard left beside the new index).
  const auto again = sh(test::dsa_binary() + " make-model --preset tiny --out " + model);
  EXPECT_NE(again.code, 0);
  EXPECT_NE(again.out.find("not empty"), std::string::npos) << again.out;
  const auto forced = sh(test::dsa_binary() + " make-model --preset tiny --shards 2 --force --out " + model);
  ASSERT_EQ(forced.code, 0) << forced.out;
  EXPECT_FALSE(fs::exists(model + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(model + "/model.safetensors.index.json"));
  for (const auto& e : fs::directory_iterator(fs::path(model).parent_path()))  // no staging folder left
    EXPECT_NE(e.path().filename().string().rfind(fs::path(model).filename().string() + ".partial", 0), 0u) << e.path();
  // Sampling values that used to produce garbage ids; a deeply nested line for tokenize.
  for (const char* bad : {"--temp nan", "--top-p 2", "--min-p -1", "--seed -1"}) {
    const auto r = sh(test::dsa_binary() + " run --model " + model + " --ids 1,2 --print-ids -n 2 " + bad);
    EXPECT_NE(r.code, 0) << bad;
    EXPECT_NE(r.out.find(std::string(bad).substr(0, std::string(bad).find(' '))), std::string::npos) << r.out;
  }
  const auto deep = sh("printf '%s' '" + std::string(2000, '[') + std::string(2000, ']') + "' | " + test::dsa_binary() +
                       " tokenize --decode --model " + model);
  EXPECT_EQ(deep.code, 1) << deep.out;
  EXPECT_NE(deep.out.find("nested deeper"), std::string::npos) << deep.out;
  const auto wrap = sh("echo '[-4294967296]' | " + test::dsa_binary() + " tokenize --decode --model " + model);
  EXPECT_EQ(wrap.code, 1) << wrap.out;  // not token 0
  EXPECT_NE(wrap.out.find("not a token id"), std::string::npos) << wrap.out;
  const auto deep_bench = sh(test::dsa_binary() + " bench --model " + model + " --depth 16000000 -p 1 -n 1 --repeat 1");
  EXPECT_EQ(deep_bench.code, 1) << deep_bench.out;
  EXPECT_NE(deep_bench.out.find("max_position_embeddings"), std::string::npos) << deep_bench.out;
  const auto verify_batch = sh(test::dsa_binary() + " bench --model " + model + " --batch 2 --verify -p 1 -n 1 --repeat 1");
  EXPECT_EQ(verify_batch.code, 1) << verify_batch.out;
  EXPECT_NE(verify_batch.out.find("--verify"), std::string::npos) << verify_batch.out;
  const auto omp = sh("OMP_NUM_THREADS=100000 " + test::dsa_binary() + " inspect --model " + model);
  EXPECT_EQ(omp.code, 1) << omp.out;
  EXPECT_NE(omp.out.find("OMP_NUM_THREADS"), std::string::npos) << omp.out;
  // logits never replaces something that is not a regular file (a FIFO here).
  const std::string fifo = tmp("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto ff = sh(test::dsa_binary() + " logits --model " + model + " --ids 1,2 --prompt-len 1 --out " + fifo);
  EXPECT_NE(ff.code, 0) << ff.out;
  EXPECT_TRUE(fs::is_fifo(fifo));
  fs::remove(fifo);
  fs::remove_all(model);
  fs::remove(out);
}

}  // namespace
