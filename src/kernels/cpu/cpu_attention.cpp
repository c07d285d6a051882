// Lightning-indexer scan, top-k selection and sparse MLA attention on the CPU.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/simd.h"
#include "kernels/ref/ref.h"

namespace dsa::kernels::cpu {
namespace {

// s[j][h] = Σ_d k_j[d] qT[d][h] for 8 tokens (rows k[0..7], d values each) and the 8 heads
// of one lane group: heads in SIMD lanes, one q load and eight broadcasts per d feed
// eight FMAs, no horizontal sums. qT rows have stride ldq; s rows stride lds.
__attribute__((target("avx2,fma"))) inline void scores_8tok(const float* qT, size_t ldq, const float* const* k, int d, float* s,
                                                           size_t lds) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  const float *k0 = k[0], *k1 = k[1], *k2 = k[2], *k3 = k[3], *k4 = k[4], *k5 = k[5], *k6 = k[6], *k7 = k[7];
  for (int i = 0; i < d; ++i, qT += ldq) {
    const __m256 q = _mm256_load_ps(qT);
    a0 = _mm256_fmadd_ps(q, _mm256_broadcast_ss(k0 + i), a0);
    a1 = _mm256_fmadd_ps(q, _mm256_broadcast_ss(k1 + i), a1);
    a2 = _mm256_fmadd_ps(q, _mm256_broadcast_ss(k2 + i), a2);
    a3 = _mm256_fmadd_ps(q, _mm256_broadcast_ss(k3 + i), a3);
    a4 = _mm256_fmadd_ps(q, _mm256_broadcast_ss(k4 + i), a4);
    a5 = _mm256_fmadd_ps(q, _mm256_broadcast_ss(k5 + i), a5);
    a6 = _mm256_fmadd_ps(q, _mm256_broadcast_ss(k6 + i), a6);
    a7 = _mm256_fmadd_ps(q, _mm256_broadcast_ss(k7 + i), a7);
  }
  _mm256_store_ps(s + 0 * lds, a0); _mm256_store_ps(s + 1 * lds, a1);
  _mm256_store_ps(s + 2 * lds, a2); _mm256_store_ps(s + 3 * lds, a3);
  _mm256_store_ps(s + 4 * lds, a4); _mm256_store_ps(s + 5 * lds, a5);
  _mm256_store_ps(s + 6 * lds, a6); _mm256_store_ps(s + 7 * lds, a7);
}

// scores_8tok for NT = 6 or 4 tokens and 16 heads (two lane groups): two q loads and NT
// broadcasts feed 2 NT FMAs per d, fewer loads per FMA than 8 tokens x 8 heads. Six keep
// twelve independent accumulators in flight (4 cycles of FMA latency x 2 ports need at least
// eight; with exactly eight the loop runs about a quarter slower in L1); four serve the
// remainder. The accumulators are named, not an array: as an array GCC keeps them on the stack.
template <int NT>
__attribute__((target("avx2,fma"))) inline void scores_ntok_16h(const float* qT, size_t ldq, const float* const* k, int d, float* s,
                                                               size_t lds) {
  static_assert(NT == 4 || NT == 6);
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
  __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0;
  const float *k0 = k[0], *k1 = k[1], *k2 = k[2], *k3 = k[3], *k4 = k[0], *k5 = k[0];
  if constexpr (NT == 6) {
    k4 = k[4];
    k5 = k[5];
  }
  for (int i = 0; i < d; ++i, qT += ldq) {
    const __m256 qa = _mm256_load_ps(qT), qb = _mm256_load_ps(qT + 8);
    __m256 kv = _mm256_broadcast_ss(k0 + i);
    a0 = _mm256_fmadd_ps(qa, kv, a0); b0 = _mm256_fmadd_ps(qb, kv, b0);
    kv = _mm256_broadcast_ss(k1 + i);
    a1 = _mm256_fmadd_ps(qa, kv, a1); b1 = _mm256_fmadd_ps(qb, kv, b1);
    kv = _mm256_broadcast_ss(k2 + i);
    a2 = _mm256_fmadd_ps(qa, kv, a2); b2 = _mm256_fmadd_ps(qb, kv, b2);
    kv = _mm256_broadcast_ss(k3 + i);
    a3 = _mm256_fmadd_ps(qa, kv, a3); b3 = _mm256_fmadd_ps(qb, kv, b3);
    if constexpr (NT == 6) {
      kv = _mm256_broadcast_ss(k4 + i);
      a4 = _mm256_fmadd_ps(qa, kv, a4); b4 = _mm256_fmadd_ps(qb, kv, b4);
      kv = _mm256_broadcast_ss(k5 + i);
      a5 = _mm256_fmadd_ps(qa, kv, a5); b5 = _mm256_fmadd_ps(qb, kv, b5);
    }
  }
  _mm256_store_ps(s, a0); _mm256_store_ps(s + 8, b0);
  _mm256_store_ps(s + lds, a1); _mm256_store_ps(s + lds + 8, b1);
  _mm256_store_ps(s + 2 * lds, a2); _mm256_store_ps(s + 2 * lds + 8, b2);
  _mm256_store_ps(s + 3 * lds, a3); _mm256_store_ps(s + 3 * lds + 8, b3);
  if constexpr (NT == 6) {
    _mm256_store_ps(s + 4 * lds, a4); _mm256_store_ps(s + 4 * lds + 8, b4);
    _mm256_store_ps(s + 5 * lds, a5); _mm256_store_ps(s + 5 * lds + 8, b5);
  }
}

// n tokens (a multiple of 4; rows padded) for 16 heads: blocks of six, the rest in fours.
__attribute__((target("avx2,fma"))) inline void scores_16h(const float* qT, size_t ldq, const float* const* k, int n, int d, float* s,
                                                          size_t lds) {
  int n6 = n / 6;
  while ((n - 6 * n6) % 4 != 0) --n6;
  int j = 0;
  for (; j < 6 * n6; j += 6) scores_ntok_16h<6>(qT, ldq, k + j, d, s + size_t(j) * lds, lds);
  for (; j < n; j += 4) scores_ntok_16h<4>(qT, ldq, k + j, d, s + size_t(j) * lds, lds);
}

// Heads in SIMD lanes, twelve keys at a time: dot_j[h] = Σ_d qT[d][h] * k_j[d] through the
// register blocks above, no horizontal sum until each key's ReLU-weighted head sum (one
// per key). The keys are widened with integer ops only (fp8x8_bits: 2^-120 times their
// values, subnormal codes on f32 subnormals), q is 2^64 times its e4m3 values, and w
// undoes the 2^-56 (a power of two: it commutes with the ReLU). Products of two e4m3
// values are exact in f32 and stay far from the subnormal range, so only the summation
// order differs from the reference. qT is [128][hp] with hp = n_heads rounded up to 8;
// padded heads have q = 0 and w = 0 and add nothing.
__attribute__((target("avx2,fma,f16c"))) void indexer_scores_lanes(const float* qT, const float* w, int hp, const uint8_t* k8,
                                                                   const float* k_scale, int t0, int t1, float* out) {
  constexpr int kKeys = 12;
  alignas(32) float kb[kKeys][128];
  alignas(32) float dots[kKeys * 64];  // [key][hp]
  const float* rows[kKeys];
  for (int j = 0; j < kKeys; ++j) rows[j] = kb[j];
  const int g16 = hp / 16 * 2;  // lane groups taken in pairs, 6 keys at a time; an odd last one 8 keys at a time
  for (int t = t0; t < t1; t += kKeys) {
    const int cnt = std::min(kKeys, t1 - t);
    // A run's last keys (a 64-token cache block is five blocks and four keys) take only the
    // kernels they need: four or six keys for a lane-group pair, eight for an odd group; the
    // rows those kernels read are widened (padding keys repeat the first, unused).
    const int pair_keys = cnt <= 4 ? 4 : cnt <= 6 ? 6 : kKeys, odd_keys = cnt <= 8 ? 8 : kKeys;
    const int nw = std::max(g16 > 0 ? pair_keys : 0, g16 < hp / 8 ? odd_keys : 0);
    for (int j = 0; j < nw; ++j) {
      const uint8_t* src = k8 + size_t(j < cnt ? t + j : t) * 128;
      for (int c = 0; c < 128; c += 8) _mm256_store_ps(&kb[j][c], fp8x8_bits(src + c));
    }
    for (int g = 0; g < g16; g += 2) {
      if (pair_keys == 4) {
        scores_ntok_16h<4>(qT + 8 * g, size_t(hp), rows, 128, dots + 8 * g, size_t(hp));
        continue;
      }
      scores_ntok_16h<6>(qT + 8 * g, size_t(hp), rows, 128, dots + 8 * g, size_t(hp));
      if (pair_keys > 6) scores_ntok_16h<6>(qT + 8 * g, size_t(hp), rows + 6, 128, dots + 6 * hp + 8 * g, size_t(hp));
    }
    if (g16 < hp / 8) {
      // Keys 0-7, then 4-11: keys 4-7 are computed twice, the same way, to the same values.
      scores_8tok(qT + 8 * g16, size_t(hp), rows, 128, dots + 8 * g16, size_t(hp));
      if (odd_keys > 8) scores_8tok(qT + 8 * g16, size_t(hp), rows + 4, 128, dots + 4 * hp + 8 * g16, size_t(hp));
    }
    for (int j = 0; j < cnt; ++j) out[t + j] = relu_weighted_sum(dots + j * hp, w, hp) * k_scale[t + j];
  }
}

}  // namespace

void indexer_scores(const uint8_t* q8, const float* w, int n_heads, const IndexKeyView& keys, int n_keys, float* out) {
  bool fast = use_avx2() && n_heads <= 64;
  for (int h = 0; h < n_heads && fast; ++h) fast = std::fabs(w[h]) < 0x1p60f;  // w * 2^56 stays finite
  if (!fast) {
    ref::indexer_scores(q8, w, n_heads, keys, n_keys, out);
    return;
  }
  const int hp = (n_heads + 7) / 8 * 8;
  const bool wide = use_avx512() && hp % 16 == 0;  // the avx512 scan: whole registers of 16 heads
  const bool bf16 = wide && bf16_dot();
  alignas(64) float qT[128 * 64];
  alignas(64) uint32_t qP[64 * 64];  // the bf16 scan's q: row pairs of bf16 (kernels/cpu/cpu.h)
  alignas(32) float wp[64];
  // bf16 bits of an e4m3 value times 2^-56: exact, the value has four significant bits.
  auto bf16_bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u >> 16;
  };
  for (int h = 0; h < hp; ++h) {
    wp[h] = h < n_heads ? w[h] * 0x1p56f : 0.0f;  // undoes 2^64 * 2^-120 (positive: commutes with ReLU)
    if (bf16) {
      for (int i = 0; i < 64; ++i) {
        const float lo = h < n_heads ? fp8_e4m3_to_f32(q8[h * 128 + 2 * i]) * 0x1p-56f : 0.0f;
        const float hi = h < n_heads ? fp8_e4m3_to_f32(q8[h * 128 + 2 * i + 1]) * 0x1p-56f : 0.0f;
        qP[i * hp + h] = bf16_bits(lo) | (bf16_bits(hi) << 16);
      }
      continue;
    }
    for (int d = 0; d < 128; ++d) qT[d * hp + h] = h < n_heads ? fp8_e4m3_to_f32(q8[h * 128 + d]) * 0x1p64f : 0.0f;
  }
  // The scan over every cached key (132 bytes each) goes in chunks of up to 256 keys that
  // are contiguous in the pool (never across a block), split across threads.
  constexpr int kChunk = 256;
  const int span = keys.blocks ? keys.block_size : std::max(n_keys, 1);  // keys per contiguous run
  const int per_run = (span + kChunk - 1) / kChunk;
  const int runs = (n_keys + span - 1) / span;
  auto chunk = [&](int c) {
    const int run = c / per_run, t0 = run * span + (c % per_run) * kChunk;
    const int t1 = std::min({n_keys, t0 + kChunk, (run + 1) * span});
    if (t0 >= t1) return;
    const int64_t slot = keys.slot(t0);
    if (bf16) avx512_kernels().indexer_lanes_bf16(qP, wp, hp, keys.k8 + size_t(slot) * 128, keys.k_scale + slot, 0, t1 - t0, out + t0);
    else if (wide) avx512_kernels().indexer_lanes(qT, wp, hp, keys.k8 + size_t(slot) * 128, keys.k_scale + slot, 0, t1 - t0, out + t0);
    else indexer_scores_lanes(qT, wp, hp, keys.k8 + size_t(slot) * 128, keys.k_scale + slot, 0, t1 - t0, out + t0);
  };
  const int n_chunks = runs * per_run;
  if (n_chunks == 1 || omp_get_level() > 0) {  // one chunk, or one query per thread in a step
    for (int c = 0; c < n_chunks; ++c) chunk(c);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int c = 0; c < n_chunks; ++c) chunk(c);
}

namespace {
// Scores as unsigned keys in the same order (higher key = higher score), branch-free:
// positive floats get the top bit set, negative ones are inverted. Adding +0 first
// turns -0 into +0, so the two zeros tie as they do for the reference's comparison.
inline uint32_t order_key(float f) {
  f += 0.0f;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u ^ (uint32_t(int32_t(u) >> 31) | 0x80000000u);
}
}  // namespace

void topk(const float* scores, int n, int k, int32_t* out) {
  // Selection without sorting and without a copy of the scores: a radix select on the
  // order keys (11 + 11 + 10 bits) finds the k-th largest key tau exactly and how many keys
  // equal to tau belong to the set. A last pass emits, in position order, every key above
  // tau and the first `ties` keys at tau: ties go to the lower positions.
  DSA_CHECK(k <= n, "topk: k > n");
  if (k == 0) return;
  // Level 1 over every key, into two histograms taken alternately: neighbouring scores tend
  // to share a bin, and one histogram makes each increment wait for the previous one.
  const bool wide = use_avx512();
  uint32_t h0[2048] = {}, h1[2048] = {};
  if (wide) {
    avx512_kernels().topk_bins(scores, n, h0, h1);
  } else {
    int i = 0;
    for (; i + 2 <= n; i += 2) {
      ++h0[order_key(scores[i]) >> 21];
      ++h1[order_key(scores[i + 1]) >> 21];
    }
    if (i < n) ++h0[order_key(scores[i]) >> 21];
  }
  int need = k;  // keys still wanted among those matching `prefix` on the fixed bits
  int bin = 2047;
  for (; bin > 0 && int(h0[bin] + h1[bin]) < need; --bin) need -= int(h0[bin] + h1[bin]);
  uint32_t prefix = uint32_t(bin) << 21, hi_mask = 0x7FFu << 21;
  // Levels 2 and 3 look only at the keys in that bin: gathered once into a stack buffer
  // when they fit (then two passes over all n keys are one), else re-read from the scores.
  constexpr int kCand = 4096;
  uint32_t cand[kCand + 16];  // the avx512 gather's whole-register stores run up to 16 past
  const int in_bin = int(h0[bin] + h1[bin]);
  const bool gathered = in_bin <= kCand;
  int m = 0;
  if (gathered && wide) {
    m = avx512_kernels().topk_gather(scores, n, hi_mask, prefix, cand);
  } else if (gathered) {
    for (int j = 0; j < n; ++j) {
      const uint32_t key = order_key(scores[j]);
      if ((key & hi_mask) == prefix) cand[m++] = key;
    }
  }
  constexpr int kShift[2] = {10, 0}, kBits[2] = {11, 10};
  for (int level = 0; level < 2; ++level) {
    uint32_t hist[2048] = {};
    const int sh = kShift[level];
    const uint32_t low = (1u << kBits[level]) - 1;
    if (gathered) {
      for (int j = 0; j < m; ++j)
        if ((cand[j] & hi_mask) == prefix) ++hist[(cand[j] >> sh) & low];
    } else {
      for (int j = 0; j < n; ++j) {
        const uint32_t key = order_key(scores[j]);
        if ((key & hi_mask) == prefix) ++hist[(key >> sh) & low];
      }
    }
    int b = int(low);
    for (; b > 0 && int(hist[b]) < need; --b) need -= int(hist[b]);
    prefix |= uint32_t(b) << sh;
    hi_mask |= low << sh;
  }
  const uint32_t tau = prefix;
  int cnt = 0, ties = need;
  if (wide) {
    avx512_kernels().topk_emit(scores, n, tau, ties, k, out);
    return;
  }
  for (int j = 0; j < n && cnt < k; ++j) {
    const uint32_t key = order_key(scores[j]);
    if (key > tau || (key == tau && ties-- > 0)) out[cnt++] = j;
  }
}

namespace {

// A bf16 or fp8 cached token's row as f32: latent [kv_lora] and k_rope [rope], with the same
// bit tricks as the weight kernels; every value is the reference's (mla_cache_read).
__attribute__((target("avx2,fma,f16c"))) void dequantize_row(const MlaCacheView& c, const uint8_t* p, float* latent, float* k_rope) {
  const int L = c.kv_lora, R = c.rope;
  if (c.type == CacheType::BF16) {
    widen16(p, true, L, latent);
    widen16(p + 2 * size_t(L), true, R, k_rope);
    return;
  }
  const int nb = (L + 127) / 128;
  int i = 0;
  // e4m3 -> f32 by bit placement (fp8x8_bits) with the 2^120 folded into the block scale: one
  // multiply of the exact product, no conversion instruction.
  for (; i + 128 <= L; i += 128) {
    float s;
    std::memcpy(&s, p + L + 4 * (i / 128), 4);
    if (!(s < 0x1p7f)) {  // s * 2^120 would overflow: the plain conversion
      for (int k = 0; k < 128; ++k) latent[i + k] = fp8_e4m3_to_f32(p[i + k]) * s;
      continue;
    }
    if (use_avx512()) {
      avx512_kernels().widen_fp8(p + i, 128, s * 0x1p120f, latent + i);
      continue;
    }
    const __m256 sv = _mm256_set1_ps(s * 0x1p120f);
    for (int k = 0; k < 128; k += 8) _mm256_storeu_ps(latent + i + k, _mm256_mul_ps(fp8x8_bits(p + i + k), sv));
  }
  for (; i < L; ++i) {
    float s;
    std::memcpy(&s, p + L + 4 * (i / 128), 4);
    latent[i] = fp8_e4m3_to_f32(p[i]) * s;
  }
  const uint8_t* r = p + L + 4 * nb;
  if (c.type == CacheType::FP8) std::memcpy(k_rope, r, size_t(R) * 4);
  else widen16(r, true, R, k_rope);
}

// One cached token as f32 [latent | rope]: a view for the f32 cache, else dequantized into buf.
const float* load_token(const MlaCacheView& c, int32_t t, float* buf) {
  const uint8_t* p = c.token(t);
  if (c.type == CacheType::F32) return reinterpret_cast<const float*>(p);
  dequantize_row(c, p, buf, buf + c.kv_lora);
  return buf;
}

}  // namespace

namespace {
constexpr int kTile = 64;  // tokens dequantized at a time: 64 x 576 f32 = 144 KB (L2)

// Thread-local scratch for one tile of the sparse decode, sized by the model's shapes (by
// reserve_scratch when the caller's state is built, else at the first call), then reused.
// The first 32-byte aligned float of a buffer allocated with 8 floats to spare (the lane
// loads of the score tiles and transposed queries are aligned).
inline float* align32(std::vector<float>& v) { return v.data() + (8 - (reinterpret_cast<uintptr_t>(v.data()) / 4) % 8) % 8; }

// One tile's online-softmax step for the lane group g of 8 heads: the tile's scores
// sc[j][8g..8g+8) (row stride ld, cnt keys) become e^(score - new running max) in place, mx
// becomes the new running max, and the result is e^(old - new) per lane (1 where the max
// did not rise, about 0 on the first tile), by which the caller rescales what it
// accumulated so far (output and running sum) before adding the tile's share.
__attribute__((target("avx2,fma"))) inline __m256 softmax_tile_exp(float* sc, size_t ld, int cnt, int g, __m256& mx) {
  __m256 tmax = mx;
  for (int j = 0; j < cnt; ++j) tmax = _mm256_max_ps(tmax, _mm256_load_ps(sc + size_t(j) * ld + size_t(8 * g)));
  const __m256 alpha = exp8(_mm256_sub_ps(mx, tmax));
  mx = tmax;
  for (int j = 0; j < cnt; ++j) {
    float* sj = sc + size_t(j) * ld + size_t(8 * g);
    _mm256_store_ps(sj, exp8(_mm256_sub_ps(_mm256_load_ps(sj), tmax)));
  }
  return alpha;
}
__attribute__((target("avx2,fma"))) inline bool rescales(__m256 alpha) {
  return _mm256_movemask_ps(_mm256_cmp_ps(alpha, _mm256_set1_ps(1.0f), _CMP_NEQ_OQ)) != 0;
}

// oT[c][h] += Σ_j k_j[c] p[j][h] with the heads in lanes (oT rows of ldo values, lane
// groups g0 .. g0 + NG): NC columns x NG lane groups held in registers across the token
// loop, each broadcast column value feeding NG FMAs and each p row load NC of them. The
// token loop reads a few consecutive floats of each gathered row (a cache line serves about
// three column blocks), where a row-per-head layout needed a new line of every row at every
// step (about a sixth faster on the tile from L2).
template <int NC, int NG>
__attribute__((target("avx2,fma"))) inline void accumulate_lanes_block(const float* p, size_t ldp, const float* const* k, int nj, int c,
                                                                      float* oT, size_t ldo) {
  __m256 a[NC][NG];
  for (int i = 0; i < NC; ++i)
    for (int g = 0; g < NG; ++g) a[i][g] = _mm256_loadu_ps(oT + size_t(c + i) * ldo + size_t(8 * g));
  for (int j = 0; j < nj; ++j) {
    __m256 pv[NG];
    for (int g = 0; g < NG; ++g) pv[g] = _mm256_load_ps(p + size_t(j) * ldp + size_t(8 * g));
    const float* kj = k[j] + c;
    for (int i = 0; i < NC; ++i) {
      const __m256 kv = _mm256_broadcast_ss(kj + i);
      for (int g = 0; g < NG; ++g) a[i][g] = _mm256_fmadd_ps(kv, pv[g], a[i][g]);
    }
  }
  for (int i = 0; i < NC; ++i)
    for (int g = 0; g < NG; ++g) _mm256_storeu_ps(oT + size_t(c + i) * ldo + size_t(8 * g), a[i][g]);
}

// accumulate_lanes_block over all d columns (a multiple of 4) and hp / 8 lane groups:
// pairs of groups six columns at a time (twelve accumulators), a last single group twelve.
__attribute__((target("avx2,fma"))) inline void accumulate_lanes(const float* p, const float* const* k, int nj, int d, float* oT,
                                                                int hp) {
  const size_t ld = size_t(hp);
  int g = 0;
  for (; g + 2 <= hp / 8; g += 2) {
    int c = 0;
    for (; c + 6 <= d; c += 6) accumulate_lanes_block<6, 2>(p + 8 * g, ld, k, nj, c, oT + 8 * g, ld);
    for (; c + 2 <= d; c += 2) accumulate_lanes_block<2, 2>(p + 8 * g, ld, k, nj, c, oT + 8 * g, ld);
  }
  if (g < hp / 8) {
    int c = 0;
    for (; c + 12 <= d; c += 12) accumulate_lanes_block<12, 1>(p + 8 * g, ld, k, nj, c, oT + 8 * g, ld);
    for (; c + 4 <= d; c += 4) accumulate_lanes_block<4, 1>(p + 8 * g, ld, k, nj, c, oT + 8 * g, ld);
  }
}

struct DecodeScratch {
  std::vector<float> scores, tile;
  // The calling thread's query and softmax partials: [D][hp]; [parts][L][hp]; [parts][hp] x 2;
  // [parts + 1][hp].
  std::vector<float> qT, part_o, part_m, part_l, part_w;
  void size_parts(int hp, int D, int L, int parts) {
    auto grow = [](std::vector<float>& v, size_t n) { if (v.size() < n) v.resize(n); };
    grow(qT, size_t(D) * size_t(hp) + 8);
    grow(part_o, size_t(parts) * size_t(L) * size_t(hp));
    grow(part_m, size_t(parts) * size_t(hp));
    grow(part_l, size_t(parts) * size_t(hp));
    grow(part_w, size_t(parts + 1) * size_t(hp));
  }
  float* sc(int hp) {  // [kTile + 8][hp] (a padded last group of 8), 32-byte aligned for the lane loads
    if (scores.size() < size_t(kTile + 8) * size_t(hp) + 8) scores.resize(size_t(kTile + 8) * size_t(hp) + 8);
    return align32(scores);
  }
  float* tl(int D) {
    if (tile.size() < size_t(kTile) * size_t(D)) tile.resize(size_t(kTile) * size_t(D));
    return tile.data();
  }
};
thread_local DecodeScratch t_decode_scratch;  // namespace scope: reserve_decode_scratch sizes every thread's

// The avx512 tier's 16-head kernels run the tile (their partial outputs are head rows).
bool wide_heads(int hp) { return use_avx512() && hp % 16 == 0; }

// Softmax partials of the selected tokens idx[0..nj) for every head: oT, the unnormalized
// output, as [L][hp] (heads in lanes), or [hp][L] (a row per head) when wide_heads(hp); m
// and l [hp] (running max and sum per head). qt is the query transposed [D][hp], times the
// softmax scale. Single-threaded, one pass (online softmax per tile of kTile tokens): each
// selected token is gathered and dequantized once, its scores and its share of oT computed
// while the tile is in L1/L2; a head's outputs are rescaled only when its running max (on
// the avx2 path, that of a head of its lane group) rises.
__attribute__((target("avx2,fma,f16c"))) void sparse_decode_part(const MlaCacheView& c, const float* qt, int hp, const int32_t* idx,
                                                                 int nj, float* oT, float* m, float* l) {
  const int L = c.kv_lora, D = L + c.rope;
  const bool wide = wide_heads(hp);
  float* sc = t_decode_scratch.sc(hp);  // [token][hp] for one tile
  float* tile = t_decode_scratch.tl(D);
  std::fill(oT, oT + size_t(L) * size_t(hp), 0.0f);
  const size_t tb = c.token_bytes();
  const float* rows[kTile + 8];
  // m and l hold the running max and sum per head from the first tile on.
  std::fill(m, m + hp, -INFINITY);
  std::fill(l, l + hp, 0.0f);
  // Tokens of a quantized cache: the gather is random, so prefetch by index. Eight tokens
  // are about a hundred lines, far more than L1 can have in flight (prefetch_stream); on Zen
  // 4 the attention kernel ran 5-10% faster at depth 16384 with them bound for L2 (three
  // pairs), and on Zen 5 decode's gather over an fp8 cache runs 20-35% faster with them.
  // The f32 view of a prefill chunk goes without: its rows are 36 lines read in address
  // order, which the hardware prefetcher follows, and on Zen 5 eight of them prefetched
  // ahead held the core on a full miss queue (perf put 72% of this function's samples on
  // that loop): prefill of 512 at depth 4096 spent 1.99-2.26 ms a token in this kernel
  // without them against 2.23-2.61 with them, three interleaved pairs.
  constexpr int kAhead = 8;
  auto prefetch = [&](int j) {
    if (c.type == CacheType::F32) return;
    const uint8_t* p = c.token(idx[j]);
    for (size_t off = 0; off < tb; off += 64) prefetch_stream(p + off);
  };
  for (int j = 0; j < std::min(nj, kAhead); ++j) prefetch(j);
  for (int jt = 0; jt < nj; jt += kTile) {
    const int cnt = std::min(kTile, nj - jt);
    for (int j = 0; j < cnt; ++j) {
      if (jt + j + kAhead < nj) prefetch(jt + j + kAhead);
      rows[j] = load_token(c, idx[jt + j], tile + size_t(j) * size_t(D));
    }
    for (int j = cnt; j < (cnt + 7) / 8 * 8; ++j) rows[j] = rows[0];  // padding tokens: computed, never used
    // Scores of the tile's tokens for every head: pairs of lane groups 6 (then 4) tokens at a
    // time (on the avx512 tier one 16-lane group), a last odd group 8 tokens at a time.
    const int g16 = hp / 16 * 2;
    const int cnt4 = (cnt + 3) / 4 * 4;
    for (int g = 0; g < g16; g += 2)
      if (wide) avx512_kernels().scores16(qt + 8 * g, size_t(hp), rows, cnt4, D, sc + size_t(8 * g), size_t(hp));
      else scores_16h(qt + 8 * g, size_t(hp), rows, cnt4, D, sc + size_t(8 * g), size_t(hp));
    if (g16 < hp / 8)
      for (int jb = 0; jb < cnt; jb += 8)
        scores_8tok(qt + 8 * g16, size_t(hp), rows + jb, D, sc + size_t(jb) * size_t(hp) + size_t(8 * g16), size_t(hp));
    for (int g = 0; g < hp / 8; g += wide ? 2 : 1) {
      if (wide) {
        avx512_kernels().softmax16(sc + 8 * g, size_t(hp), cnt, m + 8 * g, l + 8 * g, oT + size_t(8 * g) * size_t(L), size_t(L), L);
        continue;
      }
      __m256 m8 = _mm256_loadu_ps(m + 8 * g), s8 = _mm256_loadu_ps(l + 8 * g);
      const __m256 alpha = softmax_tile_exp(sc, size_t(hp), cnt, g, m8);
      if (rescales(alpha)) {  // heads whose max did not rise have alpha = 1: their values stay exact
        for (int d = 0; d < L; ++d) {
          float* od = oT + size_t(d) * size_t(hp) + size_t(8 * g);
          _mm256_storeu_ps(od, _mm256_mul_ps(_mm256_loadu_ps(od), alpha));
        }
        s8 = _mm256_mul_ps(s8, alpha);
      }
      for (int j = 0; j < cnt; ++j) s8 = _mm256_add_ps(s8, _mm256_load_ps(sc + size_t(j) * size_t(hp) + size_t(8 * g)));
      _mm256_storeu_ps(m + 8 * g, m8);
      _mm256_storeu_ps(l + 8 * g, s8);
    }
    if (wide)
      for (int g = 0; g < hp; g += 16) avx512_kernels().accumulate16(sc + g, size_t(hp), rows, cnt, L, oT + size_t(g) * size_t(L), size_t(L));
    else
      accumulate_lanes(sc, rows, cnt, L, oT, hp);
  }
}

// Columns [d0, d0 + 8) of the merged output: per lane group, Σ_t w_t ⊙ oT_t over the parts
// ([L][hp] each; pw holds [parts][hp] weights, then [hp] 1 / denominator), normalized and
// transposed into o_lat's head rows (L values each).
__attribute__((target("avx2,fma"))) void merge_column_block(const float* po, const float* pw, int parts, int H, int hp, int L, int d0,
                                                           float* o_lat) {
  for (int g = 0; g < hp / 8; ++g) {
    __m256 r[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_setzero_ps();
    for (int t = 0; t < parts; ++t) {
      const __m256 w = _mm256_loadu_ps(pw + size_t(t) * size_t(hp) + size_t(8 * g));
      const float* src = po + size_t(t) * size_t(L) * size_t(hp) + size_t(d0) * size_t(hp) + size_t(8 * g);
      for (int i = 0; i < 8; ++i) r[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(src + size_t(i) * size_t(hp)), r[i]);
    }
    const __m256 inv = _mm256_loadu_ps(pw + size_t(parts) * size_t(hp) + size_t(8 * g));
    for (int i = 0; i < 8; ++i) r[i] = _mm256_mul_ps(r[i], inv);
    if (8 * g + 8 <= H) {
      transpose8x8_store(r, o_lat + size_t(8 * g) * size_t(L) + size_t(d0), size_t(L));
    } else {  // a last group with padded heads: only the real heads' rows are written
      alignas(32) float blk[8 * 8];
      transpose8x8_store(r, blk, 8);
      for (int h = 8 * g; h < H; ++h) std::memcpy(o_lat + size_t(h) * size_t(L) + size_t(d0), blk + 8 * (h - 8 * g), 8 * sizeof(float));
    }
  }
}

// Head h's row of the merged output from head-row partials ([hp][L] each), every value
// computed as merge_column_block computes it: Σ_t w_t o_t in part order, times 1 / denominator.
__attribute__((target("avx2,fma"))) void merge_head_row(const float* po, const float* pw, int parts, int hp, int L, int h,
                                                       float* o_lat) {
  const __m256 inv = _mm256_set1_ps(pw[size_t(parts) * size_t(hp) + size_t(h)]);
  for (int d = 0; d < L; d += 8) {
    __m256 r = _mm256_setzero_ps();
    for (int t = 0; t < parts; ++t)
      r = _mm256_fmadd_ps(_mm256_set1_ps(pw[size_t(t) * size_t(hp) + size_t(h)]),
                          _mm256_loadu_ps(po + (size_t(t) * size_t(hp) + size_t(h)) * size_t(L) + size_t(d)), r);
    _mm256_storeu_ps(o_lat + size_t(h) * size_t(L) + size_t(d), _mm256_mul_ps(r, inv));
  }
}

// qt rows [d_first, d_first + width) = scale * q's heads transposed (q [H][width]; padded
// heads 0): whole groups of eight heads by 8 x 8 register transposes, the rest one by one.
// The same products as one by one, so the same bits.
__attribute__((target("avx2,fma"))) void transpose_heads(const float* q, int width, int H, int hp, float scale, float* qt,
                                                         int d_first) {
  const __m256 s = _mm256_set1_ps(scale);
  int g = 0;
  for (; g + 8 <= H && width % 8 == 0; g += 8)
    for (int d = 0; d < width; d += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_mul_ps(s, _mm256_loadu_ps(q + size_t(g + i) * size_t(width) + size_t(d)));
      transpose8x8_store(r, qt + size_t(d_first + d) * size_t(hp) + size_t(g), size_t(hp));
    }
  for (int d = 0; d < width; ++d)
    for (int h = g; h < hp; ++h) qt[size_t(d_first + d) * size_t(hp) + size_t(h)] = h < H ? scale * q[size_t(h) * size_t(width) + size_t(d)] : 0.0f;
}

__attribute__((target("avx2,fma,f16c"))) void sparse_decode_avx2(const MlaCacheView& c, const float* q_lat, const float* q_rope,
                                                                 int n_heads, const int32_t* idx, int n_idx, float scale,
                                                                 float* o_lat) {
  const int L = c.kv_lora, R = c.rope, H = n_heads;
  // Heads in SIMD lanes: the tile of dequantized tokens is shared by all heads (MQA: one
  // latent serves every head). Alone, the call splits the selected tokens across threads
  // (flash-decoding) and merges the softmax partials; inside a caller's parallel loop (one
  // query per thread in a prefill chunk) it runs on its own thread.
  const int hp = (H + 7) / 8 * 8;  // heads padded to whole lane groups (pad q = 0, unused)
  const int D = L + R;
  // Pieces of kDecodePart selected tokens, a function of n_idx alone (the merge order with
  // them), taken dynamically by the threads when the call runs alone: the cores of a shared
  // machine do not run at the same speed.
  const int parts = (n_idx + kDecodePart - 1) / kDecodePart;
  const int nt = omp_get_level() > 0 ? 1 : std::min(omp_get_max_threads(), parts);
  DecodeScratch& ds = t_decode_scratch;
  ds.size_parts(hp, D, L, parts);
  float* qt = align32(ds.qT);  // 32-byte aligned rows
  transpose_heads(q_lat, L, H, hp, scale, qt, 0);  // the query transposed: [D][hp]
  transpose_heads(q_rope, R, H, hp, scale, qt, L);
  // Plain pointers: inside the parallel region a thread_local name would mean the worker's own.
  float *po = ds.part_o.data(), *pm = ds.part_m.data(), *pl = ds.part_l.data();
  auto run = [&](int t, int T) {
    const int j0 = t * kDecodePart, j1 = t == T - 1 ? n_idx : j0 + kDecodePart;
    sparse_decode_part(c, qt, hp, idx + j0, j1 - j0, po + size_t(t) * size_t(L) * size_t(hp), pm + size_t(t) * size_t(hp),
                       pl + size_t(t) * size_t(hp));
  };
  if (nt == 1) {
    for (int p = 0; p < parts; ++p) run(p, parts);
  } else {
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int p = 0; p < parts; ++p) run(p, parts);
  }
  // Merge: o = Σ_t e^(m_t - M) o_t / Σ_t e^(m_t - M) l_t. The weights per part and head
  // first; then every 8-column block of a lane group is combined over the parts, normalized
  // and transposed into o_lat's head rows, the column blocks across the threads when the
  // partials are large (128 heads x 8 parts x 512 for DeepSeek-V3.2: about 0.2 ms alone).
  float* pw = ds.part_w.data();  // [parts][hp] weights, then [hp] 1 / denominator
  for (int h = 0; h < hp; ++h) {
    float M = -INFINITY;
    for (int t = 0; t < parts; ++t) M = std::max(M, pm[size_t(t) * size_t(hp) + size_t(h)]);
    float denom = 0;
    for (int t = 0; t < parts; ++t) {
      const float lt = pl[size_t(t) * size_t(hp) + size_t(h)];
      const float w = lt == 0 ? 0.0f : std::exp(pm[size_t(t) * size_t(hp) + size_t(h)] - M);
      pw[size_t(t) * size_t(hp) + size_t(h)] = w;
      denom += w * lt;
    }
    pw[size_t(parts) * size_t(hp) + size_t(h)] = 1.0f / denom;
  }
  const bool rows = wide_heads(hp);
  const int blocks = rows ? H : L / 8;  // head rows, or 8-column blocks of the lane layout
  auto merge = [&](int b) {
    if (rows) merge_head_row(po, pw, parts, hp, L, b, o_lat);
    else merge_column_block(po, pw, parts, H, hp, L, 8 * b, o_lat);
  };
  if (nt > 1 && size_t(H) * size_t(parts) * size_t(L) >= (size_t(1) << 17)) {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int b = 0; b < blocks; ++b) merge(b);
  } else {
    for (int b = 0; b < blocks; ++b) merge(b);
  }
}
}  // namespace

void mla_sparse_decode(const MlaCacheView& c, const float* q_lat, const float* q_rope, int n_heads,
                       const int32_t* idx, int n_idx, float scale, float* o_lat) {
  if (!use_avx2() || n_heads > 256 || c.kv_lora % 16 != 0 || c.kv_lora + c.rope > 2048 || n_idx <= 0) {
    ref::mla_sparse_decode(c, q_lat, q_rope, n_heads, idx, n_idx, scale, o_lat);
    return;
  }
  sparse_decode_avx2(c, q_lat, q_rope, n_heads, idx, n_idx, scale, o_lat);
}

void reserve_decode_scratch(int n_heads, int latent_dim, int kv_lora, int max_selected) {
  const int hp = (n_heads + 7) / 8 * 8;
  t_decode_scratch.sc(hp);
  t_decode_scratch.tl(latent_dim);
  t_decode_scratch.size_parts(hp, latent_dim, kv_lora, std::max(1, (max_selected + kDecodePart - 1) / kDecodePart));
}


// ---- a token's row of the MLA cache ---------------------------------------------------
// Layouts as the reference's: [latent | k_rope] in f32 or bf16; fp8 [kv_lora e4m3 | one f32
// scale per 128 | k_rope f32 (FP8) or bf16 (FP8_656)]. Every conversion is exact or rounds
// as the reference does, so both directions give its bits (the read is dequantize_row).
void mla_cache_write(const MlaCacheView& c, int64_t t, const float* latent, const float* k_rope) {
  if (!use_avx2()) return ref::mla_cache_write(c, t, latent, k_rope);
  uint8_t* p = c.token(t);
  const size_t L = size_t(c.kv_lora), R = size_t(c.rope);
  switch (c.type) {
    case CacheType::F32:
      std::memcpy(p, latent, L * 4);
      std::memcpy(p + L * 4, k_rope, R * 4);
      return;
    case CacheType::BF16:
      narrow_bf16(latent, c.kv_lora, p);
      narrow_bf16(k_rope, c.rope, p + 2 * L);
      return;
    case CacheType::FP8:
    case CacheType::FP8_656: {
      // Runs every decode step: no heap allocation (kv_lora_rank <= 1024 is validated).
      const int nb = (c.kv_lora + 127) / 128;
      DSA_CHECK(nb <= 8, "kv_lora_rank above 1024");
      float scales[8];
      act_quant_fp8(latent, c.kv_lora, 128, c.ue8m0, p, scales);
      std::memcpy(p + L, scales, size_t(nb) * 4);
      uint8_t* r = p + L + 4 * size_t(nb);
      if (c.type == CacheType::FP8) std::memcpy(r, k_rope, R * 4);
      else narrow_bf16(k_rope, c.rope, r);
      return;
    }
  }
}

void mla_cache_read(const MlaCacheView& c, int64_t t, float* latent, float* k_rope) {
  if (!use_avx2()) return ref::mla_cache_read(c, t, latent, k_rope);
  const uint8_t* p = c.token(t);
  if (c.type != CacheType::F32) return dequantize_row(c, p, latent, k_rope);
  std::memcpy(latent, p, size_t(c.kv_lora) * 4);
  std::memcpy(k_rope, p + size_t(c.kv_lora) * 4, size_t(c.rope) * 4);
}

}  // namespace dsa::kernels::cpu
