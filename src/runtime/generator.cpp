#include "runtime/generator.h"

#include <algorithm>

#include "core/error.h"

namespace dsa {

namespace {
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

std::vector<int32_t> undecodable_ids(const Model& m, const Tokenizer* tok) {
  std::vector<int32_t> out;
  if (tok)
    for (int32_t id = 0; id < m.config.vocab_size; ++id)
      if (!tok->is_valid_id(id)) out.push_back(id);
  return out;
}

Completion::Completion(const Model& m, const Tokenizer* tok, std::span<const int32_t> prompt, const GenerateOptions& g,
                       std::span<const int32_t> banned, TextFn on_text, TokenFn on_token, const JsonVocab* json_vocab)
    : g_(g), sampler_(m.config.vocab_size, g.sampling), stop_(g.stop), on_text_(std::move(on_text)), on_token_(std::move(on_token)) {
  if (!g.stop.empty() && !tok) throw Error("generate: stop strings need a tokenizer");
  if (g.constrained() && (!tok || !json_vocab)) throw Error("generate: JSON output, forced tool calls, choices and regexes need a tokenizer");
  if (int(g.json) + int(bool(g.tool_calls)) + int(bool(g.choices)) + int(bool(g.regex)) > 1)
    throw Error("generate: JSON output, forced tool calls, a choice and a regex exclude each other");
  if (g.max_new_tokens < 0) throw Error("generate: max_new_tokens must be >= 0");
  const int V = m.config.vocab_size;
  sampler_.set_banned(banned);
  for (int32_t id : prompt) sampler_.accept(id);
  is_eos_.assign(size_t(V), 0);
  for (int id : g.eos_ids.empty() ? std::vector<int32_t>(m.config.eos_token_ids.begin(), m.config.eos_token_ids.end()) : g.eos_ids)
    if (id >= 0 && id < V) is_eos_[size_t(id)] = 1;
  for (int32_t id : g.stop_ids)
    if (id >= 0 && id < V) is_eos_[size_t(id)] = 2;
  if (g.min_tokens > 0) {
    if (g.constrained()) throw Error("generate: min_tokens does not run with JSON output or forced tool calls");
    std::vector<int32_t> held;
    for (int32_t id = 0; id < V; ++id)
      if (is_eos_[size_t(id)] == 2 || (g.stop_on_eos && is_eos_[size_t(id)])) held.push_back(id);
    sampler_.set_suppressed(held);
    sampler_.set_suppressing(true);
  }
  if (tok) dec_.emplace(*tok);
  if (g.json) json_.emplace(*json_vocab, g_.json_schema ? *g_.json_schema : JsonSchema::any_object(), is_eos_, g.stop_on_eos);
  if (g.tool_calls) tool_calls_.emplace(*json_vocab, *g_.tool_calls, is_eos_, g.stop_on_eos);
  if (g.choices) choice_.emplace(*json_vocab, *g_.choices, is_eos_, g.stop_on_eos);
  if (g.regex) regex_.emplace(*json_vocab, *g_.regex, is_eos_, g.stop_on_eos);
  piece_.reserve(256);
  r_.prompt_tokens = int(prompt.size());
  r_.tokens.reserve(size_t(g.max_new_tokens));
  r_.text.reserve(size_t(g.max_new_tokens) * 8);
}

void Completion::text(const std::string& s) {
  if (s.empty()) return;
  r_.text += s;
  if (on_text_) on_text_(s);
}

int32_t Completion::sample(const float* logits) {
  if (json_) sampler_.set_allowed(json_->allowed());
  if (tool_calls_) sampler_.set_allowed(tool_calls_->allowed());
  if (choice_) sampler_.set_allowed(choice_->allowed());
  if (regex_) sampler_.set_allowed(regex_->allowed());
  return sampler_.sample(logits);
}

bool Completion::emit(int32_t id, bool context_full) {
  sampler_.accept(id);
  if (json_) json_->accept(id);
  if (tool_calls_) tool_calls_->accept(id);
  if (choice_) choice_->accept(id);
  if (regex_) regex_->accept(id);
  r_.tokens.push_back(id);
  // vLLM's order: the draw after the min_tokens-th token may end the reply; stop strings are
  // matched in the text of the tokens after it.
  if (int(r_.tokens.size()) >= g_.min_tokens) sampler_.set_suppressing(false);
  const bool early = int(r_.tokens.size()) <= g_.min_tokens;
  if (on_token_ && !on_token_(id)) {
    r_.reason = StopReason::Callback;
    return true;
  }
  if (is_eos_[size_t(id)] == 2 || (g_.stop_on_eos && is_eos_[size_t(id)])) {
    r_.reason = StopReason::Eos;
    if (is_eos_[size_t(id)] == 2) r_.stop_token = id;
    return true;
  }
  if (dec_) {
    piece_.clear();
    if (early) piece_ = dec_->push(id);
    else stop_.push(dec_->push(id), piece_);
    if (stop_.stopped() && g_.include_stop_str) piece_ += stop_.matched();
    text(piece_);
    if (stop_.stopped()) {
      r_.reason = StopReason::StopString;
      r_.stop_string = stop_.matched();
      return true;
    }
  }
  // The call block is whole, or the reply a choice no other goes on from, or a match no
  // character goes on from: it ends as at an end-of-sequence token.
  if ((tool_calls_ && tool_calls_->closed()) || (choice_ && choice_->closed()) || (regex_ && regex_->closed())) {
    r_.reason = StopReason::Eos;
    return true;
  }
  if (int(r_.tokens.size()) == g_.max_new_tokens) {
    r_.reason = StopReason::MaxTokens;
    return true;
  }
  if (context_full) {
    r_.reason = StopReason::ContextFull;
    return true;
  }
  return false;
}

void Completion::finish() {
  if (!dec_ || r_.reason == StopReason::StopString) return;
  piece_.clear();
  stop_.push(dec_->flush(), piece_);
  stop_.flush(piece_);
  text(piece_);
}

Generator::Generator(Engine& engine, const Tokenizer* tok, const GeneratorOptions& opt)
    : engine_(engine), tok_(tok), opt_(opt), banned_(undecodable_ids(engine.model(), tok)) {
  if (opt.prefill_chunk < 1) throw Error("generator: prefill chunk must be positive");
  if (opt.mtp && !engine.options().mtp) throw Error("generator: MTP needs an engine that holds the MTP layer's caches");
  const ModelConfig& c = engine.model().config;
  if (opt.mtp) {
    h_rows_.resize(2 * size_t(c.hidden_size));
    last_logits_.resize(size_t(c.vocab_size));
  }
  history_.reserve(size_t(engine.options().max_ctx) + 1);
}

Generator::~Generator() { reset(); }

void Generator::reset() {
  if (seq_ >= 0) engine_.release(seq_);
  seq_ = -1;
  h_rows_n_ = 0;
}

const float* Generator::step(const int32_t* ids, int n, bool decode, int logits, int unverified) {
  const StepItem it{seq_, ids, n, decode, logits, unverified};
  engine_.step(std::span<const StepItem>(&it, 1));
  return engine_.logits(0);
}

const float* Generator::prefill(std::span<const int32_t> prompt, int* reused) {
  const int n = int(prompt.size());
  if (n == 0) throw Error("generate: the prompt is empty");
  const int max_ctx = engine_.options().max_ctx;
  if (n > max_ctx) throw Error("generate: prompt of " + std::to_string(n) + " tokens exceeds the context size " + std::to_string(max_ctx));
  reset();
  seq_ = engine_.add(prompt, opt_.mtp);
  const int keep = engine_.length(seq_);
  if (reused) *reused = keep;
  const int chunk = std::min({opt_.prefill_chunk, engine_.options().max_step_tokens, max_ctx});
  const size_t H = size_t(engine_.model().config.hidden_size);
  const float* logits = nullptr;
  for (int i = keep; i < n; i += chunk) {
    const int c = std::min(n - i, chunk);
    logits = step(&prompt[size_t(i)], c, false, 1);
    if (!opt_.mtp) continue;
    // The MTP layer over this chunk's positions whose next token is in the prompt; the
    // last prompt position waits for the first sampled token.
    const bool last = i + c == n;
    const int k = last ? c - 1 : c;
    const float* h = engine_.hidden(0);
    if (last) {
      std::copy_n(logits, last_logits_.size(), last_logits_.begin());
      std::copy_n(h + size_t(c - 1) * H, H, h_rows_.begin());
      h_rows_n_ = 1;
      logits = last_logits_.data();
    }
    if (k > 0) {
      const MtpItem mi{seq_, &prompt[size_t(i) + 1], h, k, false, 0};
      engine_.step_mtp(std::span<const MtpItem>(&mi, 1));
    }
  }
  return logits;
}

int32_t Generator::mtp_draft(Sampler& sampler, std::span<const int32_t> history) {
  // history ends with the token about to be verified (not in the cache yet): the next
  // tokens of the waiting positions [mtp_length, length) are history[mtp_length + 1 ..].
  const int k = h_rows_n_, at = engine_.mtp_length(seq_);
  DSA_CHECK(k >= 1 && k <= 2 && at + k == engine_.length(seq_), "MTP positions out of step with the main cache");
  const MtpItem mi{seq_, &history[size_t(at) + 1], h_rows_.data(), k, true, 1};
  engine_.step_mtp(std::span<const MtpItem>(&mi, 1));
  h_rows_n_ = 0;
  return sampler.draft(engine_.logits(0));
}

GenerateResult Generator::generate(std::span<const int32_t> prompt, const GenerateOptions& g, const TextFn& on_text,
                                   const TokenFn& on_token) {
  const int V = engine_.model().config.vocab_size, max_ctx = engine_.options().max_ctx;
  if (g.constrained() && tok_ && !json_vocab_) json_vocab_ = std::make_unique<JsonVocab>(*tok_, V);
  Completion comp(engine_.model(), tok_, prompt, g, banned_, on_text, on_token, json_vocab_.get());
  GenerateResult& r = comp.result();
  history_.assign(prompt.begin(), prompt.end());

  const auto t0 = std::chrono::steady_clock::now();
  const float* logits = prefill(prompt, &r.reused_tokens);
  r.prefill_s = seconds_since(t0);
  if (g.max_new_tokens == 0) return std::move(r);

  Sampler& sampler = comp.sampler();
  auto emit = [&](int32_t id) {
    history_.push_back(id);
    return comp.emit(id, engine_.length(seq_) >= max_ctx);
  };
  if ((g.constrained() || g.min_tokens > 0) && (opt_.mtp || g.propose))
    throw Error("generate: JSON output, forced tool calls and min_tokens do not run with speculative decoding");
  const bool speculate = opt_.mtp || bool(g.propose);
  bool mtp_live = opt_.mtp && !g.propose;  // the MTP layer drafts (until the cache is too full to verify two)
  const size_t H = size_t(engine_.model().config.hidden_size);
  const auto t1 = std::chrono::steady_clock::now();
  int32_t next = comp.sample(logits);
  while (!emit(next)) {
    if (!speculate || engine_.length(seq_) + 2 > max_ctx) {
      // One token at a time (also the last token a nearly full cache has room for).
      logits = step(&next, 1, true, 1);
      ++r.decode_steps;
      mtp_live = false;
      next = comp.sample(logits);
      continue;
    }
    // Speculative step: propose the token after `next`, run both through the main model,
    // keep the proposal if verification accepts it, and the token after it comes free.
    const int32_t proposal = mtp_live ? mtp_draft(sampler, history_) : g.propose(std::span<const int32_t>(history_));
    if (proposal < 0 || proposal >= V) throw Error("generate: proposed token id " + std::to_string(proposal) + " out of range");
    const int32_t pair[2] = {next, proposal};
    const int len = engine_.length(seq_);
    const float* lv = step(pair, 2, true, 2, 1);
    ++r.decode_steps;
    ++r.drafted;
    if (mtp_live) {  // both positions wait for the MTP layer until their next token is known
      std::copy_n(engine_.hidden(0), 2 * H, h_rows_.begin());
      h_rows_n_ = 2;
    }
    bool ok = false;
    const int32_t t = sampler.verify(lv, proposal, mtp_live, &ok);
    if (!ok) {
      // Rejected: the proposal's cache entry is dropped (the next write reuses it).
      engine_.truncate(seq_, len + 1);
      if (mtp_live) h_rows_n_ = 1;
      next = t;
      continue;
    }
    ++r.accepted;
    if (emit(proposal)) break;
    next = sampler.sample(lv + V);
  }
  r.decode_s = seconds_since(t1);
  comp.finish();
  return std::move(r);
}

}  // namespace dsa
