#pragma once
// Where the shared fixtures live: ../shared beside the checkout, or the directories
// named by DSA_GOLDEN_DIR / DSA_TOKENIZER_DIR. They are read when the tests run, and a test
// that needs one FAILS naming the folder when it is absent or holds fewer cases than its
// README lists: a suite that checked nothing must not pass.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace dsa::test {

inline std::string golden_dir() {
  if (const char* e = std::getenv("DSA_GOLDEN_DIR")) return e;
  return std::string(DSA_REPO_ROOT) + "/../shared/golden";
}

inline std::string tokenizer_dir() {
  if (const char* e = std::getenv("DSA_TOKENIZER_DIR")) return e;
  return std::string(DSA_REPO_ROOT) + "/../shared/tokenizer";
}

inline std::string dsa_binary() { return DSA_BINARY; }

inline bool exists(const std::string& p) { return std::filesystem::exists(p); }

inline std::string missing_message(const std::string& path) {
  return "fixture not found: " + path + " (the shared test data; set DSA_GOLDEN_DIR / DSA_TOKENIZER_DIR to other folders)";
}

// The first-column names of a fixture README's markdown tables ("| `name` | ..."), each with
// its second column: the README is the list of what the folder must hold.
struct ReadmeRow {
  std::string name, second;
};
inline std::vector<ReadmeRow> readme_rows(const std::string& readme) {
  std::ifstream in(readme);
  std::vector<ReadmeRow> rows;
  const std::regex row(R"(^\|\s*`([^`]+)`\s*\|([^|]*)\|)");
  std::smatch m;
  for (std::string line; std::getline(in, line);)
    if (std::regex_search(line, m, row)) rows.push_back({m[1].str(), m[2].str()});
  return rows;
}

// The golden model cases the golden README lists (table rows naming a folder, not a file).
inline std::vector<std::string> golden_listed_cases() {
  std::vector<std::string> out;
  for (const auto& r : readme_rows(golden_dir() + "/README.md"))
    if (r.name.find('.') == std::string::npos && r.name.find('/') == std::string::npos) out.push_back(r.name);
  return out;
}

// Every case folder (one with case.json) under the golden directory, found when the test runs.
inline std::vector<std::string> golden_cases() {
  std::vector<std::string> cases;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(golden_dir(), ec))
    if (std::filesystem::exists(e.path() / "case.json")) cases.push_back(e.path().filename().string());
  std::sort(cases.begin(), cases.end());
  return cases;
}

// How many records the tokenizer README says a file holds: the first integer in the
// second column of the file's row ("| `golden.jsonl` | 333 test strings ... |"); 0 if none.
inline long tokenizer_listed_count(const std::string& file) {
  for (const auto& r : readme_rows(tokenizer_dir() + "/README.md"))
    if (r.name == file) {
      std::smatch m;
      if (std::regex_search(r.second, m, std::regex(R"((\d[\d,]*))"))) {
        std::string digits = m[1].str();
        digits.erase(std::remove(digits.begin(), digits.end(), ','), digits.end());
        return std::stol(digits);
      }
    }
  return 0;
}

// A folder for this test process's files under the temp directory, removed when the
// process exits; name() gives a fresh path inside it.
class Scratch {
 public:
  static std::string path(const std::string& name) { return (instance().root_ / name).string(); }

 private:
  Scratch() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dsa_test_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("cannot create a temp folder from " + tmpl);
    root_ = tmpl;
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  static Scratch& instance() {
    static Scratch s;
    return s;
  }
  std::filesystem::path root_;
};

inline std::string scratch(const std::string& name) { return Scratch::path(name); }

// Runs `cmd` with the shell: its exit code and its stdout (redirect stderr in `cmd` to keep it).
struct ShellResult {
  int code = -1;
  std::string out;
};
inline ShellResult shell(const std::string& cmd) {
  ShellResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

inline ::testing::AssertionResult fixture_present(const std::string& path) {
  if (exists(path)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << missing_message(path);
}

// Success when `cases` holds every case the golden README lists (and the README lists some).
inline ::testing::AssertionResult golden_cases_complete(const std::vector<std::string>& cases) {
  const std::string readme = golden_dir() + "/README.md";
  if (!exists(readme)) return ::testing::AssertionFailure() << missing_message(readme);
  const auto listed = golden_listed_cases();
  if (listed.empty()) return ::testing::AssertionFailure() << readme << " lists no golden case";
  for (const auto& c : listed)
    if (std::find(cases.begin(), cases.end(), c) == cases.end())
      return ::testing::AssertionFailure() << "golden case '" << c << "' listed in " << readme << " has no case.json";
  return ::testing::AssertionSuccess();
}

}  // namespace dsa::test

#define DSA_REQUIRE_FIXTURE(path) ASSERT_TRUE(::dsa::test::fixture_present(path))
