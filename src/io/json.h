#pragma once
// Parsing a whole JSON document whose top level must be an object, with one error that
// names where the text came from (config.json, a hardware profile, a header).
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace dsa {

inline nlohmann::json parse_json_object(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": malformed JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(where + ": expected a JSON object");
  return j;
}

}  // namespace dsa
