// Regex against std::regex (ECMAScript grammar) as the oracle: every text over a small
// alphabet is taken character by character, and the automaton must accept exactly the texts
// std::regex matches (regex_search for JSON Schema's rule, regex_match for a whole text), and
// refuse a character only when no text that goes on from it matches. With length bounds,
// random walks that take only what step() allows never get stuck and end in a match.
#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <string>

#include "core/error.h"
#include "sampling/regex.h"

using namespace dsa;

namespace {

// Steps the automaton through text: false when a character is refused.
bool walk(const Regex& re, const std::string& text, Regex::Set& s) {
  s = re.start();
  for (size_t i = 0; i < text.size(); ++i) {
    s = re.step(s, static_cast<unsigned char>(text[i]), uint32_t(i));
    if (s.none()) return false;
  }
  return true;
}

bool matches(const Regex& re, const std::string& text) {
  Regex::Set s;
  return walk(re, text, s) && re.accepts(s, uint32_t(text.size()));
}

// Every text of up to `len` characters over the alphabet.
std::vector<std::string> texts(const std::string& alphabet, size_t len) {
  std::vector<std::string> out = {""};
  for (size_t at = 0; at < out.size(); ++at)
    if (out[at].size() < len)
      for (char c : alphabet) out.push_back(out[at] + c);
  return out;
}

const char* kPatterns[] = {
    "^[a-z]+$", "^\\d{3}-\\d{2}$", "ab", "^ab", "ab$", "^(ab|b)*$", "a|^b$", "^a?b+c*$", "^(?:a|bc){2,3}$",
    "^[^a]*$", "^.{2,4}$", "^\\w\\s\\W$", "^(a{1,2}b?){1,}$", "^x*(ab){0,2}$", "^[a-c-]+$", "^[\\d\\-]{3}$",
    "^\\S+@\\S+$", "^a{0}b$", "^(a|)+$", "a.c", "^(?:[ab]|1[0-9])$", "^\\.[.]\\*$", "b{2,}", "^[+-]?\\d+(\\.\\d+)?$",
    "^\\x61\\u0062$", "^(?:)$", "^$", "[^\\s\\S]|^a$", "^\\}]$",
};

TEST(Regex, MatchesWhatStdRegexMatches) {
  const std::string alphabet = "ab1c.-@ ";
  const std::vector<std::string> all = texts(alphabet, 5);
  for (const char* pattern : kPatterns) {
    const std::regex oracle(pattern, std::regex::ECMAScript);
    const Regex search(pattern, Regex::Match::Search), whole(pattern, Regex::Match::Whole);
    for (const std::string& t : all) {
      ASSERT_EQ(matches(search, t), std::regex_search(t, oracle)) << pattern << " on '" << t << "'";
      // As a whole text the anchors change nothing: std::regex_match with them left in.
      ASSERT_EQ(matches(whole, t), std::regex_match(t, oracle)) << pattern << " (whole) on '" << t << "'";
    }
  }
}

// A refused character is final: no text that begins with the refused prefix matches (checked
// over every continuation of up to two characters; the test above covers every text up to
// five), and a taken one leaves some match open.
TEST(Regex, RefusesOnlyDeadEnds) {
  const std::string alphabet = "ab1c.-@ ";
  const std::vector<std::string> tails = texts(alphabet, 2);
  for (const char* pattern : kPatterns) {
    const std::regex oracle(pattern, std::regex::ECMAScript);
    const Regex re(pattern, Regex::Match::Search);
    for (const std::string& t : texts(alphabet, 3)) {
      Regex::Set s;
      if (walk(re, t, s)) {
        EXPECT_TRUE(re.accepts(s, uint32_t(t.size())) || re.can_take(s, 0, 0x10FFFF, uint32_t(t.size()))) << pattern << " '" << t << "'";
        continue;
      }
      for (const std::string& tail : tails) ASSERT_FALSE(std::regex_search(t + tail, oracle)) << pattern << ": '" << t << "' was refused";
    }
  }
}

TEST(Regex, LengthBoundsNeverLeadIntoADeadEnd) {
  struct Case {
    const char* pattern;
    uint32_t min, max;
  };
  const Case cases[] = {{"^[ab]+$", 3, 5}, {"^(ab)*$", 3, 7}, {"^a(bb)*$", 4, UINT32_MAX}, {"^[a-c]*c$", 0, 4},
                        {"b", 2, 3}, {"^(a|bc)+$", 5, 5}, {"^.*$", 2, UINT32_MAX}, {"^a{3}(b|cc)?$", 4, 4}};
  std::mt19937 rng(5);
  const std::string alphabet = "abc";
  for (const Case& c : cases) {
    const std::regex oracle(c.pattern, std::regex::ECMAScript);
    const Regex re(c.pattern, Regex::Match::Search, c.min, c.max);
    for (const std::string& t : texts(alphabet, 8))
      ASSERT_EQ(matches(re, t), std::regex_search(t, oracle) && t.size() >= c.min && t.size() <= c.max) << c.pattern << " '" << t << "'";
    for (int w = 0; w < 200; ++w) {
      Regex::Set s = re.start();
      std::string t;
      while (!(re.accepts(s, uint32_t(t.size())) && (t.size() >= 12 || rng() % 4 == 0))) {
        std::vector<char> ok;
        for (char x : alphabet)
          if (re.step(s, char32_t(x), uint32_t(t.size())).any()) ok.push_back(x);
        if (ok.empty() && re.accepts(s, uint32_t(t.size()))) break;  // at the upper bound
        ASSERT_FALSE(ok.empty()) << c.pattern << " stuck after '" << t << "'";
        const char x = ok[rng() % ok.size()];
        s = re.step(s, char32_t(x), uint32_t(t.size()));
        t += x;
        ASSERT_LE(t.size(), 64u) << c.pattern;
      }
      EXPECT_TRUE(std::regex_search(t, oracle) && t.size() >= c.min && t.size() <= c.max) << c.pattern << " '" << t << "'";
    }
  }
}

TEST(Regex, TakesCodePointsAndRanges) {
  const Regex re("^[\u00e0-\u00ff]\u4e2d\\u{1F600}\\s$", Regex::Match::Search);
  Regex::Set s = re.start();
  EXPECT_FALSE(re.can_take(s, 'a', 'z', 0));
  EXPECT_TRUE(re.can_take(s, 0x80, 0xFF, 0)) << "a UTF-8 lead byte C3 leaves U+00C0..U+00FF open";
  s = re.step(s, 0xE9, 0);
  ASSERT_TRUE(s.any());
  s = re.step(s, 0x4E2D, 1);
  ASSERT_TRUE(s.any());
  EXPECT_TRUE(re.can_take(s, 0x10000, 0x3FFFF, 2));
  s = re.step(s, 0x1F600, 2);
  ASSERT_TRUE(s.any());
  EXPECT_TRUE(re.accepts(re.step(s, 0x3000, 3), 4)) << "ideographic space is \\s";

  Utf8Decoder d;
  char32_t cp = 0, lo = 0, hi = 0;
  EXPECT_EQ(d.feed(0xE0, cp, lo, hi), 0);
  EXPECT_EQ(lo, 0x800u);
  EXPECT_EQ(hi, 0xFFFu);
  EXPECT_EQ(Utf8Decoder{}.feed(0xC0, cp, lo, hi), -1) << "overlong";
  Utf8Decoder e;
  EXPECT_EQ(e.feed(0xED, cp, lo, hi), 0);
  EXPECT_EQ(hi, 0xD7FFu) << "no surrogates";
  EXPECT_EQ(e.feed(0xA0, cp, lo, hi), -1);
  Utf8Decoder f;
  EXPECT_EQ(f.feed(0xF4, cp, lo, hi), 0);
  EXPECT_EQ(hi, 0x10FFFFu);
  EXPECT_EQ(f.feed(0x8F, cp, lo, hi), 0);
  EXPECT_EQ(f.feed(0xBF, cp, lo, hi), 0);
  EXPECT_EQ(f.feed(0xBF, cp, lo, hi), 1);
  EXPECT_EQ(cp, 0x10FFFFu);
}

TEST(Regex, RefusesWhatNoAutomatonSays) {
  const std::pair<const char*, const char*> bad[] = {
      {"(a)\\1", "backreferences"},     {"a(?=b)", "lookaround"},      {"\\bword", "word boundaries"},
      {"\\p{L}", "property"},           {"(?i)a", "inline flags"},     {"a(^b)", "only at the ends"},
      {"a$b", "only at the ends"},      {"(ab", "without its ')'"},    {"ab)", "unmatched ')'"},
      {"[ab", "without its ']'"},       {"[z-a]", "out of order"},     {"a{3,2}", "out of order"},
      {"a{1001}", "above 1000"},        {"*a", "nothing to repeat"},   {"^*", "nothing to repeat"},
      {"a\\", "may not end"},           {"\\q", "not an escape"},      {"[^\\s\\S]", "no text matches"},
      {"(?:a{100}){6}", "more than 511"}, {"\\uD800", "surrogate"},     {"\xff", "UTF-8"},
  };
  for (const auto& [pattern, want] : bad) {
    try {
      Regex re(pattern, Regex::Match::Search);
      ADD_FAILURE() << "compiled: " << pattern;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << pattern << "\n" << e.what();
    }
  }
  EXPECT_THROW(Regex("^a{2}$", Regex::Match::Search, 3, 5), Error) << "no text within the bounds";
  EXPECT_THROW(Regex("a", Regex::Match::Search, 0, Regex::kMaxBound + 1), Error);
  EXPECT_THROW(Regex(std::string(70000, 'a'), Regex::Match::Search), Error);
  std::string deep(200, '(');
  deep += std::string(200, ')');
  EXPECT_THROW(Regex(deep, Regex::Match::Search), Error);
  Regex empty_loop("^(?:(?:){1000}){1000}a$", Regex::Match::Search);  // no character to repeat: no work either
  EXPECT_TRUE(matches(empty_loop, "a"));
}

}  // namespace
