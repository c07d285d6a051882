#pragma once
// Helpers shared by the fuzz targets. A target returns normally when the code under test
// either succeeds or throws dsa::Error (the documented way to refuse bad input); any other
// exception, and any broken invariant (FUZZ_CHECK), aborts, which libFuzzer reports as a
// crash with the input saved.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "io/json.h"

namespace dsa::fuzz {

// Printed with a failure: the document a JSON variant (below) was running on, which the
// input file alone does not show.
inline std::string& failure_context() {
  static std::string s;
  return s;
}

[[noreturn]] inline void fail(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "%s:%d: fuzz failure: %s\n", file, line, what.c_str());
  if (!failure_context().empty()) std::fprintf(stderr, "on the document: %s\n", failure_context().c_str());
  std::abort();
}

inline std::string_view as_view(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Splits at the first NUL byte: [before, after). Valid JSON never contains a raw NUL, so a
// "JSON document, NUL, free text" input has one unambiguous reading. No NUL: all of it is
// the first part and the second is empty.
inline std::pair<std::string_view, std::string_view> split_at_nul(std::string_view s) {
  const size_t p = s.find('\0');
  if (p == std::string_view::npos) return {s, {}};
  return {s.substr(0, p), s.substr(p + 1)};
}

inline uint64_t hash_bytes(std::string_view s) {  // FNV-1a
  uint64_t h = 1469598103934665603ULL;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return h;
}

// Type confusion for the JSON targets. Byte mutations of JSON text mostly break the syntax
// and almost never turn `"tools": [...]` into `"tools": {...}` while keeping the rest valid,
// so each parsed document is also run as variants: one of its values replaced by a value of
// another type, or erased. Which values (up to max_variants, spread over the document) and
// which replacements depend on a hash of the input, so every mutation tries new ones.
// `run` gets each document; it may throw dsa::Error, anything else is reported with the
// variant that caused it.
// A byte recognizer (JsonSchemaPrefix, ToolCallPrefix) that is not at a dead end: its text is
// whole, or some byte goes on with it.
template <class Prefix>
bool goes_on(const Prefix& p) {
  if (p.complete()) return true;
  for (int c = 0; c < 256; ++c) {
    Prefix q = p;
    if (q.feed(static_cast<unsigned char>(c))) return true;
  }
  return false;
}

template <class Json, class Run>
void run_with_variants(const Json& doc, std::string_view input, size_t max_variants, Run&& run) {
  static const char* const kValues[] = {
      "null", "true", "0", "-1", "2147483647", "4294967297", "1e300", "0.5", "\"\"", "\"x\"",
      "\"</think>\"", "[]", "[{}]", "{}", "{\"type\": \"function\"}"};  // kinds 0-14; 15 erases
  auto guarded = [&](const Json& d) {
    try {
      run(d);
    } catch (const dsa::Error&) {
    } catch (const std::exception& e) {
      fail(__FILE__, __LINE__, std::string("exception other than dsa::Error: ") + e.what());
    }
  };
  static const bool print_variants = std::getenv("FUZZ_PRINT_VARIANTS") != nullptr;
  failure_context().clear();
  guarded(doc);

  // Pre-order walk: (value, parent) of every node.
  auto nodes_of = [](Json& root) {
    std::vector<std::pair<Json*, Json*>> nodes;
    auto walk = [&](auto& self, Json& v, Json* parent) -> void {
      nodes.emplace_back(&v, parent);
      if (v.is_structured())
        for (auto& c : v) self(self, c, &v);
    };
    walk(walk, root, nullptr);
    return nodes;
  };
  Json probe = doc;
  const size_t count = nodes_of(probe).size();
  const uint64_t h = hash_bytes(input);
  const size_t n = std::min(count, max_variants);
  for (size_t k = 0; k < n; ++k) {
    const size_t target = count <= max_variants ? k : (h + k * (count / n)) % count;
    const unsigned kind = unsigned((h >> (k % 60)) + k) & 15;
    Json copy = doc;
    auto [node, parent] = nodes_of(copy)[target];
    if (kind < 15) {
      *node = Json::parse(kValues[kind]);
    } else if (parent && parent->is_object()) {
      for (auto it = parent->begin(); it != parent->end(); ++it)
        if (&it.value() == node) { parent->erase(it); break; }
    } else if (parent && parent->is_array()) {
      for (size_t i = 0; i < parent->size(); ++i)
        if (&(*parent)[i] == node) { parent->erase(i); break; }
    } else {
      continue;  // the root cannot be erased
    }
    failure_context() = copy.dump();
    // A sanitizer report aborts before fail() could print the variant; replaying the saved
    // input with FUZZ_PRINT_VARIANTS=1 shows each one as it starts.
    if (print_variants) std::fprintf(stderr, "variant %zu: %s\n", k, failure_context().c_str());
    guarded(copy);
  }
  failure_context().clear();
}

// A target whose input is one JSON document that `check` parses itself from text: the text
// exactly as given (duplicate keys, odd spacing), then up to max_variants type-swapped
// variants of the parsed document (run_with_variants). Text that is not JSON stops after the
// first run; dsa::Error is the accepted way to refuse any of them.
template <class Check>
void run_json_text(std::string_view input, size_t max_variants, Check&& check) {
  try {
    check(std::string(input));
  } catch (const dsa::Error&) {
  }
  nlohmann::ordered_json doc;
  try {
    doc = dsa::parse_json_bounded<nlohmann::ordered_json>(input);
  } catch (const nlohmann::json::exception&) {
    return;
  }
  run_with_variants(doc, input, max_variants, [&](const nlohmann::ordered_json& d) { check(d.dump()); });
}

// A target whose input is a JSON document, a NUL, then a text (a schema or tools and a reply):
// check(document, text) on the parsed document and up to max_variants type-swapped variants
// of it. A document that is not JSON is left.
template <class Check>
void run_document_and_text(const uint8_t* data, size_t size, size_t max_variants, Check&& check) {
  const auto parts = split_at_nul(as_view(data, size));
  const std::string_view doc = parts.first, text = parts.second;
  nlohmann::ordered_json j;
  try {
    j = dsa::parse_json_bounded<nlohmann::ordered_json>(doc);
  } catch (const nlohmann::json::exception&) {
    return;
  }
  run_with_variants(j, doc, max_variants, [&](const nlohmann::ordered_json& d) { check(d, text); });
}

}  // namespace dsa::fuzz

#define FUZZ_CHECK(cond, msg)                                                              \
  do {                                                                                     \
    if (!(cond)) ::dsa::fuzz::fail(__FILE__, __LINE__, std::string(#cond) + ": " + (msg)); \
  } while (0)
