#pragma once
// Python's json.dumps(x, ensure_ascii=False) with default separators (", " and ": "): the
// `to_json` of DeepSeek's encoding_dsv32.py and the `tojson` filter of the GLM-5 chat template
// as transformers defines it. Keys keep insertion order, so callers pass ordered_json.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace dsa {

std::string py_json_dumps(const nlohmann::ordered_json& v);
void py_json_dump_string(std::string& out, std::string_view s);

}  // namespace dsa
