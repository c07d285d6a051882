// Generator, perplexity, chat helpers and the synthetic tokenizer, in-process on the tiny
// random model. Expected values come from the teacher-forced runner (a separate path).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "fixtures.h"
#include "runtime/teacher_forcing.h"
#include "runtime/chat.h"
#include "runtime/generator.h"
#include "runtime/perplexity.h"
#include "tiny_model.h"

using namespace dsa;

namespace {

struct Env {
  std::unique_ptr<Model> model = Model::load(test::tiny_model_dir(), false, false);
  std::unique_ptr<Model> with_mtp = Model::load(test::tiny_model_dir(), true, false);
  Tokenizer tok = Tokenizer::from_dir(test::tiny_model_dir());
};
Env& env() {
  static Env e;
  return e;
}

// Greedy decoding of exactly max_new_tokens (EOS does not stop it).
GenerateOptions greedy(int max_new_tokens) {
  GenerateOptions g;
  g.max_new_tokens = max_new_tokens;
  g.sampling.greedy = true;
  g.stop_on_eos = false;
  return g;
}

// Sampling at temperature 1 with every filter off: a draw from softmax(logits).
GenerateOptions plain_sampling(int max_new_tokens, uint64_t seed) {
  GenerateOptions g;
  g.max_new_tokens = max_new_tokens;
  g.sampling.seed = seed;
  g.sampling.temperature = 1.0f;
  g.sampling.top_k = 0;
  g.sampling.top_p = 1.0f;
  g.sampling.min_p = 0.0f;
  g.stop_on_eos = false;
  return g;
}

int32_t argmax(const float* row, int n) { return int32_t(std::max_element(row, row + n) - row); }

// An engine for one sequence of max_ctx tokens (and room for a previous one's cached
// blocks), blocks of one token so that prefix reuse is token-exact, and a generator on it.
struct TestGen {
  static EngineOptions options(int max_ctx, int chunk, CacheType cache, bool mtp) {
    EngineOptions eo;
    eo.cache = cache;
    eo.block_size = 1;
    eo.max_ctx = max_ctx;
    eo.max_seqs = 1;
    eo.max_step_tokens = std::max(2, std::min(chunk, max_ctx));
    eo.cache_tokens = 2 * int64_t(max_ctx);
    eo.mtp = mtp;
    return eo;
  }
  Engine engine;
  Generator gen;
  TestGen(const Model& m, const Tokenizer* tok, int max_ctx, int chunk, CacheType cache, bool mtp = false)
      : engine(m, options(max_ctx, chunk, cache, mtp)), gen(engine, tok, GeneratorOptions{chunk, mtp}) {}
};

std::vector<int32_t> some_ids(int n, int salt) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(int32_t((i * 37 + salt * 101 + 11) % 1000 + 20));
  return v;
}

double max_rel_diff(const float* a, const float* b, int n) {
  double mx = 0, err = 0;
  for (int i = 0; i < n; ++i) {
    mx = std::max(mx, double(std::fabs(b[i])));
    err = std::max(err, double(std::fabs(a[i] - b[i])));
  }
  return err / std::max(mx, 1e-30);
}

TEST(SyntheticTokenizer, LoadsCoversVocabAndRoundTrips) {
  const Tokenizer& tok = env().tok;
  EXPECT_EQ(tok.vocab_size(), 1024);
  for (int32_t id = 0; id < 1024; ++id) EXPECT_TRUE(tok.is_valid_id(id)) << id;
  EXPECT_EQ(tok.bos_id(), env().model->config.bos_token_id);
  ASSERT_FALSE(env().model->config.eos_token_ids.empty());
  EXPECT_EQ(tok.eos_id(), env().model->config.eos_token_ids[0]);
  EXPECT_TRUE(tok.default_add_bos());
  for (const std::string s : {"The quick brown fox, 42 times!", "caf\xc3\xa9 \xe2\x80\x94 \xe4\xb8\xad\xe6\x96\x87", " spaces  and\nnewlines\t"}) {
    const auto ids = tok.encode(s);
    EXPECT_EQ(tok.decode(ids), s);
  }
  // Merges were learned: common words take fewer tokens than bytes.
  EXPECT_LT(tok.encode(" the language model").size(), std::string(" the language model").size() / 2);
  for (const char* special : {"<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "<｜end▁of▁sentence｜>"})
    EXPECT_EQ(tok.encode(special).size(), 1u) << special;
  EXPECT_THROW(write_synthetic_tokenizer(test::tiny_model_dir() + "/small", 100), Error);
}

TEST(Generator, GreedyMatchesTeacherForcedArgmax) {
  const Model& m = *env().model;
  const int V = m.config.vocab_size;
  TestGen gen_(m, nullptr, 64, 512, CacheType::FP8); Generator& gen = gen_.gen;
  GenerateOptions g = greedy(6);
  const auto prompt = some_ids(9, 1);
  const auto r = gen.generate(prompt, g);
  ASSERT_EQ(r.tokens.size(), 6u);
  EXPECT_EQ(r.reason, StopReason::MaxTokens);
  EXPECT_EQ(r.decode_steps, 5);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), r.tokens.begin(), r.tokens.end());
  const auto tf = run_teacher_forced(m, all, int(prompt.size()), CacheType::FP8, false, false);
  for (size_t k = 0; k < r.tokens.size(); ++k)
    EXPECT_EQ(r.tokens[k], argmax(&tf.logits[(prompt.size() - 1 + k) * size_t(V)], V)) << k;
}

TEST(Generator, PrefixReuseAndChunkingGiveTheSameLogits) {
  const Model& m = *env().model;
  const int V = m.config.vocab_size;
  const auto p1 = some_ids(20, 2);
  auto p2 = p1;
  p2.resize(14);  // diverges from p1 after 14 tokens
  for (int32_t x : some_ids(9, 3)) p2.push_back(x);

  TestGen fresh_(m, nullptr, 64, 512, CacheType::FP8); Generator& fresh = fresh_.gen;
  const float* l = fresh.prefill(p2);
  const std::vector<float> want(l, l + V);

  TestGen reuse_(m, nullptr, 64, 5, CacheType::FP8); Generator& reuse = reuse_.gen;  // chunks of 5
  int reused = -1;
  reuse.prefill(p1, &reused);
  EXPECT_EQ(reused, 0);
  l = reuse.prefill(p2, &reused);
  EXPECT_EQ(reused, 14);
  EXPECT_EQ(reuse.cached_tokens(), p2);
  EXPECT_LE(max_rel_diff(l, want.data(), V), 1e-4);
  // The same prompt again: everything but the last token is reused.
  l = reuse.prefill(p2, &reused);
  EXPECT_EQ(reused, int(p2.size()) - 1);
  EXPECT_LE(max_rel_diff(l, want.data(), V), 1e-4);
}

TEST(Generator, SeedReproducesAndStopsAreHonoured) {
  const Model& m = *env().model;
  TestGen gen_(m, &env().tok, 128, 512, CacheType::FP8); Generator& gen = gen_.gen;
  GenerateOptions g = plain_sampling(24, 123);
  const auto prompt = env().tok.encode("Once upon a time", true);
  std::string streamed;
  const auto a = gen.generate(prompt, g, [&](std::string_view s) { streamed += s; });
  const auto b = gen.generate(prompt, g);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.text, streamed);
  EXPECT_EQ(a.text, env().tok.decode(a.tokens));
  g.sampling.seed = 124;
  EXPECT_NE(gen.generate(prompt, g).tokens, a.tokens);  // 24 draws over ~1000 tokens

  // A stop string taken from the middle of the text: output ends right before it.
  g.sampling.seed = 123;
  const std::string& t = a.text;
  ASSERT_GE(t.size(), 8u);
  const std::string stop = t.substr(t.size() / 2, 3);
  g.stop = {stop};
  const auto c = gen.generate(prompt, g);
  EXPECT_EQ(c.reason, StopReason::StopString);
  EXPECT_EQ(c.text, t.substr(0, t.find(stop)));

  // EOS: forcing the EOS id makes it the only choice; it is reported and not decoded.
  g.stop.clear();
  g.eos_ids = {a.tokens[0]};
  g.stop_on_eos = true;
  const auto d = gen.generate(prompt, g);
  EXPECT_EQ(d.reason, StopReason::Eos);
  EXPECT_EQ(d.tokens, std::vector<int32_t>{a.tokens[0]});
  EXPECT_EQ(d.text, "");
  TestGen no_tok_(m, nullptr, 128, 512, CacheType::FP8); Generator& no_tok = no_tok_.gen;
  g.stop = {"x"};
  EXPECT_THROW(no_tok.generate(prompt, g), Error);
}

TEST(Generator, ContextFullStops) {
  const Model& m = *env().model;
  TestGen gen_(m, nullptr, 12, 512, CacheType::FP8); Generator& gen = gen_.gen;
  GenerateOptions g = greedy(100);
  const auto r = gen.generate(some_ids(8, 4), g);
  EXPECT_EQ(r.reason, StopReason::ContextFull);
  EXPECT_EQ(r.tokens.size(), 5u);  // 4 more fit in the cache, the 5th is sampled from the last logits
  EXPECT_THROW(gen.generate(some_ids(13, 4), g), Error);
}

// Reference: per-token NLL from the teacher-forced logits of each window.
std::vector<double> reference_nll(const Model& m, const std::vector<int32_t>& ids, int N, int first, int32_t bos) {
  const int V = m.config.vocab_size;
  std::vector<double> nll;
  for (size_t w = 0; (w + 1) * size_t(N) <= ids.size(); ++w) {
    std::vector<int32_t> win(ids.begin() + std::ptrdiff_t(w * size_t(N)), ids.begin() + std::ptrdiff_t((w + 1) * size_t(N)));
    if (bos >= 0) win[0] = bos;
    const auto tf = run_teacher_forced(m, win, N, CacheType::FP8, false, false);
    for (int j = first; j + 1 < N; ++j) {
      const float* row = &tf.logits[size_t(j) * size_t(V)];
      const double mx = *std::max_element(row, row + V);
      double z = 0;
      for (int v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
      nll.push_back(std::log(z) - (row[win[size_t(j + 1)]] - mx));
    }
  }
  return nll;
}

TEST(Perplexity, MatchesTeacherForcedReference) {
  const Model& m = *env().model;
  const auto ids = some_ids(70, 5);  // 4 windows of 16, 6 tokens dropped
  for (bool all : {false, true}) {
    PerplexityOptions o;
    o.ctx = 16;
    o.score_all = all;
    o.bos_id = 0;
    int calls = 0;
    const auto r = perplexity(m, ids, o, [&](int done, int total, double) {
      EXPECT_EQ(done, ++calls);
      EXPECT_EQ(total, 4);
    });
    const auto nll = reference_nll(m, ids, 16, all ? 0 : 8, 0);
    double mean = 0;
    for (double x : nll) mean += x / double(nll.size());
    double var = 0;
    for (double x : nll) var += (x - mean) * (x - mean) / double(nll.size() - 1);
    EXPECT_EQ(r.n_windows, 4);
    EXPECT_EQ(r.n_scored, int64_t(nll.size()));
    EXPECT_EQ(r.n_scored, all ? 4 * 15 : 4 * 7);
    EXPECT_NEAR(r.ppl, std::exp(mean), 1e-4 * std::exp(mean));
    EXPECT_NEAR(r.ppl_stderr, std::exp(mean) * std::sqrt(var / double(nll.size())), 1e-3 * r.ppl_stderr + 1e-9);
    // Chunked evaluation of each window gives the same number.
    o.max_tokens = 5;
    EXPECT_NEAR(perplexity(m, ids, o).ppl, r.ppl, 1e-3 * r.ppl);
  }
  PerplexityOptions o;
  o.ctx = 100;
  EXPECT_THROW(perplexity(m, ids, o), Error);
}

TEST(Chat, SplitterSeparatesReasoningAcrossChunks) {
  const std::string text = "let me think</think>The answer.";
  for (size_t chunk = 1; chunk <= text.size(); ++chunk) {
    ReplySplitter s(true);
    std::string reasoning, content;
    auto on = [&](bool r, std::string_view x) { (r ? reasoning : content).append(x); };
    for (size_t i = 0; i < text.size(); i += chunk) s.push(std::string_view(text).substr(i, chunk), on);
    s.finish(on);
    EXPECT_EQ(reasoning, "let me think") << chunk;
    EXPECT_EQ(content, "The answer.") << chunk;
  }
  ReplySplitter plain(false);
  std::string content;
  plain.push("a</think>b", [&](bool r, std::string_view x) { EXPECT_FALSE(r); content.append(x); });
  EXPECT_EQ(content, "a</think>b");
}

TEST(Chat, SecondTurnReusesTheFirst) {
  const Model& m = *env().model;
  TestGen gen_(m, &env().tok, 512, 512, CacheType::FP8); Generator& gen = gen_.gen;
  ChatSession chat(gen, env().tok, /*thinking=*/false, "You are terse.");
  GenerateOptions g;
  g.max_new_tokens = 6;
  g.sampling.seed = 1;
  const auto t1 = chat.send("Hello there", g, {});
  EXPECT_EQ(t1.result.reused_tokens, 0);
  const auto t2 = chat.send("How are you?", g, {});
  // The second prompt starts with the first (system + first user turn at least).
  const auto first_prompt = env().tok.encode(render_chat_prompt(m.config.family, nlohmann::ordered_json::array({
      {{"role", "system"}, {"content", "You are terse."}}, {{"role", "user"}, {"content", "Hello there"}}}), false));
  EXPECT_GE(t2.result.reused_tokens, int(first_prompt.size()));
  ASSERT_EQ(chat.messages().size(), 5u);
  EXPECT_EQ(chat.messages()[2]["role"], "assistant");
  EXPECT_EQ(chat.messages()[2]["content"], t1.content);
  chat.reset();
  EXPECT_EQ(chat.messages().size(), 1u);
}

// Every generated token is the argmax of the teacher-forced logits at its position, up to
// float rounding (speculative verification runs two tokens per call, a different kernel
// path from one-token decode; an f32 cache keeps that difference at rounding level).
void expect_greedy_continuation(const Model& m, const std::vector<int32_t>& prompt, const std::vector<int32_t>& tokens) {
  const int V = m.config.vocab_size;
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), tokens.begin(), tokens.end());
  const auto tf = run_teacher_forced(m, all, int(prompt.size()), CacheType::F32, false, false);
  for (size_t k = 0; k < tokens.size(); ++k) {
    const float* row = &tf.logits[(prompt.size() - 1 + k) * size_t(V)];
    const float mx = *std::max_element(row, row + V);
    EXPECT_GE(row[tokens[k]], mx - 1e-4f * std::fabs(mx)) << "token " << k;
  }
}

TEST(Generator, MtpGreedyIsTheGreedyContinuation) {
  const Model& m = *env().with_mtp;
  TestGen gen_(m, nullptr, 96, 512, CacheType::F32, /*mtp=*/true); Generator& gen = gen_.gen;
  GenerateOptions g = greedy(24);
  const auto prompt = some_ids(9, 5);
  const auto r = gen.generate(prompt, g);
  ASSERT_EQ(r.tokens.size(), 24u);
  expect_greedy_continuation(m, prompt, r.tokens);
  // Every step verified an MTP draft; an accepted one gave a second token in that step.
  EXPECT_EQ(r.drafted, r.decode_steps);
  EXPECT_LE(int(r.tokens.size()) - 1, r.decode_steps + r.accepted);
  EXPECT_GE(int(r.tokens.size()) - 1, r.decode_steps + r.accepted - 1);
  // The same tokens as plain greedy decoding, the MTP layer only changes the speed.
  TestGen plain_(m, nullptr, 96, 512, CacheType::F32); Generator& plain = plain_.gen;
  EXPECT_EQ(plain.generate(prompt, g).tokens, r.tokens);

  // The next turn extends this one: the cache prefix is reused (the MTP layer's with it)
  // and the continuation is still the greedy one.
  std::vector<int32_t> p2 = prompt;
  p2.insert(p2.end(), r.tokens.begin(), r.tokens.end());
  for (int32_t x : some_ids(5, 6)) p2.push_back(x);
  const auto r2 = gen.generate(p2, g);
  EXPECT_GE(r2.reused_tokens, int(prompt.size() + r.tokens.size()) - 2);
  expect_greedy_continuation(m, p2, r2.tokens);
}

TEST(Generator, ProposalsAreVerified) {
  // Proposals from outside the model: an oracle (the greedy continuation itself) is always
  // kept, two tokens per main-model pass; a wrong proposal is always dropped, and the cache
  // entries it wrote must not leak into later tokens.
  const Model& m = *env().model;
  const int V = m.config.vocab_size;
  const auto prompt = some_ids(7, 8);
  GenerateOptions g = greedy(20);
  TestGen gen_(m, nullptr, 64, 512, CacheType::F32); Generator& gen = gen_.gen;
  const auto want = gen.generate(prompt, g).tokens;
  ASSERT_EQ(want.size(), 20u);
  auto nth = [&](std::span<const int32_t> seq) { return want[std::min(seq.size() - prompt.size(), want.size() - 1)]; };

  g.propose = [&](std::span<const int32_t> seq) { return nth(seq); };
  const auto oracle = gen.generate(prompt, g);
  EXPECT_EQ(oracle.tokens, want);
  EXPECT_EQ(oracle.accepted, oracle.drafted);
  EXPECT_EQ(oracle.decode_steps, 10);  // 19 tokens after the first: 9 steps of two, one of one

  g.propose = [&](std::span<const int32_t> seq) { return (nth(seq) + 1) % V; };
  const auto wrong = gen.generate(prompt, g);
  EXPECT_EQ(wrong.tokens, want);
  EXPECT_EQ(wrong.accepted, 0);
  EXPECT_EQ(wrong.drafted, 19);

  g.propose = [&](std::span<const int32_t>) { return V; };
  EXPECT_THROW(gen.generate(prompt, g), Error);
  // After the error the sequence holds exactly the prompt (not the token it was about to
  // verify): a prompt that extends past that token reuses at least the prompt (and the
  // first generated token, which an earlier run's released blocks hold) and continues as a
  // fresh generator does.
  g.propose = nullptr;
  std::vector<int32_t> longer = prompt;
  longer.push_back(want[0]);
  longer.push_back(5);
  const auto again = gen.generate(longer, g);
  EXPECT_GE(again.reused_tokens, int(prompt.size()));
  EXPECT_LE(again.reused_tokens, int(longer.size()) - 1);
  TestGen fresh_(m, nullptr, 64, 512, CacheType::F32); Generator& fresh = fresh_.gen;
  EXPECT_EQ(again.tokens, fresh.generate(longer, g).tokens);
}

TEST(Generator, MtpSamplingIsSeededAndBounded) {
  const Model& m = *env().with_mtp;
  GenerateOptions g = plain_sampling(16, 5);
  TestGen gen_(m, nullptr, 64, 4, CacheType::FP8, /*mtp=*/true); Generator& gen = gen_.gen;  // prefill in chunks of 4
  const auto prompt = some_ids(11, 9);
  const auto a = gen.generate(prompt, g);
  const auto b = gen.generate(prompt, g);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.tokens.size(), 16u);
  EXPECT_EQ(a.drafted, a.decode_steps);
  // A cache with room for 4 more tokens: the last one that fits is decoded alone (a
  // speculative step needs two free positions), as many tokens as without MTP.
  TestGen small_(m, nullptr, 12, 512, CacheType::FP8, true); Generator& small = small_.gen;
  g.max_new_tokens = 100;
  const auto c = small.generate(some_ids(8, 4), g);
  EXPECT_EQ(c.reason, StopReason::ContextFull);
  EXPECT_EQ(c.tokens.size(), 5u);
  // MTP needs the layer loaded.
  EXPECT_THROW(TestGen(*env().model, nullptr, 64, 512, CacheType::FP8, true), Error);
}

}  // namespace
