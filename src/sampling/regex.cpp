#include "sampling/regex.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace dsa {

namespace {

using Ranges = std::vector<std::pair<char32_t, char32_t>>;
constexpr char32_t kMaxCode = 0x10FFFF;
constexpr uint32_t kNone = UINT32_MAX;  // a quantifier without an upper count
constexpr uint32_t kMaxCount = 1000;    // {n,m}: counts above it would not fit the positions anyway
constexpr int kMaxGroups = 128;         // groups within groups: the parser recurses once per group
constexpr size_t kMaxPatternBytes = 65536;  // a request's pattern; the positions' bound comes far sooner

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& x : r)
    if (!out.empty() && x.first <= out.back().second + 1) out.back().second = std::max(out.back().second, x.second);
    else out.push_back(x);
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges out;
  char32_t next = 0;
  for (const auto& [lo, hi] : r) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCode) out.emplace_back(next, kMaxCode);
  return out;
}

// The code points a text can hold: surrogates are halves of UTF-16 pairs, never characters
// of their own (a class written as surrogates alone becomes one that takes nothing).
Ranges text_chars(Ranges r) {
  Ranges out;
  for (const auto& [lo, hi] : normalized(std::move(r))) {
    if (lo < 0xD800) out.emplace_back(lo, std::min<char32_t>(hi, 0xD7FF));
    if (hi > 0xDFFF) out.emplace_back(std::max<char32_t>(lo, 0xE000), hi);
  }
  return out;
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
// ECMA-262's WhiteSpace and LineTerminator code points.
const Ranges kSpace = {{9, 13}, {32, 32}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
                       {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const Ranges kDot = complement({{10, 10}, {13, 13}, {0x2028, 0x2029}});  // all but line terminators

struct Ast {
  enum Kind : uint8_t { Empty, Class, Concat, Alt, Repeat, Begin, End } kind = Empty;
  Ranges ranges;          // Class
  std::vector<Ast> kids;  // Concat, Alt; Repeat: one
  uint32_t min = 0, max = 0;  // Repeat (max kNone: unbounded)
};

bool has_anchor(const Ast& a) {
  if (a.kind == Ast::Begin || a.kind == Ast::End) return true;
  return std::any_of(a.kids.begin(), a.kids.end(), has_anchor);
}

std::vector<char32_t> code_points(std::string_view s) {
  if (s.size() > kMaxPatternBytes) throw Error("pattern: longer than " + std::to_string(kMaxPatternBytes) + " bytes");
  std::vector<char32_t> out;
  Utf8Decoder d;
  char32_t cp = 0, lo = 0, hi = 0;
  for (unsigned char b : s) {
    const int r = d.feed(b, cp, lo, hi);
    if (r < 0) throw Error("pattern: not valid UTF-8");
    if (r > 0) out.push_back(cp);
  }
  if (!d.idle()) throw Error("pattern: not valid UTF-8");
  return out;
}

// ECMA-262 pattern syntax (the subset regex.h lists), by recursive descent.
struct Parser {
  std::vector<char32_t> p;
  size_t i = 0;
  int groups = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("pattern at character " + std::to_string(i) + ": " + what);
  }
  bool more() const { return i < p.size(); }
  bool at(char32_t c) const { return more() && p[i] == c; }
  bool eat(char32_t c) {
    if (!at(c)) return false;
    ++i;
    return true;
  }

  Ast disjunction() {
    Ast alt{Ast::Alt, {}, {alternative()}};
    while (eat('|')) alt.kids.push_back(alternative());
    return alt.kids.size() == 1 ? std::move(alt.kids[0]) : alt;
  }
  Ast alternative() {
    Ast cat{Ast::Concat, {}, {}};
    while (more() && !at('|') && !at(')')) cat.kids.push_back(term());
    return cat;
  }
  Ast term() {
    if (eat('^')) return anchor(Ast::Begin);
    if (eat('$')) return anchor(Ast::End);
    Ast a = atom();
    uint32_t lo = 0, hi = 0;
    if (!quantifier(lo, hi)) return a;
    eat('?');  // lazy: the same texts
    return Ast{Ast::Repeat, {}, {std::move(a)}, lo, hi};
  }
  Ast anchor(Ast::Kind k) {
    uint32_t lo = 0, hi = 0;
    if (quantifier(lo, hi)) fail("nothing to repeat");
    return Ast{k, {}, {}};
  }
  bool quantifier(uint32_t& lo, uint32_t& hi) {
    if (eat('*')) return lo = 0, hi = kNone, true;
    if (eat('+')) return lo = 1, hi = kNone, true;
    if (eat('?')) return lo = 0, hi = 1, true;
    if (!at('{')) return false;
    const size_t back = i++;
    if (!count(lo)) return i = back, false;  // not a quantifier: a literal '{' (ECMA-262 Annex B)
    hi = lo;
    if (eat(',')) hi = at('}') ? kNone : count(hi) ? hi : kNone - 1;
    if (hi == kNone - 1 || !eat('}')) return i = back, false;
    if (hi < lo) fail("{" + std::to_string(lo) + "," + std::to_string(hi) + "}: the counts are out of order");
    return true;
  }
  bool count(uint32_t& n) {
    if (!more() || p[i] < '0' || p[i] > '9') return false;
    uint64_t v = 0;
    while (more() && p[i] >= '0' && p[i] <= '9') v = std::min<uint64_t>(v * 10 + (p[i++] - '0'), uint64_t(kMaxCount) + 1);
    if (v > kMaxCount) fail("a repetition count above " + std::to_string(kMaxCount));
    n = uint32_t(v);
    return true;
  }

  Ast atom() {
    const char32_t c = p[i++];
    switch (c) {
      case '.': return cls(kDot);
      case '[': return cls(bracket());
      case '(': return group();
      case '\\': return cls(escape(false));
      case ')': fail("an unmatched ')'");
      case '*': case '+': case '?': fail("nothing to repeat");
      default: return cls({{c, c}});
    }
  }
  static Ast cls(Ranges r) { return Ast{Ast::Class, text_chars(std::move(r)), {}}; }

  Ast group() {
    if (eat('?')) {
      if (eat(':')) {
      } else if (at('<') && i + 1 < p.size() && p[i + 1] != '=' && p[i + 1] != '!') {
        while (more() && !eat('>')) ++i;  // a named group: the name says nothing about the texts
      } else {
        fail("lookaround and inline flags are not supported");
      }
    }
    if (++groups > kMaxGroups) fail("groups nest deeper than " + std::to_string(kMaxGroups));
    Ast a = disjunction();
    --groups;
    if (!eat(')')) fail("a '(' without its ')'");
    return a;
  }

  Ranges bracket() {
    const bool negate = eat('^');
    Ranges r;
    while (!eat(']')) {
      if (!more()) fail("a '[' without its ']'");
      Ranges lo = member();
      if (at('-') && i + 1 < p.size() && p[i + 1] != ']') {
        ++i;
        Ranges hi = member();
        if (lo.size() != 1 || hi.size() != 1 || lo[0].first != lo[0].second || hi[0].first != hi[0].second)
          fail("a class escape cannot end a range");
        if (hi[0].first < lo[0].first) fail("a range out of order");
        r.emplace_back(lo[0].first, hi[0].first);
      } else {
        r.insert(r.end(), lo.begin(), lo.end());
      }
    }
    r = normalized(std::move(r));
    return negate ? complement(r) : r;
  }
  Ranges member() {
    const char32_t c = p[i++];
    if (c != '\\') return {{c, c}};
    return escape(true);
  }

  // After a backslash: a character, or a class (\d \w \s and their complements).
  Ranges escape(bool in_class) {
    if (!more()) fail("a pattern may not end with '\\'");
    const char32_t c = p[i++];
    auto one = [](char32_t x) { return Ranges{{x, x}}; };
    switch (c) {
      case 'd': return kDigit;
      case 'D': return complement(kDigit);
      case 'w': return kWord;
      case 'W': return complement(kWord);
      case 's': return kSpace;
      case 'S': return complement(kSpace);
      case 't': return one('\t');
      case 'n': return one('\n');
      case 'r': return one('\r');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case 'b':
        if (in_class) return one('\b');
        fail("word boundaries (\\b) are not supported");
      case 'B': fail("word boundaries (\\B) are not supported");
      case 'x': return one(hex(2));
      case 'u': return one(unicode());
      case 'c':
        if (more() && ((p[i] | 0x20) >= 'a' && (p[i] | 0x20) <= 'z')) return one(p[i++] % 32);
        fail("\\c without a letter");
      case 'p': case 'P': fail("Unicode property classes (\\p) are not supported");
      case 'k': fail("backreferences are not supported");
      case '0':
        if (more() && p[i] >= '0' && p[i] <= '9') fail("octal escapes are not supported");
        return one(0);
      default:
        if (c >= '1' && c <= '9') fail("backreferences are not supported");
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') fail(std::string("'\\") + char(c) + "' is not an escape");
        return one(c);  // an escaped symbol stands for itself
    }
  }
  char32_t hex(int digits) {
    char32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      const int h = more() ? hex_value(p[i]) : -1;
      if (h < 0) fail("expected " + std::to_string(digits) + " hex digits");
      v = v * 16 + char32_t(h), ++i;
    }
    return v;
  }
  char32_t unicode() {
    if (!eat('{')) {
      const char32_t v = hex(4);
      if (v >= 0xD800 && v <= 0xDFFF) fail("surrogate code points are not supported");
      return v;
    }
    char32_t v = 0;
    int n = 0;
    for (; more() && hex_value(p[i]) >= 0; ++i, ++n)
      if ((v = v * 16 + char32_t(hex_value(p[i]))) > kMaxCode) fail("a code point past U+10FFFF");
    if (n == 0 || !eat('}')) fail("expected \\u{hex digits}");
    if (v >= 0xD800 && v <= 0xDFFF) fail("surrogate code points are not supported");
    return v;
  }
  static int hex_value(char32_t c) {
    if (c >= '0' && c <= '9') return int(c - '0');
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') return int((c | 0x20) - 'a' + 10);
    return -1;
  }
};

}  // namespace

// Glushkov's construction: every Class node read becomes a position; a fragment is what a
// subexpression contributes (whether it matches the empty text, the positions it may begin and
// end with), and concatenation and loops add follow edges.
struct RegexBuilder {
  Regex& re;
  std::vector<Ranges> ranges;  // [p]: what position p takes
  struct Frag {
    bool nullable = true;
    Regex::Set first, last;
  };

  void link(const Regex::Set& from, const Regex::Set& to) {
    for (size_t p = from._Find_first(); p < from.size(); p = from._Find_next(p)) re.follow_[p] |= to;
  }
  Frag cat(const Frag& a, const Frag& b) {
    link(a.last, b.first);
    Frag f;
    f.nullable = a.nullable && b.nullable;
    f.first = a.nullable ? a.first | b.first : a.first;
    f.last = b.nullable ? a.last | b.last : b.last;
    return f;
  }
  Frag build(const Ast& a) {
    switch (a.kind) {
      case Ast::Class: {
        if (ranges.size() > size_t(Regex::kMaxPositions))
          throw Error("pattern: more than " + std::to_string(Regex::kMaxPositions) + " characters to match once repetitions are counted out");
        const size_t p = ranges.size();
        ranges.push_back(a.ranges);
        re.follow_.emplace_back();
        Frag f;
        f.nullable = false;
        f.first.set(p), f.last.set(p);
        return f;
      }
      case Ast::Concat: {
        Frag f;
        for (const Ast& k : a.kids) f = cat(f, build(k));
        return f;
      }
      case Ast::Alt: {
        Frag f;
        f.nullable = false;
        for (const Ast& k : a.kids) {
          const Frag g = build(k);
          f.nullable |= g.nullable, f.first |= g.first, f.last |= g.last;
        }
        return f;
      }
      case Ast::Repeat: return repeat(a);
      default: return Frag{};  // anchors, placed by the caller
    }
  }
  // x{n,m}: n copies, then either one that loops (m unbounded) or m - n optional ones nested
  // as (x(x(x)?)?)?, so that each copy is followed by the next alone, not by all the rest.
  Frag repeat(const Ast& a) {
    if (a.max == 0) return Frag{};
    const size_t before = ranges.size();
    Frag one = build(a.kids[0]);
    if (ranges.size() == before) return one.nullable ? Frag{} : one;  // no character: nothing to count
    std::vector<Frag> copies = {one};
    const uint32_t total = a.max == kNone ? std::max(a.min, 1u) : a.max;
    while (copies.size() < total) copies.push_back(build(a.kids[0]));
    if (a.max == kNone) link(copies.back().last, copies.back().first);  // the last copy loops
    Frag tail;  // the optional copies, innermost first
    for (size_t k = copies.size(); k-- > a.min;) {
      tail = cat(copies[k], tail);
      tail.nullable = true;
    }
    Frag f;
    for (size_t k = 0; k < a.min; ++k) f = cat(f, copies[k]);
    return cat(f, tail);
  }
};

Regex::Regex(std::string_view pattern, Match match, uint32_t min_len, uint32_t max_len)
    : min_len_(min_len), max_len_(max_len) {
  Parser ps{code_points(pattern)};
  Ast root = ps.disjunction();
  if (ps.more()) ps.fail("an unmatched ')'");
  // Each top-level alternative: its anchors off its ends, and in a search, any text where
  // an end is not anchored.
  std::vector<Ast> alts;
  if (root.kind == Ast::Alt) alts = std::move(root.kids);
  else alts.push_back(std::move(root));
  const Ast any{Ast::Repeat, {}, {Ast{Ast::Class, text_chars({{0, kMaxCode}}), {}}}, 0, kNone};
  Ast top{Ast::Alt, {}, {}};
  for (Ast& alt : alts) {
    std::vector<Ast> parts = alt.kind == Ast::Concat ? std::move(alt.kids) : std::vector<Ast>{std::move(alt)};
    bool begin = false, end = false;
    while (!parts.empty() && parts.front().kind == Ast::Begin) begin = true, parts.erase(parts.begin());
    while (!parts.empty() && parts.back().kind == Ast::End) end = true, parts.pop_back();
    if (std::any_of(parts.begin(), parts.end(), has_anchor))
      throw Error("pattern: '^' and '$' are supported only at the ends of the pattern or of its alternatives");
    if (match == Match::Search && !begin) parts.insert(parts.begin(), any);
    if (match == Match::Search && !end) parts.push_back(any);
    top.kids.push_back(Ast{Ast::Concat, {}, std::move(parts)});
  }
  follow_.emplace_back();  // position 0: the start
  RegexBuilder b{*this, {Ranges{}}};
  const RegexBuilder::Frag f = b.build(top);
  follow_[0] = f.first;
  accept_ = f.last;
  if (f.nullable) accept_.set(0);
  index_classes(b.ranges);
  Set dead;  // positions whose class is empty ([^\s\S]) take nothing
  for (size_t p = 1; p < b.ranges.size(); ++p) dead[p] = b.ranges[p].empty();
  for (Set& s : follow_) s &= ~dead;
  accept_ &= ~dead;
  build_live();
  if (!live(0).test(0)) throw Error("pattern: no text matches it" + std::string(min_len > 0 || max_len != UINT32_MAX ? " within the length bounds" : ""));
}

// The positions by class, each distinct class once, and for each ASCII character the positions
// that take it: a step then tests a character against each class once, not per position.
void Regex::index_classes(const std::vector<Ranges>& ranges) {
  for (size_t p = 1; p < ranges.size(); ++p) {
    size_t k = std::find(classes_.begin(), classes_.end(), ranges[p]) - classes_.begin();
    if (k == classes_.size()) classes_.push_back(ranges[p]), positions_of_.emplace_back();
    positions_of_[k].set(p);
  }
  ascii_.resize(128);
  for (size_t k = 0; k < classes_.size(); ++k)
    for (char32_t c = 0; c < 128; ++c)
      if (has(classes_[k], c)) ascii_[c] |= positions_of_[k];
}

bool Regex::has(const Ranges& r, char32_t c) {
  auto it = std::upper_bound(r.begin(), r.end(), c, [](char32_t x, const auto& range) { return x < range.first; });
  return it != r.begin() && std::prev(it)->second >= c;
}

void Regex::build_live() {
  const uint32_t min_len = min_len_, max_len = max_len_;
  auto pred = [&](const Set& x) {
    Set out;
    for (size_t p = 0; p < follow_.size(); ++p) out[p] = (follow_[p] & x).any();
    return out;
  };
  if (max_len != UINT32_MAX) {
    if (max_len > kMaxBound) throw Error("pattern: a maximum length above " + std::to_string(kMaxBound) + " beside a pattern");
    live_.resize(size_t(max_len) + 1);
    for (uint32_t k = max_len + 1; k-- > 0;)
      live_[k] = (k >= min_len ? accept_ : Set{}) | (k < max_len ? pred(live_[k + 1]) : Set{});
  } else {
    if (min_len > kMaxBound) throw Error("pattern: a minimum length above " + std::to_string(kMaxBound) + " beside a pattern");
    live_.resize(size_t(min_len) + 1);
    Set co = accept_;  // positions from which a match ends at all
    for (Set grown = co | pred(co); grown != co; grown = co | pred(co)) co = grown;
    live_[0] = co;
    for (uint32_t k = 1; k <= min_len; ++k) live_[k] = pred(live_[k - 1]);
  }
}

const Regex::Set& Regex::live(uint32_t count) const {
  static const Set none;
  if (max_len_ != UINT32_MAX) return count <= max_len_ ? live_[count] : none;
  return live_[count >= min_len_ ? 0 : min_len_ - count];
}

Regex::Set Regex::next_of(const Set& s, uint32_t count) const {
  Set out;
  for (size_t p = s._Find_first(); p < s.size(); p = s._Find_next(p)) out |= follow_[p];
  return out & live(count == UINT32_MAX ? count : count + 1);
}

Regex::Set Regex::takers(char32_t c) const {
  if (c < 128) return ascii_[c];
  Set out;
  for (size_t k = 0; k < classes_.size(); ++k)
    if (has(classes_[k], c)) out |= positions_of_[k];
  return out;
}

Regex::Set Regex::takers(char32_t lo, char32_t hi) const {
  Set out;
  for (size_t k = 0; k < classes_.size(); ++k) {
    const Ranges& r = classes_[k];
    auto it = std::lower_bound(r.begin(), r.end(), lo, [](const auto& range, char32_t x) { return range.second < x; });
    if (it != r.end() && it->first <= hi) out |= positions_of_[k];
  }
  return out;
}

Regex::Set Regex::step(const Set& s, char32_t c, uint32_t count) const { return next_of(s, count) & takers(c); }

bool Regex::can_take(const Set& s, char32_t lo, char32_t hi, uint32_t count) const { return (next_of(s, count) & takers(lo, hi)).any(); }

bool RegexPrefix::feed(unsigned char c) {
  char32_t cp = 0, lo = 0, hi = 0;
  const int r = dec_.feed(c, cp, lo, hi);
  if (r < 0) return false;
  if (r == 0) return re_->can_take(s_, lo, hi, count_);
  s_ = re_->step(s_, cp, count_++);
  return s_.any();
}

bool RegexPrefix::feed(std::string_view s) {
  for (char c : s)
    if (!feed(static_cast<unsigned char>(c))) return false;
  return true;
}

int Utf8Decoder::feed(unsigned char b, char32_t& cp, char32_t& range_lo, char32_t& range_hi) {
  if (need == 0) {
    if (b < 0x80) return cp = b, 1;
    if (!start(b)) return -1;
  } else {
    if (b < lo || b > hi) return -1;
    continues(b);
    if (need == 0) return cp = value, 1;
  }
  const int rest = 6 * (need - 1);  // bits after the next continuation byte
  range_lo = char32_t((value << 6 | (lo & 0x3Fu)) << rest);
  range_hi = char32_t((value << 6 | (hi & 0x3Fu)) << rest | ((1u << rest) - 1));
  return 0;
}

}  // namespace dsa
