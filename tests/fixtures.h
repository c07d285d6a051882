#pragma once
// Where the shared fixtures live: ../shared beside the checkout, or the directories
// named by DSA_GOLDEN_DIR / DSA_TOKENIZER_DIR. Tests that need them skip with a clear
// message when they are absent.
#include <cstdlib>
#include <filesystem>
#include <string>

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

}  // namespace dsa::test

#define DSA_REQUIRE_FIXTURE(path)                                             \
  do {                                                                        \
    if (!::dsa::test::exists(path)) GTEST_SKIP() << "fixture not found: " << (path); \
  } while (0)
