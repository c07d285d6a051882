#include "runtime/engine.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <utility>

#include "core/error.h"
#include "core/threads.h"
#include "runtime/dist.h"

namespace dsa {

namespace {

int64_t blocks_for(int64_t tokens, int bs) { return (tokens + bs - 1) / bs; }

// MemAvailable from /proc/meminfo (bytes), or 0 when unknown.
double available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  while (in >> key) {
    if (key == "MemAvailable:") {
      in >> kb;
      return kb * 1024.0;
    }
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

WorkspaceOptions workspace_options(const Model& m, const EngineOptions& o) {
  WorkspaceOptions w;
  w.head_ranks = m.shard.splits_head(m.config.vocab_size) ? m.shard.group() : 1;
  w.tp = m.shard.tp;
  w.dp_ranks = m.shard.dp_ranks();
  w.max_tokens = o.max_step_tokens;
  w.max_seqs = o.max_seqs;
  w.max_logit_rows = o.max_logit_rows > 0 ? o.max_logit_rows : 2 * o.max_seqs;
  w.max_ctx = o.max_ctx;
  w.mtp = o.mtp;
  w.chunk_latents = o.cache != CacheType::F32;
  return w;
}

// The caches this rank holds: its pipeline stage's layers, the MTP layer on the last stage.
KvCacheOptions cache_options(const Model& m, const EngineOptions& o, int n_blocks) {
  const int L = m.config.num_hidden_layers;
  KvCacheOptions k{o.block_size, n_blocks, o.cache, o.mtp && m.shard.last_stage()};
  k.first_layer = m.shard.first_layer(L);
  k.end_layer = m.shard.end_layer(L);
  return k;
}

size_t token_bytes(const Model& m, const EngineOptions& o) { return KvCache::bytes_per_token(m.config, cache_options(m, o, 0)); }

EngineOptions checked(const Model& m, EngineOptions o) {
  if (o.block_size < 1 || o.block_size > (1 << 20)) throw Error("engine: block size must be in 1..1048576, got " + std::to_string(o.block_size));
  if (o.max_ctx < 1) throw Error("engine: max_ctx must be positive");
  if (o.max_seqs < 1) throw Error("engine: max_seqs must be positive");
  if (o.max_step_tokens < 1) throw Error("engine: max_step_tokens must be positive");
  if (o.cache_tokens < 0 || o.cache_bytes < 0) throw Error("engine: cache size must not be negative");
  if (o.mtp && !m.weights.mtp)
    throw Error(m.config.num_nextn_predict_layers == 0
                    ? "MTP speculative decoding: the checkpoint has no MTP layer (num_nextn_predict_layers = 0)"
                    : "MTP speculative decoding: the model was loaded without its MTP layer");
  o.max_step_tokens = std::min(o.max_step_tokens, o.max_seqs * o.max_ctx);
  return o;
}

int pool_blocks(const Model& m, const EngineOptions& o) {
  int64_t tokens = o.cache_tokens;
  if (tokens == 0 && o.cache_bytes > 0) tokens = o.cache_bytes / int64_t(token_bytes(m, o));
  if (tokens == 0) tokens = default_cache_tokens(m, o);
  // Every rank of a job runs the same steps over the same block tables: the pool is the
  // smallest any rank can hold (their free memory and layers differ).
  const int64_t blocks = -int64_t(dist::max_over_ranks(-double(blocks_for(tokens, o.block_size))));
  if (blocks < 1) throw Error("engine: the cache holds less than one block of " + std::to_string(o.block_size) + " tokens");
  if (blocks > (int64_t(1) << 30)) throw Error("engine: a cache of " + std::to_string(blocks) + " blocks is beyond what the engine addresses");
  return int(blocks);
}

}  // namespace

int64_t default_cache_tokens(const Model& m, const EngineOptions& o) {
  const int64_t need = blocks_for(o.max_ctx, o.block_size) * o.block_size * o.max_seqs;
  const double per_token = double(token_bytes(m, o));
  double avail = available_memory_bytes();
  if (avail <= 0) avail = physical_memory_bytes();
  const double weights = double(shard_bytes(m.files, m.config, m.shard));
  const double budget = avail - weights - std::max(0.1 * avail, double(1 << 30));
  const int64_t fit = budget > 0 ? int64_t(budget / per_token) : 0;
  return std::max<int64_t>(std::min(need, fit), o.max_ctx);
}

std::string EngineCapacity::describe() const {
  char b[160];
  std::snprintf(b, sizeof b, "cache: %d blocks x %d tokens = %lld tokens, %.1f KB/token, %.1f MB", blocks, block_size,
                static_cast<long long>(tokens), double(bytes_per_token) / 1024.0, double(bytes) / 1e6);
  return b;
}

Engine::Engine(const Model& m, const EngineOptions& opt)
    : m_(m),
      opt_(checked(m, opt)),
      kv_(m.config, cache_options(m, opt_, pool_blocks(m, opt_))),
      dp_(m.shard.dp_ranks()),
      me_(m.shard.dp ? m.shard.member() : 0),
      pools_(size_t(dp_), BlockPool(kv_.n_blocks(), opt_.block_size)),
      ws_(m.config, workspace_options(m, opt_)) {
  const size_t S = size_t(opt_.max_seqs);
  for (auto* v : {&order_, &placed_, &item_seq_, &item_n_, &item_logits_, &item_row_, &item_tok_}) v->resize(S);
  batch_.resize(S);
  role_.resize(S);
  rank_rows_.resize(size_t(dp_));
  rank_toks_.resize(size_t(dp_));
  grabbed_.reserve(size_t(opt_.max_step_tokens / opt_.block_size + 2 * opt_.max_seqs));
  grabbed_pool_.reserve(grabbed_.capacity());
  const size_t H = size_t(m.config.hidden_size);
  if (opt_.mtp) mtp_h_.resize(size_t(opt_.max_step_tokens) * H);
  if (dp_ > 1) {
    dp_logits_.resize(size_t(ws_.opt.max_logit_rows) * size_t(m.config.vocab_size));
    dp_hidden_.resize(size_t(opt_.max_step_tokens) * H);
  }
}

const BlockPool& Engine::pool() const {
  const BlockPool* p = &pools_[0];
  for (const BlockPool& q : pools_)
    if (q.free_blocks() < p->free_blocks()) p = &q;
  return *p;
}

PrefixStats Engine::prefix_stats() const {
  PrefixStats s;
  for (const BlockPool& p : pools_) {
    s.queries += p.stats().queries;
    s.hits += p.stats().hits;
    s.evictions += p.stats().evictions;
  }
  return s;
}

EngineCapacity Engine::capacity() const {
  EngineCapacity c;
  c.blocks = kv_.n_blocks();
  c.block_size = kv_.block_size();
  c.tokens = int64_t(c.blocks) * c.block_size;
  c.bytes_per_token = token_bytes(m_, opt_);
  c.bytes = kv_.bytes();
  return c;
}

const Engine::Seq& Engine::seq(SeqId s) const {
  if (s < 0 || size_t(s) >= seqs_.size() || !seqs_[size_t(s)].live) throw Error("engine: no live sequence " + std::to_string(s));
  return seqs_[size_t(s)];
}
Engine::Seq& Engine::seq(SeqId s) { return seqs_[size_t(&std::as_const(*this).seq(s) - seqs_.data())]; }

int Engine::live_sequences() const {
  int n = 0;
  for (const Seq& q : seqs_) n += q.live;
  return n;
}

uint64_t Engine::block_hash(const Seq& q, int b, const int32_t* tokens) const {
  // An MTP block's MTP cache at its last position was made with the token after the block:
  // that token is part of what the block holds.
  const uint64_t parent = b > 0 ? q.hashes[size_t(b - 1)] : 0;
  const int bs = opt_.block_size;
  return BlockPool::chain(parent, tokens + size_t(b) * size_t(bs), q.mtp ? bs + 1 : bs, hash_seed(q.mtp));
}

SeqId Engine::add(std::span<const int32_t> prompt, bool mtp) {
  if (leading_) announce_add(prompt, mtp);
  if (mtp && !opt_.mtp) throw Error("engine: an MTP sequence in an engine built without the MTP layer's caches");
  if (int64_t(prompt.size()) > opt_.max_ctx)
    throw Error("engine: prompt of " + std::to_string(prompt.size()) + " tokens exceeds the context size " + std::to_string(opt_.max_ctx));
  SeqId id = 0;
  while (size_t(id) < seqs_.size() && seqs_[size_t(id)].live) ++id;
  if (size_t(id) == seqs_.size()) seqs_.emplace_back();
  Seq& q = seqs_[size_t(id)];
  q = Seq{};
  q.live = true;
  q.mtp = mtp;
  // Sized once: steps append without allocating.
  q.blocks.reserve(size_t(blocks_for(opt_.max_ctx, opt_.block_size)));
  q.hashes.reserve(q.blocks.capacity());
  q.tokens.reserve(size_t(opt_.max_ctx));
  const int bs = opt_.block_size;
  // Full blocks within all but the last prompt token (and for MTP, whose next token is known).
  const int full = !opt_.prefix_cache || prompt.empty() ? 0 : int((prompt.size() - 1) / size_t(bs));
  for (int b = 0; b < full; ++b) q.hashes.push_back(block_hash(q, b, prompt.data()));
  q.owner = choose_owner(prompt, q);
  if (!opt_.prefix_cache) return id;
  for (int b = 0; b < full; ++b) {
    const int32_t blk = pool_of(q).lookup(q.hashes[size_t(b)], b > 0 ? q.hashes[size_t(b - 1)] : 0, prompt.data() + size_t(b) * size_t(bs));
    if (blk == BlockPool::kNone) break;
    q.blocks.push_back(blk);
  }
  q.hashes.resize(q.blocks.size());
  q.published = int(q.blocks.size());
  q.len = q.mtp_len = q.reused = q.published * bs;
  q.tokens.assign(prompt.begin(), prompt.begin() + q.len);
  return id;
}

// The data-parallel rank a new sequence goes to: among the ranks within one sequence of the
// least loaded (so that a prompt everyone shares does not pile every sequence onto one
// rank), the one whose cache holds the longest start of the prompt, then the least loaded,
// then the lowest. q.hashes holds the prompt's full blocks' hashes.
int Engine::choose_owner(std::span<const int32_t> prompt, Seq& q) const {
  if (dp_ == 1) return 0;
  std::vector<int> live(size_t(dp_), 0);
  for (const Seq& s : seqs_)
    if (s.live && &s != &q) ++live[size_t(s.owner)];
  const int least = *std::min_element(live.begin(), live.end());
  int best = -1, best_hits = -1;
  for (int r = 0; r < dp_; ++r) {
    if (live[size_t(r)] > least + 1) continue;
    int hits = 0;
    const int bs = opt_.block_size;
    while (size_t(hits) < q.hashes.size() &&
           pools_[size_t(r)].cached(q.hashes[size_t(hits)], hits > 0 ? q.hashes[size_t(hits - 1)] : 0, prompt.data() + size_t(hits) * size_t(bs)))
      ++hits;
    if (hits > best_hits || (hits == best_hits && live[size_t(r)] < live[size_t(best)])) {
      best = r;
      best_hits = hits;
    }
  }
  return best;
}

void Engine::publish_ready(Seq& q) {
  if (!opt_.prefix_cache || q.synthetic) return;
  const int bs = opt_.block_size;
  int final_len = q.len - q.unverified;
  if (q.mtp) final_len = std::min({final_len, q.mtp_len, q.len - 1});  // and the token after the block is known
  for (int b = q.published; (b + 1) * bs <= final_len; ++b) {
    const uint64_t h = block_hash(q, b, q.tokens.data());
    pool_of(q).publish(q.blocks[size_t(b)], h, b > 0 ? q.hashes[size_t(b - 1)] : 0, q.tokens.data() + size_t(b) * size_t(bs));
    q.hashes.push_back(h);
    q.published = b + 1;
  }
}

void Engine::release(SeqId s) {
  if (leading_) announce_seq(kCallRelease, s, 0);
  Seq& q = seq(s);
  publish_ready(q);  // what is final; unverified drafts are not
  for (int32_t b : q.blocks) pool_of(q).unref(b);
  q = Seq{};
}

void Engine::truncate(SeqId s, int n) {
  if (leading_) announce_seq(kCallTruncate, s, n);
  Seq& q = seq(s);
  if (n < 0 || n > q.len) throw Error("engine: truncate to " + std::to_string(n) + " tokens, the sequence holds " + std::to_string(q.len));
  if (n < q.published * opt_.block_size)
    throw Error("engine: truncate into a published (shared) block; release the sequence and add a new one instead");
  const size_t keep = size_t(blocks_for(n, opt_.block_size));
  for (size_t b = keep; b < q.blocks.size(); ++b) pool_of(q).unref(q.blocks[b]);
  q.blocks.resize(keep);
  q.len = n;
  q.tokens.resize(size_t(n));
  q.mtp_len = std::min(q.mtp_len, n);
  q.unverified = 0;
  publish_ready(q);
}

void Engine::check_items(std::span<const SeqId> ids) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    seq(ids[i]);
    for (size_t j = 0; j < i; ++j)
      if (ids[j] == ids[i]) throw Error("engine: sequence " + std::to_string(ids[i]) + " appears twice in one step");
  }
}

void Engine::grow_tables(std::span<const StepItem> items) {
  grabbed_.clear();
  grabbed_pool_.clear();
  const int bs = opt_.block_size;
  for (const StepItem& it : items) {
    Seq& q = seqs_[size_t(it.seq)];
    const int64_t need = blocks_for(int64_t(q.len) + it.n, bs) - int64_t(q.blocks.size());
    for (int64_t k = 0; k < need; ++k) {
      const int32_t b = pool_of(q).allocate();
      if (b == BlockPool::kNone) {
        undo_growth(items);
        throw Error("engine: the KV cache pool is exhausted (" + std::to_string(pool_of(q).n_blocks()) + " blocks of " + std::to_string(bs) +
                    " tokens, all held by live sequences" + (dp_ > 1 ? " of rank " + std::to_string(q.owner) : std::string()) +
                    "); release sequences or give a larger --cache-mem / --cache-tokens");
      }
      grabbed_.push_back(b);
      grabbed_pool_.push_back(q.owner);
      q.blocks.push_back(b);
    }
  }
}

void Engine::undo_growth(std::span<const StepItem> items) {
  // Every sequence stays as it was: its table cut back to its tokens, this step's blocks returned.
  for (const StepItem& it : items) {
    Seq& r = seqs_[size_t(it.seq)];
    r.blocks.resize(size_t(blocks_for(r.len, opt_.block_size)));
  }
  for (size_t g = 0; g < grabbed_.size(); ++g) pools_[size_t(grabbed_pool_[g])].unref(grabbed_[g]);
  grabbed_.clear();
  grabbed_pool_.clear();
}

// Each rank's items in forward's order (decode items first, stable), and where each item's
// logit rows and tokens sit when every rank's are laid end to end in rank order: every
// rank works this out for every rank (they all see the same items), so the exchange after
// the step needs no counts of its own.
int Engine::place_items(int n_items) {
  int row = 0, tok = 0, mine = 0;
  for (int r = 0; r < dp_; ++r) {
    const int row0 = row, tok0 = tok;
    int k = 0;
    for (int pass = 0; pass < 2; ++pass)
      for (int i = 0; i < n_items; ++i) {
        if (seqs_[size_t(item_seq_[size_t(i)])].owner != r || (role_[size_t(i)] != 0) != (pass == 0)) continue;
        order_[size_t(i)] = k;
        item_row_[size_t(i)] = row;
        item_tok_[size_t(i)] = tok;
        row += item_logits_[size_t(i)];
        tok += item_n_[size_t(i)];
        if (r == me_) placed_[size_t(k)] = i;
        ++k;
      }
    rank_rows_[size_t(r)] = row - row0;
    rank_toks_[size_t(r)] = tok - tok0;
    if (r == me_) mine = k;
  }
  return mine;
}

void Engine::exchange_outputs() {
  if (dp_ == 1) return;
  dist::gather_rows(ws_.logits.data(), rank_rows_.data(), m_.config.vocab_size, dp_logits_.data());
  dist::gather_rows(ws_.h_final.data(), rank_toks_.data(), m_.config.hidden_size, dp_hidden_.data());
}

Batch Engine::batch(int n_items) const {
  Batch b;
  b.ids = ws_.ids.data();
  b.seqs = batch_.data();
  b.n_seqs = n_items;
  b.tap = tap_;
  return b;
}

void Engine::step(std::span<const StepItem> items) {
  if (leading_) announce_step(items);
  const int n_items = int(items.size());
  if (n_items == 0) throw Error("engine: an empty step");
  if (n_items > opt_.max_seqs)
    throw Error("engine: " + std::to_string(n_items) + " sequences in one step, the engine steps at most " + std::to_string(opt_.max_seqs));
  int total = 0;
  for (int i = 0; i < n_items; ++i) {
    const StepItem& it = items[size_t(i)];
    item_seq_[size_t(i)] = it.seq;
    const Seq& q = seq(it.seq);
    if (it.n < 1 || !it.ids) throw Error("engine: a step item without tokens");
    if (q.len + it.n > opt_.max_ctx)
      throw Error("engine: context of " + std::to_string(q.len + it.n) + " tokens exceeds the context size " + std::to_string(opt_.max_ctx));
    if (it.unverified < 0 || it.unverified > it.n) throw Error("engine: unverified tokens outside the item");
    for (int j = 0; j < it.n; ++j)
      if (it.ids[j] < 0 || it.ids[j] >= m_.config.vocab_size)
        throw Error("token id " + std::to_string(it.ids[j]) + " out of range [0, " + std::to_string(m_.config.vocab_size) + ")");
    total += it.n;
    role_[size_t(i)] = it.decode;
    item_n_[size_t(i)] = it.n;
    item_logits_[size_t(i)] = it.logits;
  }
  if (total > opt_.max_step_tokens)
    throw Error("engine: " + std::to_string(total) + " tokens in one step, the engine steps at most " + std::to_string(opt_.max_step_tokens));
  check_items(std::span<const SeqId>(item_seq_.data(), size_t(n_items)));
  // The caller went on with these sequences: their earlier drafts are confirmed.
  for (const StepItem& it : items) {
    Seq& q = seqs_[size_t(it.seq)];
    q.unverified = 0;
    publish_ready(q);
  }
  grow_tables(items);
  const int n_local = place_items(n_items);
  // This rank's tokens in forward's order (decode items first).
  int off = 0;
  for (int k = 0; k < n_local; ++k) {
    const StepItem& it = items[size_t(placed_[size_t(k)])];
    const Seq& q = seqs_[size_t(it.seq)];
    std::copy_n(it.ids, it.n, ws_.ids.begin() + off);
    batch_[size_t(k)] = SeqStep{q.len, it.n, q.blocks.data(), it.decode, it.logits};
    off += it.n;
  }
  try {
    forward(m_, kv_, ws_, batch(n_local));
  } catch (...) {
    undo_growth(items);
    throw;
  }
  exchange_outputs();
  for (const StepItem& it : items) {
    Seq& q = seqs_[size_t(it.seq)];
    q.tokens.insert(q.tokens.end(), it.ids, it.ids + it.n);
    q.len += it.n;
    q.unverified = it.unverified;
    publish_ready(q);
  }
}

void Engine::step_mtp(std::span<const MtpItem> items) {
  if (leading_) announce_mtp(items);
  const int n_items = int(items.size());
  if (!opt_.mtp) throw Error("engine: an MTP step in an engine built without the MTP layer's caches");
  if (n_items == 0 || n_items > opt_.max_seqs) throw Error("engine: an MTP step needs 1.." + std::to_string(opt_.max_seqs) + " sequences");
  int total = 0;
  for (int i = 0; i < n_items; ++i) {
    const MtpItem& it = items[size_t(i)];
    item_seq_[size_t(i)] = it.seq;
    const Seq& q = seq(it.seq);
    if (!q.mtp) throw Error("engine: an MTP step for a sequence added without MTP");
    if (it.n < 1 || !it.next || !it.h) throw Error("engine: an MTP step item without tokens");
    if (q.mtp_len + it.n > q.len) throw Error("engine: the MTP layer cannot pass the main model's positions");
    for (int j = 0; j < it.n; ++j)
      if (it.next[j] < 0 || it.next[j] >= m_.config.vocab_size)
        throw Error("token id " + std::to_string(it.next[j]) + " out of range [0, " + std::to_string(m_.config.vocab_size) + ")");
    total += it.n;
    role_[size_t(i)] = it.decode;
    item_n_[size_t(i)] = it.n;
    item_logits_[size_t(i)] = it.logits;
  }
  if (total > opt_.max_step_tokens) throw Error("engine: too many tokens in one MTP step");
  check_items(std::span<const SeqId>(item_seq_.data(), size_t(n_items)));
  const int n_local = place_items(n_items);
  const size_t H = size_t(m_.config.hidden_size);
  int off = 0;
  for (int k = 0; k < n_local; ++k) {
    const MtpItem& it = items[size_t(placed_[size_t(k)])];
    const Seq& q = seqs_[size_t(it.seq)];
    std::copy_n(it.next, it.n, ws_.ids.begin() + off);
    std::copy_n(it.h, size_t(it.n) * H, mtp_h_.begin() + std::ptrdiff_t(size_t(off) * H));
    batch_[size_t(k)] = SeqStep{q.mtp_len, it.n, q.blocks.data(), it.decode, it.logits};
    off += it.n;
  }
  forward_mtp(m_, kv_, ws_, batch(n_local), mtp_h_.data());
  if (dp_ > 1) dist::gather_rows(ws_.logits.data(), rank_rows_.data(), m_.config.vocab_size, dp_logits_.data());
  for (const MtpItem& it : items) {
    Seq& q = seqs_[size_t(it.seq)];
    q.mtp_len += it.n;
    publish_ready(q);
  }
}

int Engine::max_logit_rows() const { return ws_.opt.max_logit_rows; }

const float* Engine::logits(int item) const {
  DSA_CHECK(item >= 0 && item < opt_.max_seqs, "engine: item index out of range");
  if (dp_ > 1) return dp_logits_.data() + size_t(item_row_[size_t(item)]) * size_t(m_.config.vocab_size);
  return ws_.logits.data() + size_t(ws_.logit_first[size_t(order_[size_t(item)])]) * size_t(m_.config.vocab_size);
}

const float* Engine::hidden(int item) const {
  DSA_CHECK(item >= 0 && item < opt_.max_seqs, "engine: item index out of range");
  if (dp_ > 1) return dp_hidden_.data() + size_t(item_tok_[size_t(item)]) * size_t(m_.config.hidden_size);
  return ws_.h_final.data() + size_t(ws_.seq_first[size_t(order_[size_t(item)])]) * size_t(m_.config.hidden_size);
}

void Engine::fill_synthetic(SeqId s, int depth, uint64_t seed) {
  Seq& q = seq(s);
  if (q.len != 0) throw Error("engine: synthetic fill of a sequence that is not empty");
  if (depth < 0 || depth > opt_.max_ctx) throw Error("synthetic depth " + std::to_string(depth) + " exceeds the context size");
  const int need = int(blocks_for(depth, opt_.block_size));
  for (int k = 0; k < need; ++k) {
    const int32_t b = pool_of(q).allocate();
    if (b == BlockPool::kNone) throw Error("engine: the KV cache pool is too small for a synthetic depth of " + std::to_string(depth));
    q.blocks.push_back(b);
  }
  if (q.owner == me_) fill_cache_synthetic(m_.config, kv_, q.blocks.data(), depth, seed);
  q.len = q.mtp_len = depth;
  q.tokens.assign(size_t(depth), 0);
  q.synthetic = true;  // filler, never published
}

}  // namespace dsa
