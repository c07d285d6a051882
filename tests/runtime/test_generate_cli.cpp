// `dsa run`, `dsa chat` and `dsa perplexity` through the binary: the --ids/--print-ids
// contract on every golden model (greedy ids are the argmax of the teacher-forced
// logits), and the text commands on the tiny model with the synthetic tokenizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "cli_util.h"
#include "fixtures.h"
#include "runtime/teacher_forcing.h"
#include "tiny_model.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using namespace dsa;

namespace {

struct Result {
  int code;
  std::string out, err;
};

// stdout and stderr separately (stderr through a temp file).
Result sh(const std::string& cmd) {
  static int k = 0;
  const std::string errf = test::scratch("stderr_" + std::to_string(k++));
  Result r{-1, "", ""};
  FILE* p = ::popen((cmd + " 2>" + errf).c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream e(errf);
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  fs::remove(errf);
  return r;
}

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

TEST(RunCli, GreedyIdsAreTheTeacherForcedArgmaxOnEveryGoldenModel) {
  const auto cases = test::golden_cases();
  ASSERT_TRUE(test::golden_cases_complete(cases));
  for (const auto& name : cases) {
    SCOPED_TRACE(name);
    const fs::path dir = fs::path(test::golden_dir()) / name;
    std::ifstream in(dir / "case.json");
    const auto cj = nlohmann::json::parse(in);
    const int plen = cj["prompt_len"].get<int>();
    const std::vector<int32_t> all = cj["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> prompt(all.begin(), all.begin() + plen);
    const std::string model_dir = (dir / "model").string();
    const auto r = sh(test::dsa_binary() + " run --model " + model_dir + " --ids " + join(prompt) + " --print-ids -n 4 --greedy");
    ASSERT_EQ(r.code, 0) << r.err;
    // stdout is exactly one line of ids.
    ASSERT_FALSE(r.out.empty());
    EXPECT_EQ(r.out.back(), '\n');
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    const std::vector<int32_t> gen = cli::parse_ids(trim(r.out), "stdout");
    auto model = Model::load(model_dir, false, false);
    const auto& eos = model->config.eos_token_ids;
    const bool ended = std::find(eos.begin(), eos.end(), gen.back()) != eos.end();
    EXPECT_TRUE(gen.size() == 4u || (ended && gen.size() < 4u)) << r.out;
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), gen.begin(), gen.end());
    const auto tf = run_teacher_forced(*model, seq, plen, CacheType::FP8, false, false);
    const int V = tf.vocab;
    for (size_t k = 0; k < gen.size(); ++k) {
      const float* row = &tf.logits[(size_t(plen) - 1 + k) * size_t(V)];
      EXPECT_EQ(gen[k], int32_t(std::max_element(row, row + V) - row)) << "token " << k;
    }
  }
}

TEST(RunCli, MtpGivesTheSameGreedyIds) {
  // Speculative decoding changes the speed, not the tokens: on every golden model with an
  // MTP layer, greedy ids with --mtp are those without (f32 cache: the two-token verify
  // pass rounds like one-token decode to the last bits, and no fp8 rounding amplifies it).
  // A checkpoint without one is refused by name.
  const auto cases = test::golden_cases();
  ASSERT_TRUE(test::golden_cases_complete(cases));
  int with = 0;
  for (const auto& name : cases) {
    SCOPED_TRACE(name);
    const std::string model_dir = test::golden_dir() + "/" + name + "/model";
    const std::string cmd = test::dsa_binary() + " run --model " + model_dir +
                            " --ids 3,1,4,1,5,9,2,6 --print-ids -n 12 --greedy --ignore-eos --kv-cache f32";
    const auto spec = sh(cmd + " --mtp");
    if (Model::load(model_dir, false, false)->config.num_nextn_predict_layers == 0) {
      EXPECT_NE(spec.code, 0);
      EXPECT_NE(spec.err.find("num_nextn_predict_layers = 0"), std::string::npos) << spec.err;
      continue;
    }
    ++with;
    const auto plain = sh(cmd);
    ASSERT_EQ(plain.code, 0) << plain.err;
    ASSERT_EQ(spec.code, 0) << spec.err;
    EXPECT_EQ(spec.out, plain.out);
    EXPECT_EQ(cli::parse_ids(trim(spec.out), "stdout").size(), 12u);
    EXPECT_NE(spec.err.find("drafts accepted"), std::string::npos) << spec.err;
  }
  EXPECT_GT(with, 0) << "no golden model with an MTP layer under " << test::golden_dir();
}

TEST(RunCli, IdsErrors) {
  const std::string dir = test::tiny_model_dir();
  for (const char* args : {"--ids 1,2,x --print-ids", "--ids 1,2,99999 --print-ids", "--ids 1,2", "-p hi --ids 1,2 --print-ids",
                           "--ids 1,2 --print-ids --stop x"}) {
    const auto r = sh(test::dsa_binary() + " run --model " + dir + " " + args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_TRUE(r.out.empty()) << args << ": " << r.out;
  }
}

TEST(RunCli, TextInTextOut) {
  const std::string dir = test::tiny_model_dir();
  const Tokenizer tok = Tokenizer::from_dir(dir);
  const std::string base = test::dsa_binary() + " run --model " + dir + " -p 'Once upon a time' -n 12 --ignore-eos";
  const auto ids = sh(base + " --greedy --print-ids");
  ASSERT_EQ(ids.code, 0) << ids.err;
  const auto text = sh(base + " --greedy");
  ASSERT_EQ(text.code, 0) << text.err;
  const std::vector<int32_t> gen = cli::parse_ids(trim(ids.out), "stdout");
  EXPECT_EQ(gen.size(), 12u);
  EXPECT_EQ(trim(text.out), trim(tok.decode(gen)));
  for (const char* s : {"load:", "prompt:", "tok/s", "generated: 12 tokens"}) EXPECT_NE(text.err.find(s), std::string::npos) << text.err;

  // A seed reproduces a sampled run; the seed used is printed when none is given.
  const auto s1 = sh(base + " --seed 7"), s2 = sh(base + " --seed 7"), s3 = sh(base);
  ASSERT_EQ(s1.code, 0) << s1.err;
  EXPECT_EQ(s1.out, s2.out);
  EXPECT_NE(s3.err.find("seed: "), std::string::npos) << s3.err;

  // A stop string from the middle of the greedy text ends the output right before it.
  const std::string t = trim(text.out);
  if (t.size() >= 6) {
    const std::string stop = t.substr(t.size() / 2, 2);
    if (stop.find('\'') == std::string::npos && stop.find('\\') == std::string::npos) {
      const auto st = sh(base + " --greedy --stop '" + stop + "'");
      ASSERT_EQ(st.code, 0) << st.err;
      EXPECT_EQ(trim(st.out), t.substr(0, t.find(stop)));
      EXPECT_NE(st.err.find("stop string"), std::string::npos) << st.err;
    }
  }
  const auto chat = sh(test::dsa_binary() + " run --model " + dir + " -p hi -n 3 --thinking --seed 1");
  EXPECT_EQ(chat.code, 0) << chat.err;
}

TEST(ChatCli, TwoTurnsThroughAPipe) {
  const std::string dir = test::tiny_model_dir();
  const auto r = sh("printf 'Hello there\\nHow are you?\\n' | " + test::dsa_binary() + " chat --model " + dir +
                    " -n 8 --seed 3 --thinking --system 'Be brief.' --block-size 4");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::regex turn(R"(\[prompt: (\d+) tokens \((\d+) reused\))");
  std::vector<std::pair<int, int>> turns;
  for (std::sregex_iterator it(r.err.begin(), r.err.end(), turn), end; it != end; ++it)
    turns.emplace_back(std::stoi((*it)[1]), std::stoi((*it)[2]));
  ASSERT_EQ(turns.size(), 2u) << r.err;
  EXPECT_EQ(turns[0].second, 0);
  EXPECT_GT(turns[1].first, turns[0].first);
  EXPECT_GT(turns[1].second, 0);  // the second turn reuses the first turn's cache
  // /reset clears the conversation: the next prompt is short again, /exit stops reading.
  const auto rr = sh("printf 'Hello there\\n/reset\\nHello there\\n/exit\\nnot read\\n' | " + test::dsa_binary() +
                     " chat --model " + dir + " -n 4 --greedy");
  ASSERT_EQ(rr.code, 0) << rr.err;
  std::vector<std::pair<int, int>> t2;
  for (std::sregex_iterator it(rr.err.begin(), rr.err.end(), turn), end; it != end; ++it)
    t2.emplace_back(std::stoi((*it)[1]), std::stoi((*it)[2]));
  ASSERT_EQ(t2.size(), 2u) << rr.err;
  EXPECT_EQ(t2[0].first, t2[1].first);
  EXPECT_NE(rr.err.find("cleared"), std::string::npos);
}

TEST(PerplexityCli, ReportsPplWithError) {
  const std::string dir = test::tiny_model_dir();
  const std::string file = dir + "/text.txt";
  {
    std::ofstream f(file);
    for (int i = 0; i < 10; ++i) f << "The quick brown fox jumps over the lazy dog. Hello, how are you today? ";
  }
  const auto r = sh(test::dsa_binary() + " perplexity --model " + dir + " -f " + file + " --ctx 32");
  ASSERT_EQ(r.code, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(perplexity: ([0-9.]+) ± ([0-9.]+))"))) << r.out;
  const double ppl = std::stod(m[1]), se = std::stod(m[2]);
  EXPECT_GT(ppl, 1.0);
  EXPECT_TRUE(std::isfinite(ppl));
  EXPECT_GT(se, 0.0);
  EXPECT_NE(r.err.find("ppl"), std::string::npos) << r.err;
  const auto bad = sh(test::dsa_binary() + " perplexity --model " + dir + " -f " + file + " --ctx 100000");
  EXPECT_NE(bad.code, 0);
}

// Positions past max_position_embeddings are refused, not computed with RoPE the model
// was never trained for: perplexity's --ctx and the ids given to logits.
TEST(PerplexityCli, ContextBeyondMaxPositionsIsRefused) {
  const std::string dir = test::scratch("maxpos");
  MakeModelOptions o;
  o.preset = "tiny";
  o.out_dir = dir;
  o.verbose = false;
  o.config_patch = R"({"max_position_embeddings": 24})";
  make_model(o);
  write_synthetic_tokenizer(dir, 1024);
  const std::string file = dir + "/text.txt";
  {
    std::ofstream f(file);
    for (int i = 0; i < 10; ++i) f << "The quick brown fox jumps over the lazy dog. ";
  }
  const auto ok = sh(test::dsa_binary() + " perplexity --model " + dir + " -f " + file + " --ctx 24");
  EXPECT_EQ(ok.code, 0) << ok.err;
  const auto bad = sh(test::dsa_binary() + " perplexity --model " + dir + " -f " + file + " --ctx 25");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--ctx 25 exceeds the model's max_position_embeddings (24)"), std::string::npos) << bad.err;
  std::string ids = "1";
  for (int i = 2; i <= 25; ++i) ids += "," + std::to_string(i);
  const std::string out = dir + "/logits.safetensors";
  const auto lg = sh(test::dsa_binary() + " logits --model " + dir + " --ids " + ids + " --prompt-len 4 --out " + out);
  EXPECT_NE(lg.code, 0);
  EXPECT_NE(lg.err.find("--ids: 25 tokens exceed the model's max_position_embeddings (24)"), std::string::npos) << lg.err;
  EXPECT_FALSE(fs::exists(out));
}

// `dsa run --prompts`: one result line per prompt, in input order, whatever --parallel;
// each the same as that prompt run alone (greedy, and sampled with a fixed seed).
TEST(RunCli, PromptsFileGivesEachPromptsResultInOrder) {
  const std::string dir = test::tiny_model_dir();
  const std::string ids_file = test::scratch("prompts_ids.txt");
  const std::vector<std::string> id_lines = {"5,9,2", "7,1,3,3,8,2,11,40", "100", "3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", "9,9"};
  {
    std::ofstream f(ids_file);
    for (const auto& l : id_lines) f << l << "\n";
  }
  for (const std::string sampling : {"--greedy", "--seed 7 --temp 0.9"}) {
    SCOPED_TRACE(sampling);
    const std::string base = test::dsa_binary() + " run --model " + dir + " --print-ids -n 7 --ignore-eos " + sampling;
    const auto all = sh(base + " --prompts " + ids_file);
    ASSERT_EQ(all.code, 0) << all.err;
    const auto two = sh(base + " --prompts " + ids_file + " --parallel 2");
    const auto one = sh(base + " --prompts " + ids_file + " --parallel 1");
    EXPECT_EQ(two.out, all.out);
    EXPECT_EQ(one.out, all.out);
    std::vector<std::string> lines;
    std::istringstream in(all.out);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    ASSERT_EQ(lines.size(), id_lines.size());
    for (size_t i = 0; i < id_lines.size(); ++i) {
      const auto alone = sh(base + " --ids " + id_lines[i]);
      ASSERT_EQ(alone.code, 0) << alone.err;
      EXPECT_EQ(lines[i], trim(alone.out)) << "prompt " << i;
      EXPECT_EQ(cli::parse_ids(lines[i], "line").size(), 7u);
    }
  }
  // Text prompts are JSON strings, results too.
  const std::string text_file = test::scratch("prompts_text.txt");
  {
    std::ofstream f(text_file);
    f << "\"Hello there\"\n\n\"a second\\nprompt\"\n";
  }
  const auto text = sh(test::dsa_binary() + " run --model " + dir + " -n 5 --greedy --prompts " + text_file + " --parallel 2");
  ASSERT_EQ(text.code, 0) << text.err;
  std::istringstream tin(text.out);
  std::vector<std::string> results;
  for (std::string l; std::getline(tin, l);) results.push_back(nlohmann::json::parse(l).get<std::string>());
  ASSERT_EQ(results.size(), 2u);
  const auto alone = sh(test::dsa_binary() + " run --model " + dir + " -n 5 --greedy -p 'Hello there'");
  EXPECT_EQ(results[0], trim(alone.out));
  // A line that is not a JSON string is an error naming it.
  const std::string bad = test::scratch("prompts_bad.txt");
  {
    std::ofstream f(bad);
    f << "\"ok\"\nnot json\n";
  }
  const auto err = sh(test::dsa_binary() + " run --model " + dir + " -n 2 --prompts " + bad);
  EXPECT_NE(err.code, 0);
  EXPECT_NE(err.err.find("line 2"), std::string::npos) << err.err;
  // Id lines too, by the file's line number (blank lines count, though they hold no prompt).
  const std::string bad_ids = test::scratch("prompts_bad_ids.txt");
  {
    std::ofstream f(bad_ids);
    f << "1,2\n\n3,x\n";
  }
  const auto err_ids = sh(test::dsa_binary() + " run --model " + dir + " -n 2 --print-ids --prompts " + bad_ids);
  EXPECT_NE(err_ids.code, 0);
  EXPECT_NE(err_ids.err.find("line 3 of"), std::string::npos) << err_ids.err;
}

// `dsa logits --batch-with N`: the same file as alone, on every golden model.
TEST(LogitsCli, BatchWithWritesTheSameFileAsAlone) {
  const auto cases = test::golden_cases();
  ASSERT_TRUE(test::golden_cases_complete(cases));
  for (const auto& name : cases) {
    SCOPED_TRACE(name);
    const std::string dir = test::golden_dir() + "/" + name;
    std::ifstream in(dir + "/case.json");
    const auto cj = nlohmann::json::parse(in);
    const std::string ids = join(cj.at("ids").get<std::vector<int32_t>>());
    const std::string base = test::dsa_binary() + " logits --model " + dir + "/model --ids " + ids + " --prompt-len " +
                             std::to_string(cj.at("prompt_len").get<int>()) + " --kv-cache " +
                             (cj.at("kv_cache").get<std::string>() == "fp8" ? "fp8" : "f32");
    const std::string a = test::scratch(name + "_alone.safetensors"), b = test::scratch(name + "_with.safetensors");
    const auto ra = sh(base + " --out " + a), rb = sh(base + " --batch-with 6 --batch-seed 9 --out " + b);
    ASSERT_EQ(ra.code, 0) << ra.err;
    ASSERT_EQ(rb.code, 0) << rb.err;
    std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
    const std::string da((std::istreambuf_iterator<char>(fa)), {}), db((std::istreambuf_iterator<char>(fb)), {});
    EXPECT_FALSE(da.empty());
    EXPECT_TRUE(da == db) << "the files differ";
  }
}

}  // namespace
