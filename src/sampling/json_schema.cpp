#include "sampling/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "core/error.h"

namespace dsa {

using ojson = nlohmann::ordered_json;
using Node = JsonSchemaNode;

namespace {

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

std::bitset<256> bytes_of(std::string_view s) {
  std::bitset<256> b;
  for (unsigned char c : s) b.set(c);
  return b;
}

// Bounds on what one request may ask for: compiling recurses once per nested schema, and
// a mask scans a key's candidates for an allowed one, so without them a body of a few MB
// could overflow a stack or stall the engine thread that every request shares.
constexpr int kMaxNesting = 128;       // schemas within schemas, through $ref and anyOf too
constexpr size_t kMaxProperties = 1024, kMaxValues = 4096, kMaxAlternatives = 32;
constexpr size_t kMaxPatternBytes = size_t(8) << 20;  // every pattern's automaton and length table together

const std::set<std::string, std::less<>> kKeywords = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
                                                     "properties", "required", "additionalProperties", "items",
                                                     "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "minimum",
                                                     "maximum", "exclusiveMinimum", "exclusiveMaximum", "minProperties", "maxProperties"};
constexpr const char* kLengthKeys[] = {"minLength", "maxLength", "pattern"};
constexpr const char* kIntKeys[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
const std::set<std::string, std::less<>> kAnnotations = {"title", "description", "default", "examples", "format",
                                                        "$schema", "$id", "$comment", "$defs", "definitions"};

// The string formats OpenAI's strict mode keeps that a pattern can say, as patterns. Each
// admits a part of what its RFC allows, so that any checker takes what is written: dates
// without February 29th, times without a leap second and with at most six fraction digits,
// host names of labels up to 63 characters, e-mail addresses of dot-atoms at such a host,
// IPv6 addresses in RFC 4291's hexadecimal forms (without the dotted-IPv4 tail). A duration
// is RFC 3339's appendix A grammar whole.
const std::string* format_pattern(std::string_view format) {
  using Formats = std::map<std::string, std::string, std::less<>>;
  static const Formats kFormats = [] {
    const std::string date = R"(\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|02-(?:0[1-9]|1\d|2[0-8])))";
    const std::string time = R"((?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,6})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d))";
    const std::string label = R"([A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)";
    const std::string octet = R"((?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))";
    // Eight groups, or a groups before "::" and b after it with a + b <= 7.
    const std::string h = "[0-9a-fA-F]{1,4}", g = "(?:" + h + ":)", t = "(?::" + h + ")";
    const std::string ipv6 = "^(?:" + g + "{7}" + h + "|" + g + "{1,7}:|" + g + "{1,6}:" + h + "|" + g + "{1,5}" + t + "{1,2}|" +
                             g + "{1,4}" + t + "{1,3}|" + g + "{1,3}" + t + "{1,4}|" + g + "{1,2}" + t + "{1,5}|" + h + ":" + t +
                             "{1,6}|:(?:" + t + "{1,7}|:))$";
    // dur-time, then dur-date [dur-time] / dur-time / dur-week after the "P".
    const std::string dtime = R"(T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S))";
    const std::string duration = R"(^P(?:(?:\d+D|\d+M(?:\d+D)?|\d+Y(?:\d+M(?:\d+D)?)?)(?:)" + dtime + ")?|" + dtime + R"(|\d+W)$)";
    return Formats{
        {"date", "^" + date + "$"},
        {"time", "^" + time + "$"},
        {"date-time", "^" + date + "T" + time + "$"},
        {"uuid", R"(^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$)"},
        {"ipv4", "^(?:" + octet + R"(\.){3})" + octet + "$"},
        {"hostname", "^" + label + R"((?:\.)" + label + ")*$"},
        {"ipv6", ipv6},
        {"duration", duration},
        {"email", R"(^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@)" + label + R"((?:\.)" + label + ")+$"},
    };
  }();
  const auto it = kFormats.find(format);
  return it == kFormats.end() ? nullptr : &it->second;
}

// A JSON pointer's reference token (RFC 6901).
std::string pointer_token(const std::string& k) {
  std::string out;
  for (char c : k) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}

// The least integer >= v (up) or the greatest <= v, exact for integers; past int64 it is one
// beyond (the caller clamps).
__int128 int_bound(const ojson& v, bool up) {
  if (v.is_number_unsigned()) return __int128(v.get<uint64_t>());
  if (v.is_number_integer()) return __int128(v.get<int64_t>());
  const double d = up ? std::ceil(v.get<double>()) : std::floor(v.get<double>());
  if (d >= 0x1p63) return __int128(INT64_MAX) + 1;
  if (d < -0x1p63) return __int128(INT64_MIN) - 1;
  return __int128(int64_t(d));
}

bool of_type(const ojson& v, const std::string& t) {
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::trunc(v.get<double>()) == v.get<double>());
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  if (t == "object") return v.is_object();
  return t == "array" && v.is_array();
}

}  // namespace

struct SchemaCompiler {
  JsonSchema& out;
  const ojson& doc;
  bool lenient = false;        // a part outside the subset admits any value (JsonSchema::Lenient)
  const Node* culprit = nullptr;  // the node a check in finish() failed at
  std::map<std::string, const Node*> refs;  // resolved $refs (a node is registered before it is filled)
  std::set<std::string> resolving;          // $refs being followed to another $ref
  std::map<const Node*, std::string> where;
  int nesting = 0;  // compile() calls open
  size_t pattern_bytes = 0;

  [[noreturn]] static void fail(const std::string& path, const std::string& what) {
    throw Error("json_schema at '" + path + "': " + what);
  }
  Node& make(const std::string& path) {
    Node& n = out.nodes_.emplace_back();
    where[&n] = path;
    return n;
  }
  const Node* any(const std::string& path) {
    Node& n = make(path);
    n.scalars = Node::kAny;
    return &n;
  }

  const Node* compile(const ojson& s, const std::string& path);
  const Node* compile_nested(const ojson& s, const std::string& path);
  const Node* resolve(const ojson& ref, const std::string& path);
  void fill(Node& n, const ojson& s, const std::string& path);
  void fill_literals(Node& n, const ojson& s, const std::string& path);
  void fill_alternatives(Node& n, const ojson& s, const std::string& key, const std::string& path);
  void fill_types(Node& n, const ojson& s, const std::string& path);
  void fill_object(Node& n, const ojson& s, const std::string& path);
  void fill_property_counts(Node& n, const ojson& s, const std::string& path);
  void fill_array(Node& n, const ojson& s, const std::string& path);
  void fill_bounds(Node& n, const ojson& s, const std::string& path);
  void fill_pattern(Node& n, const ojson& s, const std::string& path);
  void fill_number_bounds(Node& n, const ojson& s, const std::string& path);
  bool bound_fails(const std::string& path, const std::string& what) const {
    if (!lenient) fail(path, what);
    return true;  // leniently the bound is read past
  }
  // A count keyword (minLength, maxProperties, ...) into `out`, at most `cap`, when it is
  // there and a non-negative integer (leniently, anything else is read past).
  void count_of(const ojson& s, const char* key, const std::string& path, uint32_t cap, uint32_t& out) const {
    if (!s.contains(key)) return;
    if (!s[key].is_number_unsigned()) return (void)bound_fails(path + "/" + key, "expected a non-negative integer");
    out = uint32_t(std::min<uint64_t>(s[key].get<uint64_t>(), cap));
  }
  std::vector<std::string> types(const ojson& s, const std::string& path);
  void finish(Node& root);
  std::bitset<256> first(const Node& n, std::map<const Node*, std::bitset<256>>& memo, std::set<const Node*>& visiting);
  void check_alternatives(const Node& n, const std::map<const Node*, std::bitset<256>>& memo);
};

const Node* SchemaCompiler::compile(const ojson& s, const std::string& path) {
  if (++nesting > kMaxNesting) {
    --nesting;
    if (lenient) return any(path);
    fail(path, "schemas nest deeper than " + std::to_string(kMaxNesting));
  }
  const Node* n = nullptr;
  try {
    n = compile_nested(s, path);
  } catch (const Error&) {
    --nesting;
    if (!lenient) throw;
    return any(path);
  }
  --nesting;
  return n;
}

const Node* SchemaCompiler::compile_nested(const ojson& s, const std::string& path) {
  if (s.is_boolean()) {
    if (!s.get<bool>()) fail(path, "the schema false admits no value");
    return any(path);
  }
  if (!s.is_object()) fail(path, "expected a schema (an object or true)");
  if (s.contains("$ref")) {
    for (const auto& [k, v] : s.items())
      if (kKeywords.count(k) && k != "$ref") fail(path, "'" + k + "' beside '$ref' is not supported");
    return resolve(s["$ref"], path + "/$ref");
  }
  Node& n = make(path);
  fill(n, s, path);
  return &n;
}

const Node* SchemaCompiler::resolve(const ojson& ref, const std::string& path) {
  if (!ref.is_string() || ref.get<std::string>().rfind('#', 0) != 0)
    fail(path, "expected a reference within the schema ('#', '#/$defs/NAME')");
  const std::string r = ref.get<std::string>();
  if (auto it = refs.find(r); it != refs.end()) return it->second;
  const ojson* target = nullptr;
  try {
    target = &doc.at(ojson::json_pointer(r.substr(1)));
  } catch (const ojson::exception&) {
    fail(path, "'" + r + "' names nothing in the schema");
  }
  if (target->is_object() && target->contains("$ref")) {
    if (!resolving.insert(r).second) fail(path, "'" + r + "' refers to itself");
    const Node* n = compile(*target, r);
    refs[r] = n;
    return n;
  }
  if (!target->is_object()) return refs[r] = compile(*target, r);
  Node& n = make(r);
  refs[r] = &n;
  try {
    fill(n, *target, r);
  } catch (const Error&) {
    if (!lenient) throw;
    n = Node{};  // others may point at it already
    n.scalars = Node::kAny;
  }
  return &n;
}

void SchemaCompiler::fill(Node& n, const ojson& s, const std::string& path) {
  for (const auto& [k, v] : s.items())
    if (!kKeywords.count(k) && !kAnnotations.count(k) && !lenient)
      fail(path, "'" + k + "' is not supported (supported: type, enum, const, anyOf, oneOf, allOf, $ref, properties, "
                           "required, additionalProperties, minProperties, maxProperties, items, prefixItems, minItems, maxItems, minLength, "
                           "maxLength, pattern, and on "
                           "integers minimum, maximum, exclusiveMinimum, exclusiveMaximum)");
  if (s.contains("enum") || s.contains("const")) return fill_literals(n, s, path);
  for (const char* key : {"anyOf", "oneOf", "allOf"})
    if (s.contains(key)) return fill_alternatives(n, s, key, path);
  fill_types(n, s, path);
}

void SchemaCompiler::fill_literals(Node& n, const ojson& s, const std::string& path) {
  if (s.contains("enum") && s.contains("const")) fail(path, "both enum and const");
  const ojson values = s.contains("const") ? ojson::array({s["const"]}) : s["enum"];
  if (!values.is_array() || values.empty()) fail(path + "/enum", "expected a non-empty list of values");
  if (values.size() > kMaxValues) fail(path + "/enum", "more than " + std::to_string(kMaxValues) + " values");
  // The values are fixed: a bound beside them would have to be checked on each (leniently it
  // is read past).
  auto beside = [&](const char* k) {
    if (s.contains(k) && !lenient) fail(path, std::string("'") + k + "' beside enum or const is not supported");
  };
  std::for_each(std::begin(kLengthKeys), std::end(kLengthKeys), beside);
  std::for_each(std::begin(kIntKeys), std::end(kIntKeys), beside);
  const std::vector<std::string> ts = s.contains("type") ? types(s, path) : std::vector<std::string>{};
  for (const ojson& v : values) {
    if (!ts.empty() && std::none_of(ts.begin(), ts.end(), [&](const std::string& t) { return of_type(v, t); }))
      fail(path, "the value " + v.dump() + " is not of the schema's type");
    n.literals.push_back(v.dump());
  }
  std::sort(n.literals.begin(), n.literals.end());
  n.literals.erase(std::unique(n.literals.begin(), n.literals.end()), n.literals.end());
}

void SchemaCompiler::fill_alternatives(Node& n, const ojson& s, const std::string& key, const std::string& path) {
  for (const auto& [k, v] : s.items())
    if (kKeywords.count(k) && k != key) fail(path, "'" + k + "' beside '" + key + "' is not supported");
  const ojson& a = s[key];
  if (!a.is_array() || a.empty()) fail(path + "/" + key, "expected a non-empty list of schemas");
  if (key == "allOf" && a.size() != 1) fail(path + "/allOf", "only an allOf of one schema is supported");
  if (a.size() > kMaxAlternatives) fail(path + "/" + key, "more than " + std::to_string(kMaxAlternatives) + " alternatives");
  for (size_t i = 0; i < a.size(); ++i) n.alts.push_back(compile(a[i], path + "/" + key + "/" + std::to_string(i)));
}

std::vector<std::string> SchemaCompiler::types(const ojson& s, const std::string& path) {
  const ojson& t = s["type"];
  std::vector<std::string> out;
  if (t.is_string()) out.push_back(t.get<std::string>());
  else if (t.is_array() && !t.empty() && std::all_of(t.begin(), t.end(), [](const ojson& x) { return x.is_string(); }))
    for (const ojson& x : t) out.push_back(x.get<std::string>());
  else fail(path + "/type", "expected a type name or a non-empty list of them");
  for (const std::string& x : out)
    if (!std::set<std::string>{"string", "number", "integer", "boolean", "null", "object", "array"}.count(x))
      fail(path + "/type", "unknown type '" + x + "'");
  return out;
}

void SchemaCompiler::fill_types(Node& n, const ojson& s, const std::string& path) {
  std::vector<std::string> ts;
  if (s.contains("type")) ts = types(s, path);
  else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required") || s.contains("minProperties") ||
           s.contains("maxProperties"))
    ts = {"object"};
  else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) ts = {"array"};
  else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern")) ts = {"string"};
  else if (std::any_of(std::begin(kIntKeys), std::end(kIntKeys), [&](const char* k) { return s.contains(k); })) ts = {"number"};
  else n.scalars = Node::kAny;
  for (const std::string& t : ts) {
    if (t == "string") n.scalars |= Node::kString;
    if (t == "number") n.scalars |= Node::kNumber;
    if (t == "integer") n.scalars |= Node::kInteger;
    if (t == "boolean") n.scalars |= Node::kBoolean;
    if (t == "null") n.scalars |= Node::kNull;
    if (t == "object" && !n.object) fill_object(n, s, path);
    if (t == "array" && !n.array) fill_array(n, s, path);
  }
  if (n.scalars & Node::kNumber) n.scalars &= uint8_t(~Node::kInteger);  // every integer is a number
  fill_bounds(n, s, path);
}

// minLength / maxLength where the node admits strings; minimum, maximum and their exclusive
// forms where it admits integers (any bound, rounded inward) or numbers (fill_number_bounds).
// A bound on a type the node does not admit constrains nothing.
void SchemaCompiler::fill_bounds(Node& n, const ojson& s, const std::string& path) {
  if (n.scalars & Node::kString) {
    count_of(s, "minLength", path, UINT32_MAX - 1, n.min_length);
    count_of(s, "maxLength", path, UINT32_MAX - 1, n.max_length);
    if (n.min_length > n.max_length && bound_fails(path, "minLength is above maxLength")) n.min_length = 0, n.max_length = UINT32_MAX;
    fill_pattern(n, s, path);
  }
  if (n.scalars & Node::kNumber) return fill_number_bounds(n, s, path);
  if (!(n.scalars & Node::kInteger)) return;
  __int128 lo = INT64_MIN, hi = INT64_MAX;
  for (const char* key : kIntKeys) {
    if (!s.contains(key)) continue;
    const ojson& v = s[key];
    if (!v.is_number()) {
      bound_fails(path + "/" + key, "expected a number");
      continue;
    }
    const std::string_view k = key;
    if (k == "minimum") lo = std::max(lo, int_bound(v, true));
    if (k == "exclusiveMinimum") lo = std::max(lo, int_bound(v, false) + 1);
    if (k == "maximum") hi = std::min(hi, int_bound(v, false));
    if (k == "exclusiveMaximum") hi = std::min(hi, int_bound(v, true) - 1);
  }
  lo = std::max<__int128>(lo, INT64_MIN), hi = std::min<__int128>(hi, INT64_MAX);
  if (lo > hi) return (void)bound_fails(path, "the bounds admit no integer (of 64 bits)");
  if (lo == INT64_MIN && hi == INT64_MAX) return;  // no bound within int64: none at all
  n.min_num = int64_t(lo), n.max_num = int64_t(hi);
  n.has_min_num = n.has_max_num = true;
}

// The pattern, or without one a format a pattern can say (format_pattern; other formats stay
// annotations), with the node's length bounds in its automaton. Leniently, one it cannot
// compile is read past, the lengths kept.
void SchemaCompiler::fill_pattern(Node& n, const ojson& s, const std::string& path) {
  std::string key = "pattern", text;
  if (s.contains("pattern")) {
    if (!s["pattern"].is_string()) return (void)bound_fails(path + "/pattern", "expected a string");
    text = s["pattern"].get<std::string>();
  } else if (const std::string* f = s.contains("format") && s["format"].is_string() ? format_pattern(s["format"].get<std::string>()) : nullptr) {
    key = "format", text = *f;
  } else {
    return;
  }
  std::shared_ptr<const Regex> re;
  try {
    re = std::make_shared<const Regex>(text, Regex::Match::Search, n.min_length, n.max_length);
  } catch (const Error& e) {
    return (void)bound_fails(path + "/" + key, e.what());
  }
  pattern_bytes += re->bytes();
  if (pattern_bytes > kMaxPatternBytes) return (void)bound_fails(path + "/" + key, "the schema's patterns need more than 8 MiB of automata");
  n.pattern = std::move(re);
}

// A bound on a number as the shortest decimal that reads back as it: r 10^-p, p <= 9 places
// (0.1 is 1 at 1 place, 5 is 5 at 0). False when it needs more places or more than int64.
static bool decimal_bound(const ojson& v, int64_t& r, int& p) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) return false;
    r = v.get<int64_t>(), p = 0;
    return true;
  }
  const double x = v.get<double>();
  long double scale = 1;
  for (p = 0; p <= 9; ++p, scale *= 10) {
    const long double scaled = (long double)x * scale;
    if (std::fabs(scaled) >= 0x1p62L) return false;
    r = std::llround(scaled);
    const std::string text = std::to_string(r) + "e-" + std::to_string(p);
    if (std::strtod(text.c_str(), nullptr) == x) return true;
  }
  return false;
}

// Bounds on numbers with fractions, each a decimal of at most 9 places (ge=0, le=1, gt=0.5:
// what pydantic's constrained floats say), scaled to the most places among them: a prefix of
// a decimal then reaches values in intervals with ends on that grid, decided in integers
// (JsonSchemaPrefix::num_reachable).
void SchemaCompiler::fill_number_bounds(Node& n, const ojson& s, const std::string& path) {
  struct Bound {
    const char* key;
    int64_t r;
    int p;
  };
  std::vector<Bound> bounds;
  int places = 0;
  for (const char* key : kIntKeys) {
    if (!s.contains(key)) continue;
    Bound b{key, 0, 0};
    if (!s[key].is_number() || !decimal_bound(s[key], b.r, b.p)) {
      bound_fails(path + "/" + key, "a bound on a number must be a decimal of at most 9 places within 64 bits");
      continue;
    }
    places = std::max(places, b.p);
    bounds.push_back(b);
  }
  n.num_places = uint8_t(places);
  for (const Bound& b : bounds) {
    __int128 units = b.r;
    for (int i = b.p; i < places; ++i) units *= 10;
    if (units > INT64_MAX || units < INT64_MIN) {
      bound_fails(path + "/" + b.key, "the bounds need more than 64 bits at " + std::to_string(places) + " places");
      continue;
    }
    const std::string_view k = b.key;
    const bool open = k.substr(0, 9) == "exclusive", lower = k == "minimum" || k == "exclusiveMinimum";
    int64_t& at = lower ? n.min_num : n.max_num;
    bool& has = lower ? n.has_min_num : n.has_max_num;
    bool& is_open = lower ? n.min_num_open : n.max_num_open;
    const int64_t x = int64_t(units);
    // The tighter bound wins; at the same value, the open one.
    if (!has || (lower ? x > at : x < at)) at = x, is_open = open;
    else if (x == at) is_open = is_open || open;
    has = true;
  }
  if (n.has_min_num && n.has_max_num && (n.min_num > n.max_num || (n.min_num == n.max_num && (n.min_num_open || n.max_num_open))) &&
      bound_fails(path, "the bounds admit no number"))
    n.has_min_num = n.has_max_num = false;
}

void SchemaCompiler::fill_object(Node& n, const ojson& s, const std::string& path) {
  n.object = true;
  std::set<std::string> required;
  if (s.contains("required")) {
    const ojson& r = s["required"];
    if (!r.is_array() || !std::all_of(r.begin(), r.end(), [](const ojson& x) { return x.is_string(); }))
      fail(path + "/required", "expected a list of property names");
    for (const ojson& x : r) required.insert(x.get<std::string>());
  }
  const ojson props = s.contains("properties") ? s["properties"] : ojson::object();
  if (!props.is_object()) fail(path + "/properties", "expected an object of schemas");
  const ojson extra = s.contains("additionalProperties") ? s["additionalProperties"] : ojson(true);
  if (props.empty()) {
    if (!required.empty() && !lenient) fail(path + "/required", "'" + *required.begin() + "' is not among the properties");
    if (!(extra.is_boolean() && !extra.get<bool>())) n.extra = compile(extra, path + "/additionalProperties");
    return fill_property_counts(n, s, path);
  }
  // Keys beyond the declared ones would leave the rest of the reply unconstrained in its shape.
  if (s.contains("additionalProperties") && !(extra.is_boolean() && !extra.get<bool>()) && !lenient)
    fail(path + "/additionalProperties", "only the declared properties can be generated: leave it out or set it to false");
  if (props.size() > kMaxProperties) fail(path + "/properties", "more than " + std::to_string(kMaxProperties) + " properties");
  for (const auto& [k, v] : props.items()) {
    const std::string text = ojson(k).dump();
    n.props.push_back({text.substr(1, text.size() - 2), compile(v, path + "/properties/" + pointer_token(k)), required.erase(k) > 0});
  }
  if (!required.empty() && !lenient) fail(path + "/required", "'" + *required.begin() + "' is not among the properties");
  const size_t P = n.props.size();
  n.by_key.resize(P);
  for (size_t i = 0; i < P; ++i) n.by_key[i] = uint16_t(i);
  std::sort(n.by_key.begin(), n.by_key.end(), [&](uint16_t a, uint16_t b) { return n.props[a].key < n.props[b].key; });
  n.required_from.assign(P + 1, uint16_t(P));
  for (size_t i = P; i-- > 0;) n.required_from[i] = n.props[i].required ? uint16_t(i) : n.required_from[i + 1];
  n.required_left.assign(P + 1, 0);
  for (size_t i = P; i-- > 0;) n.required_left[i] = uint16_t(n.required_left[i + 1] + n.props[i].required);
  fill_property_counts(n, s, path);
}

// minProperties / maxProperties, refused where no object of the node could meet them: more
// than its declared keys, fewer than its required ones, any key where it takes none.
void SchemaCompiler::fill_property_counts(Node& n, const ojson& s, const std::string& path) {
  count_of(s, "minProperties", path, UINT32_MAX, n.min_props);
  count_of(s, "maxProperties", path, UINT32_MAX, n.max_props);
  const size_t most = n.props.empty() ? (n.extra ? UINT32_MAX : 0) : n.props.size();
  const size_t least = n.props.empty() ? 0 : n.required_left[0];
  // Leniently, counts no object could meet are read past.
  if ((n.min_props > n.max_props && bound_fails(path, "minProperties is above maxProperties")) ||
      (n.min_props > most && bound_fails(path + "/minProperties", "above the " + std::to_string(most) + " keys the object may hold")) ||
      (least > n.max_props && bound_fails(path + "/maxProperties", "below the " + std::to_string(least) + " required keys")))
    n.min_props = 0, n.max_props = UINT32_MAX;
}

void SchemaCompiler::fill_array(Node& n, const ojson& s, const std::string& path) {
  n.array = true;
  if (s.contains("prefixItems")) {
    const ojson& p = s["prefixItems"];
    if (!p.is_array()) fail(path + "/prefixItems", "expected a list of schemas");
    if (p.size() > kMaxProperties) fail(path + "/prefixItems", "more than " + std::to_string(kMaxProperties) + " item schemas");
    for (size_t i = 0; i < p.size(); ++i) n.prefix_items.push_back(compile(p[i], path + "/prefixItems/" + std::to_string(i)));
  }
  const ojson items = s.contains("items") ? s["items"] : ojson(true);
  if (items.is_array()) fail(path + "/items", "a list of item schemas (a tuple) is not supported: prefixItems says it");
  if (items.is_boolean() && !items.get<bool>()) {  // no item past the prefix
    n.max_items = uint32_t(n.prefix_items.size());
    n.items = any(path + "/items");  // never read
  } else {
    n.items = compile(items, path + "/items");
  }
  for (const char* key : {"minItems", "maxItems"}) {
    if (!s.contains(key)) continue;
    const ojson& v = s[key];
    if (!v.is_number_unsigned()) fail(path + "/" + key, "expected a non-negative integer");
    const uint32_t x = uint32_t(std::min<uint64_t>(v.get<uint64_t>(), UINT32_MAX));
    if (std::string_view(key) == "minItems") n.min_items = x;
    else n.max_items = std::min(n.max_items, x);
  }
  if (n.min_items > n.max_items) fail(path, "minItems is above maxItems");
}

std::bitset<256> SchemaCompiler::first(const Node& n, std::map<const Node*, std::bitset<256>>& memo,
                                       std::set<const Node*>& visiting) {
  if (auto it = memo.find(&n); it != memo.end()) return it->second;
  std::bitset<256> b;
  if (!n.alts.empty()) {
    culprit = &n;
    if (!visiting.insert(&n).second) fail(where[&n], "the alternatives refer back to themselves before a value begins");
    if (visiting.size() > size_t(kMaxNesting)) fail(where[&n], "alternatives nest deeper than " + std::to_string(kMaxNesting));
    for (const Node* a : n.alts) b |= first(*a, memo, visiting);
    visiting.erase(&n);
  }
  if (n.scalars & Node::kAny) b |= bytes_of("{[\"-0123456789tfn");
  if (n.scalars & Node::kString) b |= bytes_of("\"");
  if (n.scalars & (Node::kNumber | Node::kInteger)) b |= bytes_of("-0123456789");
  if (n.scalars & Node::kBoolean) b |= bytes_of("tf");
  if (n.scalars & Node::kNull) b |= bytes_of("n");
  if (n.object) b.set('{');
  if (n.array) b.set('[');
  for (const std::string& l : n.literals) b.set(static_cast<unsigned char>(l[0]));
  culprit = &n;
  if (b.none()) fail(where[&n], "the schema admits no value");
  return memo[&n] = b;
}

// Alternatives are told apart by a value's first byte, so no two may share one, except a
// number and an integer (the number is read: it admits every integer).
void SchemaCompiler::check_alternatives(const Node& n, const std::map<const Node*, std::bitset<256>>& memo) {
  const std::bitset<256> numeric = bytes_of("-0123456789");
  auto plain_number = [](const Node* a) {
    return a->alts.empty() && !(a->scalars & Node::kAny) && (a->scalars & (Node::kNumber | Node::kInteger)) &&
           std::none_of(a->literals.begin(), a->literals.end(), [](const std::string& l) { return l[0] == '-' || is_digit(l[0]); });
  };
  for (size_t i = 0; i < n.alts.size(); ++i)
    for (size_t j = i + 1; j < n.alts.size(); ++j) {
      const std::bitset<256> both = memo.at(n.alts[i]) & memo.at(n.alts[j]);
      if (both.none() || ((both & ~numeric).none() && plain_number(n.alts[i]) && plain_number(n.alts[j]))) continue;
      size_t c = 0;
      while (!both.test(c)) ++c;
      fail(where[&n], "alternatives " + std::to_string(i) + " and " + std::to_string(j) + " both begin with '" +
                          std::string(1, char(c)) + "': only alternatives that begin differently are supported");
    }
}

// The nodes a value of the root can reach (leniently, parts given up on are left behind).
static std::vector<Node*> reachable(const Node* root) {
  std::vector<Node*> out;
  std::set<const Node*> seen;
  std::vector<const Node*> todo = {root};
  while (!todo.empty()) {
    const Node* n = todo.back();
    todo.pop_back();
    if (!n || !seen.insert(n).second) continue;
    out.push_back(const_cast<Node*>(n));  // every node is one of JsonSchema::nodes_
    for (const Node::Property& p : n->props) todo.push_back(p.value);
    todo.insert(todo.end(), n->alts.begin(), n->alts.end());
    todo.push_back(n->extra);
    todo.push_back(n->items);
    todo.insert(todo.end(), n->prefix_items.begin(), n->prefix_items.end());
  }
  return out;
}

// Leniently, a node that fails a check admits any value instead, and the checks run again:
// a round turns every node whose alternatives begin alike, or the one node whose first bytes
// could not be found; past 64 rounds the whole schema admits any value.
void SchemaCompiler::finish(Node& root) {
  auto give_up = [](const Node& at) {
    Node& n = const_cast<Node&>(at);  // one of out.nodes_
    n = Node{};
    n.scalars = Node::kAny;
  };
  for (int round = 0;; ++round) {
    const std::vector<Node*> nodes = reachable(&root);
    std::map<const Node*, std::bitset<256>> memo;
    std::set<const Node*> visiting;
    bool again = false;
    try {
      for (Node* n : nodes) n->first = first(*n, memo, visiting);
      for (const Node* n : nodes) {
        try {
          check_alternatives(*n, memo);
        } catch (const Error&) {
          if (!lenient) throw;
          give_up(*n);
          again = true;
        }
      }
    } catch (const Error&) {
      if (!lenient || !culprit) throw;
      give_up(round < 64 ? *culprit : root);
      again = true;
    }
    if (!again) return;
    culprit = nullptr;
  }
}

JsonSchema::JsonSchema(const ojson& schema, Lenient lenient) {
  SchemaCompiler c{*this, schema, lenient == Lenient::Yes, nullptr, {}, {}, {}};
  root_ = c.resolve("#", "#");
  c.finish(const_cast<Node&>(*root_));  // one of nodes_
}

const JsonSchema& JsonSchema::any_object() {
  static const JsonSchema s(ojson{{"type", "object"}});
  return s;
}

// ---- the recognizer ----

namespace {

// The alternative of n that a value beginning with c is read by (n itself without any).
const Node* pick(const Node& n, unsigned char c) {
  const Node* m = &n;
  while (!m->alts.empty()) {
    const Node* next = nullptr;
    for (const Node* a : m->alts)
      if (a->first.test(c) && (!next || (a->scalars & Node::kNumber))) next = a;  // a number over an integer
    if (!next) return nullptr;
    m = next;
  }
  return m;
}

// Within [lo, hi) of strings sorted and sharing their first `at` bytes, those whose next
// byte is c: a run, found by binary search (the ones that end at `at` sort first, the rest by
// that byte).
template <class Str>
std::pair<uint16_t, uint16_t> narrow(Str str, uint16_t lo, uint16_t hi, uint16_t at, unsigned char c) {
  auto next = [&](uint16_t i) { const std::string& s = str(i); return s.size() > at ? int(static_cast<unsigned char>(s[at])) : -1; };
  auto first = [&](int v) {  // the first i in [lo, hi) with next(i) >= v
    uint16_t a = lo, b = hi;
    while (a < b) {
      const uint16_t m = uint16_t(a + (b - a) / 2);
      if (next(m) < v) a = uint16_t(m + 1);
      else b = m;
    }
    return a;
  };
  return {first(c), first(c + 1)};
}

}  // namespace

JsonSchemaPrefix& JsonSchemaPrefix::operator=(const JsonSchemaPrefix& o) {
  root_ = o.root_;
  std::copy_n(o.frames_, o.depth_, frames_);
  depth_ = o.depth_;
  done_ = o.done_, in_leaf_ = o.in_leaf_, leaf_key_ = o.leaf_key_, leaf_int_ = o.leaf_int_;
  leaf_ = o.leaf_;
  bounded_ = o.bounded_, bound_ = o.bound_, count_ = o.count_, utf8_ = o.utf8_;
  if (bounded_ && bounded_->pattern) re_ = o.re_, dec_ = o.dec_, esc_ = o.esc_, cp_ = o.cp_;  // a patterned string's state
  neg_ = o.neg_, dot_ = o.dot_, frac_nonzero_ = o.frac_nonzero_, digits_ = o.digits_, frac_digits_ = o.frac_digits_;
  return *this;
}

bool JsonSchemaPrefix::feed(std::string_view s) {
  for (char c : s)
    if (!feed(static_cast<unsigned char>(c))) return false;
  return true;
}

bool JsonSchemaPrefix::feed(unsigned char c) {
  if (in_leaf_) return feed_leaf(c);
  if (depth_ > 0 && top().phase == Phase::InKey) return feed_key(c);
  if (depth_ > 0 && top().phase == Phase::InLiteral) return feed_literal(c);
  if (is_space(c)) return true;
  if (depth_ == 0) return !done_ && start_value(*root_, c);
  return top().array ? feed_array(c) : feed_object(c);
}

bool JsonSchemaPrefix::complete() const {
  if (depth_ == 0) return done_ || (in_leaf_ && leaf_.complete() && (!bounded_ || bound_ == Bound::Length || num_can_end()));
  const Frame& f = top();  // a top-level enum value, whole so far (the shortest candidate sorts first)
  return depth_ == 1 && f.phase == Phase::InLiteral && f.node->literals[f.lo].size() == f.at;
}

uint32_t JsonSchemaPrefix::string_room() const {
  if (!in_leaf_ || !bounded_ || bound_ != Bound::Length) return UINT32_MAX;
  if (bounded_->pattern) return 0;  // every byte goes through the automaton
  if (bounded_->max_length == UINT32_MAX) return UINT32_MAX;
  return uint32_t(bounded_->max_length - count_);
}

const Regex* JsonSchemaPrefix::pattern_at(Regex::Set& s, uint32_t& count) const {
  if (!in_leaf_ || !bounded_ || bound_ != Bound::Length || !bounded_->pattern || !leaf_.in_string() || esc_ != 0 || !dec_.idle()) return nullptr;
  s = re_, count = uint32_t(count_);
  return bounded_->pattern.get();
}

bool JsonSchemaPrefix::between_tokens() const {
  if (in_leaf_) return leaf_.between_tokens();  // inside a free value's object or array
  return depth_ == 0 || (top().phase != Phase::InKey && top().phase != Phase::InLiteral);
}

bool JsonSchemaPrefix::push(const Node& n, Phase p, bool array) {
  if (depth_ == kMaxFrames) return false;
  frames_[depth_++] = Frame{&n, p, array, 0, 0, 0, 0, 0};
  return true;
}

bool JsonSchemaPrefix::start_value(const Node& node, unsigned char c) {
  const Node* n = pick(node, c);
  if (!n) return false;
  if (n->scalars & Node::kAny) return start_leaf(c, false, false);
  if (!n->literals.empty()) {
    const auto [lo, hi] = narrow([&](uint16_t i) -> const std::string& { return n->literals[i]; }, 0,
                                 uint16_t(n->literals.size()), 0, c);
    if (lo == hi || !push(*n, Phase::InLiteral, false)) return false;
    Frame& f = top();
    f.lo = lo, f.hi = hi, f.at = 1;
    if (hi - lo == 1 && n->literals[lo].size() == 1) {
      --depth_;
      value_done();
    }
    return true;
  }
  if (c == '{' && n->object) return push(*n, Phase::KeyOrClose, false);
  if (c == '[' && n->array) return push(*n, Phase::ValueOrClose, true);
  const uint8_t s = n->scalars;
  if (c == '"') return (s & Node::kString) && start_leaf(c, false, false, n->string_bounds() ? n : nullptr);
  if (c == 't' || c == 'f') return (s & Node::kBoolean) && start_leaf(c, false, false);
  if (c == 'n') return (s & Node::kNull) && start_leaf(c, false, false);
  if (c == '-' || is_digit(c)) {
    const bool integer = !(s & Node::kNumber);
    return (s & (Node::kNumber | Node::kInteger)) && start_leaf(c, integer, false, n->num_bounds() ? n : nullptr);
  }
  return false;
}

bool JsonSchemaPrefix::start_leaf(unsigned char c, bool integer, bool key, const Node* bounded) {
  JsonPrefix l;
  if (!l.feed(c)) return false;
  leaf_ = l;
  in_leaf_ = true, leaf_int_ = integer, leaf_key_ = key;
  bounded_ = bounded, count_ = 0, utf8_ = Utf8Chars{};
  if (bounded && bounded->pattern) re_ = bounded->pattern->start(), dec_ = Utf8Decoder{}, esc_ = 0, cp_ = 0;
  neg_ = dot_ = frac_nonzero_ = false, digits_ = frac_digits_ = 0;
  bound_ = c == '"' ? Bound::Length : Bound::Number;
  if (!bounded || bound_ == Bound::Length) return true;
  neg_ = c == '-';  // the first byte as bounds_take reads a digit
  return neg_ ? num_reachable() : bounds_take(c);  // "-" alone: some value of that sign in range
}

// The node's bounds on the leaf's next byte: a string's length, or a number's range.
bool JsonSchemaPrefix::bounds_take(unsigned char c) { return bound_ == Bound::Length ? take_length(c) : take_number(c); }

// Characters counted at their first byte as Utf8Chars finds them, an escape as one.
bool JsonSchemaPrefix::take_length(unsigned char c) {
  if (bounded_->pattern) return take_pattern(c);
  if (!leaf_.in_string() || c < 0x20) return true;  // inside an escape, or refused by the leaf
  if (c == '"') return count_ >= bounded_->min_length;
  if (!utf8_.begins(c)) return true;
  if (count_ >= bounded_->max_length) return false;
  ++count_;
  return true;
}

// A patterned string's bytes, decoded to the characters the automaton takes (count_ of them so
// far, which its length bounds count): a byte inside a character or an escape must leave some
// code point it may become open, and the closing quote must end a match. A \u escape of a
// surrogate is refused (the character can be written as UTF-8 instead).
bool JsonSchemaPrefix::take_pattern(unsigned char c) {
  const Regex& re = *bounded_->pattern;
  const uint32_t n = uint32_t(count_);
  auto take = [&](char32_t x) {
    re_ = re.step(re_, x, n), ++count_;
    return re_.any();
  };
  auto bmp = [&](char32_t lo, char32_t hi) {  // some code point of [lo, hi] but a surrogate
    return (lo < 0xD800 && re.can_take(re_, lo, std::min<char32_t>(hi, 0xD7FF), n)) ||
           (hi > 0xDFFF && re.can_take(re_, std::max<char32_t>(lo, 0xE000), hi, n));
  };
  if (esc_ == 1) {
    esc_ = 0;
    switch (c) {
      case '"': case '\\': case '/': return take(c);
      case 'b': return take('\b');
      case 'f': return take('\f');
      case 'n': return take('\n');
      case 'r': return take('\r');
      case 't': return take('\t');
      case 'u': return esc_ = 2, cp_ = 0, bmp(0, 0xFFFF);
      default: return true;  // refused by the leaf
    }
  }
  if (esc_ >= 2) {
    const int h = is_digit(c) ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
    if (h < 0) return true;  // refused by the leaf
    cp_ = cp_ * 16 + char32_t(h);
    if (const int left = 5 - esc_; left > 0) {  // hex digits still to come
      ++esc_;
      return bmp(cp_ << 4 * left, cp_ << 4 * left | ((1u << 4 * left) - 1));
    }
    esc_ = 0;
    return (cp_ < 0xD800 || cp_ > 0xDFFF) && take(cp_);
  }
  if (c == '"') return dec_.idle() && re.accepts(re_, n);
  if (c == '\\') return esc_ = 1, dec_.idle() && bmp(0, 0xFFFF);
  if (c < 0x20) return true;  // refused by the leaf
  char32_t cp = 0, lo = 0, hi = 0;
  const int r = dec_.feed(c, cp, lo, hi);
  if (r < 0) return false;
  return r > 0 ? take(cp) : re.can_take(re_, lo, hi, n);
}

// Each digit must leave some completion in range, and a byte that ends the number must end it
// in range: over the whole part, a '.' and the fraction's digits; no exponent. From the point
// on, count_ holds the number in units of the bounds' places (its first places fraction
// digits); a digit past them only says whether the fraction goes on past zero. An integer's
// '.' or exponent is a byte that ends it (the leaf refuses it, or the value goes on without).
bool JsonSchemaPrefix::take_number(unsigned char c) {
  if (leaf_int_ && (c == '.' || c == 'e' || c == 'E')) return digits_ == 0 || num_can_end();
  if (c == 'e' || c == 'E') return false;
  const int places = bounded_->num_places;
  auto grow = [](uint64_t v, int times) {  // v 10^times, saturated
    for (; times > 0; --times) v = v > UINT64_MAX / 10 ? UINT64_MAX : v * 10;
    return v;
  };
  if (c == '.') {
    if (dot_ || digits_ == 0) return true;  // refused by the leaf
    dot_ = true;
    count_ = grow(count_, places);
    return num_reachable();
  }
  if (is_digit(c) && dot_) {
    frac_digits_ = uint8_t(std::min(frac_digits_ + 1, 255));
    if (frac_digits_ <= places) {
      const uint64_t add = grow(uint64_t(c - '0'), places - frac_digits_);
      count_ = count_ > UINT64_MAX - add ? UINT64_MAX : count_ + add;
    } else {
      frac_nonzero_ = frac_nonzero_ || c != '0';
    }
    return num_reachable();
  }
  if (is_digit(c) && !(digits_ > 0 && count_ == 0)) {
    count_ = count_ > (UINT64_MAX - 9) / 10 ? UINT64_MAX : count_ * 10 + (c - '0');
    digits_ = uint8_t(std::min(digits_ + 1, 255));
    return num_reachable();
  }
  return digits_ == 0 || num_can_end();
}

namespace {

// A number's bounds seen from its magnitude m = |x| (x = -m when negative), in the bounds'
// units; a bound that is absent lies beyond any magnitude a reply can write.
struct MagnitudeBounds {
  static constexpr __int128 kFar = __int128(1) << 100;
  __int128 lo, hi;
  bool lo_open, hi_open;
  MagnitudeBounds(const Node& n, bool neg) {
    const __int128 a = n.has_min_num ? n.min_num : -kFar, b = n.has_max_num ? n.max_num : kFar;
    if (neg) lo = -b, hi = -a, lo_open = n.max_num_open, hi_open = n.min_num_open;
    else lo = a, hi = b, lo_open = n.min_num_open, hi_open = n.max_num_open;
  }
  bool has(__int128 p) const { return (p > lo || (p == lo && !lo_open)) && (p < hi || (p == hi && !hi_open)); }
  bool inside(__int128 p) const { return lo < p + 1 && hi > p; }  // some m strictly between p and p + 1
  bool range(__int128 a, __int128 b) const { return has(a) || (lo < b && hi > a); }  // some m in [a, b)
};

__int128 pow10(int e) {
  __int128 v = 1;
  while (e-- > 0) v *= 10;
  return v;
}

}  // namespace

// Some value in range begins with the number so far, in units u = 10^-places: the whole part
// I with k more digits reaches [I 10^(k + places), (I + 1) 10^(k + places)); after the point
// with j <= places fraction digits, [count, count + 10^(places - j)); past them, [count, count
// + 1) while the extra digits are zeros, else the open (count, count + 1). The bounds lie on
// the grid of units, so each test is exact.
bool JsonSchemaPrefix::num_reachable() const {
  const MagnitudeBounds b(*bounded_, neg_);
  const int places = bounded_->num_places;
  if (digits_ == 0) return b.range(0, MagnitudeBounds::kFar);  // "-" alone
  const __int128 v = count_, unit = pow10(places);
  if (!dot_) {
    if (v == 0) return b.range(0, unit);  // "0": [0, 1)
    for (__int128 a = v * unit, step = unit; a <= MagnitudeBounds::kFar; a *= 10, step *= 10)
      if (b.range(a, a + step)) return true;
    return false;
  }
  if (frac_digits_ < places) return b.range(v, v + pow10(places - frac_digits_));
  return frac_nonzero_ ? b.inside(v) : b.range(v, v + 1);
}

bool JsonSchemaPrefix::num_can_end() const {
  if (digits_ == 0 || (dot_ && frac_digits_ == 0)) return false;
  const MagnitudeBounds b(*bounded_, neg_);
  if (!dot_) return b.has(__int128(count_) * pow10(bounded_->num_places));
  return frac_nonzero_ ? b.inside(__int128(count_)) : b.has(__int128(count_));
}

bool JsonSchemaPrefix::feed_leaf(unsigned char c) {
  if (bounded_ && !bounds_take(c)) return false;
  const bool fraction = leaf_int_ && (c == '.' || c == 'e' || c == 'E');
  if (!leaf_.complete()) {  // the value cannot end here, so a refusal is final
    if (fraction || !leaf_.feed(c)) return false;
    if (leaf_.closed()) leaf_done();  // ended by this byte
    return true;
  }
  JsonPrefix next = leaf_;  // a whole number: c goes on with it, or ends it
  if (!fraction && next.feed(c)) {
    leaf_ = next;
    if (leaf_.closed()) leaf_done();  // ended by whitespace
    return true;
  }
  leaf_done();
  return feed(c);
}

void JsonSchemaPrefix::leaf_done() {
  in_leaf_ = false;
  if (!leaf_key_) return value_done();
  leaf_key_ = false;
  top().phase = Phase::Colon;
}

namespace {

// Inside a string after the first `at` bytes of a JSON text.
bool in_string_at(std::string_view text, size_t at) {
  bool in = false;
  for (size_t i = 0; i < at; ++i)
    if (text[i] == '\\' && in) ++i;
    else if (text[i] == '"') in = !in;
  return in;
}

// Whether whitespace may come after the first `at` bytes of the enum values [lo, hi) (which
// share them): inside an object or array value, between two of its tokens for every one.
bool literal_gap(const std::vector<std::string>& L, uint16_t lo, uint16_t hi, uint16_t at) {
  const std::string& t = L[lo];
  if (at == 0 || (t[0] != '{' && t[0] != '[') || in_string_at(t, at)) return false;
  if (std::string_view("{[,:").find(t[at - 1]) != std::string_view::npos) return true;
  for (uint16_t i = lo; i < hi; ++i)
    if (L[i].size() <= at || std::string_view("}],:").find(L[i][at]) == std::string_view::npos) return false;
  return true;
}

}  // namespace

bool JsonSchemaPrefix::feed_literal(unsigned char c) {
  Frame& f = top();
  const std::vector<std::string>& L = f.node->literals;
  if (is_space(c) && literal_gap(L, f.lo, f.hi, f.at)) return true;
  const auto [lo, hi] = narrow([&](uint16_t i) -> const std::string& { return L[i]; }, f.lo, f.hi, f.at, c);
  if (lo < hi) {
    f.lo = lo, f.hi = hi, ++f.at;
    if (hi - lo == 1 && L[lo].size() == f.at) {
      --depth_;
      value_done();
    }
    return true;
  }
  if (L[f.lo].size() != f.at) return false;
  --depth_;  // a whole value (a number) ended by a byte that is not its own
  value_done();
  return feed(c);
}

bool JsonSchemaPrefix::key_allowed(const Frame& f, uint16_t p) const {
  // Declared order: any property from the next one up to the first required one left, and
  // one that leaves the key counts reachable: the required ones after it within the maximum,
  // enough after it to reach the minimum.
  const Node& n = *f.node;
  const size_t P = n.props.size();
  if (!(p >= f.next && p <= n.required_from[f.next] && p < P)) return false;
  const uint64_t keys = uint64_t(f.keys) + 1;
  return keys + n.required_left[p + 1] <= n.max_props && keys + (P - p - 1) >= n.min_props;
}

// Some key may come next: a declared one key_allowed takes, or, in a map, one more key.
bool JsonSchemaPrefix::key_room(const Frame& f) const {
  const Node& n = *f.node;
  if (n.props.empty()) return n.extra && f.keys < n.max_props;
  for (uint32_t p = f.next; p < n.props.size() && p <= n.required_from[f.next]; ++p)
    if (key_allowed(f, uint16_t(p))) return true;
  return false;
}

bool JsonSchemaPrefix::feed_key(unsigned char c) {
  Frame& f = top();
  const Node& n = *f.node;
  auto key = [&](uint16_t i) -> const std::string& { return n.props[n.by_key[i]].key; };
  if (c == '"')  // the key ends (a quote inside a key is escaped, so no candidate goes on with it here)
    for (uint16_t i = f.lo; i < f.hi; ++i)
      if (key(i).size() == f.at && key_allowed(f, n.by_key[i])) {
        f.next = n.by_key[i];
        f.phase = Phase::Colon;
        return true;
      }
  const auto [lo, hi] = narrow(key, f.lo, f.hi, f.at, c);
  bool any = false;
  for (uint16_t i = lo; i < hi && !any; ++i) any = key_allowed(f, n.by_key[i]);
  if (!any) return false;
  f.lo = lo, f.hi = hi, ++f.at;
  return true;
}

bool JsonSchemaPrefix::feed_object(unsigned char c) {
  Frame& f = top();
  const Node& n = *f.node;
  switch (f.phase) {
    case Phase::KeyOrClose:
      if (c == '}') return close_container();
      [[fallthrough]];
    case Phase::Key:
      if (c != '"' || !key_room(f)) return false;
      if (n.props.empty()) return start_leaf(c, false, true);
      f.phase = Phase::InKey;
      f.lo = 0, f.hi = uint16_t(n.props.size()), f.at = 0;
      return true;
    case Phase::Colon:
      if (c != ':') return false;
      f.phase = Phase::Value;
      return true;
    case Phase::Value: return start_value(n.props.empty() ? *n.extra : *n.props[f.next].value, c);
    case Phase::CommaOrClose:
      if (c == '}') return close_container();
      if (c != ',' || !key_room(f)) return false;
      f.phase = Phase::Key;
      return true;
    default: return false;
  }
}

bool JsonSchemaPrefix::feed_array(unsigned char c) {
  Frame& f = top();
  const Node& n = *f.node;
  switch (f.phase) {
    case Phase::ValueOrClose:
      if (c == ']') return close_container();
      if (f.next >= n.max_items) return false;
      [[fallthrough]];
    case Phase::Value: return start_value(f.next < n.prefix_items.size() ? *n.prefix_items[f.next] : *n.items, c);
    case Phase::CommaOrClose:
      if (c == ']') return close_container();
      if (c != ',' || f.next >= n.max_items) return false;
      f.phase = Phase::Value;
      return true;
    default: return false;
  }
}

bool JsonSchemaPrefix::close_container() {
  const Frame& f = top();
  const Node& n = *f.node;
  if (f.array ? f.next < n.min_items : (f.keys < n.min_props || (!n.props.empty() && n.required_from[f.next] != n.props.size())))
    return false;
  --depth_;
  value_done();
  return true;
}

void JsonSchemaPrefix::value_done() {
  if (depth_ == 0) {
    done_ = true;
    return;
  }
  Frame& f = top();
  if (f.array || !f.node->props.empty()) ++f.next;
  if (!f.array) ++f.keys;
  f.phase = Phase::CommaOrClose;
}

}  // namespace dsa
