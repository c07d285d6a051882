// `dsa tokenize` as external checks use it: JSON lines in, JSON lines out, clear errors; and
// `dsa bench mask`, which reads the same tokenizer folder.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "fixtures.h"
#include "jsonl.h"

namespace {

namespace fs = std::filesystem;

struct Result {
  int status;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Runs the dsa binary with `args`, stdin from a temp file; stdout/stderr captured to files.
Result run_dsa(const std::string& args, const std::string& input) {
  const fs::path dir = dsa::test::scratch(::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::create_directories(dir);
  { std::ofstream(dir / "in", std::ios::binary) << input; }
  // Built with append(): GCC 12 reports a false -Wrestrict on `"literal" + std::string`.
  std::string cmd;
  for (const std::string& part : {std::string("'"), dsa::test::dsa_binary(), std::string("' "), args,
                                  std::string(" < '"), (dir / "in").string(), std::string("' > '"),
                                  (dir / "out").string(), std::string("' 2> '"), (dir / "err").string(),
                                  std::string("'")})
    cmd.append(part);
  const int rc = std::system(cmd.c_str());
  Result r{rc, slurp(dir / "out"), slurp(dir / "err")};
  fs::remove_all(dir);
  return r;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> v;
  size_t i = 0;
  for (size_t j; (j = s.find('\n', i)) != std::string::npos; i = j + 1) v.push_back(s.substr(i, j - i));
  return v;
}

TEST(TokenizeCli, EncodesAndDecodesTheGoldenLines) {
  const std::string dir = dsa::test::tokenizer_dir();
  std::vector<nlohmann::ordered_json> golden;
  ASSERT_TRUE(dsa::test::listed_jsonl("golden.jsonl", &golden));
  // Only tokenizer.json in the model directory: no weights, no config.
  const fs::path model = dsa::test::scratch("tokenizer_only");
  fs::create_directories(model);
  fs::copy_file(dir + "/tokenizer.json", model / "tokenizer.json", fs::copy_options::overwrite_existing);
  std::string texts, idss;
  for (const auto& l : golden) {
    texts += l["text"].dump() + "\n";
    idss += l["ids"].dump() + "\n";
  }
  const Result enc = run_dsa(std::string("tokenize --model ").append(model.string()), texts);
  ASSERT_EQ(enc.status, 0) << enc.err;
  const auto got = lines_of(enc.out);
  ASSERT_EQ(got.size(), golden.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(nlohmann::ordered_json::parse(got[i]), golden[i]["ids"]) << golden[i]["name"];

  const Result dec = run_dsa(std::string("tokenize --decode --model ").append(model.string()), idss);
  ASSERT_EQ(dec.status, 0) << dec.err;
  const auto back = lines_of(dec.out);
  ASSERT_EQ(back.size(), golden.size());
  for (size_t i = 0; i < back.size(); ++i)
    EXPECT_EQ(nlohmann::ordered_json::parse(back[i]), golden[i]["text"]) << golden[i]["name"];

  // Ids whose bytes are not UTF-8 on their own still give valid JSON strings.
  std::string arbitrary;
  for (int k = 0; k < 300; ++k)
    arbitrary.append("[").append(std::to_string(k)).append(", ").append(std::to_string(100 + k)).append("]\n");
  const Result odd = run_dsa(std::string("tokenize --decode --model ").append(model.string()), arbitrary);
  ASSERT_EQ(odd.status, 0) << odd.err;
  for (const auto& line : lines_of(odd.out)) EXPECT_TRUE(nlohmann::json::accept(line)) << line;

  // A bad line: an error naming the line, non-zero exit.
  const Result bad = run_dsa(std::string("tokenize --model ").append(model.string()), "\"a\"\n\"b\"\n[1, 2]\n\"c\"\n");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("line 3"), std::string::npos) << bad.err;
  const Result bad_id = run_dsa(std::string("tokenize --decode --model ").append(model.string()), "[1]\n[-5]\n");
  EXPECT_NE(bad_id.status, 0);
  EXPECT_NE(bad_id.err.find("line 2"), std::string::npos) << bad_id.err;
  fs::remove_all(model);
}

// `dsa bench mask`: the mask it times allows, for a regex of one to three digits, exactly the
// vocabulary's tokens of one to three digits (counted here from tokenizer.json); a prefix the
// constraint refuses and a missing constraint are clear errors.
TEST(BenchMaskCli, CountsWhatTheConstraintAllows) {
  const std::string dir = dsa::test::tokenizer_dir();
  std::ifstream f(dir + "/tokenizer.json", std::ios::binary);
  const auto tj = nlohmann::json::parse(f);
  size_t digits = 0;
  for (const auto& [text, id] : tj["model"]["vocab"].items())
    digits += !text.empty() && text.size() <= 3 && text.find_first_not_of("0123456789") == std::string::npos;
  ASSERT_GT(digits, 0u);
  const Result r = run_dsa("bench mask --model '" + dir + "' --regex '[0-9]{1,3}' --repeats 2", "");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("; " + std::to_string(digits) + " of "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("median"), std::string::npos) << r.out;

  const Result refused = run_dsa("bench mask --model '" + dir + "' --regex '[0-9]{1,3}' --prefix x", "");
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.err.find("--prefix"), std::string::npos) << refused.err;
  const Result none = run_dsa("bench mask --model '" + dir + "'", "");
  EXPECT_NE(none.status, 0);
  EXPECT_NE(none.err.find("--regex"), std::string::npos) << none.err;
}

}  // namespace
