#include "model/kv_cache.h"

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace dsa {

void KvCache::Free::operator()(void* p) const { std::free(p); }

namespace {
MlaCacheView latent_format(const ModelConfig& cfg, CacheType type) {
  MlaCacheView v;
  v.type = type;
  v.kv_lora = cfg.kv_lora_rank;
  v.rope = cfg.qk_rope_head_dim;
  v.ue8m0 = cfg.quant.scale_ue8m0;
  return v;
}

// Zeroed pages from the system on first touch (calloc maps large blocks lazily): a large
// pool costs memory only as sequences fill it.
template <class T>
T* zeroed(size_t n, const char* what) {
  void* p = std::calloc(n ? n : 1, sizeof(T));
  if (!p) throw Error(std::string("KV cache: cannot allocate the ") + what + " (" + std::to_string(n * sizeof(T)) + " bytes)");
  return static_cast<T*>(p);
}
}  // namespace

size_t KvCache::bytes_per_token(const ModelConfig& cfg, CacheType type, bool mtp) {
  const size_t latent = latent_format(cfg, type).token_bytes();
  size_t b = 0;
  const int n = cfg.num_hidden_layers + (mtp ? 1 : 0);
  for (int l = 0; l < n; ++l) b += latent + (cfg.is_indexer_full(l) ? 132 : 0);
  return b;
}

KvCache::KvCache(const ModelConfig& cfg, const KvCacheOptions& opt) : opt_(opt), proto_(latent_format(cfg, opt.type)) {
  if (opt.block_size < 1 || opt.n_blocks < 1) throw Error("KV cache: block size and block count must be positive");
  const size_t slots = size_t(opt.n_blocks) * size_t(opt.block_size);
  const int n = cfg.num_hidden_layers + (opt.mtp ? 1 : 0);
  layers_.resize(size_t(n));
  for (int l = 0; l < n; ++l) {
    Layer& L = layers_[size_t(l)];
    L.mla.reset(zeroed<uint8_t>(slots * proto_.token_bytes(), "latent cache"));
    if (cfg.is_indexer_full(l)) {
      L.index_k.reset(zeroed<uint8_t>(slots * 128, "indexer key cache"));
      L.index_scale.reset(zeroed<float>(slots, "indexer scale cache"));
    }
  }
}

size_t KvCache::bytes() const {
  const size_t slots = size_t(opt_.n_blocks) * size_t(opt_.block_size);
  size_t b = 0;
  for (const Layer& L : layers_) b += slots * (proto_.token_bytes() + (L.index_k ? 132 : 0));
  return b;
}

MlaCacheView KvCache::mla(int layer, const int32_t* blocks) const {
  MlaCacheView v = proto_;
  v.data = layers_[size_t(layer)].mla.get();
  v.blocks = blocks;
  v.block_size = opt_.block_size;
  return v;
}

}  // namespace dsa
