#include "runtime/block_pool.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace dsa {

namespace {
inline uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

BlockPool::BlockPool(int n_blocks, int block_size) : n_blocks_(n_blocks), block_size_(block_size) {
  if (n_blocks < 1 || block_size < 1) throw Error("block pool: block count and block size must be positive");
  const size_t N = size_t(n_blocks);
  ref_.assign(N, 0);
  pub_.assign(N, 0);
  hash_.assign(N, 0);
  parent_.assign(N, 0);
  tokens_.assign(N * size_t(block_size), 0);
  free_.resize(N);
  for (int i = 0; i < n_blocks; ++i) free_[size_t(i)] = n_blocks - 1 - i;  // block 0 on top
  n_free_ = n_blocks;
  prev_.assign(N, kNone);
  next_.assign(N, kNone);
  size_t cap = 16;
  while (cap < 2 * N) cap *= 2;
  table_.assign(cap, kNone);
  mask_ = cap - 1;
}

uint64_t BlockPool::chain(uint64_t parent, const int32_t* tokens, int n, uint64_t seed) {
  uint64_t h = mix(parent ^ mix(seed));
  for (int i = 0; i < n; ++i) h = mix(h ^ uint64_t(uint32_t(tokens[i])));
  return h | 1;  // never 0, the parent of a first block
}

void BlockPool::lru_push(int32_t b) {
  prev_[size_t(b)] = lru_tail_;
  next_[size_t(b)] = kNone;
  if (lru_tail_ != kNone) next_[size_t(lru_tail_)] = b;
  else lru_head_ = b;
  lru_tail_ = b;
  ++n_lru_;
}

void BlockPool::lru_remove(int32_t b) {
  const int32_t p = prev_[size_t(b)], n = next_[size_t(b)];
  if (p != kNone) next_[size_t(p)] = n;
  else lru_head_ = n;
  if (n != kNone) prev_[size_t(n)] = p;
  else lru_tail_ = p;
  prev_[size_t(b)] = next_[size_t(b)] = kNone;
  --n_lru_;
}

int32_t BlockPool::table_find(uint64_t hash, uint64_t parent, const int32_t* tokens) const {
  for (uint64_t i = hash & mask_;; i = (i + 1) & mask_) {
    const int32_t b = table_[i];
    if (b == kNone) return kNone;
    if (hash_[size_t(b)] == hash && parent_[size_t(b)] == parent &&
        std::equal(tokens, tokens + block_size_, &tokens_[size_t(b) * size_t(block_size_)]))
      return b;
  }
}

void BlockPool::table_insert(int32_t b) {
  uint64_t i = hash_[size_t(b)] & mask_;
  while (table_[i] != kNone) i = (i + 1) & mask_;
  table_[i] = b;
}

void BlockPool::table_erase(int32_t b) {
  uint64_t i = hash_[size_t(b)] & mask_;
  while (table_[i] != b) i = (i + 1) & mask_;
  // Backward-shift deletion: later entries of the probe run move up into the hole, so
  // lookups never stop early and no tombstones accumulate.
  for (uint64_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
    const int32_t e = table_[j];
    if (e == kNone) break;
    const uint64_t home = hash_[size_t(e)] & mask_;
    // e may move to i when its home is not within (i, j] cyclically.
    const bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (stays) continue;
    table_[i] = e;
    i = j;
  }
  table_[i] = kNone;
}

int32_t BlockPool::allocate() {
  int32_t b = kNone;
  if (n_free_ > 0) {
    b = free_[size_t(--n_free_)];
  } else if (lru_head_ != kNone) {
    b = lru_head_;
    lru_remove(b);
    table_erase(b);
    pub_[size_t(b)] = 0;
    ++stats_.evictions;
  } else {
    return kNone;
  }
  ref_[size_t(b)] = 1;
  return b;
}

void BlockPool::ref(int32_t b) {
  DSA_CHECK(b >= 0 && b < n_blocks_, "block pool: block id out of range");
  if (ref_[size_t(b)]++ == 0 && pub_[size_t(b)]) lru_remove(b);
}

void BlockPool::unref(int32_t b) {
  DSA_CHECK(b >= 0 && b < n_blocks_ && ref_[size_t(b)] > 0, "block pool: releasing a block nobody holds");
  if (--ref_[size_t(b)] > 0) return;
  if (pub_[size_t(b)]) lru_push(b);
  else free_[size_t(n_free_++)] = b;
}

int32_t BlockPool::lookup(uint64_t hash, uint64_t parent, const int32_t* tokens) {
  ++stats_.queries;
  const int32_t b = table_find(hash, parent, tokens);
  if (b == kNone) return kNone;
  ++stats_.hits;
  ref(b);
  return b;
}

void BlockPool::publish(int32_t b, uint64_t hash, uint64_t parent, const int32_t* tokens) {
  DSA_CHECK(b >= 0 && b < n_blocks_ && ref_[size_t(b)] > 0, "block pool: publishing a block nobody holds");
  if (pub_[size_t(b)] || table_find(hash, parent, tokens) != kNone) return;
  hash_[size_t(b)] = hash;
  parent_[size_t(b)] = parent;
  std::copy_n(tokens, block_size_, &tokens_[size_t(b) * size_t(block_size_)]);
  pub_[size_t(b)] = 1;
  table_insert(b);
}

}  // namespace dsa
