#pragma once
// Reads a JSON-lines fixture (one record per physical line, as the fixture README promises).
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fixtures.h"

namespace dsa::test {

inline std::vector<nlohmann::ordered_json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::ordered_json> out;
  std::ifstream f(path, std::ios::binary);
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(nlohmann::ordered_json::parse(line));
  return out;
}

// Reads `file` of the tokenizer fixture folder into *out; fails when it is absent or holds
// fewer records than the folder's README says it does.
inline ::testing::AssertionResult listed_jsonl(const std::string& file, std::vector<nlohmann::ordered_json>* out) {
  const std::string path = tokenizer_dir() + "/" + file;
  if (!exists(path)) return ::testing::AssertionFailure() << missing_message(path);
  const long listed = tokenizer_listed_count(file);
  if (listed <= 0) return ::testing::AssertionFailure() << tokenizer_dir() << "/README.md gives no record count for " << file;
  *out = read_jsonl(path);
  if (long(out->size()) < listed)
    return ::testing::AssertionFailure() << path << " holds " << out->size() << " records, the README lists " << listed;
  return ::testing::AssertionSuccess();
}

}  // namespace dsa::test
