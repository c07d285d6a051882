#include "runtime/generator.h"

#include <algorithm>

#include "core/error.h"

namespace dsa {

namespace {

StateOptions state_options(const GeneratorOptions& o) {
  if (o.max_ctx < 1) throw Error("generator: max_ctx must be positive");
  if (o.prefill_chunk < 1) throw Error("generator: prefill chunk must be positive");
  StateOptions so;
  so.max_ctx = o.max_ctx;
  so.max_tokens = std::min(o.prefill_chunk, o.max_ctx);
  so.max_logit_rows = 1;
  so.cache = o.cache;
  return so;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

const char* to_string(StopReason r) {
  switch (r) {
    case StopReason::Eos: return "eos";
    case StopReason::StopString: return "stop string";
    case StopReason::MaxTokens: return "max tokens";
    case StopReason::ContextFull: return "context full";
    case StopReason::Callback: return "stopped";
  }
  return "?";
}

Generator::Generator(const Model& m, const Tokenizer* tok, const GeneratorOptions& opt)
    : m_(m), tok_(tok), opt_(opt), state_(m.config, state_options(opt)) {
  cached_.reserve(size_t(opt.max_ctx));
  if (tok_)
    for (int32_t id = 0; id < m.config.vocab_size; ++id)
      if (!tok_->is_valid_id(id)) banned_.push_back(id);
}

const float* Generator::prefill(std::span<const int32_t> prompt, int* reused) {
  const int n = int(prompt.size());
  if (n == 0) throw Error("generate: the prompt is empty");
  if (n > opt_.max_ctx)
    throw Error("generate: prompt of " + std::to_string(n) + " tokens exceeds the context size " + std::to_string(opt_.max_ctx));
  size_t lcp = 0;
  while (lcp < cached_.size() && lcp < prompt.size() && cached_[lcp] == prompt[lcp]) ++lcp;
  // The last prompt token always runs: its logits are the first distribution to sample.
  if (lcp == prompt.size()) --lcp;
  if (reused) *reused = int(lcp);
  // Cache entries past lcp are simply overwritten by the new tokens.
  state_.n_past = int(lcp);
  cached_.resize(lcp);
  const float* logits = nullptr;
  for (size_t i = lcp; i < prompt.size(); i += size_t(state_.opt.max_tokens)) {
    const int c = int(std::min(prompt.size() - i, size_t(state_.opt.max_tokens)));
    logits = forward(m_, state_, &prompt[i], c);
    cached_.insert(cached_.end(), prompt.begin() + std::ptrdiff_t(i), prompt.begin() + std::ptrdiff_t(i) + c);
  }
  return logits;
}

GenerateResult Generator::generate(std::span<const int32_t> prompt, const GenerateOptions& g, const TextFn& on_text,
                                   const TokenFn& on_token) {
  if (!g.stop.empty() && !tok_) throw Error("generate: stop strings need a tokenizer");
  if (g.max_new_tokens < 0) throw Error("generate: max_new_tokens must be >= 0");
  const int V = m_.config.vocab_size;
  GenerateResult r;
  r.prompt_tokens = int(prompt.size());

  // Setup: everything the loop needs is sized here.
  Sampler sampler(V, g.sampling);
  sampler.set_banned(banned_);
  for (int32_t id : prompt) sampler.accept(id);
  std::vector<uint8_t> is_eos(size_t(V), 0);
  for (int id : g.eos_ids.empty() ? std::vector<int32_t>(m_.config.eos_token_ids.begin(), m_.config.eos_token_ids.end())
                                  : g.eos_ids)
    if (id >= 0 && id < V) is_eos[size_t(id)] = 1;
  StopMatcher stop(g.stop);
  std::optional<StreamDecoder> dec;
  if (tok_) dec.emplace(*tok_);
  std::string piece;
  piece.reserve(256);
  r.tokens.reserve(size_t(g.max_new_tokens));
  r.text.reserve(size_t(g.max_new_tokens) * 8);
  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    r.text += s;
    if (on_text) on_text(s);
  };

  const auto t0 = std::chrono::steady_clock::now();
  const float* logits = prefill(prompt, &r.reused_tokens);
  r.prefill_s = seconds_since(t0);
  if (g.max_new_tokens == 0) return r;

  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    const int32_t id = sampler.sample(logits);
    sampler.accept(id);
    r.tokens.push_back(id);
    if (on_token && !on_token(id)) {
      r.reason = StopReason::Callback;
      break;
    }
    if (g.stop_on_eos && is_eos[size_t(id)]) {
      r.reason = StopReason::Eos;
      break;
    }
    if (dec) {
      piece.clear();
      stop.push(dec->push(id), piece);
      emit(piece);
      if (stop.stopped()) {
        r.reason = StopReason::StopString;
        break;
      }
    }
    if (i + 1 == g.max_new_tokens) {
      r.reason = StopReason::MaxTokens;
      break;
    }
    if (state_.n_past >= opt_.max_ctx) {
      r.reason = StopReason::ContextFull;
      break;
    }
    logits = forward(m_, state_, &id, 1);
    cached_.push_back(id);
    ++r.decode_steps;
  }
  r.decode_s = seconds_since(t1);
  if (dec && r.reason != StopReason::StopString) {
    piece.clear();
    stop.push(dec->flush(), piece);
    stop.flush(piece);
    emit(piece);
  }
  return r;
}

}  // namespace dsa
