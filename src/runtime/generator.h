#pragma once
// Generator: one sequence on top of the engine. It keeps the tokens that are in the KV
// cache, so a new prompt that extends them (the next chat turn) only prefills the new
// suffix; prefills in chunks of StateOptions::max_tokens; then decodes token by token,
// sampling, streaming text through the tokenizer's StreamDecoder and a StopMatcher.
// After setup the decode loop reuses its buffers: it does not allocate per token (the
// tokenizer's StreamDecoder returns short std::strings, which stay in the small-string
// buffer for one token's bytes).
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/forward.h"
#include "sampling/sampler.h"
#include "sampling/stop.h"
#include "tokenizer/tokenizer.h"

namespace dsa {

struct GeneratorOptions {
  int max_ctx = 4096;      // cache capacity: prompt + generated tokens
  int prefill_chunk = 512; // tokens per prefill forward call
  CacheType cache = CacheType::FP8;
  // Speculative decoding with the checkpoint's MTP layer (the model must be loaded with
  // it): each step the MTP layer drafts one token and the main model verifies it together
  // with the token before it, so an accepted draft yields two tokens per main-model pass.
  // Output is distributed exactly as without it (greedy: the same tokens).
  bool mtp = false;
};

struct GenerateOptions {
  int max_new_tokens = 256;
  SamplerParams sampling;
  std::vector<std::string> stop;  // stop strings (need a tokenizer)
  bool stop_on_eos = true;        // stop after sampling one of eos_ids (it is reported, not decoded)
  std::vector<int32_t> eos_ids;   // empty: the model config's eos_token_ids
  // Proposes the token after `tokens` (the prompt and everything generated so far) for the
  // main model to verify, in place of the MTP layer's draft (prompt lookup, or a test's
  // oracle). Verified as a point-mass proposal, so the output distribution is unchanged.
  std::function<int32_t(std::span<const int32_t> tokens)> propose;
};

enum class StopReason { Eos, StopString, MaxTokens, ContextFull, Callback };
const char* to_string(StopReason r);

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids, the EOS id included when it stopped there
  std::string text;             // streamed text (stop string and what follows excluded)
  StopReason reason = StopReason::MaxTokens;
  int prompt_tokens = 0;        // tokens of the prompt
  int reused_tokens = 0;        // of which were already in the cache
  double prefill_s = 0, decode_s = 0;
  int decode_steps = 0;         // main-model forward calls after the prefill
  int drafted = 0, accepted = 0;  // speculative decoding: proposals verified, and kept
  double prefill_tok_s() const { return prefill_s > 0 ? (prompt_tokens - reused_tokens) / prefill_s : 0; }
  // Tokens the decode loop produced (all but the first, which the prefill's logits give).
  double decode_tok_s() const { return decode_s > 0 && !tokens.empty() ? double(tokens.size() - 1) / decode_s : 0; }
  double acceptance() const { return drafted > 0 ? double(accepted) / drafted : 0; }
};

class Generator {
public:
  // `tok` may be null (ids in, ids out: no text, no stop strings).
  Generator(const Model& m, const Tokenizer* tok, const GeneratorOptions& opt);

  // Text callback: called with each piece of text that is final. Token callback: called
  // with each sampled id; returning false stops generation (StopReason::Callback).
  using TextFn = std::function<void(std::string_view)>;
  using TokenFn = std::function<bool(int32_t)>;
  GenerateResult generate(std::span<const int32_t> prompt, const GenerateOptions& g, const TextFn& on_text = {},
                          const TokenFn& on_token = {});

  // Brings the cache to hold exactly `prompt`, reusing the longest common prefix with what
  // it holds; returns the logits after the last prompt token. *reused: tokens kept.
  // With MTP, the MTP layer's cache follows (every prompt position but the last, whose
  // next token is not known yet).
  const float* prefill(std::span<const int32_t> prompt, int* reused = nullptr);
  void reset() {
    cached_.clear();
    state_.n_past = state_.mtp_n_past = 0;
    h_rows_n_ = 0;
  }

  const std::vector<int32_t>& cached_tokens() const { return cached_; }
  const Model& model() const { return m_; }
  const GeneratorOptions& options() const { return opt_; }

private:
  const Model& m_;
  const Tokenizer* tok_;
  GeneratorOptions opt_;
  State state_;
  // The MTP layer's draft for the token after `next` (the token about to be verified):
  // first it catches up over the positions whose next token is now known.
  int32_t mtp_draft(Sampler& sampler);

  std::vector<int32_t> cached_;  // ids whose keys are in the cache, reserved to max_ctx
  std::vector<int32_t> banned_;  // ids the tokenizer cannot decode
  // MTP: final-normed hidden states of the main positions [state_.mtp_n_past, n_past), which
  // the MTP layer has not seen yet (their next token was not known), and the last prefill
  // logits (the MTP pass overwrites the state's logits).
  std::vector<float> h_rows_, last_logits_;
  int h_rows_n_ = 0;
};

}  // namespace dsa
