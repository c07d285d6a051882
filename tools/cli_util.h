#pragma once
// Small helpers shared by the command files.
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/kernels.h"

namespace dsa::cli {

// "1,2,3" -> {1, 2, 3}; one clear error for anything else.
inline std::vector<int32_t> parse_ids(const std::string& s, const std::string& flag) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t j = s.find(',', i);
    const std::string tok = s.substr(i, j == std::string::npos ? std::string::npos : j - i);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(tok, &used);
    } catch (...) {
      used = 0;
    }
    if (tok.empty() || used != tok.size() || v < 0 || v > INT32_MAX)
      throw Error(flag + ": expected comma-separated non-negative token ids, got '" + tok + "'");
    ids.push_back(int32_t(v));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return ids;
}

inline CacheType parse_cache_type(const std::string& s) {
  if (s == "f32") return CacheType::F32;
  if (s == "bf16") return CacheType::BF16;
  if (s == "fp8") return CacheType::FP8;
  if (s == "fp8-656") return CacheType::FP8_656;
  throw Error("--kv-cache: expected f32, bf16, fp8 or fp8-656, got '" + s + "'");
}

}  // namespace dsa::cli
