#pragma once
// KvCache: the storage of every sequence's caches, one pool of fixed-size blocks for the
// engine's lifetime. A block holds block_size consecutive tokens of one sequence in every
// layer: the MLA latent (+ rope key) in the chosen format and, for layers that run their own
// indexer, the fp8 indexer keys with one f32 scale per token (132 bytes). The MTP layer's
// caches are one more layer. Which block belongs to whom is the block manager's business;
// this type only stores and addresses.
#include <cstdint>
#include <vector>

#include "core/huge_pages.h"
#include "kernels/kernels.h"
#include "model/config.h"

namespace dsa {

struct KvCacheOptions {
  int block_size = 64;  // tokens per block
  int n_blocks = 0;
  CacheType type = CacheType::FP8;
  bool mtp = false;     // also hold the MTP layer's caches
  // The main layers held, [first_layer, end_layer) (end_layer < 0: to the last): a pipeline
  // stage holds its own layers' caches only.
  int first_layer = 0, end_layer = -1;
};

class KvCache {
public:
  KvCache(const ModelConfig& cfg, const KvCacheOptions& opt);

  // Bytes one token takes in the caches of the layers `opt` holds (what a block costs, per
  // token; opt's block size and count do not matter).
  static size_t bytes_per_token(const ModelConfig& cfg, const KvCacheOptions& opt);

  const KvCacheOptions& options() const { return opt_; }
  int block_size() const { return opt_.block_size; }
  int n_blocks() const { return opt_.n_blocks; }
  int n_layers() const { return int(layers_.size()); }  // main layers + the MTP layer when held
  bool holds(int layer) const { return layers_[size_t(layer)].mla.data() != nullptr; }
  size_t bytes() const;

  // Layer `layer`'s latent cache seen through a sequence's block table.
  MlaCacheView mla(int layer, const int32_t* blocks) const;
  bool has_index(int layer) const { return layers_[size_t(layer)].index_k.data() != nullptr; }
  uint8_t* index_k(int layer) const { return layers_[size_t(layer)].index_k.data(); }  // [slots, 128] e4m3
  float* index_scale(int layer) const {  // [slots]
    return reinterpret_cast<float*>(layers_[size_t(layer)].index_scale.data());
  }

private:
  // On 2 MiB pages where the system allows (core/huge_pages.h): the sparse attention's
  // gathers and the indexer scan read all over these.
  struct Layer {
    AnonBuffer mla, index_k, index_scale;
  };
  KvCacheOptions opt_;
  MlaCacheView proto_;  // format of every layer's latent cache
  std::vector<Layer> layers_;
};

// Fills cache positions [0, depth) of a sequence (its block table) in every layer with
// random latents (unit RMS, like kv_a_layernorm output), rope keys and fp8 indexer keys.
// Used by `dsa bench` to measure decode and prefill at depth without a long prefill first:
// the cost of a step does not depend on the cached values (every indexer key is scanned
// and exactly min(index_topk, context) latents are read).
void fill_cache_synthetic(const ModelConfig& cfg, KvCache& kv, const int32_t* blocks, int depth, uint64_t seed);

}  // namespace dsa
