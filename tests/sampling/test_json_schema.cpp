// JsonSchemaPrefix against an independent validator written here from the JSON Schema rules
// of the supported subset: random values generated from each schema are taken whole
// (compact and indented); random walks that take only bytes the recognizer allows never get
// stuck, and every text they complete parses and validates; schemas outside the subset are
// refused with an error naming the place and the keyword.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <random>
#include <regex>
#include <string>
#include <tuple>

#include "core/error.h"
#include "sampling/json_schema.h"

using namespace dsa;
using ojson = nlohmann::ordered_json;

namespace {

bool accepts(const JsonSchema& s, std::string_view text) {
  JsonSchemaPrefix p(s);
  return p.feed(text) && p.complete();
}

const ojson& deref(const ojson& s, const ojson& root) {
  if (s.is_object() && s.contains("$ref")) return deref(root.at(ojson::json_pointer(s["$ref"].get<std::string>().substr(1))), root);
  return s;
}

bool is_type(const ojson& v, const std::string& t) {
  // Digits past 64 bits parse as a double: an integer still, as JSON Schema counts them.
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::trunc(v.get<double>()) == v.get<double>());
  if (t == "number") return v.is_number();
  if (t == "string") return v.is_string();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  if (t == "object") return v.is_object();
  return t == "array" && v.is_array();
}

// The formats the recognizer keeps, checked here by their RFCs' rules rather than by its
// patterns (an e-mail address loosely: one '@', a dotted host of letters, digits and hyphens).
bool format_ok(const std::string& f, const std::string& t) {
  auto all = [&](size_t from, size_t to, auto pred) { return std::all_of(t.begin() + long(from), t.begin() + long(to), pred); };
  if (f == "date") {
    int y = 0, m = 0, d = 0;
    if (t.size() != 10 || std::sscanf(t.c_str(), "%4d-%2d-%2d", &y, &m, &d) != 3 || t[4] != '-' || t[7] != '-') return false;
    const int days[] = {31, (y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)) ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return m >= 1 && m <= 12 && d >= 1 && d <= days[m - 1];
  }
  if (f == "uuid") {
    if (t.size() != 36) return false;
    for (size_t i = 0; i < 36; ++i)
      if ((i == 8 || i == 13 || i == 18 || i == 23) ? t[i] != '-' : !std::isxdigit(static_cast<unsigned char>(t[i]))) return false;
    return true;
  }
  if (f == "email") {
    const size_t at = t.find('@');
    if (at == 0 || at == std::string::npos || t.find('@', at + 1) != std::string::npos) return false;
    const std::string host = t.substr(at + 1);
    return host.find('.') != std::string::npos && host.front() != '.' && host.back() != '.' && host.find("..") == std::string::npos &&
           all(at + 1, t.size(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.'; }) &&
           all(0, at, [](char c) { return c > ' ' && c < 0x7f && c != '(' && c != ')' && c != ',' && c != ':' && c != ';' && c != '<' && c != '>'; });
  }
  if (f == "ipv6") {
    in6_addr a;
    return inet_pton(AF_INET6, t.c_str(), &a) == 1;
  }
  if (f == "duration") {  // "P", numbers with their designators, "T" once before time ones
    std::string date, time, *part = &date;
    for (size_t i = 1; i < t.size(); ++i) {
      if (t[i] == 'T' && part == &date) {
        part = &time;
        continue;
      }
      const size_t digits = i;
      while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i;
      if (i == digits || i == t.size()) return false;
      *part += t[i];
    }
    // Each part's designators are a run of Y M D (or the week alone), of H M S.
    auto run_of = [](const std::string& d, const std::string& order) { return !d.empty() && order.find(d) != std::string::npos; };
    if (t.empty() || t[0] != 'P' || (part == &time && !run_of(time, "HMS"))) return false;
    return date == "W" ? time.empty() && part == &date : (date.empty() ? part == &time : run_of(date, "YMD"));
  }
  return true;  // an annotation
}

// The subset's rules, with the recognizer's two choices: declared keys only, in order.
bool valid(const ojson& v, const ojson& schema, const ojson& root) {
  const ojson& s = deref(schema, root);
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("const")) return v == s["const"];
  if (s.contains("enum")) return std::find(s["enum"].begin(), s["enum"].end(), v) != s["enum"].end();
  for (const char* k : {"anyOf", "oneOf", "allOf"})
    if (s.contains(k)) {
      int n = 0;
      for (const ojson& a : s[k]) n += valid(v, a, root);
      return std::string(k) == "allOf" ? n == int(s[k].size()) : std::string(k) == "oneOf" ? n == 1 : n > 0;
    }
  if (s.contains("type")) {
    const ojson ts = s["type"].is_array() ? s["type"] : ojson::array({s["type"]});
    if (std::none_of(ts.begin(), ts.end(), [&](const ojson& t) { return is_type(v, t.get<std::string>()); })) return false;
  }
  if (v.is_object()) {
    if (v.size() < s.value("minProperties", size_t(0)) || v.size() > s.value("maxProperties", SIZE_MAX)) return false;
    const ojson props = s.value("properties", ojson::object());
    if (props.empty()) {
      const ojson extra = s.value("additionalProperties", ojson(true));
      for (const auto& [k, x] : v.items())
        if (!valid(x, extra, root)) return false;
      return true;
    }
    auto p = props.begin();
    for (const auto& [k, x] : v.items()) {
      while (p != props.end() && p.key() != k) ++p;
      if (p == props.end() || !valid(x, p.value(), root)) return false;  // undeclared, repeated or out of order
    }
    for (const ojson& r : s.value("required", ojson::array()))
      if (!v.contains(r.get<std::string>())) return false;
  }
  if (v.is_string()) {  // lengths in code points
    const std::string t = v.get<std::string>();
    const size_t chars = size_t(std::count_if(t.begin(), t.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
    if (chars < s.value("minLength", size_t(0)) || chars > s.value("maxLength", SIZE_MAX)) return false;
    // std::regex reads bytes: the test schemas' patterns say only ASCII.
    if (s.contains("pattern") && !std::regex_search(t, std::regex(s["pattern"].get<std::string>(), std::regex::ECMAScript))) return false;
    if (s.contains("format") && !s.contains("pattern") && !format_ok(s["format"], t)) return false;
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if ((s.contains("minimum") && x < s["minimum"].get<double>()) || (s.contains("maximum") && x > s["maximum"].get<double>()) ||
        (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>()) ||
        (s.contains("exclusiveMaximum") && x >= s["exclusiveMaximum"].get<double>()))
      return false;
  }
  if (v.is_array()) {
    if (v.size() < s.value("minItems", size_t(0)) || v.size() > s.value("maxItems", SIZE_MAX)) return false;
    const ojson prefix = s.value("prefixItems", ojson::array());
    for (size_t i = 0; i < v.size(); ++i)
      if (!valid(v[i], i < prefix.size() ? prefix[i] : s.value("items", ojson(true)), root)) return false;
  }
  return true;
}

// A random value the schema admits (shallow past depth 4).
ojson generate(const ojson& schema, const ojson& root, std::mt19937& rng, int depth = 0) {
  const ojson& s = deref(schema, root);
  auto pick = [&](size_t n) { return size_t(rng() % n); };
  if (s.is_boolean() || s.empty() || (s.size() == 1 && s.contains("description"))) {
    const ojson any[] = {1, "x\u00e9\"\\", nullptr, ojson::array({1, ojson::object({{"k", true}})}), -2.5e-3};
    return any[pick(5)];
  }
  if (s.contains("const")) return s["const"];
  if (s.contains("enum")) return s["enum"][pick(s["enum"].size())];
  for (const char* k : {"anyOf", "oneOf", "allOf"})
    if (s.contains(k)) return generate(s[k][pick(s[k].size())], root, rng, depth);
  const ojson ts = s.contains("type") ? (s["type"].is_array() ? s["type"] : ojson::array({s["type"]})) : ojson::array({"object"});
  const std::string t = ts[pick(ts.size())];
  if (t == "string" && s.contains("examples")) return s["examples"][pick(s["examples"].size())];  // the test's own
  if (t == "string" && (s.contains("minLength") || s.contains("maxLength"))) {
    const size_t lo = s.value("minLength", size_t(0)), hi = std::min(s.value("maxLength", SIZE_MAX), lo + 5);
    const char* chars[] = {"a", "\u00fc", "\u4e2d", "\"", "\\", "\n", "\u0001"};  // one character each
    std::string out;
    for (size_t n = lo + pick(hi - lo + 1); n-- > 0;) out += chars[pick(7)];
    return out;
  }
  if (t == "string") {
    const char* strs[] = {"", "plain", "quote \" and \\ backslash", "tab\t\u00fc\u4e2d", "\u0001"};
    return strs[pick(5)];
  }
  if (t == "integer") {
    int64_t lo = -1000, hi = 1000;
    if (s.contains("minimum")) lo = std::max(lo, int64_t(std::ceil(s["minimum"].get<double>())));
    if (s.contains("exclusiveMinimum")) lo = std::max(lo, int64_t(std::floor(s["exclusiveMinimum"].get<double>())) + 1);
    if (s.contains("maximum")) hi = std::min(hi, int64_t(std::floor(s["maximum"].get<double>())));
    if (s.contains("exclusiveMaximum")) hi = std::min(hi, int64_t(std::ceil(s["exclusiveMaximum"].get<double>())) - 1);
    return lo + int64_t(rng() % uint64_t(hi - lo + 1));
  }
  if (t == "number" && (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum"))) {
    const double lo = s.value("minimum", s.value("exclusiveMinimum", -50.0)), hi = s.value("maximum", s.value("exclusiveMaximum", 50.0));
    for (;;) {  // eighths in the range (whole bounds: some lie strictly inside)
      const ojson x = pick(4) == 0 ? ojson(int64_t(std::floor(lo)) + int64_t(pick(size_t(hi - lo) + 1))) : ojson(lo + double(pick(size_t(8 * (hi - lo)) + 1)) / 8.0);
      if (valid(x, s, root)) return x;
    }
  }
  if (t == "number") return pick(2) ? ojson(int64_t(rng() % 100)) : ojson(double(int(rng() % 20001) - 10000) / 128.0);
  if (t == "boolean") return bool(pick(2));
  if (t == "null") return nullptr;
  if (t == "array") {
    const ojson prefix = s.value("prefixItems", ojson::array()), items = s.value("items", ojson(true));
    const size_t most = items == ojson(false) ? prefix.size() : SIZE_MAX;
    const size_t lo = s.value("minItems", size_t(0)), hi = std::min({s.value("maxItems", SIZE_MAX), most, lo + (depth > 3 ? 0 : 3)});
    ojson a = ojson::array();
    for (size_t n = lo + pick(hi - lo + 1), i = 0; i < n; ++i) a.push_back(generate(i < prefix.size() ? prefix[i] : items, root, rng, depth + 1));
    return a;
  }
  const ojson props = s.value("properties", ojson::object());
  const size_t least = s.value("minProperties", size_t(0)), most = s.value("maxProperties", SIZE_MAX);
  if (props.empty()) {
    ojson o = ojson::object();
    const ojson extra = s.value("additionalProperties", ojson(true));
    const size_t hi = extra == ojson(false) ? 0 : std::min(most, least + (depth > 3 ? 0 : 1));
    for (size_t n = least + pick(hi - least + 1), i = 0; i < n; ++i) o["key \u00e9" + std::to_string(i)] = generate(extra, root, rng, depth + 1);
    return o;
  }
  // Optional keys by a coin (none past depth 3 unless a minimum needs them), drawn again
  // until the count is within minProperties and maxProperties.
  const ojson req = s.value("required", ojson::array());
  for (int tries = 0; tries < 1000; ++tries) {
    ojson o = ojson::object();
    for (const auto& [k, x] : props.items())
      if (std::find(req.begin(), req.end(), k) != req.end() || ((depth <= 3 || least > 0) && pick(2))) o[k] = generate(x, root, rng, depth + 1);
    if (o.size() >= least && o.size() <= most) return o;
  }
  ADD_FAILURE() << "no object of " << s.dump();
  return ojson::object();
}

const ojson kSchemas[] = {
    ojson::parse(R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
        "email": {"type": ["string", "null"], "format": "email", "examples": ["ann@example.com", "a.b+c@mail-1.example.org"]}, "tags": {"type": "array", "items": {"enum": ["a", "ab", "b", 1, 12]}, "maxItems": 3},
        "ratio": {"type": "number"}, "ok": {"type": "boolean"}}, "required": ["name", "ok"], "additionalProperties": false})"),
    // pydantic's shape: $defs, $ref, anyOf with null, const, a recursive tree.
    ojson::parse(R"({"$defs": {"Node": {"type": "object", "properties": {"label": {"const": "n"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}, "weight": {"anyOf": [{"type": "number"}, {"type": "integer"}, {"type": "null"}], "default": null}},
        "required": ["label"], "title": "Node"}}, "$ref": "#/$defs/Node"})"),
    ojson::parse(R"({"type": "array", "items": {"anyOf": [{"type": "object", "additionalProperties": {"type": "integer"}}, {"type": "string"},
        {"enum": [true, null]}, {"type": "array", "minItems": 1, "maxItems": 2}]}, "minItems": 2})"),
    ojson::parse(R"({"type": "object", "properties": {"a\"b/c": {"enum": [0, 0.5, -1, "x", [1, 2], {"k": null}]},
        "anything": {}, "fixed": {"type": "object", "additionalProperties": false}, "z": {"allOf": [{"type": "integer"}]}}, "required": ["z"]})"),
    ojson::parse(R"({"enum": [1, 12, 123, "one"]})"),
    ojson::parse(R"({"type": ["integer", "string"]})"),
    // Bounds: string lengths in characters, integer ranges (inclusive, exclusive, negative).
    ojson::parse(R"({"type": "object", "properties": {"code": {"type": "string", "minLength": 2, "maxLength": 4},
        "n": {"type": "integer", "minimum": -15, "exclusiveMaximum": 120}, "big": {"type": "integer", "exclusiveMinimum": 99, "maximum": 1000},
        "neg": {"type": "integer", "maximum": -10.5}, "s": {"type": ["string", "integer"], "maxLength": 1, "minimum": 3},
        "list": {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 2},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1}, "temp": {"type": "number", "exclusiveMinimum": -5, "exclusiveMaximum": 40.0},
        "p": {"type": "number", "exclusiveMinimum": 0.5, "maximum": 2.25}},
        "required": ["code", "n", "big", "neg", "ratio"]})"),
    // pydantic's tuples: Tuple[int, str] (fixed), Tuple[bool, ...] after a prefix (open).
    ojson::parse(R"({"type": "object", "properties": {"pair": {"type": "array", "prefixItems": [{"type": "integer", "minimum": 0},
        {"type": "string"}], "minItems": 2, "maxItems": 2}, "rest": {"type": "array", "prefixItems": [{"enum": ["a", "b"]}],
        "items": {"type": "boolean"}}, "none": {"type": "array", "prefixItems": [{"type": "null"}], "items": false}},
        "required": ["pair", "rest", "none"]})"),
    // pydantic's constr(pattern=...): anchored, unanchored, with lengths, beside null; the
    // examples (which match) are what the generator writes.
    ojson::parse(R"({"type": "object", "properties": {"zip": {"type": "string", "pattern": "^\\d{5}(-\\d{4})?$",
        "examples": ["12345", "12345-6789"]}, "id": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$", "minLength": 3,
        "maxLength": 8, "examples": ["abc", "x_1_2", "q2345678"]}, "note": {"type": ["string", "null"], "pattern": "[k-z]$",
        "examples": ["k", "ok \"k\"\nz", "\\k"]}}, "required": ["zip", "id"]})"),
    // Formats (pydantic's date, UUID4 and EmailStr): kept as patterns; an unknown one is an annotation.
    ojson::parse(R"({"type": "object", "properties": {"day": {"type": "string", "format": "date", "examples": ["2024-02-28", "1999-12-31"]},
        "id": {"type": "string", "format": "uuid", "examples": ["a3bb189e-8bf9-4888-9912-ACE4E6543002"]},
        "mail": {"type": "string", "format": "email", "examples": ["x@y.io"]}, "free": {"type": "string", "format": "color"},
        "ip": {"type": "string", "format": "ipv6", "examples": ["::1", "fe80::1:2"]}, "span": {"type": "string", "format": "duration",
        "examples": ["P1Y2M", "PT30S", "P2W"]}}, "required": ["day", "id", "mail", "ip", "span"]})"),
    // Key counts: two or three of five declared keys (one required), and a map of one or two.
    ojson::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"},
        "d": {"type": "null"}, "m": {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1, "maxProperties": 2}},
        "required": ["c"], "minProperties": 2, "maxProperties": 3})"),
};

TEST(JsonSchema, TakesEveryValueItAdmits) {
  std::mt19937 rng(7);
  for (const ojson& schema : kSchemas) {
    const JsonSchema s(schema);
    for (int i = 0; i < 300; ++i) {
      const ojson v = generate(schema, schema, rng);
      ASSERT_TRUE(valid(v, schema, schema)) << v.dump();  // the generator against the validator
      for (const int indent : {-1, 2}) {
        std::string text(1, ' ');  // whitespace around the value, as a model may write it
        text += v.dump(indent);
        text += '\n';
        EXPECT_TRUE(accepts(s, text)) << schema.dump() << "\n" << text;
      }
    }
  }
}

TEST(JsonSchema, RefusesWhatItDoesNotAdmit) {
  const JsonSchema person(kSchemas[0]);
  const char* bad[] = {
      R"({"ok": true, "name": "x"})",          // out of order
      R"({"name": "x"})",                      // required ok missing
      R"({"name": "x", "ok": true, "x": 1})",  // undeclared
      R"({"name": "x", "name": "y", "ok": true})",
      R"({"name": 1, "ok": true})",
      R"({"name": "x", "age": 1.5, "ok": true})",
      R"({"name": "x", "age": 1e3, "ok": true})",
      R"({"name": "x", "tags": ["c"], "ok": true})",
      R"({"name": "x", "tags": [1, 2], "ok": true})",  // 2 is no enum value (1 and 12 are)
      R"({"name": "x", "tags": [1, 1, 1, 1], "ok": true})",
      R"({"name": "x", "ok": null})",
      R"([])",
  };
  for (const char* text : bad) EXPECT_FALSE(accepts(person, text)) << text;
  EXPECT_TRUE(accepts(person, R"({"name": "x", "tags": [12, "ab", 1], "ok": false})"));
  const JsonSchema numbers(kSchemas[4]);
  for (const char* ok : {"1", "12", "123", "\"one\"", " 12 "}) EXPECT_TRUE(accepts(numbers, ok)) << ok;
  for (const char* no : {"2", "1234", "13", "\"on\"", "1.0"}) EXPECT_FALSE(accepts(numbers, no)) << no;
  JsonSchemaPrefix p(numbers);
  EXPECT_TRUE(p.feed("12"));
  EXPECT_TRUE(p.complete());  // may still become 123
  EXPECT_FALSE(p.closed());
}

// Random walks over the bytes the recognizer allows, drawn towards closing after a while:
// never stuck, and every text completed is JSON the schema admits.
TEST(JsonSchema, WalksNeverGetStuckAndEndValid) {
  std::mt19937 rng(11);
  const std::string closers = "\"@}],:";  // '@' moves an e-mail address on to its host
  for (const ojson& schema : kSchemas) {
    const JsonSchema s(schema);
    for (int walk = 0; walk < 300; ++walk) {
      JsonSchemaPrefix p(s);
      std::string text;
      for (int step = 0; step < 2000; ++step) {
        if (p.complete() && (step > 60 || rng() % 8 == 0)) break;
        std::vector<unsigned char> ok;
        const size_t u = text.rfind("\\u");  // inside a \u escape's hex digits, 'e' is one
        const bool in_hex = u != std::string::npos && text.size() - u <= 5 &&
                            std::all_of(text.begin() + long(u) + 2, text.end(), [](char h) { return std::isxdigit(static_cast<unsigned char>(h)); });
        for (int c = '\n'; c < 0x7f; ++c) {
          // Printable ASCII; \u escapes of no surrogate (nlohmann refuses the lone ones a random
          // escape makes). No exponents: a random one overflows a double, which nlohmann refuses.
          const bool escape_u = (c == 'd' || c == 'D') && text.size() >= 2 && text.compare(text.size() - 2, 2, "\\u") == 0;
          const bool exponent = (c == 'e' || c == 'E') && !in_hex && !text.empty() && std::isdigit(static_cast<unsigned char>(text.back()));
          JsonSchemaPrefix q = p;
          if ((c >= 0x20 || c == '\n') && !escape_u && !exponent && q.feed(static_cast<unsigned char>(c))) ok.push_back(static_cast<unsigned char>(c));
        }
        ASSERT_FALSE(ok.empty()) << schema.dump() << "\nstuck after: " << text;
        unsigned char c = ok[rng() % ok.size()];
        const bool finish = step > 60 && rng() % 4 != 0;  // late in a walk, mostly prefer bytes that finish something
        for (char want : closers)
          if (finish && std::find(ok.begin(), ok.end(), static_cast<unsigned char>(want)) != ok.end()) {
            c = static_cast<unsigned char>(want);
            break;
          }
        ASSERT_TRUE(p.feed(c));
        text += char(c);
      }
      ASSERT_TRUE(p.complete()) << text;
      const ojson v = ojson::parse(text, nullptr, false);
      ASSERT_FALSE(v.is_discarded()) << text;
      EXPECT_TRUE(valid(v, schema, schema)) << schema.dump() << "\n" << text;
    }
  }
}

// Bounds at their edges: each byte of an integer must leave some value in range and the
// number may end only in range; a string's characters are counted as written.
TEST(JsonSchema, BoundsHoldToTheEdge) {
  const JsonSchema small(ojson::parse(R"({"type": "integer", "minimum": -5, "maximum": 37})"));
  for (const char* ok : {"-5", "-0", "0", "37", "4", "-1", " 30 "}) EXPECT_TRUE(accepts(small, ok)) << ok;
  for (const char* no : {"-6", "38", "40", "370", "-50", "00", "4.0"}) EXPECT_FALSE(accepts(small, no)) << no;
  JsonSchemaPrefix p(small);
  EXPECT_TRUE(p.feed("3"));
  EXPECT_FALSE(JsonSchemaPrefix(p).feed('8')) << "no value in range begins with 38";
  const JsonSchema high(ojson::parse(R"({"type": "integer", "exclusiveMinimum": 99.5})"));
  JsonSchemaPrefix h(high);
  EXPECT_FALSE(JsonSchemaPrefix(h).feed('-'));
  EXPECT_FALSE(JsonSchemaPrefix(h).feed('0'));
  EXPECT_TRUE(h.feed("99"));
  EXPECT_FALSE(h.complete()) << "99 may go on to 990, but not end";
  EXPECT_TRUE(accepts(high, "100"));
  const JsonSchema top(ojson::parse(R"({"type": "integer", "minimum": 9223372036854775800})"));
  EXPECT_TRUE(accepts(top, "9223372036854775807"));
  EXPECT_FALSE(accepts(top, "9223372036854775808"));
  EXPECT_FALSE(accepts(top, "92233720368547758070"));
  const JsonSchema bottom(ojson::parse(R"({"type": "integer", "maximum": -9223372036854775800})"));
  EXPECT_TRUE(accepts(bottom, "-9223372036854775808"));
  EXPECT_FALSE(accepts(bottom, "-9223372036854775809"));
  EXPECT_FALSE(accepts(bottom, "-9223372036854775799"));

  // Numbers with fractions, against whole bounds: inclusive, open, negative.
  const JsonSchema unit(ojson::parse(R"({"type": "number", "minimum": 0, "maximum": 1})"));
  for (const char* ok : {"0", "1", "0.5", "1.0", "1.000", "-0", "-0.0", "0.999"}) EXPECT_TRUE(accepts(unit, ok)) << ok;
  for (const char* no : {"1.5", "-0.1", "2", "1.01", "10", "1e0", "0.5e1", "-1"}) EXPECT_FALSE(accepts(unit, no)) << no;
  const JsonSchema positive(ojson::parse(R"({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 100})"));
  for (const char* ok : {"0.001", "5", "99.99", "99"}) EXPECT_TRUE(accepts(positive, ok)) << ok;
  for (const char* no : {"0", "0.0", "-0", "-1", "100", "100.0", "100.5"}) EXPECT_FALSE(accepts(positive, no)) << no;
  JsonSchemaPrefix q(positive);
  EXPECT_TRUE(q.feed("0."));
  EXPECT_FALSE(q.complete());
  EXPECT_FALSE(JsonSchemaPrefix(positive).feed("100."));
  // Decimal bounds, taken as their shortest decimals (0.1 is one tenth, not the double's
  // expansion), at the most places among them.
  const JsonSchema part(ojson::parse(R"({"type": "number", "exclusiveMinimum": 0.5, "maximum": 2.25})"));
  for (const char* ok : {"0.51", "0.5000001", "2.25", "2.250", "1", "2.2", "2.249999"}) EXPECT_TRUE(accepts(part, ok)) << ok;
  for (const char* no : {"0.5", "0.50", "2.2500001", "2.3", "0", "3", "0.4999"}) EXPECT_FALSE(accepts(part, no)) << no;
  const JsonSchema tenth(ojson::parse(R"({"type": "number", "minimum": -1.5, "maximum": 0.1})"));
  for (const char* ok : {"0.1", "0.10", "0.09", "-1.5", "-1.49", "-0"}) EXPECT_TRUE(accepts(tenth, ok)) << ok;
  for (const char* no : {"0.1000001", "0.11", "-1.51", "-1.5000001", "1"}) EXPECT_FALSE(accepts(tenth, no)) << no;
  const JsonSchema cold(ojson::parse(R"({"type": "number", "minimum": -5, "maximum": -2})"));
  for (const char* ok : {"-3.5", "-2", "-5", "-2.0", "-4.99"}) EXPECT_TRUE(accepts(cold, ok)) << ok;
  for (const char* no : {"-5.1", "-1.9", "3", "-1.99", "-50", "-5.01"}) EXPECT_FALSE(accepts(cold, no)) << no;

  const JsonSchema code(ojson::parse(R"({"type": "string", "minLength": 2, "maxLength": 3})"));
  for (const char* ok : {"\"ab\"", "\"\\n\\t\"", "\"\u00e9\u4e2d\"", "\"\\u00e9x\"", "\"a\\\"c\""})
    EXPECT_TRUE(accepts(code, ok)) << ok;
  for (const char* no : {"\"a\"", "\"abcd\"", "\"\\n\\n\\n\\n\"", "\"\u00e9\u00e9\u00e9\u00e9\""}) EXPECT_FALSE(accepts(code, no)) << no;
  // Invalid UTF-8 counts as the U+FFFD characters the decoder makes of it: one per maximal
  // invalid part (a stray continuation byte, a lead byte whose sequence breaks off).
  for (const char* ok : {"\"a\x9e\"", "\"a\xe4\xb8\"", "\"\xe0\x80\"", "\"a\xf0\x9f\x98\""}) EXPECT_TRUE(accepts(code, ok)) << ok;
  for (const char* no : {"\"a\x9e\x9e\x9e\"", "\"\xe0\x80\x80\x80\"", "\"ab\xed\xa0\x80\""}) EXPECT_FALSE(accepts(code, no)) << no;
  JsonSchemaPrefix c(code);
  EXPECT_EQ(c.string_room(), UINT32_MAX);
  EXPECT_TRUE(c.feed("\"a\u00e9"));
  EXPECT_EQ(c.string_room(), 1u);
  EXPECT_FALSE(JsonSchemaPrefix(c).feed("xy"));
}

// Key counts at their edges: a key that would leave too few keys after it for the minimum is
// refused, as is a comma once the maximum is reached and a close before the minimum.
TEST(JsonSchema, KeyCountsHoldToTheEdge) {
  const JsonSchema two(ojson::parse(R"({"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "minProperties": 2, "maxProperties": 2})"));
  for (const char* ok : {R"({"a": 1, "b": 2})", R"({"a": 1, "c": 3})", R"({"b": [], "c": {}})"}) EXPECT_TRUE(accepts(two, ok)) << ok;
  for (const char* no : {"{}", R"({"a": 1})", R"({"a": 1, "b": 2, "c": 3})"}) EXPECT_FALSE(accepts(two, no)) << no;
  JsonSchemaPrefix p(two);
  ASSERT_TRUE(p.feed("{\""));
  EXPECT_FALSE(JsonSchemaPrefix(p).feed('c')) << "no key after c to make two";
  ASSERT_TRUE(p.feed("a\": 1, \"b\": 2"));
  EXPECT_FALSE(JsonSchemaPrefix(p).feed(',')) << "two keys already";
  const JsonSchema map(ojson::parse(R"({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1, "maxProperties": 2})"));
  for (const char* ok : {R"({"x": 1})", R"({"x": 1, "y": 2})"}) EXPECT_TRUE(accepts(map, ok)) << ok;
  for (const char* no : {"{}", R"({"x": 1, "y": 2, "z": 3})"}) EXPECT_FALSE(accepts(map, no)) << no;
  const JsonSchema required(ojson::parse(R"({"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "required": ["c"], "maxProperties": 2})"));
  JsonSchemaPrefix q(required);
  ASSERT_TRUE(q.feed(R"({"a": 1, )"));
  EXPECT_FALSE(JsonSchemaPrefix(q).feed(R"("b")")) << "c is required and would make three";
  EXPECT_TRUE(accepts(required, R"({"a": 1, "c": 2})"));
}

TEST(JsonSchema, TuplesTakeTheirPositions) {
  const JsonSchema pair(ojson::parse(R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": false})"));
  for (const char* ok : {"[]", "[1]", "[1, \"x\"]"}) EXPECT_TRUE(accepts(pair, ok)) << ok;
  for (const char* no : {"[\"x\"]", "[1, 2]", "[1, \"x\", 3]", "[1, \"x\", \"y\"]"}) EXPECT_FALSE(accepts(pair, no)) << no;
  const JsonSchema open(ojson::parse(R"({"prefixItems": [{"const": 0}], "items": {"type": "string"}, "minItems": 2})"));
  for (const char* ok : {"[0, \"a\"]", "[0, \"a\", \"b\"]"}) EXPECT_TRUE(accepts(open, ok)) << ok;
  for (const char* no : {"[0]", "[1, \"a\"]", "[0, 1]"}) EXPECT_FALSE(accepts(open, no)) << no;
}

// A pattern sees the string's characters as its escapes decode them, and a byte inside a UTF-8
// character or an escape is refused as soon as no character it may become goes on.
TEST(JsonSchema, PatternsHoldInsideStrings) {
  const JsonSchema code(ojson::parse(R"({"type": "string", "pattern": "^[A-Z]{2}[a-z\u00e9]*$", "maxLength": 4})"));
  for (const char* ok : {R"("AB")", R"("ABcé")", R"("AB\u00e9")", R"("AB\u00E9")", R"("\u0041B")"}) EXPECT_TRUE(accepts(code, ok)) << ok;
  for (const char* no : {R"("A")", R"("Ab")", R"("ABcde")", R"("AB1")", R"("AB\n")", R"("ABÀ")"}) EXPECT_FALSE(accepts(code, no)) << no;
  JsonSchemaPrefix p(code);
  ASSERT_TRUE(p.feed("\"AB"));
  EXPECT_TRUE(JsonSchemaPrefix(p).feed('\xC3')) << "C3 begins U+00C0..U+00FF, and é is among them";
  EXPECT_FALSE(JsonSchemaPrefix(p).feed('\xE4')) << "nothing from U+4000 is allowed";
  EXPECT_FALSE(JsonSchemaPrefix(p).feed('\xA9')) << "a lone continuation byte";
  EXPECT_TRUE(JsonSchemaPrefix(p).feed("\\u0"));
  EXPECT_FALSE(JsonSchemaPrefix(p).feed("\\u01")) << "U+0100..U+01FF holds no letter it allows";
  EXPECT_FALSE(JsonSchemaPrefix(p).feed("\\n"));
  EXPECT_EQ(p.string_room(), 0u) << "no token is taken without the automaton";
  ASSERT_TRUE(p.feed("xy"));
  EXPECT_FALSE(JsonSchemaPrefix(p).feed('z')) << "maxLength";
  EXPECT_TRUE(p.feed('"'));
  EXPECT_TRUE(p.complete());

  const JsonSchema word(ojson::parse(R"({"type": "string", "pattern": "cat", "minLength": 5})"));
  for (const char* ok : {R"("a cat")", R"("cattle")", R"("\"cat\"")", R"("c\u0061t??")"}) EXPECT_TRUE(accepts(word, ok)) << ok;
  for (const char* no : {R"("cat")", R"("a dog")", R"("c\u0061t")", R"("ca\tt!!")"}) EXPECT_FALSE(accepts(word, no)) << no;
  EXPECT_FALSE(JsonSchemaPrefix(word).feed(R"("\ud8)")) << "a surrogate is written as UTF-8, not escaped";
  EXPECT_TRUE(accepts(word, "\"cat \xF0\x9F\x98\x80\""));
}

// The formats a pattern can say are kept (each a part of what its RFC allows: no February
// 29th, no leap second); others stay annotations; a pattern beside a format is what is kept.
TEST(JsonSchema, FormatsAreKeptAsPatterns) {
  auto string_of = [](const char* format) {
    return std::make_unique<JsonSchema>(ojson{{"type", "string"}, {"format", format}});
  };
  auto quoted = [](const std::string& t) { return "\"" + t + "\""; };
  const std::string label63(63, 'a');
  const std::vector<std::tuple<const char*, std::vector<std::string>, std::vector<std::string>>> cases = {
      {"date", {"2024-02-28", "1999-12-31", "2024-04-30"}, {"2024-02-30", "2024-04-31", "2024-13-01", "2024-1-01", "2024-02-29"}},
      {"time", {"23:59:59Z", "00:00:00.5+05:30"}, {"23:59:60Z", "24:00:00Z", "12:00:00", "12:00Z"}},
      {"date-time", {"2024-05-01T12:30:00Z", "2024-05-01T12:30:00.123456-02:00"}, {"2024-05-01 12:30:00Z", "2024-05-01T12:30:00", "2024-05-01"}},
      {"uuid", {"a3bb189e-8bf9-4888-9912-ace4e6543002", "A3BB189E-8BF9-4888-9912-ACE4E6543002"}, {"a3bb189e8bf948889912ace4e6543002", "a3bb189e-8bf9-4888-9912-ace4e654300"}},
      {"ipv4", {"192.168.0.1", "0.0.0.0", "255.255.255.255"}, {"256.0.0.1", "1.2.3", "01.2.3.4"}},
      {"hostname", {"a-b.example", "localhost", label63 + ".io"}, {"-a.com", "a..b", label63 + "a.io"}},
      {"email", {"x@y.io", "first.last+tag@mail-1.example.org"}, {"x@y", "@y.io", "x y@z.io", "x@-y.io", "x.@y.io"}},
      {"ipv6", {"::", "::1", "1::", "fe80::1:2", "2001:db8:0:0:0:0:2:1", "1:2:3:4:5:6:7::", "1::3:4:5:6:7:8", "ABCD:ef01::"},
       {"1:2:3:4:5:6:7:8:9", "1::2::3", "12345::", "1:2:3:4:5:6:7", ":1::", "1:2:3:4:5:6:7:8::", "::ffff:1.2.3.4", "g::"}},
      {"duration", {"P1Y", "P1Y2M3D", "P2M10D", "P3D", "PT1H", "PT1H30M", "PT90S", "P1DT12H", "P4W", "P0D"},
       {"P", "PT", "P1", "P1Y2D", "PT1H2S", "P1W2D", "P1DT", "1Y", "P1.5Y", "P1H", "PT1D", "p1y"}},
      {"color", {"", "anything at all"}, {}},
  };
  for (const auto& [format, good, bad] : cases) {
    const auto s = string_of(format);
    for (const std::string& t : good) EXPECT_TRUE(accepts(*s, quoted(t))) << format << ": " << t;
    for (const std::string& t : bad) EXPECT_FALSE(accepts(*s, quoted(t))) << format << ": " << t;
  }
  const JsonSchema both(ojson::parse(R"({"type": "string", "format": "date", "pattern": "^x$"})"));
  EXPECT_TRUE(accepts(both, "\"x\""));
}

TEST(JsonSchema, RefusesWhatItCannotConstrain) {
  const std::pair<const char*, const char*> bad[] = {
      {R"({"type": "string", "pattern": "(a)\\1"})", "#/pattern': pattern at character 5: backreferences"},
      {R"({"type": "string", "pattern": "^a{5}$", "maxLength": 4})", "no text matches it within the length bounds"},
      {R"({"type": "string", "pattern": 5})", "#/pattern': expected a string"},
      {R"({"enum": ["a"], "pattern": "a"})", "'pattern' beside enum"},
      {R"({"type": "object", "properties": {"a": {}}, "minProperties": 2})", "#/minProperties': above the 1 keys"},
      {R"({"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a", "b"], "maxProperties": 1})", "below the 2 required keys"},
      {R"({"type": "object", "additionalProperties": false, "minProperties": 1})", "above the 0 keys"},
      {R"({"minProperties": 3, "maxProperties": 2})", "minProperties is above maxProperties"},
      {R"({"type": "object", "maxProperties": -1})", "#/maxProperties': expected a non-negative integer"},
      {R"({"type": "object", "properties": {"n": {"type": "number", "minimum": 0.1234567891}}})", "#/properties/n/minimum"},
      {R"({"type": "number", "exclusiveMinimum": 3, "maximum": 3})", "admit no number"},
      {R"({"type": "integer", "minimum": 3, "exclusiveMaximum": 4.0, "maximum": 2})", "admit no integer"},
      {R"({"type": "string", "minLength": 3, "maxLength": 2})", "minLength is above maxLength"},
      {R"({"type": "string", "maxLength": -1})", "non-negative integer"},
      {R"({"enum": ["a", "b"], "maxLength": 1})", "beside enum"},
      {R"({"anyOf": [{"type": "object"}, {"type": "object", "properties": {"a": {}}}]})", "both begin with '{'"},
      {R"({"anyOf": [{"type": "string"}, {"enum": ["x"]}]})", "both begin with '\"'"},
      {R"({"$ref": "#/$defs/Missing"})", "names nothing"},
      {R"({"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"})", "refers to itself"},
      {R"({"anyOf": [{"$ref": "#"}, {"type": "null"}]})", "refer back to themselves"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})", "'b' is not among the properties"},
      {R"({"type": "object", "properties": {"a": {}}, "additionalProperties": true})", "only the declared properties"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "minItems is above maxItems"},
      {R"({"type": "array", "items": [{"type": "string"}]})", "prefixItems says it"},
      {R"({"type": "array", "prefixItems": [{"type": "string"}], "items": false, "minItems": 2})", "minItems is above maxItems"},
      {R"({"enum": []})", "non-empty"},
      {R"({"type": "string", "enum": ["a", 1]})", "not of the schema's type"},
      {R"({"type": "text"})", "unknown type 'text'"},
      {R"(false)", "admits no value"},
      {R"({"allOf": [{"type": "string"}, {"type": "string"}]})", "allOf of one schema"},
  };
  std::vector<std::pair<std::string, std::string>> cases(std::begin(bad), std::end(bad));
  ojson many_values = {{"enum", ojson::array()}}, many_props = {{"properties", ojson::object()}}, many_alts = {{"anyOf", ojson::array()}};
  for (int i = 0; i < 5000; ++i) many_values["enum"].push_back(i);
  for (int i = 0; i < 1100; ++i) many_props["properties"][std::to_string(i)] = ojson::object();
  for (int i = 0; i < 40; ++i) many_alts["anyOf"].push_back({{"type", "integer"}});
  cases.emplace_back(many_values.dump(), "more than 4096 values");
  cases.emplace_back(many_props.dump(), "more than 1024 properties");
  cases.emplace_back(many_alts.dump(), "more than 32 alternatives");
  ojson many_patterns = {{"type", "object"}, {"properties", ojson::object()}};  // 40 x 16384 rows of 64 bytes
  for (int i = 0; i < 40; ++i) {
    std::string key = "p";  // built with += (GCC 12 warns falsely on "p" + std::to_string)
    key += std::to_string(i);
    many_patterns["properties"][key] = {{"type", "string"}, {"pattern", "a"}, {"maxLength", 16384}};
  }
  cases.emplace_back(many_patterns.dump(), "the schema's patterns need more than 8 MiB");
  for (const auto& [schema, want] : cases) {
    try {
      JsonSchema s(ojson::parse(schema));
      ADD_FAILURE() << "compiled: " << schema;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << schema << "\n" << e.what();
    }
  }
}

// Leniently (a tool's parameters without "strict") every schema compiles: keywords outside the
// subset are read past, a part it cannot say admits any value, and what it can say still holds.
TEST(JsonSchema, LenientlyWhatItCannotSayIsNotEnforced) {
  auto lenient = [](const char* schema) { return std::make_unique<JsonSchema>(ojson::parse(schema), JsonSchema::Lenient::Yes); };
  auto s = lenient(R"({"type": "string", "pattern": "(a)\\1", "maxLength": 2})");
  EXPECT_TRUE(accepts(*s, "\"bc\"")) << "a pattern it cannot compile is read past";
  EXPECT_FALSE(accepts(*s, "\"bcd\"")) << "the length is kept";
  EXPECT_FALSE(accepts(*s, "5"));
  s = lenient(R"({"type": "object", "properties": {"n": {"type": "number", "minimum": 1e-12}, "e": {"enum": ["x"]}}, "required": ["e"]})");
  EXPECT_TRUE(accepts(*s, R"({"n": -3, "e": "x"})"));
  EXPECT_FALSE(accepts(*s, R"({"n": "3", "e": "x"})"));
  EXPECT_FALSE(accepts(*s, R"({"n": 3})")) << "a required key";
  EXPECT_FALSE(accepts(*s, R"({"e": "y"})")) << "the enum";
  s = lenient(R"({"type": "object", "properties": {"u": {"anyOf": [{"type": "object"}, {"type": "object", "properties": {"a": {}}}]}}})");
  EXPECT_TRUE(accepts(*s, R"({"u": {"z": [1]}})"));
  EXPECT_TRUE(accepts(*s, R"({"u": 7})")) << "alternatives it cannot tell apart admit any value";
  EXPECT_FALSE(accepts(*s, R"({"v": 7})"));
  s = lenient(R"({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": true})");
  EXPECT_TRUE(accepts(*s, R"({"a": 1})"));
  EXPECT_FALSE(accepts(*s, R"({"b": 1})")) << "only the declared keys are written";
  s = lenient(R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "gone"]})");
  EXPECT_TRUE(accepts(*s, R"({"a": 1})")) << "a required key that is not declared is read past";
  EXPECT_FALSE(accepts(*s, "{}"));
  s = lenient(R"({"type": "object", "properties": {"a": {}}, "minProperties": 5, "maxProperties": 1})");
  EXPECT_TRUE(accepts(*s, R"({"a": 1})")) << "key counts no object meets are read past";
  s = lenient(R"({"anyOf": [{"$ref": "#"}, {"type": "null"}]})");
  EXPECT_TRUE(accepts(*s, "[1, {}]"));
  ojson many = {{"type", "object"}, {"properties", ojson::object()}};  // more parts given up on than rounds
  for (int i = 0; i < 200; ++i) {
    std::string key = "p";  // built with += (GCC 12 warns falsely on "p" + std::to_string)
    key += std::to_string(i);
    many["properties"][key] = ojson::parse(R"({"anyOf": [{"type": "object"}, {"type": "object"}]})");
  }
  s = std::make_unique<JsonSchema>(many, JsonSchema::Lenient::Yes);
  EXPECT_TRUE(accepts(*s, R"({"p3": [1], "p7": "x"})"));
  EXPECT_FALSE(accepts(*s, R"({"q": 1})"));
  for (const char* any : {R"({"type": "array", "items": [{"type": "string"}]})", R"({"type": "text"})", "false", R"({"$ref": "#/$defs/M"})"}) {
    s = lenient(any);
    EXPECT_TRUE(accepts(*s, R"({"k": [1, "x", null]})")) << any;
  }
}

}  // namespace
