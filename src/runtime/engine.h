#pragma once
// Engine: many sequences over one paged cache, one forward step at a time. It owns the
// cache pool (KvCache + BlockPool, with the prefix cache) and the step workspace, and
// keeps each sequence's block table and tokens. It has no scheduler: the caller (a
// command, the server) decides which sequences step together and with which tokens:
//
//   SeqId s = engine.add(prompt);              // shares cached prefix blocks
//   engine.step({{s, ids, n, ...}, ...});      // one forward over every item
//   const float* l = engine.logits(0);         // item 0's rows, until the next step
//   engine.release(s);                          // its blocks go back (full ones stay cached)
//
// Pool exhaustion, a full context, a bad id or a released sequence are dsa::Error from
// the call that meets them, leaving every sequence as it was before the call.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/workspace.h"
#include "runtime/block_pool.h"

namespace dsa {

struct EngineOptions {
  CacheType cache = CacheType::FP8;
  int block_size = 64;        // tokens per cache block (prefix hits align on it)
  int64_t cache_tokens = 0;   // pool capacity in tokens; 0: from cache_bytes, else the default
  int64_t cache_bytes = 0;    // pool capacity in bytes; 0: the default (see default_cache_tokens)
  int max_ctx = 4096;         // longest sequence: prompt + generated tokens
  int max_seqs = 16;          // sequences in one step
  int max_step_tokens = 512;  // tokens in one step, over all its sequences
  int max_logit_rows = 0;     // logit rows one step returns; 0: two per sequence
  bool mtp = false;           // hold the MTP layer's caches (the model must have it loaded)
  bool prefix_cache = true;   // publish full blocks and reuse them across sequences
};

// The pool's tokens when no size is given: every sequence of a step at full context, as
// far as the machine's available memory after the weights allows (keeping 10% and at
// least 1 GiB free), and at least one sequence at full context.
int64_t default_cache_tokens(const Model& m, const EngineOptions& o);

struct EngineCapacity {
  int blocks = 0, block_size = 0;
  int64_t tokens = 0;
  size_t bytes_per_token = 0, bytes = 0;
  std::string describe() const;  // "cache: 512 blocks x 64 tokens = 32768 tokens, 7.2 KB/token, 236 MB"
};

using SeqId = int32_t;

// One sequence's part of a step.
struct StepItem {
  SeqId seq = -1;
  const int32_t* ids = nullptr;  // n new tokens, appended at the sequence's length
  int n = 0;
  bool decode = false;  // decode / verify tokens (batch-invariant order), else a prefill chunk
  int logits = 1;       // rows returned: 0, 1 (the last token) or n
  int unverified = 0;   // trailing tokens a verify step checks: never published until a later
                        // call on the sequence (truncate, step, release) confirms them
};

// One sequence's part of an MTP step: the MTP layer over positions mtp_length .. + n - 1,
// `next` the ids that follow them, h their main-model final-normed hidden states [n, hidden].
struct MtpItem {
  SeqId seq = -1;
  const int32_t* next = nullptr;
  const float* h = nullptr;
  int n = 0;
  bool decode = false;
  int logits = 1;
};

class Engine {
public:
  Engine(const Model& m, const EngineOptions& opt);
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // A new, empty sequence. With `prompt`, the cached blocks its prompt starts with are
  // taken by reference (at most all but its last token, which always runs): the sequence
  // then holds reused_tokens() of it. `mtp`: it keeps the MTP layer's cache too.
  SeqId add(std::span<const int32_t> prompt = {}, bool mtp = false);
  void release(SeqId s);
  // Drops the sequence's tokens past n (rejected drafts) and confirms those before it.
  void truncate(SeqId s, int n);

  void step(std::span<const StepItem> items);
  void step_mtp(std::span<const MtpItem> items);
  const float* logits(int item) const;  // the item's rows of the last step ([rows, vocab])
  int max_logit_rows() const;           // logit rows one step may return, over all its items
  const float* hidden(int item) const;  // its tokens' final-normed hidden states ([n, hidden])

  int length(SeqId s) const { return seq(s).len; }
  int mtp_length(SeqId s) const { return seq(s).mtp_len; }
  int reused_tokens(SeqId s) const { return seq(s).reused; }
  std::span<const int32_t> tokens(SeqId s) const { return {seq(s).tokens.data(), size_t(seq(s).len)}; }
  int live_sequences() const;

  const Model& model() const { return m_; }
  const EngineOptions& options() const { return opt_; }
  EngineCapacity capacity() const;
  // The pool new work is checked against. Under data-parallel attention each rank's
  // sequences hold blocks of a pool of their own (every rank keeps the books of all of
  // them, its cache only the blocks of its own): this is the one with the fewest free
  // blocks, so that what fits it fits every rank's.
  const BlockPool& pool() const;
  PrefixStats prefix_stats() const;  // over every rank's pool

  // Observes the internals of every later step (golden files; steps run their per-query
  // loops in order); null: none.
  void set_tap(const Tap* tap) { tap_ = tap; }

  // An MPI job driven from one rank (the server): after lead() on rank 0, every later add,
  // release, truncate, step and step_mtp of this engine also runs on each other rank's
  // engine, built alike and sitting in follow(), until stop_followers(). Commands that run
  // the same program on every rank (run, logits, bench) use neither. No-ops outside a job.
  void lead();
  void follow();  // returns when the leader calls stop_followers()
  void stop_followers();

  // Benchmarks: fills the sequence's cache to `depth` tokens of synthetic keys (as if
  // prefilled) without running the model; the sequence must be empty. Never published.
  void fill_synthetic(SeqId s, int depth, uint64_t seed);

private:
  struct Seq {
    bool live = false, mtp = false, synthetic = false;
    int owner = 0;  // the data-parallel rank that attends for it (0 without)
    int len = 0, mtp_len = 0, unverified = 0, reused = 0, published = 0;  // published: leading blocks
    std::vector<int32_t> blocks, tokens;
    std::vector<uint64_t> hashes;  // chained hash of each published block
  };
  const Model& m_;
  EngineOptions opt_;
  KvCache kv_;
  int dp_ = 1, me_ = 0;            // data-parallel ranks, and this one among them
  std::vector<BlockPool> pools_;   // one per data-parallel rank
  Workspace ws_;
  std::vector<Seq> seqs_;
  std::vector<SeqStep> batch_;    // this rank's part of the step in forward's order
  std::vector<int32_t> order_;    // item i -> its place in its rank's batch
  std::vector<int32_t> placed_;   // place k in batch_ -> its item
  std::vector<int32_t> item_row_, item_tok_;  // item i -> its first logit row, first token, over every rank's
  std::vector<int32_t> rank_rows_, rank_toks_;  // each rank's logit rows and tokens in the step
  std::vector<float> dp_logits_, dp_hidden_;  // every rank's logits and hidden states of the step
  std::vector<int32_t> grabbed_, grabbed_pool_;  // blocks taken by the step being prepared, and their pools
  std::vector<uint8_t> role_;     // item i is decode-role
  std::vector<int32_t> item_n_, item_logits_;  // item i's tokens and logit rows
  std::vector<SeqId> item_seq_;   // item i's sequence
  std::vector<float> mtp_h_;      // MTP step's hidden rows in forward's order
  const Tap* tap_ = nullptr;
  bool leading_ = false;
  std::vector<uint8_t> wire_;     // the call being sent to the followers (or received)

  Seq& seq(SeqId s);
  const Seq& seq(SeqId s) const;
  uint64_t hash_seed(bool mtp) const { return mtp ? 0x6d7470ull : 0x6d61696eull; }
  uint64_t block_hash(const Seq& q, int b, const int32_t* tokens) const;
  void publish_ready(Seq& q);
  void grow_tables(std::span<const StepItem> items);
  void check_items(std::span<const SeqId> ids) const;
  BlockPool& pool_of(const Seq& q) { return pools_[size_t(q.owner)]; }
  int choose_owner(std::span<const int32_t> prompt, Seq& q) const;
  int place_items(int n_items);  // from item_seq_, role_, item_n_, item_logits_; returns this rank's item count
  void exchange_outputs();  // under data-parallel attention: every rank's logits (and hidden states) to every rank
  void undo_growth(std::span<const StepItem> items);  // returns the blocks grow_tables took
  Batch batch(int n_items) const;   // the step laid out in ws_.ids and batch_
  enum Call : int { kCallAdd = 1, kCallRelease, kCallTruncate, kCallStep, kCallMtp, kCallStop };
  // Leader: each mutating call, sent to the followers before it runs here (engine_follow.cpp).
  void announce_add(std::span<const int32_t> prompt, bool mtp);
  void announce_seq(int call, SeqId s, int n);  // release, truncate
  void announce_step(std::span<const StepItem> items);
  void announce_mtp(std::span<const MtpItem> items);
  void send_wire(int call);
  bool replay();  // follower: receives and runs one call; false at the leader's stop
};

}  // namespace dsa
