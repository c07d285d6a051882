// Instruction-set tiers: what the CPU and the OS allow, read once from CPUID and XGETBV,
// and the tier the cpu backend runs (the best one, or a lower one named by DSA_ISA).
#include <cpuid.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/kernels.h"

namespace dsa::kernels {
namespace {

struct Features {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512bf16 = false, avx512vbmi = false, avx512fp16 = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  bool os_ymm = false, os_zmm = false, os_amx = false;  // XCR0: the OS saves those registers
};

uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

Features detect() {
  Features f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & bit_OSXSAVE;
  f.fma = c & bit_FMA;
  f.f16c = c & bit_F16C;
  if (osxsave) {
    const uint64_t xcr0 = xgetbv0();
    f.os_ymm = (xcr0 & 0x6) == 0x6;            // SSE and AVX state
    f.os_zmm = f.os_ymm && (xcr0 & 0xE0) == 0xE0;  // opmask, ZMM0-15 upper halves, ZMM16-31
    f.os_amx = (xcr0 & 0x60000) == 0x60000;    // XTILECFG and XTILEDATA
  }
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = b & bit_AVX2;
  f.avx512f = b & bit_AVX512F;
  f.avx512dq = b & bit_AVX512DQ;
  f.avx512bw = b & bit_AVX512BW;
  f.avx512vl = b & bit_AVX512VL;
  f.avx512vbmi = c & bit_AVX512VBMI;
  f.avx512vnni = c & bit_AVX512VNNI;
  f.avx512fp16 = d & (1u << 23);
  f.amx_bf16 = d & (1u << 22);
  f.amx_tile = d & (1u << 24);
  f.amx_int8 = d & (1u << 25);
  __cpuid_count(7, 1, a, b, c, d);
  f.avx512bf16 = a & (1u << 5);
  return f;
}

const Features& features() {
  static const Features f = detect();
  return f;
}

bool avx512(const Features& f) {
  return f.os_ymm && f.avx2 && f.fma && f.f16c && f.os_zmm && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
}

// The tile unit: CPUID and XCR0 say it is there, Linux grants the tile data state, and one
// small product on it agrees with f64 (a hypervisor can pass the CPUID bits through and
// still not run the tiles right: the tier is then reported unavailable, with the reason).
struct AmxState {
  bool usable = false;
  const char* why = "";
};
const AmxState& amx_state() {
  static const AmxState s = [] {
    const Features& f = features();
    if (!f.amx_tile || !f.amx_bf16) return AmxState{false, ""};
    if (!f.os_amx) return AmxState{false, " (tile state off in the OS)"};
    if (!avx512(f)) return AmxState{false, ""};
    if (!cpu::request_amx_permission()) return AmxState{false, " (Linux refused the tile data permission)"};
    if (!cpu::amx_self_check(cpu::amx_native())) return AmxState{false, " (the tile unit failed its self-check)"};
    return AmxState{true, ""};
  }();
  return s;
}

bool supported(Isa t) {
  const Features& f = features();
  const bool avx2 = f.os_ymm && f.avx2 && f.fma && f.f16c;
  switch (t) {
    case Isa::Generic: return true;
    case Isa::Avx2: return avx2;
    case Isa::Avx512: return avx512(f);
    case Isa::Amx: return avx512(f) && amx_state().usable;
  }
  return false;
}

Isa best() {
  Isa t = Isa::Generic;
  for (Isa c : {Isa::Avx2, Isa::Avx512, Isa::Amx})
    if (supported(c)) t = c;
  return t;
}

// DSA_ISA names a tier to run instead of the best one; a name that is not a tier, or a
// tier this CPU cannot run, is one clear message and exit status 1 (dsa reads it before any work).
Isa initial_isa() {
  const char* e = std::getenv("DSA_ISA");
  if (!e || !*e) return best();
  for (Isa t : {Isa::Generic, Isa::Avx2, Isa::Avx512, Isa::Amx}) {
    if (std::strcmp(e, isa_name(t)) != 0) continue;
    if (supported(t)) return t;
    std::fprintf(stderr, "error: DSA_ISA=%s: this CPU cannot run the %s tier (it has: %s)\n", e, e, cpu_features().c_str());
    std::exit(1);
  }
  std::fprintf(stderr, "error: DSA_ISA=%s: expected generic, avx2, avx512 or amx\n", e);
  std::exit(1);
}

// Read at first use (a static's initializer in another file may run before this one's).
Isa& current() {
  static Isa t = initial_isa();
  return t;
}

}  // namespace

const char* isa_name(Isa t) {
  switch (t) {
    case Isa::Generic: return "generic";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Amx: return "amx";
  }
  return "?";
}

bool bf16_dot_supported() { return supported(Isa::Avx512) && features().avx512bf16; }
namespace cpu {
bool vbmi_supported() { return supported(Isa::Avx512) && features().avx512vbmi; }
}  // namespace cpu

namespace {
bool& bf16_state() {
  static bool on = [] {
    const char* e = std::getenv("DSA_BF16");
    return bf16_dot_supported() && !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}
}  // namespace

bool bf16_dot() { return isa() >= Isa::Avx512 && bf16_state(); }
void set_bf16_dot(bool on) {
  DSA_CHECK(!on || bf16_dot_supported(), "this CPU has no AVX512-BF16 dot products");
  bf16_state() = on;
}

bool isa_supported(Isa t) { return supported(t); }
Isa isa() { return current(); }
void set_isa(Isa t) {
  DSA_CHECK(supported(t), std::string("this CPU cannot run the ") + isa_name(t) + " tier");
  current() = t;
}

namespace cpu {
namespace {
// w's product with x [40 tokens, w.cols] on k's tiles against f64 sums of the
// weights' values (value(r, k)).
template <class Value>
bool self_check_case(const AmxKernels& k, const Linear& w, const std::vector<float>& x, Value value) {
  constexpr int n = 40, n_pad = 48;
  std::vector<uint16_t> xs(size_t(3) * n_pad * size_t(w.cols)), wp(size_t(kAmxUnitRows) * kAmxKc);
  std::vector<float> y(size_t(n) * size_t(w.rows));
  k.split_x(x.data(), size_t(w.cols), n, 0, n_pad, 0, w.cols, n_pad, xs.data());
  k.unit(w, 0, w.rows, 0, w.cols, xs.data(), n, n_pad, y.data(), size_t(w.rows), false, wp.data());
  for (int i = 0; i < n; ++i)
    for (int r = 0; r < w.rows; ++r) {
      double sum = 0, mag = 0;
      for (int c = 0; c < w.cols; ++c) {
        const double p = double(x[size_t(i) * size_t(w.cols) + size_t(c)]) * value(r, c);
        sum += p;
        mag += std::fabs(p);
      }
      if (!(std::fabs(double(y[size_t(i) * size_t(w.rows) + size_t(r)]) - sum) <= 1e-5 * mag + 1e-30)) return false;
    }
  return true;
}
}  // namespace

bool amx_self_check(const AmxKernels& k) {
  // 40 tokens (a pair of token tiles and a lone partial one) x 48 rows (a pair of panels and
  // a lone one) x 64 columns, activations with all three parts nonzero; bf16 weights, and fp8 ones on
  // 32 x 32 scale blocks (two blocks' sums leave the tiles per row, subnormal codes included).
  constexpr int n = 40, rows = 48, cols = 64;
  std::vector<float> x(size_t(n) * cols);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < cols; ++k) x[size_t(i) * cols + k] = float((i * 7 + k * 3) % 11 - 5) / 3.0f;
  std::vector<uint16_t> wbits(size_t(rows) * cols);
  std::vector<uint8_t> codes(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < cols; ++k) {
      wbits[size_t(r) * cols + k] = f32_to_bf16(float((r * 5 + k) % 9 - 4) * 0.5f);
      codes[size_t(r) * cols + k] = uint8_t(((r * 5 + k * 3) % 0x7f) | (k % 3 == 0 ? 0x80 : 0));  // 0x7f (NaN) never
    }
  const float scales[4] = {0.5f, 0.75f, 2.0f, 0.125f};  // [2 row blocks][2 column blocks]
  Linear b, f;
  b.dtype = DType::BF16;
  b.data = reinterpret_cast<const uint8_t*>(wbits.data());
  b.rows = f.rows = rows;
  b.cols = f.cols = cols;
  f.dtype = DType::F8_E4M3;
  f.data = codes.data();
  f.scale = scales;
  f.block_rows = f.block_cols = 32;
  return self_check_case(k, b, x, [&](int r, int c) { return double(bf16_to_f32(wbits[size_t(r) * cols + c])); }) &&
         self_check_case(k, f, x, [&](int r, int c) {
           return double(fp8_e4m3_to_f32(codes[size_t(r) * cols + c])) * double(scales[(r / 32) * 2 + c / 32]);
         });
}

void force_isa(Isa t) { current() = t; }
void force_bf16_dot(bool on) { bf16_state() = on; }
namespace {
int g_bf16_tile_chunk = 0;
}  // namespace
void set_bf16_tile_chunk(int cols) { g_bf16_tile_chunk = cols; }
int bf16_tile_chunk_set() { return g_bf16_tile_chunk; }
}  // namespace cpu

std::string cpu_features() {
  const Features& f = features();
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vl, "avx512vl");
  add(f.avx512dq, "avx512dq");
  add(f.avx512vnni, "avx512vnni");
  add(f.avx512bf16, "avx512bf16");
  add(f.avx512vbmi, "avx512vbmi");
  add(f.avx512fp16, "avx512fp16");
  add(f.amx_tile, "amx-tile");
  add(f.amx_bf16, "amx-bf16");
  add(f.amx_int8, "amx-int8");
  if (f.avx512f && !f.os_zmm) s += " (zmm state off in the OS)";
  s += amx_state().why;
  return s.empty() ? "none of avx2, avx512, amx" : s;
}

}  // namespace dsa::kernels
