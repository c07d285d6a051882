#include <cstring>

#include "core/error.h"
#include "kernels/kernels.h"

namespace dsa {

size_t Linear::bytes() const {
  size_t b = size_t(rows) * size_t(cols) * dtype_size(dtype);
  if (dtype == DType::F8_E4M3) b += size_t((rows + block_rows - 1) / block_rows) * size_t(scale_cols()) * 4;
  return b;
}

float Vec::at(int i) const {
  switch (dtype) {
    case DType::F32: { float v; std::memcpy(&v, data + 4 * size_t(i), 4); return v; }
    case DType::BF16: { uint16_t h; std::memcpy(&h, data + 2 * size_t(i), 2); return bf16_to_f32(h); }
    case DType::F16: { uint16_t h; std::memcpy(&h, data + 2 * size_t(i), 2); return f16_to_f32(h); }
    default: DSA_CHECK(false, "unsupported vector dtype");
  }
  return 0;
}

size_t MlaCacheView::token_bytes() const {
  switch (type) {
    case CacheType::F32: return size_t(kv_lora + rope) * 4;
    case CacheType::BF16: return size_t(kv_lora + rope) * 2;
    case CacheType::FP8: return size_t(kv_lora) + 4 * size_t((kv_lora + 127) / 128) + 4 * size_t(rope);
    case CacheType::FP8_656: return size_t(kv_lora) + 4 * size_t((kv_lora + 127) / 128) + 2 * size_t(rope);
  }
  return 0;
}

}  // namespace dsa
