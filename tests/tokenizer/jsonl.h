#pragma once
// Reads a JSON-lines fixture (one record per physical line, as the fixture README promises).
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dsa::test {

inline std::vector<nlohmann::ordered_json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::ordered_json> out;
  std::ifstream f(path, std::ios::binary);
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(nlohmann::ordered_json::parse(line));
  return out;
}

}  // namespace dsa::test
