#include "runtime/scheduler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace dsa {

namespace {
int blocks_for(int64_t tokens, int bs) { return int((tokens + bs - 1) / bs); }
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

bool Request::take(Output& out, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  if (!news_) cv_.wait_for(lk, timeout, [&] { return news_; });
  if (!news_) return false;
  out = std::move(out_);
  out_ = Output{};
  news_ = false;
  return true;
}

void Request::push_text(std::string_view s) {
  std::lock_guard lk(mu_);
  out_.text.append(s);
  news_ = true;
  if (stream) cv_.notify_all();
}

void Request::push_token(TokenOut t) {
  std::lock_guard lk(mu_);
  out_.tokens.push_back(std::move(t));
  news_ = true;
  if (stream) cv_.notify_all();
}

void Request::push_prompt(TokenOut t) {
  std::lock_guard lk(mu_);
  out_.prompt.push_back(std::move(t));
  news_ = true;
  if (stream) cv_.notify_all();
}

void Request::finish(GenerateResult r, std::string error) {
  std::lock_guard lk(mu_);
  out_.done = true;
  out_.error = std::move(error);
  out_.result = std::move(r);
  news_ = true;
  cv_.notify_all();
}

Scheduler::Scheduler(Engine& engine, const Tokenizer* tok, const SchedulerOptions& opt,
                     std::function<void(const Request&, const GenerateResult&, const std::string&)> on_finish)
    : engine_(engine), tok_(tok), opt_(opt), on_finish_(std::move(on_finish)), banned_(undecodable_ids(engine.model(), tok)) {
  const EngineOptions& eo = engine.options();
  opt_.max_seqs = std::min(opt_.max_seqs > 0 ? opt_.max_seqs : eo.max_seqs, eo.max_seqs);
  opt_.max_batch_tokens = std::min(opt_.max_batch_tokens > 0 ? opt_.max_batch_tokens : eo.max_step_tokens, eo.max_step_tokens);
  if (opt_.prefill_chunk < 1) throw Error("scheduler: the prefill chunk must be positive");
  const int per_seq = opt_.mtp ? 2 : 1;  // a verify step carries two tokens
  if (opt_.max_batch_tokens < per_seq * opt_.max_seqs)
    throw Error("scheduler: a step of " + std::to_string(opt_.max_batch_tokens) + " tokens cannot carry " + std::to_string(per_seq) +
                " token(s) of each of " + std::to_string(opt_.max_seqs) + " sequences");
  if (opt_.mtp && !eo.mtp) throw Error("scheduler: MTP needs an engine that holds the MTP layer's caches");
  max_rows_ = engine.max_logit_rows();
  running_.reserve(size_t(opt_.max_seqs));
  items_.reserve(size_t(opt_.max_seqs));
  mtp_items_.reserve(size_t(opt_.max_seqs));
  mtp_lives_.reserve(size_t(opt_.max_seqs));
}

Scheduler::~Scheduler() { cancel_all(); }

bool Scheduler::submit(std::shared_ptr<Request> r) {
  const int max_ctx = engine_.options().max_ctx;
  if (r->prompt.empty()) throw Error("the prompt is empty");
  if (int64_t(r->prompt.size()) > max_ctx)
    throw Error("the prompt has " + std::to_string(r->prompt.size()) + " tokens; the context size is " + std::to_string(max_ctx));
  for (int32_t id : r->prompt)
    if (id < 0 || id >= engine_.model().config.vocab_size)
      throw Error("token id " + std::to_string(id) + " out of range [0, " + std::to_string(engine_.model().config.vocab_size) + ")");
  r->arrived = Clock::now();
  std::lock_guard lk(mu_);
  if (stopping_ || stats_.waiting + int(inbox_.size()) >= opt_.max_waiting) return false;
  inbox_.push_back(std::move(r));
  cv_.notify_all();
  return true;
}

void Scheduler::stop() {
  std::lock_guard lk(mu_);
  stopping_ = true;
  cv_.notify_all();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lk(mu_);
  SchedulerStats s = stats_;
  s.waiting += int(inbox_.size());
  return s;
}

bool Scheduler::idle() const {
  std::lock_guard lk(mu_);
  return inbox_.empty() && stats_.running == 0 && stats_.waiting == 0;
}

void Scheduler::run(bool until_idle) {
  while (take_inbox(running_.empty() && waiting_.empty() && !until_idle)) {
    if (until_idle && running_.empty() && waiting_.empty()) return;
    drop_cancelled();
    admit();
    if (!running_.empty() && plan_step()) {
      try {
        draft();
        engine_.step(items_);
        ++steps_;
        after_step();
        mtp_prefill();
      } catch (const std::exception& e) {
        fail_step(e.what());
      }
    }
    publish_stats();
  }
  cancel_all();
}

// Everything still here ends as cancelled.
void Scheduler::cancel_all() {
  take_inbox(false);
  for (Live& l : running_) end(l, "the server is shutting down");
  for (Live& l : waiting_) end(l, "the server is shutting down");
  running_.clear();
  waiting_.clear();
  publish_stats();
}

// Moves submitted requests to the queue (waiting for one when `block`); false once stopping.
bool Scheduler::take_inbox(bool block) {
  std::unique_lock lk(mu_);
  if (block) cv_.wait(lk, [&] { return stopping_ || !inbox_.empty(); });
  while (!inbox_.empty()) {
    Live l;
    l.req = std::move(inbox_.front());
    inbox_.pop_front();
    waiting_.push_back(std::move(l));
  }
  stats_.waiting = int(waiting_.size());
  return !stopping_;
}

void Scheduler::drop_cancelled() {
  auto drop = [&](auto& list) {
    for (auto it = list.begin(); it != list.end();) {
      if (!it->req->cancelled()) {
        ++it;
        continue;
      }
      end(*it);
      it = list.erase(it);
    }
  };
  drop(running_);
  drop(waiting_);
}

// First come, first served while there is room: a request is admitted when the pool has
// blocks for its whole cache so far and one more token, beyond what the running requests
// are still to take for theirs (at least one new block each: the next step may take it).
void Scheduler::admit() {
  const int bs = engine_.options().block_size;
  int promised = 0;
  for (const Live& l : running_) {
    const int len = engine_.length(l.seq);
    promised += std::max(1, blocks_for(int64_t(std::max(len, int(l.feed.size()))) + 1, bs) - blocks_for(len, bs));
  }
  while (int(running_.size()) < opt_.max_seqs && !waiting_.empty()) {
    Live& w = waiting_.front();
    const bool fresh = !w.comp;
    if (fresh) {
      w.feed = w.req->prompt;
      w.prompt_n = int(w.feed.size());
      // JSON output's constraint and min_tokens' suppression follow one token at a time.
      w.mtp = opt_.mtp && !w.req->gen.constrained() && w.req->gen.min_tokens == 0;
      if (w.mtp) {
        w.h.resize(2 * size_t(engine_.model().config.hidden_size));
        w.hist.reserve(size_t(engine_.options().max_ctx) + 2);
        w.hist = w.req->prompt;
      }
    }
    const int need = blocks_for(int64_t(w.feed.size()) + 1, bs);
    if (!running_.empty() && engine_.pool().free_blocks() - promised < need) return;
    if (fresh) {
      Request* req = w.req.get();
      try {
        if (w.req->gen.constrained() && tok_ && !json_vocab_) json_vocab_ = std::make_unique<JsonVocab>(*tok_, engine_.model().config.vocab_size);
        w.comp = std::make_unique<Completion>(engine_.model(), tok_, w.req->prompt, w.req->gen, banned_,
                                              [req](std::string_view s) { req->push_text(s); }, TokenFn{}, json_vocab_.get());
      } catch (const std::exception& e) {
        end(w, e.what());
        waiting_.pop_front();
        continue;
      }
      w.req->scheduled = Clock::now();
      prompt_tokens_ += int64_t(w.req->prompt.size());
    }
    // Prompt log-probabilities need every prompt row computed: no prefix-cache reuse.
    w.seq = engine_.add(wants_prompt_rows(w) ? std::span<const int32_t>() : std::span<const int32_t>(w.feed), w.mtp);
    if (fresh) w.comp->result().reused_tokens = engine_.reused_tokens(w.seq);
    w.order = next_order_++;
    promised += need;
    running_.push_back(std::move(w));
    waiting_.pop_front();
  }
}

int Scheduler::blocks_needed(const Live& l, int n) const {
  const int bs = engine_.options().block_size;
  const int len = engine_.length(l.seq);
  return blocks_for(int64_t(len) + n, bs) - blocks_for(len, bs);
}

// Lays out the next step in items_: one token of every decoding request, then the others'
// next pieces (prompt chunks in the prefill role, generated tokens being put back after a
// preemption in the decode role) while the budget lasts. When the pool cannot hold the
// step, the youngest request is preempted and the step planned again. False: nothing to run.
bool Scheduler::plan_step() {
  for (;;) {
    items_.clear();
    int budget = opt_.max_batch_tokens, need = 0, rows = 0;
    for (Live& l : running_) {
      l.step_n = 0;
      l.verify = false;
      l.step_rows = false;
      if (l.next < 0 || engine_.length(l.seq) < int(l.feed.size())) continue;
      // With MTP, the token and a draft (unverified) while the context has room for both;
      // a request that cannot verify two goes on one token at a time.
      if (l.mtp && engine_.length(l.seq) + 2 > engine_.options().max_ctx) l.mtp = false;
      l.verify = l.mtp;
      const int n = l.verify ? 2 : 1;
      l.pair[0] = l.next;
      l.item = int(items_.size());
      l.step_n = n;
      items_.push_back(StepItem{l.seq, l.verify ? l.pair : &l.next, n, true, n, l.verify ? 1 : 0});
      need += blocks_needed(l, n);
      budget -= n;
      rows += n;
    }
    // Chunks whose rows give prompt log-probabilities come last, each as long as the step
    // has logit rows left (every other item fits in the engine's two rows per sequence).
    for (const bool all_rows : {false, true})
      for (Live& l : running_) {
        const int len = engine_.length(l.seq);
        const bool prefill = len < l.prompt_n;
        if (len >= int(l.feed.size()) || budget <= 0 || all_rows != (prefill && wants_prompt_rows(l))) continue;
        int n = std::min({budget, prefill ? std::min(opt_.prefill_chunk, l.prompt_n - len) : int(l.feed.size()) - len});
        if (all_rows) n = std::min(n, max_rows_ - rows);
        if (n <= 0) continue;
        const bool last = len + n == int(l.feed.size()) && l.next < 0;
        const int n_rows = all_rows ? n : last ? 1 : 0;
        l.item = int(items_.size());
        l.step_n = n;
        l.step_pos = len;
        l.step_rows = all_rows;
        items_.push_back(StepItem{l.seq, l.feed.data() + len, n, !prefill, n_rows, 0});
        need += blocks_needed(l, n);
        budget -= n;
        rows += n_rows;
      }
    if (need <= engine_.pool().free_blocks()) return !items_.empty();
    if (running_.size() == 1) {
      // Alone and still no room: the pool is smaller than this request's context.
      running_[0].comp->result().reason = StopReason::ContextFull;
      end(running_[0]);
      running_.clear();
      return false;
    }
    preempt_youngest();
  }
}

void Scheduler::preempt_youngest() {
  auto y = std::max_element(running_.begin(), running_.end(), [](const Live& a, const Live& b) { return a.order < b.order; });
  Live l = std::move(*y);
  running_.erase(y);
  engine_.release(l.seq);
  l.seq = -1;
  l.mtp = false;  // the MTP cache is not rebuilt: it goes on without drafts
  l.h_n = 0;
  // Its cache to rebuild: the prompt, then every generated token but the last (sampled, to be fed).
  const std::vector<int32_t>& gen = l.comp->result().tokens;
  l.feed.assign(l.req->prompt.begin(), l.req->prompt.end());
  if (!gen.empty()) l.feed.insert(l.feed.end(), gen.begin(), gen.end() - 1);
  ++l.req->preemptions;
  ++preemptions_;
  waiting_.push_front(std::move(l));
}

void Scheduler::after_step() {
  for (size_t i = 0; i < running_.size();) {
    if (!advance(running_[i])) {
      ++i;
      continue;
    }
    end(running_[i]);
    running_.erase(running_.begin() + std::ptrdiff_t(i));
  }
}

// Samples where the step gave logits; true when the request is done.
bool Scheduler::advance(Live& l) {
  if (l.step_n == 0) return false;
  const int V = engine_.model().config.vocab_size;
  if (l.step_rows) deliver_prompt_logprobs(l, engine_.logits(l.item));
  const bool decoding = l.next >= 0 && engine_.length(l.seq) > int(l.feed.size());
  GenerateResult& res = l.comp->result();
  if (!decoding) {
    if (engine_.length(l.seq) < int(l.feed.size()) || l.next >= 0) return false;  // more to put back first
    res.prefill_s = seconds(l.req->scheduled, Clock::now());
    if (l.req->gen.max_new_tokens == 0) return true;
  } else {
    ++res.decode_steps;
  }
  // A chunk that returned all its rows samples from its last.
  const float* logits = engine_.logits(l.item) + (l.step_rows ? size_t(l.step_n - 1) * size_t(V) : 0);
  if (l.verify) return verify(l, logits);
  return emit(l, l.comp->sample(logits), logits);
}

// A verify step's two rows, as the Generator takes them: a rejected draft leaves the
// token the verification drew; an accepted one is kept and the token after it comes free.
bool Scheduler::verify(Live& l, const float* logits) {
  GenerateResult& res = l.comp->result();
  const size_t H = size_t(engine_.model().config.hidden_size);
  std::copy_n(engine_.hidden(l.item), 2 * H, l.h.begin());  // both wait for their next token
  l.h_n = 2;
  bool ok = false;
  const int32_t t = l.comp->sampler().verify(logits, l.pair[1], true, &ok);
  if (!ok) {
    engine_.truncate(l.seq, engine_.length(l.seq) - 1);  // the draft's cache entry goes
    l.h_n = 1;
    return emit(l, t, logits);
  }
  ++res.accepted;
  if (emit(l, l.pair[1], logits)) return true;
  const float* second = logits + engine_.model().config.vocab_size;
  return emit(l, l.comp->sampler().sample(second), second);
}

// Hands a sampled token to the request; true when the request is done.
bool Scheduler::emit(Live& l, int32_t id, const float* logits) {
  if (l.comp->result().tokens.empty()) l.req->first_token = Clock::now();
  l.req->push_token(token_out(id, logits, l.req->logprobs));
  ++generation_tokens_;
  l.next = id;
  if (l.mtp) l.hist.push_back(id);
  return l.comp->emit(id, engine_.length(l.seq) >= engine_.options().max_ctx);
}

// MTP drafts for this step's verify items: the MTP layer over each one's waiting positions
// (their next tokens are known now, the last being the token about to be verified).
void Scheduler::draft() {
  mtp_items_.clear();
  mtp_lives_.clear();
  for (Live& l : running_) {
    if (!l.verify) continue;
    const int at = engine_.mtp_length(l.seq);
    DSA_CHECK(l.h_n >= 1 && l.h_n <= 2 && at + l.h_n == engine_.length(l.seq), "MTP positions out of step with the main cache");
    mtp_items_.push_back(MtpItem{l.seq, &l.hist[size_t(at) + 1], l.h.data(), l.h_n, true, 1});
    mtp_lives_.push_back(&l);
  }
  if (mtp_items_.empty()) return;
  engine_.step_mtp(mtp_items_);
  for (size_t i = 0; i < mtp_lives_.size(); ++i) {
    Live& l = *mtp_lives_[i];
    l.pair[1] = l.comp->sampler().draft(engine_.logits(int(i)));
    l.h_n = 0;
    ++l.comp->result().drafted;
  }
}

// The MTP layer over the prompt chunks this step ran, where the next token is in the
// prompt; a prompt's last position waits for its first sampled token.
void Scheduler::mtp_prefill() {
  mtp_items_.clear();
  const size_t H = size_t(engine_.model().config.hidden_size);
  for (Live& l : running_) {
    if (!l.mtp || l.step_n == 0 || l.verify || l.step_pos >= l.prompt_n) continue;
    const bool last = l.step_pos + l.step_n == l.prompt_n;
    const float* h = engine_.hidden(l.item);
    if (last) {
      std::copy_n(h + size_t(l.step_n - 1) * H, H, l.h.begin());
      l.h_n = 1;
    }
    const int k = last ? l.step_n - 1 : l.step_n;
    if (k > 0) mtp_items_.push_back(MtpItem{l.seq, &l.feed[size_t(l.step_pos) + 1], h, k, false, 0});
  }
  if (!mtp_items_.empty()) engine_.step_mtp(mtp_items_);
}

// Prompt log-probabilities are wanted while some position after the first is undelivered.
bool Scheduler::wants_prompt_rows(const Live& l) const { return l.req->prompt_logprobs >= 0 && l.prompt_lp < l.prompt_n; }

// The step's rows of a prompt chunk (positions step_pos ..): row r gives the log-probability
// of the prompt token after it. Positions delivered before a preemption are not sent again.
void Scheduler::deliver_prompt_logprobs(Live& l, const float* logits) {
  const size_t V = size_t(engine_.model().config.vocab_size);
  for (int r = 0; r < l.step_n; ++r) {
    const int p = l.step_pos + r + 1;  // the token this row predicts
    if (p != l.prompt_lp || p >= l.prompt_n) continue;
    l.req->push_prompt(token_out(l.feed[size_t(p)], logits + size_t(r) * V, l.req->prompt_logprobs));
    ++l.prompt_lp;
  }
}

// The token with its log-probability and the k most likely (k < 0: the id alone).
TokenOut Scheduler::token_out(int32_t id, const float* logits, int k) {
  TokenOut t;
  t.id = id;
  if (k < 0) return t;
  // Log-probabilities of the model's distribution (before penalties and temperature).
  const int V = engine_.model().config.vocab_size;
  const float mx = *std::max_element(logits, logits + V);
  double sum = 0;
  for (int v = 0; v < V; ++v) sum += std::exp(double(logits[v]) - mx);
  const float lse = mx + float(std::log(sum));
  t.logprob = logits[id] - lse;
  if (k > 0) {
    std::vector<int32_t>& idx = order_;  // sized once, on the first request that asks
    idx.resize(static_cast<size_t>(V));
    std::iota(idx.begin(), idx.end(), 0);
    const int kk = std::min(k, V);
    std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    for (int j = 0; j < kk; ++j) t.top.emplace_back(idx[size_t(j)], logits[idx[size_t(j)]] - lse);
  }
  return t;
}

void Scheduler::end(Live& l, std::string error) {
  GenerateResult r;
  if (l.comp) {
    if (l.req->cancelled() && error.empty()) l.comp->result().reason = StopReason::Callback;
    l.comp->finish();
    r = std::move(l.comp->result());
  } else {
    r.reason = StopReason::Callback;
    r.prompt_tokens = int(l.req->prompt.size());
  }
  l.req->finished = Clock::now();
  if (l.req->scheduled != Clock::time_point{}) r.decode_s = seconds(l.req->scheduled, l.req->finished) - r.prefill_s;
  if (l.seq >= 0) engine_.release(l.seq);
  l.seq = -1;
  // The counters include this request before its client can see the reply: one that reads
  // the metrics right after finds its own tokens counted.
  publish_stats();
  if (on_finish_) on_finish_(*l.req, r, error);
  l.req->finish(std::move(r), std::move(error));
}

void Scheduler::fail_step(const std::string& error) {
  // The engine left every sequence as it was; the step's requests fail, the rest go on.
  for (size_t i = 0; i < running_.size();) {
    if (running_[i].step_n == 0) {
      ++i;
      continue;
    }
    end(running_[i], error);
    running_.erase(running_.begin() + std::ptrdiff_t(i));
  }
}

void Scheduler::publish_stats() {
  std::lock_guard lk(mu_);
  stats_.running = int(running_.size());
  stats_.waiting = int(waiting_.size());
  stats_.prompt_tokens = prompt_tokens_;
  stats_.generation_tokens = generation_tokens_;
  stats_.preemptions = preemptions_;
  stats_.steps = steps_;
  stats_.blocks = engine_.pool().n_blocks();
  stats_.blocks_free = engine_.pool().free_blocks();
  stats_.blocks_cached = engine_.pool().cached_blocks();
  stats_.prefix = engine_.prefix_stats();
}

}  // namespace dsa
