#include "runtime/parallel.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>

#include "core/error.h"

namespace dsa {

namespace {

using Clock = std::chrono::steady_clock;

int blocks_for(int64_t tokens, int bs) { return int((tokens + bs - 1) / bs); }

// The prompts' run: which are running, their step items, and the results waiting for their
// turn to be handed out.
class Runner {
public:
  Runner(Engine& e, const Tokenizer* tok, const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& g,
         const ParallelOptions& o, const std::function<void(size_t, GenerateResult&)>& on_result)
      : e_(e), tok_(tok), prompts_(prompts), g_(g), on_result_(on_result), banned_(undecodable_ids(e.model(), tok)),
        done_(prompts.size()) {
    const EngineOptions& eo = e.options();
    K_ = std::min(o.parallel > 0 ? o.parallel : int(prompts.size()), eo.max_seqs);
    chunk_ = std::min(o.prefill_chunk, eo.max_step_tokens);
    if (chunk_ < 1) throw Error("generate: prefill chunk must be positive");
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (prompts[i].empty()) throw Error("prompt " + std::to_string(i + 1) + " is empty");
      if (int64_t(prompts[i].size()) > eo.max_ctx)
        throw Error("prompt " + std::to_string(i + 1) + " of " + std::to_string(prompts[i].size()) +
                    " tokens exceeds the context size " + std::to_string(eo.max_ctx));
    }
    run_.reserve(size_t(K_));
    items_.reserve(size_t(K_));
  }

  void run() {
    while (next_out_ < prompts_.size()) {
      admit();
      plan_step();
      DSA_CHECK(!items_.empty(), "generate: a step with nothing to run");
      e_.step(items_);
      after_step();
    }
  }

private:
  struct Running {
    size_t index = 0;
    SeqId seq = -1;
    int pos = 0;         // prompt tokens in the cache
    int32_t next = -1;   // sampled, not yet fed (decoding)
    int step_n = 0;      // tokens in the current step
    int item = -1;       // its item in the current step
    int blocks_max = 0;  // blocks the sequence can grow to
    std::unique_ptr<Completion> comp;
    Clock::time_point t0;
    int prompt_len(const Runner& r) const { return int(r.prompts_[index].size()); }
  };

  Engine& e_;
  const Tokenizer* tok_;
  const std::vector<std::vector<int32_t>>& prompts_;
  const GenerateOptions& g_;
  const std::function<void(size_t, GenerateResult&)>& on_result_;
  std::vector<int32_t> banned_;
  std::vector<std::optional<GenerateResult>> done_;
  size_t next_out_ = 0, next_in_ = 0;
  int K_ = 1, chunk_ = 1;
  std::vector<Running> run_;
  std::vector<StepItem> items_;

  // Blocks the running sequences may still take: admission keeps that much free, so a
  // running sequence never meets an exhausted pool.
  int promised() const {
    int b = 0;
    for (const Running& r : run_) b += r.blocks_max - blocks_for(e_.length(r.seq), e_.options().block_size);
    return b;
  }

  void admit() {
    const EngineOptions& eo = e_.options();
    while (int(run_.size()) < K_ && next_in_ < prompts_.size()) {
      const std::vector<int32_t>& p = prompts_[next_in_];
      const int total = int(std::min<int64_t>(int64_t(p.size()) + std::max(g_.max_new_tokens, 1), eo.max_ctx));
      const int need = blocks_for(total, eo.block_size);
      if (!run_.empty() && e_.pool().free_blocks() - promised() < need) return;  // wait for room
      Running r;
      r.index = next_in_++;
      r.seq = e_.add(p);
      r.pos = e_.length(r.seq);
      r.blocks_max = need;
      r.comp = std::make_unique<Completion>(e_.model(), tok_, p, g_, banned_);
      r.comp->result().reused_tokens = r.pos;
      r.t0 = Clock::now();
      run_.push_back(std::move(r));
    }
  }

  // One token of every decoding sequence, then prefill chunks while the token budget lasts.
  // A prompt's chunks are always chunk_ tokens from its start (the last shorter): when the
  // next one does not fit, it waits for the next step.
  void plan_step() {
    items_.clear();
    int budget = e_.options().max_step_tokens;
    for (Running& r : run_) {
      r.step_n = 0;
      if (r.next < 0) continue;
      r.item = int(items_.size());
      items_.push_back(StepItem{r.seq, &r.next, 1, true, 1, 0});
      r.step_n = 1;
      --budget;
    }
    for (Running& r : run_) {
      if (r.next >= 0) continue;
      const int n = std::min(chunk_, r.prompt_len(*this) - r.pos);
      if (n > budget) break;
      r.item = int(items_.size());
      items_.push_back(StepItem{r.seq, &prompts_[r.index][size_t(r.pos)], n, false, r.pos + n == r.prompt_len(*this) ? 1 : 0, 0});
      r.step_n = n;
      budget -= n;
    }
  }

  // Samples where the step gave logits; true when the sequence is done.
  bool advance(Running& r) {
    if (r.step_n == 0) return false;
    if (r.next < 0) {
      r.pos += r.step_n;
      if (r.pos < r.prompt_len(*this)) return false;
      r.comp->result().prefill_s = std::chrono::duration<double>(Clock::now() - r.t0).count();
      if (g_.max_new_tokens == 0) return true;
    } else {
      ++r.comp->result().decode_steps;
    }
    r.next = r.comp->sampler().sample(e_.logits(r.item));
    return r.comp->emit(r.next, e_.length(r.seq) >= e_.options().max_ctx);
  }

  void after_step() {
    for (size_t i = 0; i < run_.size();) {
      if (!advance(run_[i])) {
        ++i;
        continue;
      }
      finish(run_[i]);
      run_.erase(run_.begin() + std::ptrdiff_t(i));
    }
  }

  // Hands out every result whose turn has come.
  void finish(Running& r) {
    r.comp->finish();
    GenerateResult& res = r.comp->result();
    res.decode_s = std::chrono::duration<double>(Clock::now() - r.t0).count() - res.prefill_s;
    e_.release(r.seq);
    done_[r.index] = std::move(res);
    while (next_out_ < done_.size() && done_[next_out_]) {
      on_result_(next_out_, *done_[next_out_]);
      done_[next_out_].reset();
      ++next_out_;
    }
  }
};

}  // namespace

void generate_parallel(Engine& e, const Tokenizer* tok, const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& g,
                       const ParallelOptions& o, const std::function<void(size_t, GenerateResult&)>& on_result) {
  Runner(e, tok, prompts, g, o, on_result).run();
}

}  // namespace dsa
