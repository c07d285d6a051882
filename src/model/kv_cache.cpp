#include "model/kv_cache.h"

#include <string>
#include <vector>

#include "core/error.h"

namespace dsa {

namespace {
MlaCacheView latent_format(const ModelConfig& cfg, CacheType type) {
  MlaCacheView v;
  v.type = type;
  v.kv_lora = cfg.kv_lora_rank;
  v.rope = cfg.qk_rope_head_dim;
  v.ue8m0 = cfg.quant.scale_ue8m0;
  return v;
}

// Zeroed pages from the system on first touch: a large pool costs memory only as sequences
// fill it.
AnonBuffer zeroed(size_t bytes, const char* what) {
  AnonBuffer b(bytes);
  if (!b.data()) throw Error(std::string("KV cache: cannot allocate the ") + what + " (" + std::to_string(bytes) + " bytes)");
  return b;
}
}  // namespace

namespace {
bool held(const ModelConfig& cfg, const KvCacheOptions& opt, int l) {
  const int L = cfg.num_hidden_layers;
  return l >= L ? opt.mtp : l >= opt.first_layer && (opt.end_layer < 0 || l < opt.end_layer);
}
}  // namespace

size_t KvCache::bytes_per_token(const ModelConfig& cfg, const KvCacheOptions& opt) {
  const size_t latent = latent_format(cfg, opt.type).token_bytes();
  size_t b = 0;
  const int n = cfg.num_hidden_layers + (opt.mtp ? 1 : 0);
  for (int l = 0; l < n; ++l)
    if (held(cfg, opt, l)) b += latent + (cfg.is_indexer_full(l) ? 132 : 0);
  return b;
}

KvCache::KvCache(const ModelConfig& cfg, const KvCacheOptions& opt) : opt_(opt), proto_(latent_format(cfg, opt.type)) {
  if (opt.block_size < 1 || opt.n_blocks < 1) throw Error("KV cache: block size and block count must be positive");
  const size_t slots = size_t(opt.n_blocks) * size_t(opt.block_size);
  const int n = cfg.num_hidden_layers + (opt.mtp ? 1 : 0);
  layers_.resize(size_t(n));
  for (int l = 0; l < n; ++l) {
    if (!held(cfg, opt, l)) continue;
    Layer& L = layers_[size_t(l)];
    L.mla = zeroed(slots * proto_.token_bytes(), "latent cache");
    if (cfg.is_indexer_full(l)) {
      L.index_k = zeroed(slots * 128, "indexer key cache");
      L.index_scale = zeroed(slots * sizeof(float), "indexer scale cache");
    }
  }
}

size_t KvCache::bytes() const {
  const size_t slots = size_t(opt_.n_blocks) * size_t(opt_.block_size);
  size_t b = 0;
  for (const Layer& L : layers_)
    if (L.mla.data()) b += slots * (proto_.token_bytes() + (L.index_k.data() ? 132 : 0));
  return b;
}

MlaCacheView KvCache::mla(int layer, const int32_t* blocks) const {
  MlaCacheView v = proto_;
  v.data = layers_[size_t(layer)].mla.data();
  v.blocks = blocks;
  v.block_size = opt_.block_size;
  return v;
}

void fill_cache_synthetic(const ModelConfig& cfg, KvCache& kv, const int32_t* blocks, int depth, uint64_t seed) {
  const int L = cfg.kv_lora_rank, R = cfg.qk_rope_head_dim;
  // Layers in parallel, each with its own generator seeded from (seed, layer): the filler
  // is the same whatever the thread count.
#pragma omp parallel for schedule(dynamic, 1)
  for (int l = 0; l < kv.n_layers(); ++l) {
    if (!kv.holds(l)) continue;
    uint64_t x = (seed * 0x9e3779b97f4a7c15ull + 1) ^ (uint64_t(l + 1) * 0xbf58476d1ce4e5b9ull);
    auto next = [&x] {  // xorshift64*: cheap and plenty for filler values
      x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
      return float(double((x * 0x2545f4914f6cdd1dull) >> 11) * 0x1.0p-53 * 3.4 - 1.7);
    };
    std::vector<float> lat(static_cast<size_t>(L)), kr(static_cast<size_t>(R)), ik(128);
    const MlaCacheView view = kv.mla(l, blocks);
    for (int t = 0; t < depth; ++t) {
      for (float& v : lat) v = next();
      for (float& v : kr) v = next();
      kernels::mla_cache_write(view, t, lat.data(), kr.data());
      if (kv.has_index(l)) {
        for (float& v : ik) v = next();
        const int64_t s = view.slot(t);
        kernels::act_quant_fp8(ik.data(), 128, 128, true, kv.index_k(l) + size_t(s) * 128, kv.index_scale(l) + s);
      }
    }
  }
}

}  // namespace dsa
