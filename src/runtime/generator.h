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
};

struct GenerateOptions {
  int max_new_tokens = 256;
  SamplerParams sampling;
  std::vector<std::string> stop;  // stop strings (need a tokenizer)
  bool stop_on_eos = true;        // stop after sampling one of eos_ids (it is reported, not decoded)
  std::vector<int32_t> eos_ids;   // empty: the model config's eos_token_ids
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
  int decode_steps = 0;         // forward calls after the prefill
  double prefill_tok_s() const { return prefill_s > 0 ? (prompt_tokens - reused_tokens) / prefill_s : 0; }
  double decode_tok_s() const { return decode_s > 0 ? decode_steps / decode_s : 0; }
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
  const float* prefill(std::span<const int32_t> prompt, int* reused = nullptr);
  void reset() { cached_.clear(); state_.n_past = 0; }

  const std::vector<int32_t>& cached_tokens() const { return cached_; }
  const Model& model() const { return m_; }
  const GeneratorOptions& options() const { return opt_; }

private:
  const Model& m_;
  const Tokenizer* tok_;
  GeneratorOptions opt_;
  State state_;
  std::vector<int32_t> cached_;  // ids whose keys are in the cache, reserved to max_ctx
  std::vector<int32_t> banned_;  // ids the tokenizer cannot decode
};

}  // namespace dsa
