#pragma once
// Parsing a whole JSON document whose top level must be an object, with one error that
// names where the text came from (config.json, a hardware profile, a header).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "core/error.h"

namespace dsa {

// Nesting deeper than this is refused while parsing: nlohmann's dump() (used in error
// messages) recurses, and a line of 100000 '[' overflows the stack. No file or request the
// engine reads nests beyond a handful of levels.
inline constexpr int kMaxJsonDepth = 128;

// A nlohmann exception, so that the callers' existing handlers add their context.
struct JsonTooDeep : nlohmann::json::exception {
  JsonTooDeep() : nlohmann::json::exception(700, "[json.exception.too_deep] nested deeper than 128 levels") {}
};

// Json::parse with the depth bound; Json is nlohmann::json or nlohmann::ordered_json.
template <class Json = nlohmann::json, class... Input>
Json parse_json_bounded(Input&&... in) {
  return Json::parse(std::forward<Input>(in)..., [](int depth, typename Json::parse_event_t, Json&) {
    if (depth > kMaxJsonDepth) throw JsonTooDeep();
    return true;
  });
}

// An integer in [lo, hi], read without narrowing: get<int>() would wrap 2^32 + 256 to 256,
// and an unsigned value above 2^63 would read as negative through get<int64_t>().
inline bool json_int_in(const nlohmann::json& v, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned()) return hi >= 0 && v.get<uint64_t>() <= uint64_t(hi) && (lo <= 0 || v.get<uint64_t>() >= uint64_t(lo));
  return v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
}

inline nlohmann::json parse_json_object(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = parse_json_bounded(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": malformed JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(where + ": expected a JSON object");
  return j;
}

}  // namespace dsa
