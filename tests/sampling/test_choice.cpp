// ChoicePrefix (vLLM's guided_choice): every choice is taken whole and nothing else is; a
// choice that others go on from is complete but not closed; random walks over the bytes it
// allows never get stuck and end in a choice.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "sampling/choice_grammar.h"

using namespace dsa;

namespace {

const std::vector<std::string> kChoices = {"positive", "pos", "negative", "neutral", "😀 yes", "pos"};

TEST(Choice, TakesEachChoiceAndNothingElse) {
  const ChoiceGrammar g(kChoices);
  EXPECT_EQ(g.choices().size(), 5u) << "each once";
  for (const std::string& c : kChoices) {
    ChoicePrefix p(g);
    EXPECT_TRUE(p.feed(c) && p.complete()) << c;
  }
  for (const char* no : {"po", "posit", "positives", "Positive", "neg", " pos", "😀"}) {
    ChoicePrefix p(g);
    EXPECT_FALSE(p.feed(no) && p.complete()) << no;
  }
  ChoicePrefix p(g);
  EXPECT_TRUE(p.feed("pos"));
  EXPECT_TRUE(p.complete());
  EXPECT_FALSE(p.closed()) << "positive goes on from pos";
  EXPECT_FALSE(ChoicePrefix(p).feed('x'));
  EXPECT_TRUE(p.feed("itive"));
  EXPECT_TRUE(p.closed());
  EXPECT_FALSE(ChoicePrefix(p).feed('s'));
}

TEST(Choice, WalksNeverGetStuckAndEndInAChoice) {
  const ChoiceGrammar g(kChoices);
  std::mt19937 rng(3);
  for (int walk = 0; walk < 500; ++walk) {
    ChoicePrefix p(g);
    std::string text;
    while (!p.closed() && !(p.complete() && rng() % 3 == 0)) {
      std::vector<unsigned char> ok;
      for (int c = 0; c < 256; ++c) {
        ChoicePrefix q = p;
        if (q.feed(static_cast<unsigned char>(c))) ok.push_back(static_cast<unsigned char>(c));
      }
      ASSERT_FALSE(ok.empty()) << "stuck after: " << text;
      const unsigned char c = ok[rng() % ok.size()];
      ASSERT_TRUE(p.feed(c));
      text += char(c);
    }
    EXPECT_NE(std::find(kChoices.begin(), kChoices.end(), text), kChoices.end()) << text;
  }
}

TEST(Choice, RefusesWhatCannotBeAChoice) {
  EXPECT_THROW(ChoiceGrammar({}), Error);
  EXPECT_THROW(ChoiceGrammar({"a", ""}), Error);
  EXPECT_THROW(ChoiceGrammar(std::vector<std::string>(ChoiceGrammar::kMaxChoices + 1, "x")), Error);
  EXPECT_THROW(ChoiceGrammar({std::string(ChoiceGrammar::kMaxBytes + 1, 'x')}), Error);
}

}  // namespace
