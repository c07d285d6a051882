#pragma once
// Regular expressions for constrained decoding: JSON Schema's "pattern" and vLLM's regex
// outputs. A pattern compiles to a position automaton (Glushkov's construction: one state per
// character class written in the pattern, plus the start) over Unicode code points, so a
// recognizer's state is a set of positions it copies in a few words and steps one character at
// a time, and it can ask whether any code point of a range goes on: the question a byte in the
// middle of a UTF-8 sequence or a \u escape raises. Regex libraries answer whether a whole text
// matches, not that, which is why the automaton is built here.
//
// The syntax is ECMA-262's (what JSON Schema names) without what no finite automaton says:
// literals and escapes (\t \n \r \f \v \0 \xHH \uHHHH \u{H...} \cX, an escaped symbol), '.',
// \d \D \w \W \s \S, classes with ranges and negation, groups ((...), (?:...), (?<name>...)),
// alternation, and the quantifiers * + ? {n} {n,} {n,m} (lazy forms too: the language is the
// same). '^' may only begin and '$' only end the pattern or one of its top-level alternatives.
// Backreferences, lookaround, word boundaries, \p{...} and flags are errors that name them.
//
// Bounds on a text's length in characters (JSON Schema's minLength and maxLength) are part of
// the automaton: step() keeps only positions from which some text within the bounds still
// ends, so a recognizer that takes only what step() takes never walks into a dead end.
#include <bitset>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "sampling/plain_reply.h"

namespace dsa {

class Regex {
public:
  static constexpr int kMaxPositions = 511;  // character classes after {n,m} is expanded
  static constexpr uint32_t kMaxBound = 16384;  // a length bound the automaton counts to
  using Set = std::bitset<kMaxPositions + 1>;   // bit 0: the start
  // Search: a text matches when the pattern matches some part of it (RegExp.test, JSON
  // Schema's rule) unless the anchors say otherwise. Whole: the pattern must match the whole
  // text ('^' and '$' at the ends change nothing).
  enum class Match { Search, Whole };
  // Throws Error naming the place in the pattern and what is wrong, or that no text within
  // the bounds matches. max_len UINT32_MAX: no upper bound.
  Regex(std::string_view pattern, Match match, uint32_t min_len = 0, uint32_t max_len = UINT32_MAX);

  Set start() const {
    Set s;
    s.set(0);
    return s;
  }
  // The positions after the code point c, taken by a text of `count` characters before it
  // (none: c cannot go on from s within the bounds).
  Set step(const Set& s, char32_t c, uint32_t count) const;
  // Some code point in [lo, hi] goes on from s after `count` characters.
  bool can_take(const Set& s, char32_t lo, char32_t hi, uint32_t count) const;
  // The same steps in two halves, for a caller that steps many texts from one state: the live
  // positions some character may take from s after `count` characters, and the positions
  // that take c (or some code point of [lo, hi]). step() is next_of(s, count) & takers(c).
  Set next_of(const Set& s, uint32_t count) const;
  Set takers(char32_t c) const;
  Set takers(char32_t lo, char32_t hi) const;
  // The `count` characters that led to s are a match within the bounds.
  bool accepts(const Set& s, uint32_t count) const { return count >= min_len_ && count <= max_len_ && (s & accept_).any(); }
  size_t bytes() const { return (follow_.size() + live_.size() + positions_of_.size() + ascii_.size()) * sizeof(Set); }  // what the automaton holds, roughly

private:
  using Ranges = std::vector<std::pair<char32_t, char32_t>>;  // sorted, disjoint, inclusive
  std::vector<Ranges> classes_;    // the distinct classes the pattern writes
  std::vector<Set> positions_of_;  // [k]: the positions that take classes_[k]
  std::vector<Set> ascii_;         // [c]: the positions that take the ASCII character c
  std::vector<Set> follow_;        // [p]: the positions that may come after p
  Set accept_;
  uint32_t min_len_, max_len_;
  // live_[k]: the positions from which a text within the bounds still ends. With an upper
  // bound, k is the characters taken; without one, the characters still owed to the lower
  // bound (min_len - taken, at least 0).
  std::vector<Set> live_;
  const Set& live(uint32_t count) const;
  void index_classes(const std::vector<Ranges>& ranges);
  void build_live();
  static bool has(const Ranges& r, char32_t c);
  friend struct RegexBuilder;
};

// A code point at a time from UTF-8 bytes, refusing what is not well formed (overlong forms,
// surrogates, past U+10FFFF): feed() gives 1 with cp set when a character is whole, 0 while
// one is under way with [lo, hi] the code points it may still become, -1 for a bad byte.
struct Utf8Decoder {
  uint32_t value = 0;
  uint8_t need = 0, lo = 0x80, hi = 0xBF;  // continuation bytes still wanted; the next one's range
  int feed(unsigned char b, char32_t& cp, char32_t& range_lo, char32_t& range_hi);
  bool idle() const { return need == 0; }
  // b as a character's first byte: the continuation bytes it wants and the next one's range
  // (none for ASCII or a byte that starts no character; false then).
  bool start(unsigned char b) {
    need = 0, lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) need = 1, value = b & 0x1Fu;
    if (b >= 0xE0 && b <= 0xEF) need = 2, value = b & 0x0Fu, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    if (b >= 0xF0 && b <= 0xF4) need = 3, value = b & 0x07u, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    return need > 0;
  }
  // b as the continuation byte under way, already checked against [lo, hi]: takes its bits
  // and sets the next one's range.
  void continues(unsigned char b) { value = value << 6 | (b & 0x3Fu), --need, lo = 0x80, hi = 0xBF; }
};

// vLLM's regex outputs: the reply, decoded from UTF-8, is a whole match of the pattern (a
// Regex built with Match::Whole); it is closed once it is a match that no character goes on
// from.
class RegexPrefix : public PlainReply {
public:
  explicit RegexPrefix(const Regex& re) : re_(&re), s_(re.start()) {}
  bool feed(unsigned char c);  // false: no match goes on with c (the state is then unspecified)
  bool feed(std::string_view s);
  bool complete() const { return dec_.idle() && re_->accepts(s_, count_); }
  bool closed() const { return complete() && !re_->can_take(s_, 0, 0x10FFFF, count_); }
  // At a character's start: the automaton, with s and count set to the state and the
  // characters so far (null while a UTF-8 character is under way).
  const Regex* pattern_at(Regex::Set& s, uint32_t& count) const {
    if (!dec_.idle()) return nullptr;
    s = s_, count = count_;
    return re_;
  }

private:
  const Regex* re_;
  Regex::Set s_;
  Utf8Decoder dec_;
  uint32_t count_ = 0;  // characters so far
};

}  // namespace dsa
