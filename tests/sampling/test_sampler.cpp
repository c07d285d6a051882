// Sampler: each step against a distribution computed here by hand from the definition.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include "core/error.h"
#include "sampling/sampler.h"

using namespace dsa;

namespace {

SamplerParams plain() {  // every filter off: a draw from softmax(logits)
  SamplerParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  return p;
}

std::vector<double> softmax(const std::vector<float>& l, double t = 1.0) {
  const double mx = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double z = 0;
  for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp((l[i] - mx) / t);
  for (double& x : p) x /= z;
  return p;
}

std::set<int32_t> ids_of(std::span<const Sampler::Candidate> c) {
  std::set<int32_t> s;
  for (const auto& x : c) s.insert(x.id);
  return s;
}

// Ids sorted by descending probability (lower id first on ties).
std::vector<int32_t> order(const std::vector<double>& p) {
  std::vector<int32_t> o(p.size());
  std::iota(o.begin(), o.end(), 0);
  std::stable_sort(o.begin(), o.end(), [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
  return o;
}

const std::vector<float> kLogits = {0.5f, 2.0f, -1.0f, 1.5f, 0.0f, 3.0f, -2.0f, 1.0f};

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  SamplerParams p = plain();
  p.greedy = true;
  Sampler s(8, p);
  const auto o = order(softmax(kLogits));
  EXPECT_EQ(s.sample(kLogits.data()), o[0]);
  std::vector<float> tie = {1.0f, 4.0f, 0.0f, 4.0f};
  Sampler t(4, p);
  EXPECT_EQ(t.sample(tie.data()), 1);
  p.greedy = false;
  p.temperature = 0.0f;  // temperature 0 is greedy too
  Sampler u(8, p);
  EXPECT_EQ(u.sample(kLogits.data()), o[0]);
  // So is its limit: 1/T overflows float (it gave NaN probabilities and token 0).
  for (float t : {1e-40f, 1e-37f}) {
    p.temperature = t;
    Sampler v(8, p);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(v.sample(kLogits.data()), o[0]) << t;
  }
}

TEST(Sampler, TopK1EqualsGreedy) {
  SamplerParams p = plain();
  p.top_k = 1;
  p.seed = 7;
  Sampler s(8, p);
  std::vector<float> l = kLogits;
  for (int step = 0; step < 20; ++step) {
    std::rotate(l.begin(), l.begin() + 1, l.end());  // a different argmax each time
    const auto o = order(softmax(l));
    EXPECT_EQ(s.sample(l.data()), o[0]) << step;
  }
}

TEST(Sampler, TopKKeepsTheKBest) {
  SamplerParams p = plain();
  p.top_k = 3;
  Sampler s(8, p);
  const auto c = s.prepare(kLogits.data());
  const auto o = order(softmax(kLogits));
  ASSERT_EQ(c.size(), 3u);
  double z = 0;
  for (int i = 0; i < 3; ++i) z += std::exp(double(kLogits[size_t(o[size_t(i)])]));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(c[size_t(i)].id, o[size_t(i)]);
    EXPECT_NEAR(c[size_t(i)].p, std::exp(double(kLogits[size_t(o[size_t(i)])])) / z, 1e-6);
  }
}

TEST(Sampler, TopPCut) {
  const auto pr = softmax(kLogits);
  const auto o = order(pr);
  // For each cut point k, a top_p just below the mass of the k best keeps exactly k.
  double cum = 0;
  for (size_t k = 1; k < o.size(); ++k) {
    cum += pr[size_t(o[k - 1])];
    SamplerParams p = plain();
    p.top_p = float(cum - 1e-4);
    Sampler s(8, p);
    const auto c = s.prepare(kLogits.data());
    EXPECT_EQ(c.size(), k) << "top_p " << p.top_p;
    for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(c[i].id, o[i]);
    double sum = 0;
    for (const auto& x : c) sum += x.p;
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
}

TEST(Sampler, MinPCut) {
  const auto pr = softmax(kLogits);
  const double pmax = *std::max_element(pr.begin(), pr.end());
  for (float mp : {0.05f, 0.2f, 0.5f, 0.9f}) {
    SamplerParams p = plain();
    p.min_p = mp;
    Sampler s(8, p);
    std::set<int32_t> want;
    for (size_t i = 0; i < pr.size(); ++i)
      if (pr[i] >= mp * pmax) want.insert(int32_t(i));
    EXPECT_EQ(ids_of(s.prepare(kLogits.data())), want) << "min_p " << mp;
  }
}

TEST(Sampler, TopPThenMinP) {
  // Both on: the survivors are the intersection of the two cuts.
  const auto pr = softmax(kLogits);
  const auto o = order(pr);
  SamplerParams p = plain();
  p.top_p = float(pr[size_t(o[0])] + pr[size_t(o[1])] + pr[size_t(o[2])] - 1e-4);  // 3 best
  p.min_p = float(pr[size_t(o[1])] / pr[size_t(o[0])] - 1e-4);                      // 2 best
  Sampler s(8, p);
  EXPECT_EQ(ids_of(s.prepare(kLogits.data())), (std::set<int32_t>{o[0], o[1]}));
  p.min_p = 1e-6f;  // now top-p binds
  Sampler t(8, p);
  EXPECT_EQ(ids_of(t.prepare(kLogits.data())), (std::set<int32_t>{o[0], o[1], o[2]}));
}

TEST(Sampler, TemperatureScalesTheDistribution) {
  SamplerParams p = plain();
  p.temperature = 0.5f;
  Sampler s(8, p);
  const auto want = softmax(kLogits, 0.5);
  for (const auto& c : s.prepare(kLogits.data())) EXPECT_NEAR(c.p, want[size_t(c.id)], 1e-6);
}

TEST(Sampler, PenaltiesAsSpecified) {
  SamplerParams p = plain();
  p.repeat_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.penalty_last_n = -1;
  Sampler s(8, p);
  // Seen: 1 (positive logit) three times, 2 (negative) once, 4 (zero) twice.
  for (int32_t id : {1, 2, 1, 4, 1, 4}) s.accept(id);
  std::vector<float> l = kLogits;
  s.apply_penalties(l.data());
  std::vector<float> want = kLogits;
  auto pen = [&](int id, int count) {
    float v = want[size_t(id)];
    v = v > 0 ? v / 2.0f : v * 2.0f;
    want[size_t(id)] = v - 0.5f - 0.25f * float(count);
  };
  pen(1, 3);
  pen(2, 1);
  pen(4, 2);
  for (size_t i = 0; i < l.size(); ++i) EXPECT_FLOAT_EQ(l[i], want[i]) << i;
}

TEST(Sampler, PenaltyWindowForgetsOldTokens) {
  SamplerParams p = plain();
  p.presence_penalty = 1.0f;
  p.penalty_last_n = 2;
  Sampler s(8, p);
  for (int32_t id : {3, 5, 7}) s.accept(id);  // 3 has left the window
  std::vector<float> l = kLogits;
  s.apply_penalties(l.data());
  for (size_t i = 0; i < l.size(); ++i) EXPECT_FLOAT_EQ(l[i], kLogits[i] - ((i == 5 || i == 7) ? 1.0f : 0.0f)) << i;
  s.reset();
  l = kLogits;
  s.apply_penalties(l.data());
  EXPECT_EQ(l, kLogits);
}

TEST(Sampler, PenaltiesChangeGreedyChoice) {
  SamplerParams p = plain();
  p.greedy = true;
  p.repeat_penalty = 10.0f;
  Sampler s(8, p);
  const auto o = order(softmax(kLogits));
  s.accept(o[0]);
  EXPECT_EQ(s.sample(kLogits.data()), o[1]);
}

// A logit bias is added to the raw logits: +100 makes a token the argmax, -100 on the two
// best leaves the third; sampling sees the biased distribution too; a bias outside the
// vocabulary or not finite is refused.
TEST(Sampler, LogitBiasShiftsTheLogits) {
  const auto o = order(softmax(kLogits));
  SamplerParams p = plain();
  p.greedy = true;
  p.logit_bias = {{o[7], 100.0f}};
  EXPECT_EQ(Sampler(8, p).sample(kLogits.data()), o[7]);
  p.logit_bias = {{o[0], -100.0f}, {o[1], -100.0f}};
  EXPECT_EQ(Sampler(8, p).sample(kLogits.data()), o[2]);
  p.greedy = false;
  p.seed = 5;
  Sampler s(8, p);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = s.sample(kLogits.data());
    EXPECT_NE(t, o[0]);
    EXPECT_NE(t, o[1]);
  }
  p.logit_bias = {{8, 1.0f}};
  EXPECT_THROW(Sampler(8, p), dsa::Error);
  p.logit_bias = {{0, std::numeric_limits<float>::infinity()}};
  EXPECT_THROW(Sampler(8, p), dsa::Error);
}

TEST(Sampler, BannedNeverSampled) {
  SamplerParams p = plain();
  p.seed = 3;
  Sampler s(8, p);
  const auto o = order(softmax(kLogits));
  const int32_t ban[] = {o[0], o[1]};
  s.set_banned(ban);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = s.sample(kLogits.data());
    EXPECT_NE(t, o[0]);
    EXPECT_NE(t, o[1]);
  }
}

// Suppressed ids (min_tokens' end-of-sequence and stop ids) are excluded only while
// suppressing: greedy falls to the second best, and back once released; banned stays banned.
TEST(Sampler, SuppressedOnlyWhileSuppressing) {
  SamplerParams p = plain();
  p.greedy = true;
  Sampler s(8, p);
  const auto o = order(softmax(kLogits));
  const int32_t held[] = {o[0]}, ban[] = {o[1]};
  s.set_suppressed(held);
  s.set_banned(ban);
  EXPECT_EQ(s.sample(kLogits.data()), o[0]);
  s.set_suppressing(true);
  EXPECT_EQ(s.sample(kLogits.data()), o[2]);
  s.set_suppressing(false);
  EXPECT_EQ(s.sample(kLogits.data()), o[0]);
}

std::vector<int32_t> draw(uint64_t seed, int n) {
  SamplerParams p = plain();
  p.seed = seed;
  const std::vector<float> flat(64, 0.0f);  // uniform over 64 tokens
  Sampler s(64, p);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(s.sample(flat.data()));
  return out;
}

TEST(Sampler, SameSeedSameSequenceDifferentSeedDifferent) {
  EXPECT_EQ(draw(42, 64), draw(42, 64));
  // Two independent uniform sequences of 64 draws over 64 tokens agree with
  // probability 64^-64: a difference is certain in practice.
  EXPECT_NE(draw(42, 64), draw(43, 64));
}

TEST(Sampler, ResetReseeds) {
  SamplerParams p = plain();
  p.seed = 9;
  const std::vector<float> flat(64, 0.0f);
  Sampler s(64, p);
  std::vector<int32_t> a, b;
  for (int i = 0; i < 32; ++i) a.push_back(s.sample(flat.data()));
  s.reset();
  for (int i = 0; i < 32; ++i) b.push_back(s.sample(flat.data()));
  EXPECT_EQ(a, b);
}

TEST(Sampler, DrawsFollowTheDistribution) {
  // Frequencies of 20000 draws within 5 standard errors of the softmax probabilities.
  SamplerParams p = plain();
  p.seed = 1;
  Sampler s(8, p);
  const auto pr = softmax(kLogits);
  std::vector<int> hist(8, 0);
  const int N = 20000;
  for (int i = 0; i < N; ++i) ++hist[size_t(s.sample(kLogits.data()))];
  for (size_t i = 0; i < 8; ++i) {
    const double se = std::sqrt(pr[i] * (1 - pr[i]) / N);
    EXPECT_NEAR(double(hist[i]) / N, pr[i], 5 * se + 1e-4) << i;
  }
}

TEST(Sampler, UniformIsInUnitInterval) {
  Sampler s(4, plain());
  for (int i = 0; i < 10000; ++i) {
    const double u = s.next_uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

TEST(Sampler, RejectsBadParameters) {
  SamplerParams p = plain();
  p.top_p = 0.0f;
  EXPECT_THROW(Sampler(8, p), std::exception);
  p = plain();
  p.repeat_penalty = 0.0f;
  EXPECT_THROW(Sampler(8, p), std::exception);
  EXPECT_THROW(Sampler(0, plain()), std::exception);
  // NaN passes a plain range check; every field must refuse it (or garbage ids follow).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float SamplerParams::*f : {&SamplerParams::temperature, &SamplerParams::top_p, &SamplerParams::min_p,
                                  &SamplerParams::repeat_penalty, &SamplerParams::presence_penalty, &SamplerParams::frequency_penalty}) {
    p = plain();
    p.*f = nan;
    EXPECT_THROW(Sampler(8, p), dsa::Error);
  }
  p = plain();
  p.top_p = 2.0f;
  EXPECT_THROW(Sampler(8, p), dsa::Error);
  p = plain();
  p.min_p = -1.0f;
  EXPECT_THROW(Sampler(8, p), dsa::Error);
  p = plain();
  p.top_k = -1;
  EXPECT_THROW(Sampler(8, p), dsa::Error);
  p = plain();
  p.repeat_penalty = std::numeric_limits<float>::infinity();
  EXPECT_THROW(Sampler(8, p), dsa::Error);
  EXPECT_NO_THROW(Sampler(8, plain()));
}

// NaN logits (a NaN weight upstream makes every logit NaN) give one error that says so,
// greedy or not; a single NaN logit is skipped, the others still sampled.
TEST(Sampler, NanLogitsAreNamed) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> all_nan(8, nan);
  SamplerParams greedy = plain();
  greedy.temperature = 0.0f;
  for (const SamplerParams& p : {plain(), greedy}) {
    Sampler s(8, p);
    try {
      s.sample(all_nan.data());
      ADD_FAILURE() << "no error for NaN logits";
    } catch (const dsa::Error& e) {
      EXPECT_NE(std::string(e.what()).find("logits are NaN"), std::string::npos) << e.what();
    }
    std::vector<float> one = {0.0f, nan, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < 50; ++i) EXPECT_NE(s.sample(one.data()), 1);
  }
  // Every token banned is not a NaN problem.
  Sampler s(8, plain());
  const int32_t ban[] = {0, 1, 2, 3, 4, 5, 6, 7};
  s.set_banned(ban);
  try {
    s.sample(kLogits.data());
    ADD_FAILURE() << "no error with every token banned";
  } catch (const dsa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("probability zero"), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Sampler, SpeculativeVerificationKeepsTheTargetDistribution) {
  // Draft from q, verify against p: the kept tokens must follow p whatever q is (here q
  // favours tokens p dislikes), and a draft is kept with probability sum min(p, q).
  // Also with top-k on both (the distributions actually sampled are what must match).
  const std::vector<float> q_logits = {2.0f, -1.0f, 1.0f, 0.0f, 2.5f, -0.5f, 1.5f, 0.5f};
  for (int top_k : {0, 5}) {
    SamplerParams sp = plain();
    sp.top_k = top_k;
    sp.seed = 7;
    Sampler s(8, sp);
    std::vector<double> p(8, 0.0), q(8, 0.0);
    for (const auto& c : s.prepare(kLogits.data())) p[size_t(c.id)] = c.p;
    for (const auto& c : s.prepare(q_logits.data())) q[size_t(c.id)] = c.p;
    double keep = 0;
    for (size_t i = 0; i < 8; ++i) keep += std::min(p[i], q[i]);
    std::vector<int> hist(8, 0);
    int kept = 0;
    const int N = 40000;
    for (int i = 0; i < N; ++i) {
      const int32_t d = s.draft(q_logits.data());
      bool ok = false;
      const int32_t t = s.verify(kLogits.data(), d, true, &ok);
      if (ok) {
        EXPECT_EQ(t, d);
        ++kept;
      }
      ++hist[size_t(t)];
    }
    for (size_t i = 0; i < 8; ++i) {
      const double se = std::sqrt(p[i] * (1 - p[i]) / N);
      EXPECT_NEAR(double(hist[i]) / N, p[i], 5 * se + 1e-4) << "top_k " << top_k << " token " << i;
    }
    EXPECT_NEAR(double(kept) / N, keep, 5 * std::sqrt(keep * (1 - keep) / N)) << top_k;

    // A proposal from elsewhere (a point mass at token 2): kept with probability p(2),
    // the rest drawn from p without it; together exactly p.
    std::fill(hist.begin(), hist.end(), 0);
    kept = 0;
    for (int i = 0; i < N; ++i) {
      bool ok = false;
      const int32_t t = s.verify(kLogits.data(), 2, false, &ok);
      kept += ok;
      EXPECT_EQ(ok, t == 2);
      ++hist[size_t(t)];
    }
    for (size_t i = 0; i < 8; ++i) {
      const double se = std::sqrt(p[i] * (1 - p[i]) / N);
      EXPECT_NEAR(double(hist[i]) / N, p[i], 5 * se + 1e-4) << "point mass, top_k " << top_k << " token " << i;
    }
    EXPECT_NEAR(double(kept) / N, p[2], 5 * std::sqrt(p[2] * (1 - p[2]) / N) + 1e-4);
  }
}

TEST(Sampler, GreedyVerificationKeepsTheArgmax) {
  SamplerParams sp = plain();
  sp.greedy = true;
  Sampler s(8, sp);
  const std::vector<float> q_logits = {2.0f, -1.0f, 1.0f, 0.0f, 2.5f, -0.5f, 1.5f, 0.5f};
  EXPECT_EQ(s.draft(q_logits.data()), 4);  // the draft's argmax
  bool ok = true;
  EXPECT_EQ(s.verify(kLogits.data(), 4, true, &ok), 5);  // the target's argmax, draft rejected
  EXPECT_FALSE(ok);
  EXPECT_EQ(s.verify(kLogits.data(), 5, false, &ok), 5);
  EXPECT_TRUE(ok);
}
