#pragma once
// JSON Schema for constrained decoding (OpenAI's response_format json_schema): a schema is
// compiled once into a graph of nodes, and JsonSchemaPrefix recognizes, byte by byte, the
// JSON texts it admits. It is used as JsonPrefix is: feed() refuses every byte with which no
// admitted text begins, so a sampler masked by it never walks into a dead end.
//
// The subset is what OpenAI's strict mode and pydantic emit:
//  - type (one or a list), enum, const (the value written as compact JSON), anyOf / oneOf
//    whose alternatives begin with different bytes (a string and null, an object and an
//    array; an integer and a number merge), allOf with one schema, $ref to "#",
//    "#/$defs/NAME" or "#/definitions/NAME" (recursion allowed), true (any value);
//  - objects with properties: the declared keys only, in the schema's order, each at most
//    once, required ones always; without properties, any keys with values of
//    additionalProperties (left out or true: any value; false: no key); minProperties and
//    maxProperties (on a map, the keys as written: a key written twice counts twice);
//  - arrays: prefixItems (a tuple's positions), items (the rest; false: none), minItems,
//    maxItems; strings, numbers, integers, booleans, null;
//  - strings: minLength, maxLength, in characters as written (a UTF-8 character, each invalid
//    part as the U+FFFD it becomes, or an escape; a surrogate pair written as two \u escapes
//    counts two); pattern (sampling/regex.h: ECMA-262 syntax without backreferences or
//    lookaround, matched anywhere in the string unless anchored; the string's characters as
//    the escapes decode them, which must then be well-formed UTF-8 without \u surrogates, and
//    its lengths in those characters); integers and numbers: minimum, maximum, exclusiveMinimum, exclusiveMaximum
//    (on a type that admits fractions a bound is taken as the shortest decimal that reads back
//    as it, of at most 9 places, and a bounded value is written without an exponent; it is
//    decided on the decimal as written, which a reader rounding to doubles may find equal to
//    an open bound when it lies within half a unit in the last place of it);
//  - annotations are read past: title, description, default, examples, $schema, $id,
//    $comment; format, an annotation in JSON Schema since 2019-09, is kept as a pattern where
//    one can say it and the string has no pattern of its own (date, time, date-time,
//    duration, uuid, ipv4, ipv6, hostname, email: each a part of what its RFC allows) and
//    read past otherwise.
// Any other keyword is an error that names it: a constraint the output would not keep is
// never taken silently.
#include <bitset>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sampling/json_prefix.h"
#include "sampling/regex.h"

namespace dsa {

// Counts characters as the reply's text will hold them: the decoder replaces each maximal
// invalid subpart of UTF-8 (and a truncated tail) with one U+FFFD, so a byte begins a
// character unless it continues a well-formed sequence begun before it (Unicode's table 3-7).
struct Utf8Chars {
  Utf8Decoder d;  // its need and range only: which bytes continue the character under way
  bool begins(unsigned char b) {
    if (d.need > 0 && b >= d.lo && b <= d.hi) {
      d.continues(b);
      return false;
    }
    d.start(b);  // a byte that starts no character counts as one of its own
    return true;
  }
};

struct JsonSchemaNode {
  enum Scalar : uint8_t { kString = 1, kNumber = 2, kInteger = 4, kBoolean = 8, kNull = 16, kAny = 32 };
  struct Property {
    std::string key;  // as written between the quotes (JSON-escaped)
    const JsonSchemaNode* value;
    bool required;
  };
  uint8_t scalars = 0;
  bool object = false, array = false;
  std::vector<Property> props;          // declared order
  std::vector<uint16_t> by_key;         // props' indices sorted by key text
  std::vector<uint16_t> required_from;  // [i]: the first required index >= i (props.size(): none)
  std::vector<uint16_t> required_left;  // [i]: how many of props [i, size) are required
  uint32_t min_props = 0, max_props = UINT32_MAX;
  const JsonSchemaNode* extra = nullptr;  // objects without props: every key's value (null: no key)
  std::vector<const JsonSchemaNode*> prefix_items;  // the first items' schemas, by position
  const JsonSchemaNode* items = nullptr;             // the items past them
  uint32_t min_items = 0, max_items = UINT32_MAX;
  uint32_t min_length = 0, max_length = UINT32_MAX;  // strings, in characters
  std::shared_ptr<const Regex> pattern;              // strings: with the length bounds in it
  // Bounds on numbers in units of 10^-num_places, each present or not, inclusive or open.
  // Integers' bounds are rounded inward to whole values (0 places, both ends closed and
  // present, within int64: bounded integers are exact in 64 bits).
  int64_t min_num = 0, max_num = 0;
  uint8_t num_places = 0;
  bool has_min_num = false, has_max_num = false, min_num_open = false, max_num_open = false;
  bool string_bounds() const { return min_length > 0 || max_length < UINT32_MAX || pattern; }
  bool num_bounds() const { return has_min_num || has_max_num; }
  std::vector<std::string> literals;        // enum / const as compact JSON, sorted
  std::vector<const JsonSchemaNode*> alts;  // anyOf / oneOf: told apart by their first byte
  std::bitset<256> first;                   // the bytes a value of this node begins with
};

class JsonSchema {
public:
  // Lenient::Yes (a tool's parameters without "strict"): a part of the schema outside the
  // subset admits any value there, and keywords outside it are read past (the output then
  // keeps what the subset can say: the shape, the types, the declared keys, the enums).
  enum class Lenient { No, Yes };
  // Throws Error naming the place in the schema (a JSON pointer) and what is not supported
  // (never leniently: there any part it cannot read admits any value).
  explicit JsonSchema(const nlohmann::ordered_json& schema, Lenient lenient = Lenient::No);
  JsonSchema(const JsonSchema&) = delete;
  JsonSchema& operator=(const JsonSchema&) = delete;
  const JsonSchemaNode& root() const { return *root_; }
  // {"type": "object"}: JSON mode (response_format json_object).
  static const JsonSchema& any_object();

private:
  std::deque<JsonSchemaNode> nodes_;  // stable addresses: nodes point at each other
  const JsonSchemaNode* root_ = nullptr;
  friend struct SchemaCompiler;
};

// The state is a fixed stack of frames (objects, arrays and enum values being read) and the
// JsonPrefix reading the scalar or free value at the top, so trying a token is a copy and a
// feed, as with JsonPrefix. The schema outlives the recognizer.
class JsonSchemaPrefix {
public:
  static constexpr int kMaxFrames = 32;
  explicit JsonSchemaPrefix(const JsonSchema& schema) : root_(&schema.root()) {}
  // A value of one node of a schema (a tool parameter's); the schema outlives the recognizer.
  explicit JsonSchemaPrefix(const JsonSchemaNode& root) : root_(&root) {}
  // Copies copy only the frames in use: a mask tries thousands of tokens, each on a copy.
  JsonSchemaPrefix(const JsonSchemaPrefix& o) { *this = o; }
  JsonSchemaPrefix& operator=(const JsonSchemaPrefix& o);

  bool feed(unsigned char c);  // as JsonPrefix::feed
  bool feed(std::string_view s);
  bool complete() const;       // the bytes so far are an admitted text (a number may go on)
  bool closed() const { return depth_ == 0 && done_; }  // only whitespace may follow
  // Inside a string any value of which is admitted, past any escape.
  bool in_string() const { return in_leaf_ && leaf_.in_string(); }
  // Characters a string being read may still take (UINT32_MAX: any number): a byte of text
  // that keeps a string open is refused only past them.
  uint32_t string_room() const;
  // Between tokens of the text: whitespace leaves the state as it is.
  bool between_tokens() const;
  // Inside a patterned string at a character's start (no escape or UTF-8 character under way):
  // its automaton, with s and count set to the state and the characters so far; else null.
  // There the string's bytes other than a quote, backslash or control byte go to the
  // automaton alone.
  const Regex* pattern_at(Regex::Set& s, uint32_t& count) const;
  // As ToolCallPrefix: no raw text, no markup to keep out, whitespace bounded everywhere.
  static constexpr bool kGuardsMarkup = false;
  bool in_raw() const { return false; }
  bool bounded_blanks() const { return true; }

private:
  enum class Phase : uint8_t { KeyOrClose, Key, InKey, Colon, Value, CommaOrClose, ValueOrClose, InLiteral };
  struct Frame {
    const JsonSchemaNode* node;
    Phase phase;
    bool array;
    uint32_t next;    // object: the first property not passed (while its value is read: that one); array: items so far
    uint16_t lo, hi;  // InKey / InLiteral: the sorted candidates that begin with the bytes so far
    uint16_t at;      // bytes matched so far
    uint32_t keys;    // object: keys written so far
  };
  const JsonSchemaNode* root_ = nullptr;
  Frame frames_[kMaxFrames];  // [0, depth_) in use
  uint8_t depth_ = 0;
  bool done_ = false;     // the top-level value has ended
  bool in_leaf_ = false;  // leaf_ is reading a value (or a free key) at the top
  bool leaf_key_ = false, leaf_int_ = false;
  JsonPrefix leaf_;
  // The leaf's node where it bounds a string's length or a number (null otherwise), and what
  // the bounds are checked against: the string's characters so far, or the number's sign,
  // whole part (saturated past any int64), digits so far and fraction.
  enum class Bound : uint8_t { Length, Number };
  const JsonSchemaNode* bounded_ = nullptr;
  Bound bound_ = Bound::Length;
  uint64_t count_ = 0;
  Utf8Chars utf8_;
  // A patterned string: the automaton's positions, the UTF-8 character under way, and an
  // escape's progress (1: after the backslash; 2 + k: k hex digits of a \u escape, in cp_).
  Regex::Set re_;
  Utf8Decoder dec_;
  uint8_t esc_ = 0;
  char32_t cp_ = 0;
  bool neg_ = false, dot_ = false, frac_nonzero_ = false;
  uint8_t digits_ = 0, frac_digits_ = 0;

  Frame& top() { return frames_[depth_ - 1]; }
  const Frame& top() const { return frames_[depth_ - 1]; }
  bool push(const JsonSchemaNode& n, Phase p, bool array);
  bool start_value(const JsonSchemaNode& n, unsigned char c);
  bool start_leaf(unsigned char c, bool integer, bool key, const JsonSchemaNode* bounded = nullptr);
  bool feed_leaf(unsigned char c);
  bool bounds_take(unsigned char c);
  bool take_length(unsigned char c);
  bool take_pattern(unsigned char c);
  bool take_number(unsigned char c);
  bool num_reachable() const;
  bool num_can_end() const;
  bool feed_literal(unsigned char c);
  bool feed_key(unsigned char c);
  bool feed_object(unsigned char c);
  bool feed_array(unsigned char c);
  bool close_container();
  void leaf_done();
  void value_done();
  bool key_allowed(const Frame& f, uint16_t p) const;
  bool key_room(const Frame& f) const;
};

}  // namespace dsa
