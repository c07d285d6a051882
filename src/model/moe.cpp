// Mixture of experts, DeepSeek-V3 "noaux_tc" routing, tokens grouped by expert.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "kernels/kernels.h"
#include "model/forward.h"

namespace dsa {
namespace {

// Routing for one token. sig: sigmoid scores [E]; bias: e_score_correction_bias.
// Selection uses sig + bias; with n_group > 1 only the topk_group groups with the
// largest sum of their two best biased scores stay eligible. The weights are the
// unbiased sigmoid scores of the chosen experts, normalized, times routed_scaling_factor.
void route(const ModelConfig& c, const float* sig, const Vec& bias, int32_t* ids, float* weights) {
  const int E = c.n_routed_experts, k = c.num_experts_per_tok, G = c.n_group;
  // Stack scratch sized by the bounds ModelConfig::validate enforces; checked here too, since
  // a config could be built in code without validation.
  DSA_CHECK(E <= kMaxRoutedExperts && G <= kMaxExpertGroups && k <= E, "route: config beyond the validated bounds");
  float sel[kMaxRoutedExperts];
  bool eligible[kMaxRoutedExperts];
  for (int e = 0; e < E; ++e) {
    sel[e] = sig[e] + bias.at(e);
    eligible[e] = true;
  }
  if (G > 1) {
    const int per = E / G;
    float gscore[kMaxExpertGroups];
    int gorder[kMaxExpertGroups];
    for (int g = 0; g < G; ++g) {
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int e = g * per; e < (g + 1) * per; ++e) {
        if (sel[e] > b1) { b2 = b1; b1 = sel[e]; }
        else if (sel[e] > b2) b2 = sel[e];
      }
      gscore[g] = b1 + b2;
      gorder[g] = g;
    }
    // std::sort with an index tie-break: same order as a stable sort, and no temporary
    // buffer (stable_sort allocates, and this runs in the decode loop).
    std::sort(gorder, gorder + G, [&](int a, int b) { return gscore[a] > gscore[b] || (gscore[a] == gscore[b] && a < b); });
    for (int r = c.topk_group; r < G; ++r)
      for (int e = gorder[r] * per; e < (gorder[r] + 1) * per; ++e) eligible[e] = false;
  }
  int order[kMaxRoutedExperts];
  int m = 0;
  for (int e = 0; e < E; ++e)
    if (eligible[e]) order[m++] = e;
  std::partial_sort(order, order + k, order + m, [&](int a, int b) { return sel[a] > sel[b] || (sel[a] == sel[b] && a < b); });
  double sum = 0;
  for (int j = 0; j < k; ++j) {
    ids[j] = order[j];
    weights[j] = sig[order[j]];
    sum += sig[order[j]];
  }
  const double norm = c.norm_topk_prob ? 1.0 / (sum + 1e-20) : 1.0;
  for (int j = 0; j < k; ++j) weights[j] = float(weights[j] * norm * c.routed_scaling_factor);
}

}  // namespace

// Copies the tokens that picked expert e (grouped by expert_offset / expert_rows) into their
// rows of s.xg and returns those rows.
static const float* gather_tokens(State& s, int e, int k, int H) {
  const int cnt = s.expert_count[size_t(e)], off = s.expert_offset[size_t(e)];
  float* xg = &s.xg[size_t(off) * size_t(H)];
  for (int j = 0; j < cnt; ++j)
    std::copy_n(&s.xn[size_t(s.expert_rows[size_t(off + j)] / k) * size_t(H)], H, xg + size_t(j) * size_t(H));
  return xg;
}

// moe_out row t = the routing-weighted sum of token t's k expert outputs, slots in order
// (the reference's summation order).
static void combine_token(State& s, int t, int k, int H) {
  float* out = &s.moe_out[size_t(t) * size_t(H)];
  std::fill(out, out + H, 0.0f);
  for (int j = 0; j < k; ++j) {
    const int r = t * k + j;
    const float wt = s.expert_w[size_t(r)];
    const float* dj = &s.d[size_t(s.expert_pos[size_t(r)]) * size_t(H)];
    for (int h = 0; h < H; ++h) out[h] += wt * dj[h];
  }
}

void moe_block(const Model& m, const MoeWeights& w, State& s, int layer, int pos0, int n, const Tap* tap) {
  const ModelConfig& c = m.config;
  const int E = c.n_routed_experts, k = c.num_experts_per_tok, H = c.hidden_size, I = c.moe_intermediate_size;

  // Router in f32 (GLM's moe_router_dtype, and what vLLM forces for both families).
  kernels::linear(w.gate, s.xn.data(), n, s.router.data());
  for (size_t i = 0; i < size_t(n) * size_t(E); ++i) s.router[i] = 1.0f / (1.0f + std::exp(-s.router[i]));
  for (int i = 0; i < n; ++i) {
    route(c, &s.router[size_t(i) * size_t(E)], w.e_score_correction_bias, &s.expert_ids[size_t(i) * size_t(k)],
          &s.expert_w[size_t(i) * size_t(k)]);
    if (tap && tap->ints) tap->ints("moe.experts." + std::to_string(layer), pos0 + i, &s.expert_ids[size_t(i) * size_t(k)], k);
  }

  // Group the (token, slot) pairs by expert so each expert's weights are read once per call.
  std::fill(s.expert_count.begin(), s.expert_count.begin() + E, 0);
  for (int r = 0; r < n * k; ++r) ++s.expert_count[size_t(s.expert_ids[size_t(r)])];
  s.expert_offset[0] = 0;
  for (int e = 0; e < E; ++e) s.expert_offset[size_t(e) + 1] = s.expert_offset[size_t(e)] + s.expert_count[size_t(e)];
  std::fill(s.expert_count.begin(), s.expert_count.begin() + E, 0);
  for (int r = 0; r < n * k; ++r) {
    const int e = s.expert_ids[size_t(r)];
    s.expert_rows[size_t(s.expert_offset[size_t(e)] + s.expert_count[size_t(e)]++)] = r;
  }

  for (int e = 0; e < E; ++e)
    for (int j = 0; j < s.expert_count[size_t(e)]; ++j)
      s.expert_pos[size_t(s.expert_rows[size_t(s.expert_offset[size_t(e)] + j)])] = s.expert_offset[size_t(e)] + j;

  // Experts in parallel, one per thread at a time (dynamic: their token counts differ),
  // each running its three GEMMs on its own thread: one parallel region per layer instead
  // of three per expert, and every expert's rows stay disjoint in xg, g, u and d.
  int n_active = 0;
  for (int e = 0; e < E; ++e)
    if (s.expert_count[size_t(e)] > 0) s.expert_active[size_t(n_active++)] = e;
  if (n <= kernels::kGemvMaxTokens && 2 * n_active + 2 <= 64) {
    // Decode, and a speculative step's few tokens: every active expert (with the tokens
    // that picked it) and the shared expert in two calls, gate+up then down, each one
    // parallel region over all their rows, so each expert's weights stream once.
    const int S = w.has_shared ? w.shared_experts.gate_proj.rows : 0;
    const size_t routed = size_t(n) * size_t(k);  // grouped rows; the shared expert's follow
    kernels::LinearJob jobs[64];
    int nj = 0;
    for (int a = 0; a < n_active; ++a) {
      const int e = s.expert_active[size_t(a)], cnt = s.expert_count[size_t(e)], off = s.expert_offset[size_t(e)];
      const float* xg = gather_tokens(s, e, k, H);
      const MlpWeights& ex = w.experts[size_t(e)];
      jobs[nj++] = {&ex.gate_proj, xg, &s.g[size_t(off) * size_t(I)], cnt};
      jobs[nj++] = {&ex.up_proj, xg, &s.u[size_t(off) * size_t(I)], cnt};
    }
    if (w.has_shared) {
      jobs[nj++] = {&w.shared_experts.gate_proj, s.xn.data(), &s.g[routed * size_t(I)], n};
      jobs[nj++] = {&w.shared_experts.up_proj, s.xn.data(), &s.u[routed * size_t(I)], n};
    }
    kernels::linear_multi(jobs, nj);
    kernels::silu_mul(s.g.data(), s.u.data(), routed * size_t(I) + size_t(n) * size_t(S), s.g.data());
    nj = 0;
    for (int a = 0; a < n_active; ++a) {
      const int e = s.expert_active[size_t(a)], cnt = s.expert_count[size_t(e)], off = s.expert_offset[size_t(e)];
      jobs[nj++] = {&w.experts[size_t(e)].down_proj, &s.g[size_t(off) * size_t(I)], &s.d[size_t(off) * size_t(H)], cnt};
    }
    if (w.has_shared) jobs[nj++] = {&w.shared_experts.down_proj, &s.g[routed * size_t(I)], &s.d[routed * size_t(H)], n};
    kernels::linear_multi(jobs, nj);
    // Weighted combine per token, then the shared expert.
    for (int t = 0; t < n; ++t) {
      combine_token(s, t, k, H);
      if (w.has_shared) {
        float* out = &s.moe_out[size_t(t) * size_t(H)];
        const float* ds = &s.d[(routed + size_t(t)) * size_t(H)];
        for (int h = 0; h < H; ++h) out[h] += ds[h];
      }
    }
    return;
  }

  auto run_expert = [&](int e) {
    const int cnt = s.expert_count[size_t(e)], off = s.expert_offset[size_t(e)];
    const float* xg = gather_tokens(s, e, k, H);
    const MlpWeights& ex = w.experts[size_t(e)];
    float* g = &s.g[size_t(off) * size_t(I)];
    float* u = &s.u[size_t(off) * size_t(I)];
    kernels::linear(ex.gate_proj, xg, cnt, g);
    kernels::linear(ex.up_proj, xg, cnt, u);
    kernels::silu_mul(g, u, size_t(cnt) * size_t(I), g);
    kernels::linear(ex.down_proj, g, cnt, &s.d[size_t(off) * size_t(H)]);
  };
#pragma omp parallel for schedule(dynamic, 1)
  for (int a = 0; a < n_active; ++a) run_expert(s.expert_active[size_t(a)]);

  // Weighted combine per token (each output row written by one thread).
#pragma omp parallel for schedule(static)
  for (int t = 0; t < n; ++t) combine_token(s, t, k, H);
  if (w.has_shared) {
    mlp_block(w.shared_experts, s, n, s.xn.data(), s.d.data());
    for (size_t i = 0; i < size_t(n) * size_t(H); ++i) s.moe_out[i] += s.d[i];
  }
}

}  // namespace dsa
