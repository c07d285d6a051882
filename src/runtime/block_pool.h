#pragma once
// BlockPool: who owns which cache block, and the prefix cache. Blocks are reference-counted:
// a sequence holds one reference to each block of its table. A full block whose tokens
// are final can be published under the chained hash of its tokens (the parent block's
// hash and the block's ids, as vLLM keys them); a new sequence whose prompt starts with
// published blocks takes them by reference. A published block nobody references stays
// cached, in least-recently-released order, until allocation needs it back.
//
// All bookkeeping is in arrays sized at construction (an open-addressing hash table,
// an intrusive LRU list, a free stack): allocating, publishing and evicting never touch
// the heap.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dsa {

struct PrefixStats {
  int64_t queries = 0;    // full blocks looked up
  int64_t hits = 0;       // of which were found
  int64_t evictions = 0;  // cached blocks taken back for new tokens
};

class BlockPool {
public:
  BlockPool(int n_blocks, int block_size);

  static constexpr int32_t kNone = -1;

  // A fresh block (reference count 1): a free one, else the least recently used cached
  // block, unpublished first. kNone when every block is referenced.
  int32_t allocate();
  void ref(int32_t b);
  void unref(int32_t b);

  // Chained hash of one block's tokens under its parent's hash (`parent` 0 for the first
  // block; `seed` separates caches that differ in what a block holds).
  static uint64_t chain(uint64_t parent, const int32_t* tokens, int n, uint64_t seed);
  // The published block with this hash and these tokens, with a reference taken (and
  // counted as a hit), or kNone (a miss).
  int32_t lookup(uint64_t hash, uint64_t parent, const int32_t* tokens);
  // Publishes full block b (held by the caller) under hash; a block with the same hash
  // already published keeps its place and b stays private.
  void publish(int32_t b, uint64_t hash, uint64_t parent, const int32_t* tokens);
  // Whether lookup would find the block, without taking it or counting the query.
  bool cached(uint64_t hash, uint64_t parent, const int32_t* tokens) const { return table_find(hash, parent, tokens) != kNone; }

  int n_blocks() const { return n_blocks_; }
  int block_size() const { return block_size_; }
  int free_blocks() const { return n_free_ + n_lru_; }  // allocatable now
  int cached_blocks() const { return n_lru_; }           // published, unreferenced
  int refcount(int32_t b) const { return ref_[size_t(b)]; }
  bool published(int32_t b) const { return pub_[size_t(b)] != 0; }
  const PrefixStats& stats() const { return stats_; }

private:
  int n_blocks_, block_size_;
  std::vector<int32_t> ref_;
  std::vector<uint8_t> pub_;
  std::vector<uint64_t> hash_, parent_;
  std::vector<int32_t> tokens_;            // [n_blocks, block_size] a published block's ids
  std::vector<int32_t> free_;              // stack of unreferenced unpublished blocks
  int n_free_ = 0;
  std::vector<int32_t> prev_, next_;       // LRU list of unreferenced published blocks
  int32_t lru_head_ = kNone, lru_tail_ = kNone;
  int n_lru_ = 0;
  std::vector<int32_t> table_;             // open addressing: block ids by hash, kNone empty
  uint64_t mask_ = 0;
  PrefixStats stats_;

  void lru_push(int32_t b);
  void lru_remove(int32_t b);
  void table_insert(int32_t b);
  void table_erase(int32_t b);
  int32_t table_find(uint64_t hash, uint64_t parent, const int32_t* tokens) const;
};

}  // namespace dsa
