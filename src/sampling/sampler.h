#pragma once
// Token sampling: penalties, temperature, top-k, top-p, min-p and a seeded draw, with
// every buffer sized for the vocabulary once so that sampling a token never allocates.
//
// Order of the steps (the HF transformers / vLLM order, so top-p and min-p act on the
// distribution that is actually sampled; llama.cpp applies temperature last instead):
//   1. logit biases added to the raw logits (OpenAI's logit_bias), then penalties over
//      the tokens passed to accept() (the last
//      penalty_last_n of them): repetition (logit / r if > 0, logit * r otherwise, once
//      per distinct token), presence (- presence once per distinct token), frequency
//      (- frequency * count). 2. greedy (argmax) when greedy or temperature <= 0.
//   3. logits / temperature. 4. top-k. 5. top-p (smallest prefix of the descending
//   order whose probability reaches top_p). 6. min-p (drop p < min_p * p_max).
//   7. draw from the renormalized survivors with the sampler's own mt19937_64.
// Ties are broken by the lower token id everywhere, so a seed gives the same tokens on
// every platform and standard library (mt19937_64 is fully specified by the standard;
// the uniform float is derived by hand, not with std::uniform_real_distribution).
#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace dsa {

struct SamplerParams {
  bool greedy = false;
  float temperature = 0.8f;   // <= 0 means greedy
  int top_k = 40;             // <= 0 or >= vocab: off
  float top_p = 0.95f;        // >= 1: off
  float min_p = 0.05f;        // <= 0: off
  float repeat_penalty = 1.0f;     // 1: off
  float presence_penalty = 0.0f;   // 0: off
  float frequency_penalty = 0.0f;  // 0: off
  int penalty_last_n = 64;    // tokens of history the penalties see; -1: all, 0: off
  uint64_t seed = 0;
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token, added to its logit): step 1
};

class Sampler {
public:
  struct Candidate {
    int32_t id;
    float logit;  // after penalties and temperature
    float p;      // renormalized probability among the survivors (filled by prepare)
  };

  Sampler(int vocab_size, const SamplerParams& params);

  // Records a token in the penalty history (prompt tokens and sampled ones alike).
  void accept(int32_t id);
  // Forgets the history and reseeds the generator with params.seed.
  void reset();
  // Tokens that may never be sampled (their logits are treated as -inf), e.g. ids the
  // checkpoint has but the tokenizer does not. Call during setup.
  void set_banned(std::span<const int32_t> ids);
  // Tokens excluded only while set_suppressing(true): the end-of-sequence and stop ids
  // before a request's min_tokens. Call set_suppressed during setup.
  void set_suppressed(std::span<const int32_t> ids);
  void set_suppressing(bool on) { suppressing_ = on; }
  // Tokens allowed at the next draw, for a constraint that changes with each token (JSON
  // mode): allowed[id] != 0, [vocab], read by every later draw; null: all (but the banned).
  void set_allowed(const uint8_t* allowed) { allowed_ = allowed; }

  // Samples from logits [vocab]; does not call accept().
  int32_t sample(const float* logits);

  // Speculative decoding (Leviathan et al. 2023; Chen et al. 2023). draft() samples a
  // proposal from a draft model's logits exactly as sample() would and keeps its
  // distribution q. verify() takes the target model's logits at the proposal's position
  // and returns a token distributed exactly as sample() on them: the proposal with
  // probability min(1, p/q), otherwise a draw from max(0, p - q) renormalized. q is the
  // last draft()'s distribution, or, when `from_draft` is false (a proposal from
  // elsewhere, e.g. prompt lookup), a point mass at the proposal. Greedy: the argmax, and
  // the proposal is accepted when it is the argmax. Neither calls accept(); call them with
  // the same history (the proposal's position is the same for both).
  int32_t draft(const float* logits);
  int32_t verify(const float* logits, int32_t proposal, bool from_draft, bool* accepted);

  // The pieces of sample(), exposed for tests and for callers that want the distribution.
  // apply_penalties: logits (in place) as step 1 above.
  void apply_penalties(float* logits) const;
  // Steps 1 and 3-6 on a copy of logits; returns the survivors, most probable first where
  // top-k or top-p cut them, else in id order.
  std::span<const Candidate> prepare(const float* logits);

  const SamplerParams& params() const { return p_; }
  int vocab_size() const { return vocab_; }
  bool is_greedy() const { return p_.greedy || p_.temperature <= 0.0f; }
  // Uniform double in [0, 1) from the next 53 bits of the generator.
  double next_uniform();

private:
  void forget(int32_t id);
  // One draw from prepared candidates by their probabilities (one uniform).
  int32_t draw(std::span<const Candidate> c);

  int vocab_;
  SamplerParams p_;
  std::mt19937_64 rng_;
  std::vector<float> work_;             // [vocab] penalized logits
  std::vector<Candidate> cand_;         // [vocab]
  std::vector<float> q_;                // [vocab] the last draft()'s distribution (0 elsewhere)
  std::vector<int32_t> q_ids_;          // ids where q_ is non-zero, to clear it
  std::vector<uint8_t> banned_;         // [vocab] bit 0: banned; bit 1: suppressed
  const uint8_t* allowed_ = nullptr;    // [vocab] or null (set_allowed)
  bool suppressing_ = false;
  static size_t nucleus(Candidate* c, size_t n, double mass);
  bool excluded(int32_t id) const {
    const uint8_t b = banned_[size_t(id)];
    return (b & 1) || ((b & 2) && suppressing_) || (allowed_ && !allowed_[size_t(id)]);
  }
  // Penalty history: counts per token, the distinct tokens with count > 0 (and each
  // one's slot in that list, for O(1) removal) and a ring of the last penalty_last_n ids.
  std::vector<int32_t> count_, distinct_, slot_, ring_;
  size_t ring_pos_ = 0, ring_len_ = 0;
};

}  // namespace dsa
