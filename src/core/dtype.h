#pragma once
// Scalar conversions between the checkpoint dtypes and f32. These are the reference
// conversions; SIMD kernels must agree with them bit for bit.
#include <cstddef>
#include <cstdint>
#include <array>
#include <cstring>
#include <string>

namespace dsa {

enum class DType { F32, F16, BF16, F8_E4M3, I32, I64, U8, I8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);            // safetensors spelling: "F32", "F8_E4M3", ...
bool dtype_from_name(const std::string& s, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, NaN kept quiet (what torch's .to(bfloat16) does).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits, no infinities,
// 0x7f/0xff are NaN, largest finite 448. Decoding goes through a 256-entry table.
extern const std::array<float, 256> kFp8E4M3Table;
inline float fp8_e4m3_to_f32(uint8_t v) { return kFp8E4M3Table[v]; }

// Round-to-nearest-even encode; input must already be clamped to [-448, 448].
uint8_t f32_to_fp8_e4m3(float x);

}  // namespace dsa
