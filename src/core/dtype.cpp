#include "core/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace dsa {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::F16: case DType::BF16: return 2;
    case DType::F8_E4M3: case DType::U8: case DType::I8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::I8: return "I8";
  }
  return "?";
}

bool dtype_from_name(const std::string& s, DType* out) {
  static const struct { const char* n; DType t; } kNames[] = {
      {"F32", DType::F32}, {"F16", DType::F16},   {"BF16", DType::BF16}, {"F8_E4M3", DType::F8_E4M3},
      {"I32", DType::I32}, {"I64", DType::I64},   {"U8", DType::U8},     {"I8", DType::I8}};
  for (const auto& e : kNames)
    if (s == e.n) { *out = e.t; return true; }
  return false;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0) v = std::ldexp(float(man), -24);
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = std::ldexp(float(man | 0x400), int(exp) - 25);
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u |= sign;
  std::memcpy(&v, &u, 4);
  return v;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;
  if (a < std::ldexp(1.0f, -14)) {  // subnormal: multiples of 2^-24
    return sign | uint16_t(std::nearbyint(std::ldexp(a, 24)));
  }
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int q = int(std::nearbyint((m * 2.0f - 1.0f) * 1024.0f));
  int be = e - 1 + 15;
  if (q == 1024) { q = 0; ++be; }
  return sign | uint16_t(be << 10) | uint16_t(q);
}

namespace {
constexpr float pow2(int e) {
  float r = 1.0f;
  for (; e > 0; --e) r *= 2.0f;
  for (; e < 0; ++e) r *= 0.5f;
  return r;
}
constexpr std::array<float, 256> make_fp8_table() {
  std::array<float, 256> t{};
  for (int i = 0; i < 256; ++i) {
    const int e = (i >> 3) & 0xf, m = i & 7;
    float x;
    if (e == 0xf && m == 7) x = std::numeric_limits<float>::quiet_NaN();
    else if (e == 0) x = float(m) * pow2(-9);  // subnormal: m * 2^-9
    else x = (1.0f + float(m) / 8.0f) * pow2(e - 7);
    t[i] = (i & 0x80) ? -x : x;
  }
  return t;
}
}  // namespace

const std::array<float, 256> kFp8E4M3Table = make_fp8_table();

uint8_t f32_to_fp8_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (a < 0.015625f) {  // below the smallest normal 2^-6: subnormal steps of 2^-9
    const int q = int(std::nearbyint(a * 512.0f));  // 0..8; 8 encodes 2^-6 exactly
    return sign | uint8_t(q);
  }
  // Normal range: keep the f32 exponent and the top 3 of its 23 mantissa bits, rounding the
  // 20 dropped bits to nearest, ties to even (a carry out of the mantissa bumps the
  // exponent, as it should), then rebias the exponent from 127 to 7.
  uint32_t u;
  std::memcpy(&u, &a, 4);
  u += 0x7FFFFu + ((u >> 20) & 1u);
  return uint8_t(sign | uint8_t((u >> 20) - (120u << 3)));
}

}  // namespace dsa
