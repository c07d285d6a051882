// Lightning-indexer scan, top-k selection and sparse MLA attention on the CPU.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/ref/ref.h"

namespace dsa::kernels::cpu {
namespace {

// e4m3 codes -> f32 through the half-precision bit trick (see cpu_linear.cpp): the
// result is 2^-8 times the e4m3 value.
__attribute__((target("avx2,fma,f16c"))) inline __m256 fp8x8_to_f32_scaled(const uint8_t* p) {
  const __m128i v = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(v, _mm_set1_epi16(0x80)), 8),
                                 _mm_slli_epi16(_mm_and_si128(v, _mm_set1_epi16(0x7f)), 7));
  return _mm256_cvtph_ps(h);
}

__attribute__((target("avx2,fma"))) inline float hsum(__m256 s) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

// scores[h][j] = (q[h] . k[j]) * scale for 4 heads x 4 tokens at once: 8 loads feed 16
// FMAs (a plain dot product needs two loads per FMA and starves the FMA units).
// q rows have stride dq, k rows stride dk; d (the shared length) is a multiple of 8.
__attribute__((target("avx2,fma"))) inline void scores_4x4(const float* q, size_t dq, const float* const* k, int d, float* out,
                                                          size_t ldo) {
  __m256 acc[4][4];
  for (int h = 0; h < 4; ++h)
    for (int j = 0; j < 4; ++j) acc[h][j] = _mm256_setzero_ps();
  for (int i = 0; i < d; i += 8) {
    const __m256 k0 = _mm256_loadu_ps(k[0] + i), k1 = _mm256_loadu_ps(k[1] + i), k2 = _mm256_loadu_ps(k[2] + i),
                 k3 = _mm256_loadu_ps(k[3] + i);
    for (int h = 0; h < 4; ++h) {
      const __m256 qh = _mm256_loadu_ps(q + size_t(h) * dq + size_t(i));
      acc[h][0] = _mm256_fmadd_ps(qh, k0, acc[h][0]);
      acc[h][1] = _mm256_fmadd_ps(qh, k1, acc[h][1]);
      acc[h][2] = _mm256_fmadd_ps(qh, k2, acc[h][2]);
      acc[h][3] = _mm256_fmadd_ps(qh, k3, acc[h][3]);
    }
  }
  for (int h = 0; h < 4; ++h)
    for (int j = 0; j < 4; ++j) out[size_t(h) * ldo + size_t(j)] += hsum(acc[h][j]);
}

// One key against all heads. q holds the heads' fp8 values already converted to f32
// (scaled by 2^-8 like the key): products of two e4m3 values are exact in f32, so only
// the summation order differs from the reference.
__attribute__((target("avx2,fma,f16c"))) void indexer_scores_avx2(const float* qf, const float* w, int n_heads,
                                                                  const uint8_t* k8, const float* k_scale, int t0,
                                                                  int t1, float* out) {
  for (int t = t0; t < t1; ++t) {
    __m256 k[16];
    for (int j = 0; j < 16; ++j) k[j] = fp8x8_to_f32_scaled(k8 + size_t(t) * 128 + size_t(j) * 8);
    float s = 0;
    for (int h = 0; h < n_heads; ++h) {
      const float* q = qf + size_t(h) * 128;
      __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(q), k[0]);
      __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(q + 8), k[1]);
      for (int j = 2; j < 16; j += 2) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * j), k[j], a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * j + 8), k[j + 1], a1);
      }
      const float dot = hsum(_mm256_add_ps(a0, a1)) * 65536.0f;  // undo the two 2^-8
      s += w[h] * std::max(dot, 0.0f);
    }
    out[t] = s * k_scale[t];
  }
}

// Four keys at a time against every head (n_heads a multiple of 4): the keys are widened
// once into a small L1 tile, then 4 heads x 4 keys dot products share their loads.
__attribute__((target("avx2,fma,f16c"))) void indexer_scores_blocked(const float* qf, const float* w, int n_heads, const uint8_t* k8,
                                                                     const float* k_scale, int t0, int t1, float* out) {
  alignas(32) float kb[4][128];
  alignas(32) float dots[64 * 4];
  for (int t = t0; t < t1; t += 4) {
    const int cnt = std::min(4, t1 - t);
    const float* rows[4];
    for (int j = 0; j < 4; ++j) {
      const uint8_t* src = k8 + size_t(j < cnt ? t + j : t) * 128;
      for (int c = 0; c < 128; c += 8) _mm256_store_ps(&kb[j][c], fp8x8_to_f32_scaled(src + c));
      rows[j] = kb[j];
    }
    std::fill(dots, dots + n_heads * 4, 0.0f);
    for (int h = 0; h < n_heads; h += 4) scores_4x4(qf + size_t(h) * 128, 128, rows, 128, dots + h * 4, 4);
    for (int j = 0; j < cnt; ++j) {
      float s = 0;
      for (int h = 0; h < n_heads; ++h) s += w[h] * std::max(dots[h * 4 + j] * 65536.0f, 0.0f);  // undo the two 2^-8
      out[t + j] = s * k_scale[t + j];
    }
  }
}

}  // namespace

void indexer_scores(const uint8_t* q8, const float* w, int n_heads, const uint8_t* k8, const float* k_scale,
                    int n_keys, float* out) {
  if (!has_avx2_fma() || n_heads > 64) {
    ref::indexer_scores(q8, w, n_heads, k8, k_scale, n_keys, out);
    return;
  }
  alignas(32) float qf[64 * 128];
  for (int i = 0; i < n_heads * 128; ++i) qf[i] = fp8_e4m3_to_f32(q8[i]) / 256.0f;
  // Memory-bound scan over every cached key (132 bytes each): split keys across threads.
  const int chunk = 256;
  const int n_chunks = (n_keys + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (n_chunks > 1)
  for (int c = 0; c < n_chunks; ++c) {
    if (n_heads % 4 == 0) indexer_scores_blocked(qf, w, n_heads, k8, k_scale, c * chunk, std::min(n_keys, (c + 1) * chunk), out);
    else indexer_scores_avx2(qf, w, n_heads, k8, k_scale, c * chunk, std::min(n_keys, (c + 1) * chunk), out);
  }
}

void topk(const float* scores, int n, int k, int32_t* out) {
  // Partial selection, not a full sort: one pass keeps a threshold-based candidate set.
  // Ordering (score desc, index asc) makes ties go to the lower position.
  DSA_CHECK(k <= n, "topk: k > n");
  if (k == 0) return;
  auto better = [&](int32_t a, int32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); };
  if (k == n) {
    for (int i = 0; i < n; ++i) out[i] = i;
    std::sort(out, out + n, better);
    return;
  }
  // Min-heap of the best k seen so far (root = worst kept).
  for (int i = 0; i < k; ++i) out[i] = i;
  std::make_heap(out, out + k, better);
  for (int i = k; i < n; ++i) {
    if (better(i, out[0])) {
      std::pop_heap(out, out + k, better);
      out[k - 1] = i;
      std::push_heap(out, out + k, better);
    }
  }
  std::sort_heap(out, out + k, better);
}

namespace {
__attribute__((target("avx2,fma"))) inline float dot8(const float* a, const float* b, int n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  float r = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}
__attribute__((target("avx2,fma"))) inline void axpy8(float a, const float* x, float* y, int n) {
  const __m256 va = _mm256_set1_ps(a);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}
}  // namespace

namespace {

// One cached token as f32 [latent | rope]: a view for the f32 cache, else dequantized
// into buf with the same bit tricks as the weight kernels.
__attribute__((target("avx2,fma,f16c"))) const float* load_token(const MlaCacheView& c, int32_t t, float* buf) {
  const uint8_t* p = c.data + size_t(t) * c.token_bytes();
  const int L = c.kv_lora, R = c.rope;
  switch (c.type) {
    case CacheType::F32: return reinterpret_cast<const float*>(p);
    case CacheType::BF16: {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
      int i = 0;
      for (; i + 8 <= L + R; i += 8)
        _mm256_storeu_ps(buf + i, _mm256_castsi256_ps(_mm256_slli_epi32(
                                      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))), 16)));
      for (; i < L + R; ++i) buf[i] = bf16_to_f32(h[i]);
      return buf;
    }
    case CacheType::FP8:
    case CacheType::FP8_656: {
      const int nb = (L + 127) / 128;
      int i = 0;
      for (; i + 8 <= L; i += 8) {
        float s;
        std::memcpy(&s, p + L + 4 * (i / 128), 4);
        _mm256_storeu_ps(buf + i, _mm256_mul_ps(fp8x8_to_f32_scaled(p + i), _mm256_set1_ps(s * 256.0f)));
      }
      for (; i < L; ++i) {
        float s;
        std::memcpy(&s, p + L + 4 * (i / 128), 4);
        buf[i] = fp8_e4m3_to_f32(p[i]) * s;
      }
      const uint8_t* r = p + L + 4 * nb;
      if (c.type == CacheType::FP8) std::memcpy(buf + L, r, size_t(R) * 4);
      else
        for (int k = 0; k < R; ++k) { uint16_t h; std::memcpy(&h, r + 2 * k, 2); buf[L + k] = bf16_to_f32(h); }
      return buf;
    }
  }
  return buf;
}

}  // namespace

namespace {

// o[h][0:d] += Σ_j p[h][j] k[j][0:d] for 4 heads over nj tokens, 16 columns at a time
// held in registers across the whole token loop.
__attribute__((target("avx2,fma"))) inline void accumulate_4heads(const float* p, size_t ldp, const float* kbuf, size_t ldk, int nj,
                                                                 int d, float* o, size_t ldo) {
  for (int c = 0; c < d; c += 16) {
    __m256 acc[4][2];
    for (int h = 0; h < 4; ++h) {
      acc[h][0] = _mm256_loadu_ps(o + size_t(h) * ldo + size_t(c));
      acc[h][1] = _mm256_loadu_ps(o + size_t(h) * ldo + size_t(c) + 8);
    }
    for (int j = 0; j < nj; ++j) {
      const float* kj = kbuf + size_t(j) * ldk + size_t(c);
      const __m256 k0 = _mm256_loadu_ps(kj), k1 = _mm256_loadu_ps(kj + 8);
      for (int h = 0; h < 4; ++h) {
        const __m256 ph = _mm256_broadcast_ss(p + size_t(h) * ldp + size_t(j));
        acc[h][0] = _mm256_fmadd_ps(ph, k0, acc[h][0]);
        acc[h][1] = _mm256_fmadd_ps(ph, k1, acc[h][1]);
      }
    }
    for (int h = 0; h < 4; ++h) {
      _mm256_storeu_ps(o + size_t(h) * ldo + size_t(c), acc[h][0]);
      _mm256_storeu_ps(o + size_t(h) * ldo + size_t(c) + 8, acc[h][1]);
    }
  }
}

}  // namespace

void mla_sparse_decode(const MlaCacheView& c, const float* q_lat, const float* q_rope, int n_heads,
                       const int32_t* idx, int n_idx, float scale, float* o_lat) {
  const int L = c.kv_lora, R = c.rope, H = n_heads;
  if (!has_avx2_fma() || H % 4 != 0 || L % 16 != 0 || R % 8 != 0 || L + R > 2048) {
    ref::mla_sparse_decode(c, q_lat, q_rope, n_heads, idx, n_idx, scale, o_lat);
    return;
  }
  // Split-K across threads (flash-decoding): each thread takes a range of the selected
  // tokens, dequantizes them once into a tile shared by all heads (MQA: one latent
  // serves every head), computes exact softmax partials in two register-blocked passes,
  // and the partials are merged.
  constexpr int kTile = 64;  // tokens dequantized at a time: 64 x 576 f32 = 144 KB (L2)
  const int nt = std::max(1, std::min(omp_get_max_threads(), n_idx / 32));
  static thread_local std::vector<float> scores, tile;
  static std::vector<float> part_o, part_m, part_l;  // [nt][H][L], [nt][H]
  if (part_o.size() < size_t(nt) * size_t(H) * size_t(L)) part_o.resize(size_t(nt) * size_t(H) * size_t(L));
  if (part_m.size() < size_t(nt) * size_t(H)) { part_m.resize(size_t(nt) * size_t(H)); part_l.resize(size_t(nt) * size_t(H)); }
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    const int j0 = int(int64_t(n_idx) * t / nt), j1 = int(int64_t(n_idx) * (t + 1) / nt), nj = j1 - j0;
    // Sized once for DeepSeek's index_topk (2048) so growing contexts never reallocate.
    if (scores.size() < size_t(H) * size_t(std::max(nj + 4, 2048))) scores.resize(size_t(H) * size_t(std::max(nj + 4, 2048)));
    if (tile.size() < size_t(kTile) * size_t(L + R)) tile.resize(size_t(kTile) * size_t(L + R));
    const size_t lds = size_t(nj + 4), ldt = size_t(L + R);
    float* o = &part_o[size_t(t) * size_t(H) * size_t(L)];
    float* m = &part_m[size_t(t) * size_t(H)];
    float* l = &part_l[size_t(t) * size_t(H)];
    std::fill(scores.begin(), scores.begin() + ptrdiff_t(size_t(H) * lds), 0.0f);
    std::fill(o, o + size_t(H) * size_t(L), 0.0f);
    auto load_tile = [&](int jt, int cnt, const float** rows) {
      for (int j = 0; j < 4 * ((cnt + 3) / 4); ++j) {
        float* dst = &tile[size_t(j) * ldt];
        if (j < cnt) {
          const float* src = load_token(c, idx[j0 + jt + j], dst);
          rows[j] = src;
        } else {
          rows[j] = rows[0];  // padding columns of the last 4-block: computed, never used
        }
      }
    };
    const float* rows[kTile];
    // Pass 1: scores for every (head, token).
    for (int jt = 0; jt < nj; jt += kTile) {
      const int cnt = std::min(kTile, nj - jt);
      load_tile(jt, cnt, rows);
      for (int jb = 0; jb < cnt; jb += 4)
        for (int h = 0; h < H; h += 4) {
          float* out = &scores[size_t(h) * lds + size_t(jt + jb)];
          scores_4x4(q_lat + size_t(h) * size_t(L), size_t(L), rows + jb, L, out, lds);
          const float* kr[4] = {rows[jb] + L, rows[jb + 1] + L, rows[jb + 2] + L, rows[jb + 3] + L};
          scores_4x4(q_rope + size_t(h) * size_t(R), size_t(R), kr, R, out, lds);
        }
    }
    for (int h = 0; h < H; ++h) {
      float* sh = &scores[size_t(h) * lds];
      float mx = -INFINITY;
      for (int j = 0; j < nj; ++j) mx = std::max(mx, sh[j] *= scale);
      float sum = 0;
      for (int j = 0; j < nj; ++j) sum += (sh[j] = std::exp(sh[j] - mx));
      m[h] = mx;
      l[h] = sum;
    }
    // Pass 2: o[h] += p[h][j] latent[j], the tile dequantized again (cheaper than
    // keeping every selected latent resident).
    for (int jt = 0; jt < nj; jt += kTile) {
      const int cnt = std::min(kTile, nj - jt);
      load_tile(jt, cnt, rows);
      if (c.type != CacheType::F32)
        for (int h = 0; h < H; h += 4)
          accumulate_4heads(&scores[size_t(h) * lds + size_t(jt)], lds, tile.data(), ldt, cnt, L, o + size_t(h) * size_t(L), size_t(L));
      else
        for (int j = 0; j < cnt; ++j)
          for (int h = 0; h < H; ++h) axpy8(scores[size_t(h) * lds + size_t(jt + j)], rows[j], o + size_t(h) * size_t(L), L);
    }
  }
  // Merge: o = Σ_t e^(m_t - M) o_t / Σ_t e^(m_t - M) l_t.
  for (int h = 0; h < H; ++h) {
    float M = -INFINITY;
    for (int t = 0; t < nt; ++t) M = std::max(M, part_m[size_t(t) * size_t(H) + size_t(h)]);
    float denom = 0;
    float* out = o_lat + size_t(h) * size_t(L);
    std::fill(out, out + L, 0.0f);
    for (int t = 0; t < nt; ++t) {
      const float lt = part_l[size_t(t) * size_t(H) + size_t(h)];
      if (lt == 0) continue;
      const float w = std::exp(part_m[size_t(t) * size_t(H) + size_t(h)] - M);
      denom += w * lt;
      axpy8(w, &part_o[(size_t(t) * size_t(H) + size_t(h)) * size_t(L)], out, L);
    }
    const float inv = 1.0f / denom;
    for (int d = 0; d < L; ++d) out[d] *= inv;
  }
}

void mha_sparse_prefill(const float* q, const float* kv, const float* k_rope, int n_heads, int nope, int rope,
                        int v_dim, const int32_t* idx, int n_idx, float scale, float* out) {
  if (!has_avx2_fma()) {
    ref::mha_sparse_prefill(q, kv, k_rope, n_heads, nope, rope, v_dim, idx, n_idx, scale, out);
    return;
  }
  // Called once per query from an outer parallel loop: single-threaded inside.
  const size_t kv_stride = size_t(n_heads) * size_t(nope + v_dim);
  for (int h = 0; h < n_heads; ++h) {
    const float* qh = q + size_t(h) * size_t(nope + rope);
    float* o = out + size_t(h) * size_t(v_dim);
    std::fill(o, o + v_dim, 0.0f);
    float mh = -INFINITY, lh = 0;
    for (int j = 0; j < n_idx; ++j) {
      const float* k = kv + size_t(idx[j]) * kv_stride + size_t(h) * size_t(nope + v_dim);
      const float s = (dot8(qh, k, nope) + dot8(qh + nope, k_rope + size_t(idx[j]) * size_t(rope), rope)) * scale;
      if (s > mh) {
        const float corr = std::exp(mh - s);
        for (int d = 0; d < v_dim; ++d) o[d] *= corr;
        lh *= corr;
        mh = s;
      }
      const float p = std::exp(s - mh);
      lh += p;
      axpy8(p, k + nope, o, v_dim);
    }
    const float inv = 1.0f / lh;
    for (int d = 0; d < v_dim; ++d) o[d] *= inv;
  }
}

}  // namespace dsa::kernels::cpu
