// The tokenizer.json normalizers against the tokenizers crate's semantics, on a hand-made
// tokenizer whose ids are the bytes themselves (no merges), so an encoding spells out the
// normalized text. Expected strings were worked out from the Unicode data, not from this code.
#include <gtest/gtest.h>

#include "byte_level.h"
#include "core/error.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using J = nlohmann::json;
using dsa::tok::Normalizer;

using dsa::test::byte_char;

J added(int id, const std::string& content, bool normalized) {
  return J{{"id", id}, {"content", content}, {"special", true}, {"normalized", normalized},
           {"lstrip", false}, {"rstrip", false}, {"single_word", false}};
}

// Byte b has id b; no merges. Added tokens get ids from 300.
J byte_tokenizer(const J& normalizer, const J& added_tokens = J::array()) {
  J vocab = J::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  return J{{"version", "1.0"},
           {"added_tokens", added_tokens},
           {"normalizer", normalizer},
           {"pre_tokenizer", J{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
           {"decoder", J{{"type", "ByteLevel"}}},
           {"model", J{{"type", "BPE"}, {"vocab", vocab}, {"merges", J::array()}}}};
}

std::vector<int32_t> ids_of(std::string_view bytes) {
  std::vector<int32_t> v;
  for (char c : bytes) v.push_back(static_cast<unsigned char>(c));
  return v;
}

J type(const char* t) { return J{{"type", t}}; }
J seq(const J& list) { return J{{"type", "Sequence"}, {"normalizers", list}}; }
J replace_string(const std::string& from, const std::string& to) {
  return J{{"type", "Replace"}, {"pattern", {{"String", from}}}, {"content", to}};
}
J replace_regex(const std::string& re, const std::string& to) {
  return J{{"type", "Replace"}, {"pattern", {{"Regex", re}}}, {"content", to}};
}
J prepend(const std::string& p) { return J{{"type", "Prepend"}, {"prepend", p}}; }
J strip(bool l, bool r) { return J{{"type", "Strip"}, {"strip_left", l}, {"strip_right", r}}; }

std::string norm(const J& j, std::string_view text) { return Normalizer::from_json(j).apply(text); }

// Message of the dsa::Error that loading `t` throws ("" if it loads).
std::string load_error(const J& t) {
  try {
    (void)dsa::Tokenizer::from_json(t);
  } catch (const dsa::Error& e) {
    return e.what();
  }
  return "";
}

const char* kDecomposed = "e\u0301 a\u0300 o\u0308 n\u0303, Vie\u0323\u0302t Nam, \u1112\u1161\u11AB\u1100\u1173\u11AF";
const char* kComposed = "\u00E9 \u00E0 \u00F6 \u00F1, Vi\u1EC7t Nam, \uD55C\uAE00";

TEST(Normalizer, NfcMakesDecomposedAndPrecomposedEncodeTheSame) {
  const auto tok = dsa::Tokenizer::from_json(byte_tokenizer(type("NFC")));
  EXPECT_EQ(tok.encode(kDecomposed), ids_of(kComposed));
  EXPECT_EQ(tok.encode(kComposed), ids_of(kComposed));
  // Canonical order first: U+0316 (class 220) moves before U+0301 (230), which still composes.
  EXPECT_EQ(norm(type("NFC"), "a\u0301\u0316"), "\u00E1\u0316");
  // Composition exclusions stay decomposed; an ASCII NUL is an ordinary starter.
  EXPECT_EQ(norm(type("NFC"), "\u0958"), "\u0915\u093C");
  EXPECT_EQ(norm(type("NFC"), std::string("a\0e\u0301", 5)), std::string("a\0\u00E9", 4));
  // Compatibility characters are left alone by NFC.
  EXPECT_EQ(norm(type("NFC"), "\uFB01 \u2460"), "\uFB01 \u2460");
}

TEST(Normalizer, NfdAndNfkdDecompose) {
  const auto nfd = dsa::Tokenizer::from_json(byte_tokenizer(type("NFD")));
  EXPECT_EQ(nfd.encode(kComposed), ids_of(kDecomposed));
  EXPECT_EQ(nfd.encode(kDecomposed), ids_of(kDecomposed));
  EXPECT_EQ(norm(type("NFD"), "a\u0301\u0316"), "a\u0316\u0301");
  EXPECT_EQ(norm(type("NFD"), "\uFB01"), "\uFB01");
  EXPECT_EQ(norm(type("NFKD"), "\uFB01 \u00E9 \uFF76\uFF9E"), "fi e\u0301 \u30AB\u3099");
  // The longest compatibility decomposition (18 code points).
  EXPECT_EQ(norm(type("NFKD"), "\uFDFA"),
            "\u0635\u0644\u0649 \u0627\u0644\u0644\u0647 \u0639\u0644\u064A\u0647 \u0648\u0633\u0644\u0645");
}

TEST(Normalizer, NfkcMapsCompatibilityCharacters) {
  const auto tok = dsa::Tokenizer::from_json(byte_tokenizer(type("NFKC")));
  EXPECT_EQ(tok.encode("\uFB01"), ids_of("fi"));
  EXPECT_EQ(tok.encode("\u2460 \uFF21\uFF42 \u339E \u3392"), ids_of("1 Ab km MHz"));
  // Half-width katakana plus voiced mark compose once mapped.
  EXPECT_EQ(tok.encode("\uFF76\uFF9E"), ids_of("\u30AC"));
  EXPECT_EQ(tok.encode(kDecomposed), ids_of(kComposed));
}

TEST(Normalizer, LongRunsOfMarksStayCheap) {
  // 200k marks in alternating classes: a quadratic reordering would take minutes.
  std::string s = "a";
  for (int k = 0; k < 100000; ++k) s += "\u0301\u0316";
  const std::string out = norm(type("NFD"), s);
  std::string want = "a";
  for (int k = 0; k < 100000; ++k) want += "\u0316";
  for (int k = 0; k < 100000; ++k) want += "\u0301";
  EXPECT_EQ(out, want);
  EXPECT_EQ(norm(type("NFC"), s).substr(0, 2), "\u00E1");  // first U+0301 composes
}

TEST(Normalizer, LowercaseIsRustCharToLowercase) {
  EXPECT_EQ(norm(type("Lowercase"), "HeLLo \u00DCN\u00CF \u0391\u03A3 \u0130"), "hello \u00FCn\u00EF \u03B1\u03C3 i\u0307");
  // Per character, so no final-sigma rule (JavaScript's toLowerCase would give U+03C2).
  EXPECT_EQ(norm(type("Lowercase"), "\u039F\u0394\u039F\u03A3"), "\u03BF\u03B4\u03BF\u03C3");
  EXPECT_EQ(norm(type("Lowercase"), "\u1E9E \u2160 \uFF21 \U00010400"), "\u00DF \u2170 \uFF41 \U00010428");
}

TEST(Normalizer, ReplacePrependStrip) {
  EXPECT_EQ(norm(replace_string("''", "\""), "This is a ''test''"), "This is a \"test\"");
  EXPECT_EQ(norm(replace_string(".*", "x"), "a.*b.c"), "axb.c");  // a String is literal
  EXPECT_EQ(norm(replace_regex("\\s+", " "), "This     is \t\n a test"), "This is a test");
  EXPECT_EQ(norm(replace_regex("(l)(e)", "$1 $2"), "le"), "$1 $2");  // no group expansion
  // Empty matches are replaced too, once per position (Oniguruma's find_iter).
  EXPECT_EQ(norm(replace_regex("x*", "-"), "ab"), "-a-b-");
  EXPECT_EQ(norm(replace_string(" ", "\u2581"), "a b  c"), "a\u2581b\u2581\u2581c");

  EXPECT_EQ(norm(prepend("\u2581"), "Hello"), "\u2581Hello");
  EXPECT_EQ(norm(prepend("\u2581"), ""), "");

  EXPECT_EQ(norm(strip(true, true), "  \u4F60\u597Dasa \n"), "\u4F60\u597Dasa");
  EXPECT_EQ(norm(strip(true, false), " \u3000a \u2028"), "a \u2028");
  EXPECT_EQ(norm(strip(false, true), " \u3000a \u2028\u0085"), " \u3000a");
  EXPECT_EQ(norm(strip(true, true), " \t\u00A0 "), "");
  // U+200B and U+FEFF are not White_Space; U+180E no longer is.
  EXPECT_EQ(norm(strip(true, true), "\u200Bx\uFEFF\u180E"), "\u200Bx\uFEFF\u180E");
}

TEST(PreTokenizer, SplitWithAStringPatternIsLiteral) {
  // {"String": ...} compiles in PCRE2's literal mode (which refuses the UCP flag).
  J t = byte_tokenizer(nullptr, J::array());
  t["pre_tokenizer"] = J{{"type", "Sequence"},
                         {"pretokenizers", J::array({J{{"type", "Split"}, {"pattern", {{"String", ".+"}}}, {"behavior", "Removed"}},
                                                     J{{"type", "ByteLevel"}, {"use_regex", false}}})}};
  t["model"]["vocab"]["ab"] = 256;
  t["model"]["merges"] = J::array({"a b"});
  const auto tok = dsa::Tokenizer::from_json(t);
  EXPECT_EQ(tok.encode("ab.+ab.+"), (std::vector<int32_t>{256, 256}));
  EXPECT_EQ(tok.encode("a.b"), ids_of("a.b"));
}

TEST(Normalizer, SequenceAppliesInOrder) {
  EXPECT_EQ(norm(seq(J::array({type("Lowercase"), replace_string("a", "b")})), "Aa"), "bb");
  EXPECT_EQ(norm(seq(J::array({replace_string("a", "b"), type("Lowercase")})), "Aa"), "ab");
  // U+1D400 (bold A) has no lowercase of its own: only NFKC first makes it an "a".
  EXPECT_EQ(norm(seq(J::array({type("NFKC"), type("Lowercase")})), "\U0001D400"), "a");
  EXPECT_EQ(norm(seq(J::array({type("Lowercase"), type("NFKC")})), "\U0001D400"), "A");
  const J nested = seq(J::array({strip(true, true), seq(J::array({prepend("_"), replace_string("_", "__")}))}));
  EXPECT_EQ(norm(nested, "  x "), "__x");
  EXPECT_TRUE(Normalizer::from_json(seq(J::array())).is_identity());
  EXPECT_TRUE(Normalizer::from_json(nullptr).is_identity());
}

TEST(Normalizer, AddedTokensNormalizedOrRaw) {
  // <|endoftext|> is matched on the raw text; <Think> on the normalized text, by its own
  // normalized form ("<think>").
  const J tokens = J::array({added(300, "<|EndOfText|>", false), added(301, "<Think>", true)});
  const auto tok = dsa::Tokenizer::from_json(byte_tokenizer(type("Lowercase"), tokens));
  EXPECT_EQ(tok.encode("A<|EndOfText|>B"), (std::vector<int32_t>{'a', 300, 'b'}));
  EXPECT_EQ(tok.encode("<|ENDOFTEXT|>"), ids_of("<|endoftext|>"));  // raw match only
  EXPECT_EQ(tok.encode("x<THINK>y<think>"), (std::vector<int32_t>{'x', 301, 'y', 301}));
  // Decoding gives the tokens' bytes; no normalizer runs on the way back.
  EXPECT_EQ(tok.decode(std::vector<int32_t>{'A', 300, 301}), "A<|EndOfText|><Think>");

  // NFC: a normalized token written decomposed in the file matches precomposed input.
  const auto nfc = dsa::Tokenizer::from_json(byte_tokenizer(type("NFC"), J::array({added(300, "cafe\u0301", true)})));
  EXPECT_EQ(nfc.encode("un caf\u00E9"), (std::vector<int32_t>{'u', 'n', ' ', 300}));
  EXPECT_EQ(nfc.encode("un cafe\u0301"), (std::vector<int32_t>{'u', 'n', ' ', 300}));
  EXPECT_EQ(nfc.decode(nfc.encode("e\u0301")), "\u00E9");
  EXPECT_EQ(nfc.decode(ids_of("e\u0301")), "e\u0301");
}

TEST(Normalizer, NormalizesEachPieceBetweenRawTokens) {
  // Prepend and Strip run on every piece the raw tokens leave, not on the whole text.
  const J tokens = J::array({added(300, "<s>", false)});
  const auto pre = dsa::Tokenizer::from_json(byte_tokenizer(prepend("_"), tokens));
  EXPECT_EQ(pre.encode("a<s>b<s><s>"), (std::vector<int32_t>{'_', 'a', 300, '_', 'b', 300, 300}));
  const auto st = dsa::Tokenizer::from_json(byte_tokenizer(strip(true, true), tokens));
  EXPECT_EQ(st.encode(" a <s> b "), (std::vector<int32_t>{'a', 300, 'b'}));
}

TEST(Normalizer, InvalidUtf8IsAnErrorNotACrash) {
  const auto tok = dsa::Tokenizer::from_json(byte_tokenizer(seq(J::array({type("NFKC"), type("Lowercase")}))));
  for (const std::string& bad : {std::string("\xC3"), std::string("a\xE2\x82"), std::string("\xED\xA0\x80"), std::string("\xFF")})
    EXPECT_THROW(tok.encode(bad), dsa::Error);
}

TEST(Normalizer, UnsupportedTypesAreLoadErrorsNamingTheField) {
  const std::string unknown = load_error(byte_tokenizer(seq(J::array({type("NFC"), type("Foo")}))));
  EXPECT_NE(unknown.find("normalizer.normalizers[1].type is 'Foo'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("NFKC"), std::string::npos) << unknown;  // says what is supported
  for (const char* t : {"BertNormalizer", "StripAccents", "Precompiled", "Nmt", "ByteLevel"}) {
    const std::string e = load_error(byte_tokenizer(type(t)));
    EXPECT_NE(e.find(std::string("normalizer.type is '") + t + "'"), std::string::npos) << e;
  }
  EXPECT_NE(load_error(byte_tokenizer(J{{"type", "Replace"}, {"pattern", {{"Glob", "*"}}}, {"content", ""}})).find("normalizer.pattern"),
            std::string::npos);
  EXPECT_NE(load_error(byte_tokenizer(replace_regex("(", ""))).find("normalizer.pattern"), std::string::npos);
  EXPECT_NE(load_error(byte_tokenizer(J{{"type", "Strip"}, {"strip_left", true}})).find("strip_right"), std::string::npos);
  EXPECT_NE(load_error(byte_tokenizer(J{{"normalizers", J::array()}})).find("\"type\""), std::string::npos);

  J t = byte_tokenizer(nullptr);
  t["pre_tokenizer"] = J{{"type", "Sequence"},
                         {"pretokenizers", J::array({J{{"type", "ByteLevel"}, {"use_regex", false}}, type("Metaspace")})}};
  const std::string pre = load_error(t);
  EXPECT_NE(pre.find("pre_tokenizer.pretokenizers[1].type is 'Metaspace'"), std::string::npos) << pre;
  EXPECT_NE(pre.find("Split"), std::string::npos) << pre;
  t["pre_tokenizer"] = J{{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Sideways"}};
  EXPECT_NE(load_error(t).find("pre_tokenizer.behavior is 'Sideways'"), std::string::npos) << load_error(t);
}

}  // namespace
