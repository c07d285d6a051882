#pragma once
// Generation on top of the engine. Completion is one sequence's sampling state (sampler,
// stop strings, streamed text, result); Generator runs one completion at a time on an
// engine: prefill in chunks (a prompt that starts with cached blocks, the previous chat
// turn's included, prefills only the rest), then decode token by token or speculatively
// with the MTP layer. After setup the decode loop reuses its buffers: it does not allocate
// per token (the tokenizer's StreamDecoder returns short std::strings, which stay in the
// small-string buffer for one token's bytes).
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/engine.h"
#include "runtime/json_mode.h"
#include "sampling/sampler.h"
#include "sampling/stop.h"
#include "tokenizer/tokenizer.h"

namespace dsa {

struct GeneratorOptions {
  int prefill_chunk = 512;  // tokens per prefill step
  // Speculative decoding with the checkpoint's MTP layer (the engine must hold its caches):
  // each step the MTP layer drafts one token and the main model verifies it together with
  // the token before it, so an accepted draft yields two tokens per main-model pass.
  // Output is distributed exactly as without it (greedy: the same tokens).
  bool mtp = false;
};

struct GenerateOptions {
  int max_new_tokens = 256;
  SamplerParams sampling;
  std::vector<std::string> stop;  // stop strings (need a tokenizer)
  bool include_stop_str = false;  // the stop string that ended the text ends it (vLLM's include_stop_str_in_output)
  bool stop_on_eos = true;        // stop after sampling one of eos_ids (it is reported, not decoded)
  std::vector<int32_t> eos_ids;   // empty: the model config's eos_token_ids
  // Tokens that end generation as an end-of-sequence token does, stop_on_eos or not
  // (vLLM's stop_token_ids).
  std::vector<int32_t> stop_ids;
  // vLLM's min_tokens: until this many tokens are out, no end-of-sequence (when it would
  // stop) or stop id is drawn and no stop string is matched. Not with JSON output or
  // speculative decoding.
  int min_tokens = 0;
  // Proposes the token after `tokens` (the prompt and everything generated so far) for the
  // main model to verify, in place of the MTP layer's draft (prompt lookup, or a test's
  // oracle). Verified as a point-mass proposal, so the output distribution is unchanged.
  std::function<int32_t(std::span<const int32_t> tokens)> propose;
  // JSON mode (OpenAI's response_format json_object or json_schema; needs a tokenizer):
  // every token is drawn among those whose bytes keep the reply a prefix of a JSON text
  // json_schema admits (without one: any object), and once the text is closed the reply
  // ends (an end-of-sequence token; with stop_on_eos off, spaces).
  bool json = false;
  std::shared_ptr<const JsonSchema> json_schema;
  // Forced tool calls (tool_choice "required" or a named function, DeepSeek-V3.2's DSML;
  // needs a tokenizer): every token is drawn among those that keep the reply the start of a
  // call block these tools admit (sampling/tool_call_grammar.h); the block's end ends it.
  std::shared_ptr<const ToolCallGrammar> tool_calls;
  // vLLM's guided_choice (needs a tokenizer): every token is drawn among those that keep the
  // reply the start of one of the choices; the reply ends once it is a choice that no other
  // goes on from, or at an end-of-sequence token once it is one.
  std::shared_ptr<const ChoiceGrammar> choices;
  // vLLM's regex output (needs a tokenizer): every token is drawn among those that keep the
  // reply the start of a whole match (a Regex built with Match::Whole); the reply ends once
  // it is a match no character goes on from, or at an end-of-sequence token once it is one.
  std::shared_ptr<const Regex> regex;
  bool constrained() const { return json || tool_calls || choices || regex; }
};

enum class StopReason { Eos, StopString, MaxTokens, ContextFull, Callback };
const char* to_string(StopReason r);

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids, the EOS id included when it stopped there
  std::string text;             // streamed text (stop string and what follows excluded)
  StopReason reason = StopReason::MaxTokens;
  std::string stop_string;      // the stop string that ended it (StopString)
  int32_t stop_token = -1;      // the one of GenerateOptions::stop_ids that ended it (Eos)
  int prompt_tokens = 0;        // tokens of the prompt
  int reused_tokens = 0;        // of which were already in the cache
  double prefill_s = 0, decode_s = 0;
  int decode_steps = 0;         // main-model steps after the prefill
  int drafted = 0, accepted = 0;  // speculative decoding: proposals verified, and kept
  double prefill_tok_s() const { return prefill_s > 0 ? (prompt_tokens - reused_tokens) / prefill_s : 0; }
  // Tokens the decode loop produced (all but the first, which the prefill's logits give).
  double decode_tok_s() const { return decode_s > 0 && !tokens.empty() ? double(tokens.size() - 1) / decode_s : 0; }
  double acceptance() const { return drafted > 0 ? double(accepted) / drafted : 0; }
};

using TextFn = std::function<void(std::string_view)>;
using TokenFn = std::function<bool(int32_t)>;

// One sequence's sampling and output: every sampled token goes through emit(), which keeps
// the history, streams text, and says when generation stops.
class Completion {
public:
  // `tok` may be null (ids only); `banned`: ids the tokenizer cannot decode; `json_vocab`:
  // the tokenizer's table for JSON mode (needed when g.json; it outlives the Completion).
  Completion(const Model& m, const Tokenizer* tok, std::span<const int32_t> prompt, const GenerateOptions& g,
             std::span<const int32_t> banned, TextFn on_text = {}, TokenFn on_token = {}, const JsonVocab* json_vocab = nullptr);
  Sampler& sampler() { return sampler_; }
  // Draws the next token from logits [vocab] (in JSON mode among the tokens it allows).
  int32_t sample(const float* logits);
  // Records a sampled token; true when generation stops (result().reason says why).
  // `context_full`: the sequence has no room for another token.
  bool emit(int32_t id, bool context_full);
  void finish();  // flushes the streamed text (unless a stop string ended it)
  GenerateResult& result() { return r_; }

private:
  GenerateOptions g_;
  Sampler sampler_;
  std::optional<JsonMode> json_;
  std::optional<ToolCallMode> tool_calls_;
  std::optional<ChoiceMode> choice_;
  std::optional<RegexMode> regex_;
  std::vector<uint8_t> is_eos_;  // 1: an end-of-sequence token, 2: one of stop_ids
  StopMatcher stop_;
  std::optional<StreamDecoder> dec_;
  std::string piece_;
  TextFn on_text_;
  TokenFn on_token_;
  GenerateResult r_;
  void text(const std::string& s);
};

// The ids a tokenizer cannot decode (never sampled); empty without a tokenizer.
std::vector<int32_t> undecodable_ids(const Model& m, const Tokenizer* tok);

class Generator {
public:
  // `tok` may be null (ids in, ids out: no text, no stop strings).
  Generator(Engine& engine, const Tokenizer* tok, const GeneratorOptions& opt);
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  GenerateResult generate(std::span<const int32_t> prompt, const GenerateOptions& g, const TextFn& on_text = {},
                          const TokenFn& on_token = {});

  // Starts a new sequence holding `prompt` (its cached prefix blocks reused) and returns the
  // logits after its last token. *reused: tokens taken from the prefix cache. With MTP, the
  // MTP layer's cache follows (every prompt position but the last, whose next token is not
  // known yet).
  const float* prefill(std::span<const int32_t> prompt, int* reused = nullptr);
  void reset();  // releases the sequence (its full blocks stay in the prefix cache)

  const Engine& engine() const { return engine_; }
  const Model& model() const { return engine_.model(); }
  // The ids in the sequence's cache (empty before the first prompt).
  std::vector<int32_t> cached_tokens() const {
    if (seq_ < 0) return {};
    const auto t = engine_.tokens(seq_);
    return {t.begin(), t.end()};
  }
  const GeneratorOptions& options() const { return opt_; }

private:
  Engine& engine_;
  const Tokenizer* tok_;
  GeneratorOptions opt_;
  SeqId seq_ = -1;
  std::vector<int32_t> banned_;
  std::unique_ptr<JsonVocab> json_vocab_;  // built at the first JSON-mode request
  // The MTP layer's draft for the token after `next` (about to be verified): first it
  // catches up over the positions whose next token is now known.
  int32_t mtp_draft(Sampler& sampler, std::span<const int32_t> history);
  const float* step(const int32_t* ids, int n, bool decode, int logits, int unverified = 0);
  // MTP: final-normed hidden states of the main positions [mtp_length, length), which the
  // MTP layer has not seen yet (their next token was not known), and the last prefill
  // logits (the MTP pass overwrites the engine's logits).
  std::vector<float> h_rows_, last_logits_;
  std::vector<int32_t> history_;  // prompt + generated: the ids the draft proposers see
  int h_rows_n_ = 0;
};

}  // namespace dsa
