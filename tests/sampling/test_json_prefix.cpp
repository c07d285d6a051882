// JsonPrefix against nlohmann::json's own parser: on random byte strings built from JSON's
// alphabet, a string is a whole JSON text for the recognizer exactly when nlohmann accepts
// it, and every prefix of an accepted text is fed without a refusal.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <functional>
#include <random>
#include <string>

#include "sampling/json_prefix.h"

using namespace dsa;

namespace {

// Fed whole: every byte taken and the text complete at the end.
bool accepts(std::string_view s) {
  JsonPrefix p;
  return p.feed(s) && p.complete();
}

// The first byte refused, or npos.
size_t refused_at(std::string_view s) {
  JsonPrefix p;
  for (size_t i = 0; i < s.size(); ++i)
    if (!p.feed(static_cast<unsigned char>(s[i]))) return i;
  return std::string_view::npos;
}

TEST(JsonPrefix, KnownTexts) {
  for (const char* ok : {"{}", "[]", " { \"a\" : [1, -2.5e+3, true, false, null, \"x\\u00e9\\n\"] } ", "0", "-0.0E-0", "\"\"", "[[[]]]",
                         "{\"k\":{\"k\":{}}}", "12 ", "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\""})
    EXPECT_TRUE(accepts(ok)) << ok;
  // Refused at the byte that no JSON text can have there.
  const std::pair<const char*, size_t> bad[] = {{"01", 1}, {"{,}", 1}, {"[1,]", 3}, {"{\"a\" 1}", 5}, {"[1 2]", 3}, {"tru e", 3},
                                                {"\"\\x\"", 2}, {"\"\\u12g\"", 5}, {"{} {}", 3}, {"1.", std::string_view::npos},
                                                {"-", std::string_view::npos}, {"[}", 1}, {"{]", 1}, {"\"a\nb\"", 2}, {"+1", 0}};
  for (const auto& [text, at] : bad) {
    EXPECT_EQ(refused_at(text), at) << text;
    EXPECT_FALSE(accepts(text)) << text;
  }
  // Prefixes are taken but not complete.
  JsonPrefix p;
  EXPECT_TRUE(p.feed("{\"a\": [1, {\"b\": \"c"));
  EXPECT_FALSE(p.complete());
  EXPECT_FALSE(p.closed());
  EXPECT_TRUE(p.feed("\"}]}"));
  EXPECT_TRUE(p.complete());
  EXPECT_TRUE(p.closed());
  JsonPrefix n;
  EXPECT_TRUE(n.feed("12"));
  EXPECT_TRUE(n.complete());  // a top-level number may still go on
  EXPECT_FALSE(n.closed());
}

TEST(JsonPrefix, ObjectModeTakesOnlyAnObject) {
  for (const char* text : {"{}", " {\"a\": [1]} "}) {
    JsonPrefix p(true);
    EXPECT_TRUE(p.feed(text) && p.complete()) << text;
  }
  for (const char* text : {"[]", "1", "\"s\"", "true", "null"}) {
    JsonPrefix p(true);
    EXPECT_FALSE(p.feed(text)) << text;
  }
}

TEST(JsonPrefix, NestingDeeperThanTheLimitIsRefused) {
  EXPECT_TRUE(accepts(std::string(JsonPrefix::kMaxDepth, '[') + std::string(JsonPrefix::kMaxDepth, ']')));
  EXPECT_EQ(refused_at(std::string(JsonPrefix::kMaxDepth + 1, '[')), size_t(JsonPrefix::kMaxDepth));
}

// Random strings over JSON's punctuation, literals and a few letters: the recognizer and
// nlohmann agree on whole texts; texts nlohmann accepts are refused at no prefix. (\u
// escapes are left out: nlohmann also checks that surrogates pair up.)
TEST(JsonPrefix, AgreesWithNlohmannOnRandomStrings) {
  const std::string pieces[] = {"{", "}", "[", "]", ",", ":", "\"", "\"a\"", "\\n", "\\\"", "1", "0", "-", ".", "e", "+", "2",
                                " ", "\n", "true", "false", "null", "x", "t", "\t"};
  std::mt19937 g(7);
  int whole = 0;
  for (int i = 0; i < 200000; ++i) {
    std::string s;
    const int n = 1 + int(g() % 12);
    for (int k = 0; k < n; ++k) s += pieces[g() % std::size(pieces)];
    const bool ref = nlohmann::json::accept(s);
    ASSERT_EQ(accepts(s), ref) << s;
    if (ref) {
      ++whole;
      EXPECT_EQ(refused_at(s), std::string_view::npos) << s;
    }
  }
  EXPECT_GT(whole, 1000) << "too few valid texts drawn to compare";
}

// Generated documents (nested values of every kind, dumped compact and indented).
TEST(JsonPrefix, TakesDumpedDocuments) {
  std::mt19937 g(11);
  std::function<nlohmann::json(int)> value = [&](int depth) -> nlohmann::json {
    switch (depth > 4 ? g() % 4 : g() % 6) {
      case 0: return int64_t(g()) - int64_t(1) * (1 << 30);
      case 1: return double(g()) / 1e3 * ((g() & 1) ? -1 : 1);
      case 2: {
        std::string t(1 + g() % 5, char('a' + g() % 26));
        t.append("\"\\\n\t");  // what a dump must escape
        return t;
      }
      case 3: return (g() & 1) ? nlohmann::json(nullptr) : nlohmann::json(bool(g() & 1));
      case 4: {
        nlohmann::json a = nlohmann::json::array();
        for (unsigned k = g() % 4; k > 0; --k) a.push_back(value(depth + 1));
        return a;
      }
      default: {
        nlohmann::json o = nlohmann::json::object();
        for (unsigned k = g() % 4; k > 0; --k) o[std::to_string(g() % 100)] = value(depth + 1);
        return o;
      }
    }
  };
  for (int i = 0; i < 2000; ++i) {
    const nlohmann::json v = value(0);
    EXPECT_TRUE(accepts(v.dump())) << v.dump();
    EXPECT_TRUE(accepts(v.dump(2))) << v.dump(2);
  }
}

}  // namespace
