#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/error.h"

namespace dsa {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Descending logit, then ascending id: a strict total order, so sorting and selection
// give the same result with any standard library.
bool before(const Sampler::Candidate& a, const Sampler::Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// Nothing left to sample: say whether the model produced NaN (a non-finite value in the
// checkpoint's weights, or an activation that overflowed) rather than a bare "no token".
[[noreturn]] void throw_nothing_to_sample(const std::vector<float>& logits) {
  if (std::any_of(logits.begin(), logits.end(), [](float l) { return std::isnan(l); }))
    throw Error("sampler: the logits are NaN (non-finite values in the checkpoint's weights, or activations that overflowed)");
  throw Error("sampler: every token has probability zero");
}

}  // namespace

Sampler::Sampler(int vocab_size, const SamplerParams& params) : vocab_(vocab_size), p_(params) {
  if (vocab_size <= 0) throw Error("sampler: vocabulary size must be positive");
  // NaN fails every comparison below (written so that it does): one error, not a stream of
  // token 0 or an all-NaN distribution.
  auto check = [](bool ok, const char* what, float v) {
    if (!ok) throw Error(std::string("sampler: ") + what + ", got " + std::to_string(v));
  };
  check(std::isfinite(p_.temperature), "temperature must be a finite number (<= 0: greedy)", p_.temperature);
  check(p_.top_k >= 0, "top_k must be >= 0 (0: off)", float(p_.top_k));
  check(p_.top_p > 0.0f && p_.top_p <= 1.0f, "top_p must be in (0, 1] (1: off)", p_.top_p);
  check(p_.min_p >= 0.0f && p_.min_p <= 1.0f, "min_p must be in [0, 1] (0: off)", p_.min_p);
  check(p_.repeat_penalty > 0.0f && std::isfinite(p_.repeat_penalty), "repeat penalty must be a finite number > 0 (1: off)", p_.repeat_penalty);
  check(std::isfinite(p_.presence_penalty), "presence penalty must be a finite number", p_.presence_penalty);
  check(std::isfinite(p_.frequency_penalty), "frequency penalty must be a finite number", p_.frequency_penalty);
  if (p_.penalty_last_n < -1) throw Error("sampler: penalty_last_n must be >= -1");
  for (const auto& [id, bias] : p_.logit_bias) {
    if (id < 0 || id >= vocab_size)
      throw Error("sampler: logit bias for token " + std::to_string(id) + ", outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    check(std::isfinite(bias), "a logit bias must be a finite number", bias);
  }
  const auto V = size_t(vocab_size);
  work_.resize(V);
  cand_.resize(V);
  q_.assign(V, 0.0f);
  q_ids_.reserve(V);
  banned_.assign(V, 0);
  count_.assign(V, 0);
  slot_.assign(V, -1);
  distinct_.reserve(V);
  if (p_.penalty_last_n > 0) ring_.resize(size_t(p_.penalty_last_n));
  reset();
}

void Sampler::reset() {
  rng_.seed(p_.seed);
  for (int32_t id : distinct_) {
    count_[size_t(id)] = 0;
    slot_[size_t(id)] = -1;
  }
  distinct_.clear();
  ring_pos_ = ring_len_ = 0;
}

void Sampler::set_banned(std::span<const int32_t> ids) {
  for (int32_t id : ids)
    if (id >= 0 && id < vocab_) banned_[size_t(id)] |= 1;
}

void Sampler::set_suppressed(std::span<const int32_t> ids) {
  for (int32_t id : ids)
    if (id >= 0 && id < vocab_) banned_[size_t(id)] |= 2;
}

void Sampler::forget(int32_t id) {
  if (--count_[size_t(id)] > 0) return;
  // Swap-remove from the distinct list.
  const int32_t s = slot_[size_t(id)], last = distinct_.back();
  distinct_[size_t(s)] = last;
  slot_[size_t(last)] = s;
  distinct_.pop_back();
  slot_[size_t(id)] = -1;
}

void Sampler::accept(int32_t id) {
  if (id < 0 || id >= vocab_ || p_.penalty_last_n == 0) return;
  if (p_.penalty_last_n > 0) {
    if (ring_len_ == ring_.size()) forget(ring_[ring_pos_]);  // oldest leaves the window
    else ++ring_len_;
    ring_[ring_pos_] = id;
    ring_pos_ = (ring_pos_ + 1) % ring_.size();
  }
  if (count_[size_t(id)]++ == 0) {
    slot_[size_t(id)] = int32_t(distinct_.size());
    distinct_.push_back(id);  // capacity is vocab: never reallocates
  }
}

void Sampler::apply_penalties(float* logits) const {
  for (const auto& [id, bias] : p_.logit_bias) logits[size_t(id)] += bias;
  const bool rep = p_.repeat_penalty != 1.0f;
  if (!rep && p_.presence_penalty == 0.0f && p_.frequency_penalty == 0.0f) return;
  for (int32_t id : distinct_) {
    float& l = logits[size_t(id)];
    if (rep) l = l > 0.0f ? l / p_.repeat_penalty : l * p_.repeat_penalty;
    l -= float(count_[size_t(id)]) * p_.frequency_penalty + p_.presence_penalty;
  }
}

double Sampler::next_uniform() { return double(rng_() >> 11) * 0x1.0p-53; }

std::span<const Sampler::Candidate> Sampler::prepare(const float* logits) {
  std::copy_n(logits, size_t(vocab_), work_.begin());
  apply_penalties(work_.data());
  const bool greedy = is_greedy();
  const float inv_t = greedy ? 1.0f : 1.0f / p_.temperature;
  int top_k = p_.top_k;

  size_t n = 0;
  bool overflow = false;  // some finite logit / T leaves the float range
  for (int32_t i = 0; i < vocab_; ++i) {
    const float l = work_[size_t(i)];
    if (!greedy && std::isfinite(l) && !(double(std::fabs(l)) * double(inv_t) < 1e37)) overflow = true;
    if (excluded(i) || std::isnan(l) || l == kNegInf) continue;
    cand_[n++] = Candidate{i, l * inv_t, 0.0f};
  }
  if (n == 0) throw_nothing_to_sample(work_);
  auto* c = cand_.data();
  if (overflow) {
    // A temperature so small that logit / T overflows (1e-40 gives 1/T = inf, and then
    // NaN probabilities): use its limit, the most likely token.
    for (size_t i = 0; i < n; ++i) c[i].logit = work_[size_t(c[i].id)];
    top_k = 1;
  }

  // top-k: the k best, in order.
  if (top_k > 0 && size_t(top_k) < n) {
    std::nth_element(c, c + top_k, c + n, before);
    n = size_t(top_k);
  }
  // Probabilities against the full normalizer of the current set.
  const float mx = std::max_element(c, c + n, [](const Candidate& a, const Candidate& b) { return before(b, a); })->logit;
  double z = 0.0;
  for (size_t i = 0; i < n; ++i) {
    c[i].p = std::exp(c[i].logit - mx);
    z += c[i].p;
  }
  // min-p keeps p >= min_p * p_max whatever top-p removes (top-p cuts only the tail, and
  // the ratio to the max survives renormalization), so it can run first and shrink the sort.
  // A compaction that keeps the order (no allocation, unlike std::stable_partition).
  size_t keep_min_p = n;
  if (p_.min_p > 0.0f) {
    const float thr = p_.min_p;  // p / p_max = exp(logit - mx) = c.p before normalizing
    keep_min_p = 0;
    for (size_t i = 0; i < n; ++i)
      if (c[i].p >= thr) c[keep_min_p++] = c[i];
  }
  size_t keep = keep_min_p;
  if (p_.top_p < 1.0f) keep = nucleus(c, keep_min_p, double(p_.top_p) * z);
  else if (top_k > 0) std::sort(c, c + keep_min_p, before);
  // Without a top-k or top-p cut the survivors stay in id order: sorting a whole vocabulary
  // took 12 ms a token at 129280 (the order only fixes which token a seed's draw lands on).
  double zk = 0.0;
  for (size_t i = 0; i < keep; ++i) zk += c[i].p;
  for (size_t i = 0; i < keep; ++i) c[i].p = float(c[i].p / zk);
  return {c, keep};
}

// The top-p prefix of c[0, n) in descending order, sorted in front: the fewest candidates
// whose p sum (before normalizing, as they come in that order) reaches `mass`, or all n.
// The k best are selected for growing k and only they are sorted, so a peaked distribution
// sorts a few dozen candidates; the prefix is that of a sort of all n, sums included.
size_t Sampler::nucleus(Candidate* c, size_t n, double mass) {
  for (size_t k = 64;; k *= 4) {
    const bool all = k >= n;
    if (!all) {
      std::nth_element(c, c + k, c + n, before);
      double top = 0.0;
      for (size_t i = 0; i < k; ++i) top += c[i].p;
      if (top < mass * (1.0 + 1e-12)) continue;  // the prefix may reach past these k
    }
    const size_t m = all ? n : k;
    std::sort(c, c + m, before);
    double cum = 0.0;
    for (size_t i = 0; i < m; ++i) {
      cum += c[i].p;
      if (cum >= mass) return i + 1;
    }
    if (all) return n;
  }
}

int32_t Sampler::sample(const float* logits) {
  if (is_greedy()) {
    // Argmax of the penalized logits (banned ids excluded), lowest id on ties.
    std::copy_n(logits, size_t(vocab_), work_.begin());
    apply_penalties(work_.data());
    int32_t best = -1;
    for (int32_t i = 0; i < vocab_; ++i) {
      const float l = work_[size_t(i)];
      if (excluded(i) || std::isnan(l)) continue;
      if (best < 0 || l > work_[size_t(best)]) best = i;
    }
    if (best < 0) throw_nothing_to_sample(work_);
    return best;
  }
  return draw(prepare(logits));
}

int32_t Sampler::draw(std::span<const Candidate> c) {
  const double u = next_uniform();
  double cum = 0.0;
  for (const Candidate& x : c) {
    cum += x.p;
    if (u < cum) return x.id;
  }
  return c.back().id;  // u within rounding of 1
}

int32_t Sampler::draft(const float* logits) {
  for (int32_t id : q_ids_) q_[size_t(id)] = 0.0f;
  q_ids_.clear();
  if (is_greedy()) return sample(logits);  // verify() compares argmaxes; q is not used
  const auto c = prepare(logits);
  for (const Candidate& x : c) {
    q_[size_t(x.id)] = x.p;
    q_ids_.push_back(x.id);
  }
  return draw(c);
}

int32_t Sampler::verify(const float* logits, int32_t proposal, bool from_draft, bool* accepted) {
  if (is_greedy()) {
    const int32_t t = sample(logits);
    *accepted = t == proposal;
    return t;
  }
  const auto c = prepare(logits);
  auto q_of = [&](int32_t id) -> double {
    if (from_draft) return q_[size_t(id)];
    return id == proposal ? 1.0 : 0.0;
  };
  double p_d = 0.0;
  for (const Candidate& x : c)
    if (x.id == proposal) p_d = x.p;
  const double q_d = q_of(proposal);
  // Accept with probability min(1, p/q): u * q < p (q > 0 for a proposal drawn from q).
  if (q_d > 0.0 && next_uniform() * q_d < p_d) {
    *accepted = true;
    return proposal;
  }
  *accepted = false;
  // The residual max(0, p - q): what p has beyond what the proposal already covered.
  double z = 0.0;
  for (const Candidate& x : c) z += std::max(0.0, double(x.p) - q_of(x.id));
  if (!(z > 0.0)) return draw(c);  // p == q within rounding: the residual is empty, p itself is exact
  const double u = next_uniform();
  double cum = 0.0;
  int32_t last = c.front().id;
  for (const Candidate& x : c) {
    const double r = std::max(0.0, double(x.p) - q_of(x.id));
    if (r <= 0.0) continue;
    last = x.id;
    cum += r;
    if (u * z < cum) return x.id;
  }
  return last;  // u * z within rounding of z
}

}  // namespace dsa
