// The amx tier's prefill GEMM (linear's contract) on AMX BF16 tiles; everything else in the
// tier is the avx512 tier's code.
//
// Numerics. TDPBF16PS multiplies bf16 pairs exactly and sums in f32, so the weights go in
// exactly: e4m3 codes and bf16 weights are exact bf16 values; the fp8 block scale is applied
// to each 128-column block's partial sums in f32 (as the reference applies it per block).
// Each f32 activation is split into three bf16 parts, x = hi + mid + lo within 2^-27 |x|,
// each multiplied as its own row block: three tile products per weight tile, about f32's
// accuracy in place of bf16's (the golden tolerances and routing margins are f32's).
//
// Layout. A tiles (16 x 32 bf16) hold 16 tokens of one part, straight from the split
// activations [3][n_pad][kc]. B tiles hold 16 weight rows in the VNNI pair layout: tile row
// k2 is the sixteen (w[r][2 k2], w[r][2 k2 + 1]) pairs, a 16 x 16 transpose of 32-bit pairs.
// A unit of up to 128 weight rows is packed once per K chunk and multiplied by every token
// tile in pairs: four C tiles (32 tokens x 32 rows), two A and two B tiles (a lone last
// token tile or row panel runs alone).
//
// Built twice: natively, and for the tests with DSA_AMX_EMULATED, where the tile
// instructions are a plain C++ model of their documented semantics (the AVX-512 code stays
// native), so that everything but the tile unit itself is checked on machines without AMX.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <immintrin.h>

#include "core/dtype.h"
#include "kernels/cpu/cpu.h"

#ifndef DSA_AMX_EMULATED
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,amx-tile,amx-bf16"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,amx-tile,amx-bf16")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "kernels/cpu/simd512.h"

#ifdef DSA_AMX_EMULATED
#define DSA_AMX_NS amx_emulated
#else
#define DSA_AMX_NS amx
#endif

namespace dsa::kernels::cpu::DSA_AMX_NS {
namespace {

// LDTILECFG's 64-byte operand (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 0, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

#ifdef DSA_AMX_EMULATED
// The tile unit as Intel documents it: eight tiles of up to 16 rows of 64 bytes, shaped by
// the loaded configuration; TDPBF16PS adds to each f32 of C the products of bf16 pairs, the
// even element's product first (the Intrinsics Guide's order; the SDM's text keeps even and
// odd products in two sums per instruction, a difference in the last bits: no test compares
// this GEMM bitwise with another tier's), with denormal inputs and results flushed.
struct Tile {
  int rows = 0, colsb = 0;
  alignas(64) uint8_t d[16][64] = {};
};
thread_local Tile t_tiles[8];

void emu_config(const TileConfig* c) {
  for (int t = 0; t < 8; ++t) {
    t_tiles[t].rows = c->rows[t];
    t_tiles[t].colsb = c->colsb[t];
  }
}
void emu_load(int t, const void* base, long stride) {
  Tile& x = t_tiles[t];
  for (int r = 0; r < 16; ++r) {
    std::memset(x.d[r], 0, 64);
    if (r < x.rows) std::memcpy(x.d[r], static_cast<const uint8_t*>(base) + r * stride, size_t(x.colsb));
  }
}
void emu_store(int t, void* base, long stride) {
  const Tile& x = t_tiles[t];
  for (int r = 0; r < x.rows; ++r) std::memcpy(static_cast<uint8_t*>(base) + r * stride, x.d[r], size_t(x.colsb));
}
void emu_zero(int t) {
  for (auto& row : t_tiles[t].d) std::memset(row, 0, 64);
}
float flush_denormal(float v) { return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v; }
float emu_bf16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return flush_denormal(bf16_to_f32(h));
}
void emu_dpbf16ps(int c, int a, int b) {
  Tile &C = t_tiles[c], &A = t_tiles[a], &B = t_tiles[b];
  for (int m = 0; m < C.rows; ++m)
    for (int n = 0; n < C.colsb / 4; ++n) {
      float acc;
      std::memcpy(&acc, C.d[m] + 4 * n, 4);
      for (int k = 0; k < A.colsb / 4; ++k) {
        acc = flush_denormal(acc + emu_bf16(A.d[m] + 4 * k) * emu_bf16(B.d[k] + 4 * n));
        acc = flush_denormal(acc + emu_bf16(A.d[m] + 4 * k + 2) * emu_bf16(B.d[k] + 4 * n + 2));
      }
      std::memcpy(C.d[m] + 4 * n, &acc, 4);
    }
}
#define DSA_TILE_CONFIG(cfg) emu_config(cfg)
#define DSA_TILE_LOAD(t, base, stride) emu_load(t, base, long(stride))
#define DSA_TILE_STORE(t, base, stride) emu_store(t, base, long(stride))
#define DSA_TILE_ZERO(t) emu_zero(t)
#define DSA_TILE_DP(c, a, b) emu_dpbf16ps(c, a, b)
#else
// GCC's tile loads are asm statements that do not say they read memory: a compiler barrier
// keeps the packing stores before them.
#define DSA_TILE_CONFIG(cfg)             \
  do {                                   \
    __asm__ volatile("" ::: "memory"); \
    _tile_loadconfig(cfg);               \
  } while (0)
#define DSA_TILE_LOAD(t, base, stride) _tile_loadd(t, base, stride)
#define DSA_TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define DSA_TILE_ZERO(t) _tile_zero(t)
#define DSA_TILE_DP(c, a, b) _tile_dpbf16ps(c, a, b)
#endif

// Every tile 16 rows of 64 bytes: C tiles 0-3 (16 tokens x 16 f32), A tiles 4-5
// (16 tokens x 32 bf16), B tiles 6-7 (16 pair rows x 16 pairs).
void configure_tiles() {
  TileConfig cfg;
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  DSA_TILE_CONFIG(&cfg);
}

// Round to nearest even in bf16 (finite values): the f32 bits, 16 lanes.
inline __m512i bf16_bits(__m512 v) {
  const __m512i b = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  return _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
}
inline __m512 bf16_value(__m512i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)); }

// Rows [r0, r0 + nr) of W, columns [k0, k0 + kc), as B tiles: panel p (rows 16 p ..) and
// k step s (32 columns) at wp + (p * kc / 2 + 16 s) * 32; rows past nr in the last of the
// `panels` panels are zeros.
void pack_rows(const Linear& w, int r0, int nr, int k0, int kc, int panels, uint16_t* wp) {
  const size_t ld = size_t(w.cols);
  const __m512i sub = _mm512_load_si512(kFp8SubnormalBf16.v);
  for (int p = 0; p < panels; ++p)
    for (int s = 0; s < kc / 32; ++s) {
      __m512 rows[16];  // 16 pairs of bf16 per row, as 32-bit lanes
      for (int j = 0; j < 16; ++j) {
        const int r = 16 * p + j;
        const size_t off = size_t(r0 + r) * ld + size_t(k0 + 32 * s);
        if (r >= nr) rows[j] = _mm512_setzero_ps();
        else if (w.dtype == DType::F8_E4M3) rows[j] = _mm512_castsi512_ps(bf16x32_from_fp8(w.data + off, sub));  // exact values
        else rows[j] = _mm512_loadu_ps(w.data + 2 * off);
      }
      // Row k2 of the B tile: pair k2 of each of the 16 rows.
      transpose16_store(rows, reinterpret_cast<float*>(wp + (size_t(p) * size_t(kc / 2) + size_t(16 * s)) * 32));
    }
}

// Adds the stored C tiles of TT token tiles x PP row panels, scaled per weight row (s[0:32]),
// to the 32 x 32 accumulator.
template <int TT, int PP>
inline void add_scaled(const float (*c)[16][16], const float* s, float (*acc)[32]) {
  const __m512 s0 = _mm512_loadu_ps(s), s1 = _mm512_loadu_ps(s + 16);
  for (int i = 0; i < TT; ++i)
    for (int m = 0; m < 16; ++m) {
      float* a = acc[16 * i + m];
      _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_loadu_ps(c[2 * i][m]), s0, _mm512_loadu_ps(a)));
      if constexpr (PP == 2) _mm512_storeu_ps(a + 16, _mm512_fmadd_ps(_mm512_loadu_ps(c[2 * i + 1][m]), s1, _mm512_loadu_ps(a + 16)));
    }
}

// One block of TT token tiles x PP row panels (up to 32 tokens x 32 rows) over the chunk:
// per scale block, the tile products of the three activation parts, then the block's sums
// scaled into acc. C tile 2 i + j holds token tile i and panel j; a lone last token tile or
// panel runs as a block of one, not as a pair with zeros.
template <int TT, int PP>
void block_product(const uint16_t* xs, int n_pad, int kc, int kblock, const uint16_t* wp, const float* ws, int t0, int p0,
                   float (*acc)[32]) {
  const size_t lda = size_t(kc) * 2, part = size_t(n_pad) * size_t(kc);
  const uint16_t* a0 = xs + size_t(16 * t0) * size_t(kc);
  const uint16_t* b0 = wp + size_t(p0) * size_t(kc / 2) * 32;
  const uint16_t* b1 = b0 + size_t(kc / 2) * 32;
  std::memset(acc, 0, 32 * 32 * sizeof(float));
  alignas(64) float c[4][16][16];
  for (int kb = 0; kb < kc; kb += kblock) {
    DSA_TILE_ZERO(0);
    if constexpr (PP == 2) DSA_TILE_ZERO(1);
    if constexpr (TT == 2) DSA_TILE_ZERO(2);
    if constexpr (TT == 2 && PP == 2) DSA_TILE_ZERO(3);
    for (int k = kb; k < std::min(kc, kb + kblock); k += 32) {
      DSA_TILE_LOAD(6, b0 + size_t(k / 2) * 32, 64);
      if constexpr (PP == 2) DSA_TILE_LOAD(7, b1 + size_t(k / 2) * 32, 64);
      for (int q = 0; q < 3; ++q) {
        const uint16_t* a = a0 + size_t(q) * part + size_t(k);
        DSA_TILE_LOAD(4, a, lda);
        DSA_TILE_DP(0, 4, 6);
        if constexpr (PP == 2) DSA_TILE_DP(1, 4, 7);
        if constexpr (TT == 2) {
          DSA_TILE_LOAD(5, a + 16 * size_t(kc), lda);
          DSA_TILE_DP(2, 5, 6);
          if constexpr (PP == 2) DSA_TILE_DP(3, 5, 7);
        }
      }
    }
    DSA_TILE_STORE(0, c[0], 64);
    if constexpr (PP == 2) DSA_TILE_STORE(1, c[1], 64);
    if constexpr (TT == 2) DSA_TILE_STORE(2, c[2], 64);
    if constexpr (TT == 2 && PP == 2) DSA_TILE_STORE(3, c[3], 64);
    add_scaled<TT, PP>(c, ws + size_t(kb / kblock) * kAmxUnitRows + size_t(16 * p0), acc);
  }
}

// Each unit row's scale for each scale block of the chunk (ones for bf16 weights).
void unit_scales(const Linear& w, int r0, int nr, int k0, int kc, int kblock, float* ws) {
  for (int kb = 0; kb * kblock < kc; ++kb)
    for (int r = 0; r < kAmxUnitRows; ++r) {
      float s = 1.0f;
      if (w.dtype == DType::F8_E4M3 && r < nr)
        s = w.scale[size_t((r0 + r) / w.block_rows) * size_t(w.scale_cols()) + size_t((k0 + kb * kblock) / w.block_cols)];
      ws[size_t(kb) * kAmxUnitRows + size_t(r)] = r < nr ? s : 0.0f;
    }
}

void split_x(const float* x, size_t ldx, int n, int i0, int i1, int k0, int kc, int n_pad, uint16_t* xs) {
  const size_t part = size_t(n_pad) * size_t(kc);
  for (int i = i0; i < i1; ++i) {
    uint16_t* h = xs + size_t(i) * size_t(kc);
    if (i >= n) {
      for (int q = 0; q < 3; ++q) std::memset(h + q * part, 0, size_t(kc) * 2);
      continue;
    }
    const float* xi = x + size_t(i) * ldx + size_t(k0);
    for (int k = 0; k < kc; k += 16) {
      const __m512 v = _mm512_loadu_ps(xi + k);
      const __m512i hi = bf16_bits(v);
      const __m512 r1 = _mm512_sub_ps(v, bf16_value(hi));
      const __m512i mid = bf16_bits(r1);
      const __m512i lo = bf16_bits(_mm512_sub_ps(r1, bf16_value(mid)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(h + k), _mm512_cvtepi32_epi16(hi));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(h + part + k), _mm512_cvtepi32_epi16(mid));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(h + 2 * part + k), _mm512_cvtepi32_epi16(lo));
    }
  }
}

void unit(const Linear& w, int r0, int nr, int k0, int kc, const uint16_t* xs, int n, int n_pad, float* y, size_t ldy,
          bool accumulate, uint16_t* wp) {
  const int panels = (nr + 15) / 16, tiles = (n + 15) / 16;
  const int kblock = w.dtype == DType::F8_E4M3 ? w.block_cols : kc;
  alignas(64) float ws[(kAmxKc / 32) * kAmxUnitRows];
  unit_scales(w, r0, nr, k0, kc, kblock, ws);
  pack_rows(w, r0, nr, k0, kc, panels, wp);
  configure_tiles();  // after the pack: the configuration's barrier keeps its stores before the tile loads
  alignas(64) float acc[32][32];
  for (int t0 = 0; t0 < tiles; t0 += 2)
    for (int p0 = 0; p0 < panels; p0 += 2) {
      const bool tt = t0 + 1 < tiles, pp = p0 + 1 < panels;
      if (tt && pp) block_product<2, 2>(xs, n_pad, kc, kblock, wp, ws, t0, p0, acc);
      else if (tt) block_product<2, 1>(xs, n_pad, kc, kblock, wp, ws, t0, p0, acc);
      else if (pp) block_product<1, 2>(xs, n_pad, kc, kblock, wp, ws, t0, p0, acc);
      else block_product<1, 1>(xs, n_pad, kc, kblock, wp, ws, t0, p0, acc);
      const int mr = std::min(32, n - 16 * t0), cr = std::min(32, nr - 16 * p0);
      for (int m = 0; m < mr; ++m) {
        float* yr = y + size_t(16 * t0 + m) * ldy + size_t(16 * p0);
        if (accumulate)
          for (int j = 0; j < cr; ++j) yr[j] += acc[m][j];
        else
          std::memcpy(yr, acc[m], size_t(cr) * sizeof(float));
      }
    }
}

// The peak probe: four independent C tiles, each TDPBF16PS 16 x 16 x 32 pairs.
void dot_loop(long iters) {
  alignas(64) static const uint16_t zeros[16 * 32] = {};
  configure_tiles();
  DSA_TILE_LOAD(4, zeros, 64);
  DSA_TILE_LOAD(5, zeros, 64);
  DSA_TILE_LOAD(6, zeros, 64);
  DSA_TILE_LOAD(7, zeros, 64);
  DSA_TILE_ZERO(0);
  DSA_TILE_ZERO(1);
  DSA_TILE_ZERO(2);
  DSA_TILE_ZERO(3);
  for (long i = 0; i < iters; ++i) {
    DSA_TILE_DP(0, 4, 6);
    DSA_TILE_DP(1, 4, 7);
    DSA_TILE_DP(2, 5, 6);
    DSA_TILE_DP(3, 5, 7);
  }
  alignas(64) float c[16][16];
  DSA_TILE_STORE(0, c, 64);
}

}  // namespace
}  // namespace dsa::kernels::cpu::DSA_AMX_NS

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

namespace dsa::kernels::cpu {
#ifdef DSA_AMX_EMULATED
const AmxKernels& amx_emulated_kernels() {
  static const AmxKernels k{amx_emulated::split_x, amx_emulated::unit, amx_emulated::dot_loop};
  return k;
}
#else
const AmxKernels& amx_native() {
  static const AmxKernels k{amx::split_x, amx::unit, amx::dot_loop};
  return k;
}

bool request_amx_permission() {
  // Linux hands out the 8 KB tile data state only on request (arch_prctl
  // ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); the permission covers the whole process.
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

#endif
}  // namespace dsa::kernels::cpu
