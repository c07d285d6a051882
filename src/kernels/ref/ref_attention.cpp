#include <algorithm>
#include <cstring>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "kernels/ref/ref.h"

namespace dsa::kernels::ref {

void indexer_scores(const uint8_t* q8, const float* w, int n_heads, const IndexKeyView& keys, int n_keys, float* out) {
  for (int t = 0; t < n_keys; ++t) {
    const int64_t slot = keys.slot(t);
    const uint8_t* k8 = keys.k8 + size_t(slot) * 128;
    double s = 0;
    for (int h = 0; h < n_heads; ++h) {
      double dot = 0;
      for (int d = 0; d < 128; ++d) dot += double(fp8_e4m3_to_f32(q8[h * 128 + d])) * fp8_e4m3_to_f32(k8[d]);
      s += double(w[h]) * std::max(dot, 0.0);
    }
    out[t] = float(s * keys.k_scale[slot]);
  }
}

void topk(const float* scores, int n, int k, int32_t* out) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
  std::sort(order.begin(), order.begin() + k);  // the contract's order: ascending positions
  for (int i = 0; i < k; ++i) out[i] = order[size_t(i)];
}

void mla_cache_write(const MlaCacheView& c, int64_t t, const float* latent, const float* k_rope) {
  uint8_t* p = c.token(t);
  switch (c.type) {
    case CacheType::F32:
      std::memcpy(p, latent, size_t(c.kv_lora) * 4);
      std::memcpy(p + size_t(c.kv_lora) * 4, k_rope, size_t(c.rope) * 4);
      break;
    case CacheType::BF16:
      for (int i = 0; i < c.kv_lora; ++i) { uint16_t h = f32_to_bf16(latent[i]); std::memcpy(p + 2 * i, &h, 2); }
      for (int i = 0; i < c.rope; ++i) { uint16_t h = f32_to_bf16(k_rope[i]); std::memcpy(p + 2 * (c.kv_lora + i), &h, 2); }
      break;
    case CacheType::FP8:
    case CacheType::FP8_656: {
      // [kv_lora e4m3 | ceil(kv_lora/128) f32 scales | rope f32 (FP8) or bf16 (FP8_656)]
      // Runs every decode step: no heap allocation (kv_lora_rank <= 1024 is validated).
      const int nb = (c.kv_lora + 127) / 128;
      float scales[8];
      DSA_CHECK(nb <= 8, "kv_lora_rank above 1024");
      act_quant_fp8(latent, c.kv_lora, 128, c.ue8m0, p, scales);
      std::memcpy(p + c.kv_lora, scales, size_t(nb) * 4);
      uint8_t* r = p + c.kv_lora + 4 * nb;
      if (c.type == CacheType::FP8) std::memcpy(r, k_rope, size_t(c.rope) * 4);
      else
        for (int i = 0; i < c.rope; ++i) { uint16_t h = f32_to_bf16(k_rope[i]); std::memcpy(r + 2 * i, &h, 2); }
      break;
    }
  }
}

void mla_cache_read(const MlaCacheView& c, int64_t t, float* latent, float* k_rope) {
  const uint8_t* p = c.token(t);
  switch (c.type) {
    case CacheType::F32:
      std::memcpy(latent, p, size_t(c.kv_lora) * 4);
      std::memcpy(k_rope, p + size_t(c.kv_lora) * 4, size_t(c.rope) * 4);
      break;
    case CacheType::BF16:
      for (int i = 0; i < c.kv_lora; ++i) { uint16_t h; std::memcpy(&h, p + 2 * i, 2); latent[i] = bf16_to_f32(h); }
      for (int i = 0; i < c.rope; ++i) { uint16_t h; std::memcpy(&h, p + 2 * (c.kv_lora + i), 2); k_rope[i] = bf16_to_f32(h); }
      break;
    case CacheType::FP8:
    case CacheType::FP8_656: {
      const int nb = (c.kv_lora + 127) / 128;
      for (int i = 0; i < c.kv_lora; ++i) {
        float s;
        std::memcpy(&s, p + c.kv_lora + 4 * (i / 128), 4);
        latent[i] = fp8_e4m3_to_f32(p[i]) * s;
      }
      const uint8_t* r = p + c.kv_lora + 4 * nb;
      if (c.type == CacheType::FP8) std::memcpy(k_rope, r, size_t(c.rope) * 4);
      else
        for (int i = 0; i < c.rope; ++i) { uint16_t h; std::memcpy(&h, r + 2 * i, 2); k_rope[i] = bf16_to_f32(h); }
      break;
    }
  }
}

void mla_sparse_decode(const MlaCacheView& c, const float* q_lat, const float* q_rope, int n_heads,
                       const int32_t* idx, int n_idx, float scale, float* o_lat) {
  std::vector<float> lat(size_t(n_idx) * size_t(c.kv_lora)), kr(size_t(n_idx) * size_t(c.rope));
  for (int j = 0; j < n_idx; ++j) mla_cache_read(c, idx[j], &lat[size_t(j) * size_t(c.kv_lora)], &kr[size_t(j) * size_t(c.rope)]);
  std::vector<double> p(static_cast<size_t>(n_idx));
  for (int h = 0; h < n_heads; ++h) {
    double mx = -INFINITY;
    for (int j = 0; j < n_idx; ++j) {
      double s = 0;
      for (int d = 0; d < c.kv_lora; ++d) s += double(q_lat[size_t(h) * size_t(c.kv_lora) + size_t(d)]) * lat[size_t(j) * size_t(c.kv_lora) + size_t(d)];
      for (int d = 0; d < c.rope; ++d) s += double(q_rope[size_t(h) * size_t(c.rope) + size_t(d)]) * kr[size_t(j) * size_t(c.rope) + size_t(d)];
      p[size_t(j)] = s * scale;
      mx = std::max(mx, p[size_t(j)]);
    }
    double sum = 0;
    for (int j = 0; j < n_idx; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
    for (int d = 0; d < c.kv_lora; ++d) {
      double acc = 0;
      for (int j = 0; j < n_idx; ++j) acc += p[size_t(j)] * lat[size_t(j) * size_t(c.kv_lora) + size_t(d)];
      o_lat[size_t(h) * size_t(c.kv_lora) + size_t(d)] = float(acc / sum);
    }
  }
}

}  // namespace dsa::kernels::ref
