// The DeepSeek-V3.2 tokenizer against golden.jsonl (reference: Hugging Face tokenizers).
#include <gtest/gtest.h>

#include "fixtures.h"
#include "jsonl.h"
#include "tokenizer/tokenizer.h"

namespace {

const dsa::Tokenizer& deepseek() {
  static const dsa::Tokenizer tok = dsa::Tokenizer::from_dir(dsa::test::tokenizer_dir());
  return tok;
}

TEST(TokenizerGolden, EncodeMatchesEveryLine) {
  std::vector<nlohmann::ordered_json> lines;
  ASSERT_TRUE(dsa::test::listed_jsonl("golden.jsonl", &lines));
  int failures = 0;
  for (const auto& l : lines) {
    const std::string text = l["text"].get<std::string>();
    const auto want = l["ids"].get<std::vector<int32_t>>();
    const auto got = deepseek().encode(text, /*add_bos=*/false);
    if (got != want) {
      ++failures;
      ADD_FAILURE() << l["name"].get<std::string>() << ": got " << nlohmann::json(got).dump()
                    << " want " << nlohmann::json(want).dump();
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(TokenizerGolden, DecodeRoundTripsEveryLine) {
  std::vector<nlohmann::ordered_json> lines;
  ASSERT_TRUE(dsa::test::listed_jsonl("golden.jsonl", &lines));
  for (const auto& l : lines) {
    const auto ids = l["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(deepseek().decode(ids), l["text"].get<std::string>()) << l["name"];
  }
}

TEST(TokenizerGolden, StreamDecoderMatchesDecodeAndStaysValid) {
  std::vector<nlohmann::ordered_json> lines;
  ASSERT_TRUE(dsa::test::listed_jsonl("golden.jsonl", &lines));
  for (const auto& l : lines) {
    dsa::StreamDecoder sd(deepseek());
    std::string all;
    for (int32_t id : l["ids"].get<std::vector<int32_t>>()) {
      const std::string piece = sd.push(id);
      // Every emitted piece is valid UTF-8 on its own (parsing it as JSON would throw otherwise).
      EXPECT_NO_THROW((void)nlohmann::json(piece).dump()) << l["name"];
      all += piece;
    }
    all += sd.flush();
    EXPECT_EQ(all, l["text"].get<std::string>()) << l["name"];
  }
}

TEST(TokenizerGolden, ConfigGivesBosAndEos) {
  DSA_REQUIRE_FIXTURE(dsa::test::tokenizer_dir() + "/tokenizer_config.json");
  EXPECT_EQ(deepseek().bos_id(), 0);
  EXPECT_EQ(deepseek().eos_id(), 1);
  EXPECT_TRUE(deepseek().default_add_bos());
  const auto with_bos = deepseek().encode("hello", /*add_bos=*/true);
  ASSERT_FALSE(with_bos.empty());
  EXPECT_EQ(with_bos[0], 0);
  EXPECT_EQ(deepseek().token_to_id("<think>"), std::optional<int32_t>(128798));
}

}  // namespace
