#pragma once
// Scheduler: continuous batching of many requests on one Engine, run by one thread (the
// engine thread, the one calling run()) that owns the model; other threads only submit
// requests and read their output. Run it on the thread that loaded the model: OpenMP keeps
// one worker pool per thread that starts parallel regions, and two pools on the machine's
// cores make libgomp stop spinning at barriers (slower steps). Each step carries one token of every decoding request and, while the step's
// token budget lasts, prefill chunks of the others (chunked prefill, as vLLM and SGLang
// schedule): a new request joins the running batch at the next step. Admission is first
// come, first served, up to max_seqs running. When the cache pool cannot hold the next
// step, the youngest running request gives its blocks back and waits at the head of the
// queue (preemption by recompute); when it runs again its prompt is prefilled and its
// generated tokens are put back in the decode role, so its cache, and so its output, is
// bitwise what it would have been without the preemption.
//
// Every request gets exactly the tokens it gets alone with the same sampling seed: steps
// are batch-invariant, and a prefix hit computes what a miss does (docs/ENGINE.md).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/generator.h"

namespace dsa {

struct SchedulerOptions {
  int max_seqs = 16;          // running requests (at most the engine's max_seqs)
  int max_batch_tokens = 0;   // tokens per step; 0: the engine's max_step_tokens
  int prefill_chunk = 512;    // longest prefill piece of one request in one step
  int max_waiting = 1024;     // queued requests; submit() refuses more
  // Speculative decoding with the checkpoint's MTP layer for every request (the engine must
  // hold its caches): each decode step verifies the token before it and the MTP layer's
  // draft, so an accepted draft gives two tokens per step. Output is distributed exactly as
  // without it (greedy: the same tokens); each request's tokens are those it gets alone with
  // MTP. A request preempted once continues without drafts.
  bool mtp = false;
};

// One generated token as the client sees it.
struct TokenOut {
  int32_t id = -1;
  float logprob = 0;                             // log-probability under the model (when asked)
  std::vector<std::pair<int32_t, float>> top;    // the most likely tokens and theirs
};

using Clock = std::chrono::steady_clock;

// A request, shared by its submitter and the engine thread. The submitter fills the
// inputs, submits it, then takes its output with wait() until done.
class Request {
public:
  // Inputs (fixed once submitted).
  std::vector<int32_t> prompt;
  GenerateOptions gen;
  int logprobs = -1;  // -1: none; k >= 0: each token's log-probability and the k most likely
  // -1: none; k >= 0: the log-probability of every prompt token after the first, and the k
  // most likely at its position (the OpenAI completions' echo with logprobs). The prompt then
  // runs whole, without prefix-cache reuse, in chunks of at most the engine's spare logit rows.
  int prompt_logprobs = -1;
  // false: a waiting take() wakes only when the request ends, not for every token (a
  // waiter woken per token takes a core from the engine's threads in the middle of a step).
  bool stream = true;

  // Asks the engine thread to stop the request (its blocks go back at the next step).
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

  // What arrived since the last take.
  struct Output {
    std::string text;              // streamed text (stop strings excluded)
    std::vector<TokenOut> tokens;  // sampled tokens
    std::vector<TokenOut> prompt;  // with prompt_logprobs: prompt tokens 1, 2, ... in order
    bool done = false;
    std::string error;             // non-empty: the request failed
    GenerateResult result;         // when done: the whole result (all its text and tokens)
  };
  // Moves the new output into `out` (replacing it); waits up to `timeout` when there is none.
  // Returns false when nothing arrived in time.
  bool take(Output& out, std::chrono::milliseconds timeout);

  // Timing, set by the engine thread (read after done).
  Clock::time_point arrived, scheduled, first_token, finished;
  int preemptions = 0;

private:
  friend class Scheduler;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  Output out_;
  bool news_ = false;
  void push_text(std::string_view s);
  void push_token(TokenOut t);
  void push_prompt(TokenOut t);
  void finish(GenerateResult r, std::string error);
};

// A snapshot of the scheduler for the metrics.
struct SchedulerStats {
  int running = 0, waiting = 0;
  int64_t prompt_tokens = 0, generation_tokens = 0, preemptions = 0, steps = 0;
  int blocks = 0, blocks_free = 0, blocks_cached = 0;
  PrefixStats prefix;
};

class Scheduler {
public:
  // `tok` may be null (ids only). `on_finish` runs on the engine thread for every request
  // that ends, with its result and error ("" when none): metrics, results in order.
  Scheduler(Engine& engine, const Tokenizer* tok, const SchedulerOptions& opt,
            std::function<void(const Request&, const GenerateResult&, const std::string&)> on_finish = {});
  ~Scheduler();  // cancels what was never run
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request; false when the queue is full or the scheduler is stopping. Throws
  // dsa::Error for a request that can never run (empty prompt, longer than the context, ids
  // out of range).
  bool submit(std::shared_ptr<Request> r);
  // The engine loop, on the calling thread: until stop(), or with `until_idle` until nothing
  // is running or queued.
  void run(bool until_idle = false);
  // Makes run() cancel every request, running or queued, and return (any thread).
  void stop();
  SchedulerStats stats() const;
  bool idle() const;  // nothing running or queued
  const Engine& engine() const { return engine_; }

private:
  struct Live {
    std::shared_ptr<Request> req;
    SeqId seq = -1;
    std::vector<int32_t> feed;  // what the cache must hold: the prompt, then generated tokens but the last
    int prompt_n = 0;           // feed[0, prompt_n) prefill role, the rest decode role
    int32_t next = -1;          // sampled, not fed yet
    std::unique_ptr<Completion> comp;
    uint64_t order = 0;         // admission order: the youngest is preempted first
    int item = -1, step_n = 0, step_pos = 0;
    bool step_rows = false;     // the step returns every row of its prompt chunk (prompt_logprobs)
    int prompt_lp = 1;          // with prompt_logprobs: the next prompt position to deliver
    // MTP: drafting, the main model's final-normed hidden rows of the positions the MTP
    // layer has not seen ([mtp_length, length), their next token not known when they ran),
    // the verify pair (next, draft), and the prompt + generated ids the MTP layer reads.
    bool mtp = false, verify = false;
    int h_n = 0;
    std::vector<float> h;
    int32_t pair[2] = {-1, -1};
    std::vector<int32_t> hist;
  };

  Engine& engine_;
  const Tokenizer* tok_;
  SchedulerOptions opt_;
  std::function<void(const Request&, const GenerateResult&, const std::string&)> on_finish_;
  std::vector<int32_t> banned_;
  std::unique_ptr<JsonVocab> json_vocab_;  // built at the first JSON-mode request

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> inbox_;  // submitted, not yet seen by the engine thread
  bool stopping_ = false;
  SchedulerStats stats_;

  // Engine thread only.
  std::deque<Live> waiting_;  // admitted order; preempted requests go back to the front
  std::vector<Live> running_;
  std::vector<StepItem> items_;
  std::vector<MtpItem> mtp_items_;
  std::vector<Live*> mtp_lives_;
  std::vector<int32_t> order_;  // token ids by logit, for top log-probabilities
  int max_rows_ = 0;            // logit rows one engine step returns
  uint64_t next_order_ = 0;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0, preemptions_ = 0, steps_ = 0;
  bool take_inbox(bool block);
  void cancel_all();
  void drop_cancelled();
  void admit();
  int blocks_needed(const Live& l, int n) const;
  bool plan_step();
  void preempt_youngest();
  void after_step();
  bool advance(Live& l);
  bool verify(Live& l, const float* logits);
  bool emit(Live& l, int32_t id, const float* logits);
  void draft();
  void mtp_prefill();
  void end(Live& l, std::string error = {});
  void fail_step(const std::string& error);
  void publish_stats();
  bool wants_prompt_rows(const Live& l) const;
  void deliver_prompt_logprobs(Live& l, const float* logits);
  TokenOut token_out(int32_t id, const float* logits, int k);
};

}  // namespace dsa
