// Tokenizer pieces that need no fixture: a tiny hand-made tokenizer.json in two other
// pre-tokenizer styles (GPT-2 ByteLevel regex, Llama-3 Split), the stream decoder on split
// characters, UTF-8 repair and Python-style JSON.
#include <gtest/gtest.h>

#include "byte_level.h"
#include "core/error.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/pyjson.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using J = nlohmann::json;

using dsa::test::byte_char;

// Vocabulary: byte b has id b; merges (in rank order) add ids 256, 257, ...
J tiny_tokenizer(const J& pre_tokenizer, bool array_merges) {
  J vocab = J::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {byte_char(' '), "w"}, {"o", "r"},
      {"1", "2"}, {"3", "4"}};
  J m = J::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    if (array_merges) m.push_back(J::array({a, b}));
    else m.push_back(a + " " + b);
  }
  return J{{"version", "1.0"},
           {"added_tokens", J::array({J{{"id", 300}, {"content", "<|endoftext|>"}, {"special", true},
                                        {"normalized", false}, {"lstrip", false}, {"rstrip", false},
                                        {"single_word", false}}})},
           {"normalizer", nullptr},
           {"pre_tokenizer", pre_tokenizer},
           {"post_processor", nullptr},
           {"decoder", J{{"type", "ByteLevel"}}},
           {"model", J{{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
}

J gpt2_pre() { return J{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}; }

J llama3_pre() {
  return J{{"type", "Sequence"},
           {"pretokenizers",
            J::array({J{{"type", "Split"},
                        {"pattern", {{"Regex", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
                        {"behavior", "Isolated"}, {"invert", false}},
                      J{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
}

std::vector<int32_t> ids_of(std::string_view bytes) {
  std::vector<int32_t> v;
  for (char c : bytes) v.push_back(static_cast<unsigned char>(c));
  return v;
}

TEST(TinyTokenizer, Gpt2ByteLevelRegexAndMerges) {
  for (bool array_merges : {false, true}) {
    const auto tok = dsa::Tokenizer::from_json(tiny_tokenizer(gpt2_pre(), array_merges));
    // "hello" merges all the way; " world" becomes Ġw + or + l + d.
    EXPECT_EQ(tok.encode("hello world"), (std::vector<int32_t>{259, 260, 261, 'l', 'd'}));
    EXPECT_EQ(tok.decode(tok.encode("hello world")), "hello world");
    // Added token matched literally, the text around it encoded on its own.
    EXPECT_EQ(tok.encode("hi<|endoftext|>hello"), (std::vector<int32_t>{'h', 'i', 300, 259}));
    EXPECT_EQ(tok.decode(std::vector<int32_t>{300}), "<|endoftext|>");
    EXPECT_TRUE(tok.is_special(300));
    // The GPT-2 regex keeps the digits of "12345" in one piece: 12 + 34 + 5.
    EXPECT_EQ(tok.encode("12345"), (std::vector<int32_t>{262, 263, '5'}));
  }
}

TEST(TinyTokenizer, Llama3SplitRegex) {
  const auto tok = dsa::Tokenizer::from_json(tiny_tokenizer(llama3_pre(), false));
  // \p{N}{1,3} cuts 12345 into 123 | 45 before BPE, so 3 and 4 never merge.
  EXPECT_EQ(tok.encode("12345"), (std::vector<int32_t>{262, '3', '4', '5'}));
  // Case-insensitive contraction group: "'S" is its own piece.
  EXPECT_EQ(tok.encode("IT'S"), ids_of("IT'S"));
  EXPECT_EQ(tok.encode("hello world"), (std::vector<int32_t>{259, 260, 261, 'l', 'd'}));
  EXPECT_EQ(tok.decode(tok.encode("héllo\r\n\tworld  ")), "héllo\r\n\tworld  ");
}

TEST(TinyTokenizer, RejectsWhatItCannotDo) {
  J t = tiny_tokenizer(gpt2_pre(), false);
  t["pre_tokenizer"] = J{{"type", "Metaspace"}};
  EXPECT_THROW(dsa::Tokenizer::from_json(t), dsa::Error);
  t = tiny_tokenizer(gpt2_pre(), false);
  t["model"]["merges"].push_back("x zz");
  EXPECT_THROW(dsa::Tokenizer::from_json(t), dsa::Error);
  // Token ids index tables: negative, wrapping (2^32 -> 0) or absurd ones are refused.
  for (const J& id : {J(-5), J(4294967296ll), J(2147483647), J("7")}) {
    t = tiny_tokenizer(gpt2_pre(), false);
    t["added_tokens"].push_back(J{{"id", id}, {"content", "ZZZ"}, {"special", true}});
    EXPECT_THROW(dsa::Tokenizer::from_json(t), dsa::Error) << id.dump();
  }
  const auto tok = dsa::Tokenizer::from_json(tiny_tokenizer(gpt2_pre(), false));
  EXPECT_THROW(tok.encode(std::string("\xC3", 1)), dsa::Error);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{5000}), dsa::Error);
}

TEST(StreamDecoder, HoldsSplitCharactersAndRepairsBadBytes) {
  const auto tok = dsa::Tokenizer::from_json(tiny_tokenizer(gpt2_pre(), false));
  dsa::StreamDecoder sd(tok);
  EXPECT_EQ(sd.push(0xE2), "");
  EXPECT_EQ(sd.push(0x82), "");
  EXPECT_EQ(sd.push(0xAC), "€");
  EXPECT_EQ(sd.push(0xFF), "\xEF\xBF\xBD");
  EXPECT_EQ(sd.push('a'), "a");
  EXPECT_EQ(sd.push(0xF0), "");
  EXPECT_EQ(sd.push('b'), "\xEF\xBF\xBD" "b");  // a lead byte followed by ASCII can never complete
  EXPECT_EQ(sd.push(0xC3), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{0xE2, 0x82}), "\xEF\xBF\xBD");
}

TEST(Utf8, SanitizeUsesMaximalSubparts) {
  EXPECT_EQ(dsa::utf8::sanitize("ok"), "ok");
  EXPECT_EQ(dsa::utf8::sanitize("\xE2\x82" "x"), "\xEF\xBF\xBD" "x");
  EXPECT_EQ(dsa::utf8::sanitize("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(dsa::utf8::sanitize("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong
  EXPECT_FALSE(dsa::utf8::valid("\xF4\x90\x80\x80"));                                       // > U+10FFFF
  EXPECT_EQ(dsa::utf8::py_strip("\x1f\xC2\x85 a b\xE3\x80\x80"), "a b");
}

TEST(OnigTranslation, WhiteSpaceClassIsSpelledOut) {
  // \s must not match U+180E (PCRE2's \h does, Oniguruma's \s does not).
  const dsa::tok::Regex re("\\s+");
  std::vector<std::pair<uint32_t, uint32_t>> m;
  re.find_all("a\xE1\xA0\x8E" "b \t", m);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0], (std::pair<uint32_t, uint32_t>{5, 7}));
  EXPECT_EQ(dsa::tok::onig_to_pcre2("[^\\s\\p{L}]"), "[^\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}\\p{L}]");
}

TEST(PyJson, MatchesPythonJsonDumps) {
  using O = nlohmann::ordered_json;
  EXPECT_EQ(dsa::py_json_dumps(O::parse(R"({"b": 1, "a": [true, null, "x"], "c": {}})")),
            R"({"b": 1, "a": [true, null, "x"], "c": {}})");
  EXPECT_EQ(dsa::py_json_dumps(O("a\"b\\c\n\x01\x7f" "é/")), "\"a\\\"b\\\\c\\n\\u0001\x7f" "é/\"");
  const std::pair<double, const char*> floats[] = {
      {2.0, "2.0"}, {1.5, "1.5"}, {-0.0, "-0.0"}, {0.0001, "0.0001"}, {1e-5, "1e-05"},
      {1e15, "1000000000000000.0"}, {1e16, "1e+16"}, {1.25e17, "1.25e+17"}, {0.1, "0.1"},
      {123456789.125, "123456789.125"}, {3.14e-10, "3.14e-10"}};
  for (const auto& [v, s] : floats) EXPECT_EQ(dsa::py_json_dumps(O(v)), s) << s;
}

}  // namespace

// Regression test for an input found by fuzz/fuzz_tokenizer: the id tables are sized by the
// highest id, so one id of 9118250 in a 1.8 KB tokenizer.json allocated 290 MB. Ids far past
// the number of entries are refused; a modest gap is still fine.
namespace {

TEST(TinyTokenizer, IdFarBeyondTheEntriesIsRefused) {
  const J far = J::parse(R"({"model":{"type":"BPE","vocab":{"a":9118250},"merges":[]},"pre_tokenizer":{"type":"ByteLevel"}})");
  try {
    dsa::Tokenizer::from_json(far);
    FAIL() << "id 9118250 with one entry should have been refused";
  } catch (const dsa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("9118250"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("unused ids"), std::string::npos) << e.what();
  }
  const J gap = J::parse(R"({"model":{"type":"BPE","vocab":{"a":0,"b":1000},"merges":[]},"pre_tokenizer":{"type":"ByteLevel"}})");
  EXPECT_EQ(dsa::Tokenizer::from_json(gap).vocab_size(), 1001);
}

}  // namespace
