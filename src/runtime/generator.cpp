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
  // A speculative step verifies two tokens in one call and samples from both rows.
  so.max_tokens = std::max(2, std::min(o.prefill_chunk, o.max_ctx));
  so.max_logit_rows = 2;
  so.cache = o.cache;
  so.mtp = o.mtp;
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
  if (opt.mtp && !m.weights.mtp)
    throw Error(m.config.num_nextn_predict_layers == 0
                    ? "MTP speculative decoding: the checkpoint has no MTP layer (num_nextn_predict_layers = 0)"
                    : "MTP speculative decoding: the model was loaded without its MTP layer");
  cached_.reserve(size_t(opt.max_ctx) + 1);
  if (opt.mtp) {
    h_rows_.resize(2 * size_t(m.config.hidden_size));
    last_logits_.resize(size_t(m.config.vocab_size));
  }
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
  size_t keep = lcp;
  // The last prompt token always runs: its logits are the first distribution to sample.
  if (keep == prompt.size()) --keep;
  if (opt_.mtp) {
    // MTP position j read h[j] and token j+1: it is still valid when j + 1 < lcp, and only
    // if the MTP pass got there. The main cache is cut to the same point, so both caches
    // restart together (at most one extra main token is recomputed).
    keep = std::min({keep, lcp > 0 ? lcp - 1 : 0, size_t(state_.mtp_n_past)});
    state_.mtp_n_past = int(keep);
    h_rows_n_ = 0;
  }
  if (reused) *reused = int(keep);
  // Cache entries past `keep` are simply overwritten by the new tokens.
  state_.n_past = int(keep);
  cached_.resize(keep);
  const size_t chunk = size_t(std::min(opt_.prefill_chunk, opt_.max_ctx));
  const float* logits = nullptr;
  for (size_t i = keep; i < prompt.size(); i += chunk) {
    const int c = int(std::min(prompt.size() - i, chunk));
    logits = forward(m_, state_, &prompt[i], c);
    cached_.insert(cached_.end(), prompt.begin() + std::ptrdiff_t(i), prompt.begin() + std::ptrdiff_t(i) + c);
    if (!opt_.mtp) continue;
    // The MTP layer over this chunk's positions whose next token is in the prompt; the
    // last prompt position waits for the first sampled token.
    const bool last = i + size_t(c) == prompt.size();
    const int k = last ? c - 1 : c;
    if (last) {
      std::copy_n(logits, last_logits_.size(), last_logits_.begin());
      const size_t H = size_t(m_.config.hidden_size);
      std::copy_n(&state_.h_final[size_t(c - 1) * H], H, h_rows_.begin());
      h_rows_n_ = 1;
      logits = last_logits_.data();
    }
    if (k > 0) forward_mtp(m_, state_, state_.h_final.data(), &prompt[i + 1], k);
  }
  return logits;
}

int32_t Generator::mtp_draft(Sampler& sampler) {
  // cached_ ends with the token about to be verified (not in the cache yet): the next
  // tokens of the waiting positions [mtp_n_past, n_past) are cached_[mtp_n_past + 1 ..].
  const int k = h_rows_n_;
  DSA_CHECK(k >= 1 && k <= 2 && state_.mtp_n_past + k == state_.n_past, "MTP positions out of step with the main cache");
  const float* ml = forward_mtp(m_, state_, h_rows_.data(), &cached_[size_t(state_.mtp_n_past) + 1], k);
  h_rows_n_ = 0;
  return sampler.draft(ml);
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

  // Emits one token: history, callbacks, stop conditions. True when generation stops.
  auto emit_token = [&](int32_t id) {
    sampler.accept(id);
    r.tokens.push_back(id);
    if (on_token && !on_token(id)) {
      r.reason = StopReason::Callback;
      return true;
    }
    if (g.stop_on_eos && is_eos[size_t(id)]) {
      r.reason = StopReason::Eos;
      return true;
    }
    if (dec) {
      piece.clear();
      stop.push(dec->push(id), piece);
      emit(piece);
      if (stop.stopped()) {
        r.reason = StopReason::StopString;
        return true;
      }
    }
    if (int(r.tokens.size()) == g.max_new_tokens) {
      r.reason = StopReason::MaxTokens;
      return true;
    }
    if (state_.n_past >= opt_.max_ctx) {
      r.reason = StopReason::ContextFull;
      return true;
    }
    return false;
  };

  const bool speculate = opt_.mtp || bool(g.propose);
  bool mtp_live = opt_.mtp && !g.propose;  // the MTP layer drafts (until the cache is too full to verify two)
  const size_t H = size_t(m_.config.hidden_size);
  ForwardOptions both_rows;  // a speculative step samples from both rows' logits
  both_rows.all_logits = true;
  const auto t1 = std::chrono::steady_clock::now();
  int32_t next = sampler.sample(logits);
  while (!emit_token(next)) {
    if (!speculate || state_.n_past + 2 > opt_.max_ctx) {
      // One token at a time (also the last token a nearly full cache has room for).
      logits = forward(m_, state_, &next, 1);
      cached_.push_back(next);
      ++r.decode_steps;
      mtp_live = false;
      next = sampler.sample(logits);
      continue;
    }
    // Speculative step: propose the token after `next`, run both through the main model,
    // keep the proposal if verification accepts it, and the token after it comes free.
    cached_.push_back(next);
    int32_t proposal = -1;
    try {
      proposal = mtp_live ? mtp_draft(sampler) : g.propose(std::span<const int32_t>(cached_));
      if (proposal < 0 || proposal >= V) throw Error("generate: proposed token id " + std::to_string(proposal) + " out of range");
    } catch (...) {
      cached_.pop_back();  // `next` is not in the cache: cached_ must say exactly what is
      throw;
    }
    cached_.push_back(proposal);
    const int32_t pair[2] = {next, proposal};
    const float* lv = forward(m_, state_, pair, 2, both_rows);
    ++r.decode_steps;
    ++r.drafted;
    if (mtp_live) {  // both positions wait for the MTP layer until their next token is known
      std::copy_n(state_.h_final.data(), 2 * H, h_rows_.begin());
      h_rows_n_ = 2;
    }
    bool ok = false;
    const int32_t t = sampler.verify(lv, proposal, mtp_live, &ok);
    if (!ok) {
      // Rejected: the proposal's cache entries are dropped (the next write reuses them).
      --state_.n_past;
      cached_.pop_back();
      if (mtp_live) h_rows_n_ = 1;
      next = t;
      continue;
    }
    ++r.accepted;
    if (emit_token(proposal)) break;
    next = sampler.sample(lv + V);
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
