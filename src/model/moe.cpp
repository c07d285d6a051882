// Mixture of experts, DeepSeek-V3 "noaux_tc" routing, tokens grouped by expert.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "kernels/kernels.h"
#include "model/blocks.h"

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

// Copies the tokens (rows of xn) that picked expert e (grouped by expert_offset /
// expert_rows) into their rows of ws.xg and returns those rows.
static const float* gather_tokens(Workspace& ws, const float* xn, int e, int H) {
  const int cnt = ws.expert_count[size_t(e)], off = ws.expert_offset[size_t(e)];
  float* xg = &ws.xg[size_t(off) * size_t(H)];
  kernels::gather_rows(xn, size_t(H), &ws.expert_token[size_t(off)], cnt, H, xg);
  return xg;
}

// Row t of acc = the routing-weighted sum of token t's k expert outputs, slots in order
// (the reference's order); on an expert-parallel rank, of the slots whose experts it owns
// (group_by_expert marks the others; the ranks' partial rows are summed afterwards). Rows of
// `width` columns in d and acc: the hidden size, or a tensor-parallel member's columns of it.
//
// Why doubles: the ranks of an expert-parallel layout hold disjoint slots, and adding their
// rounded f32 partial sums differs from one process's sum by an ulp or so; with an fp8
// latent cache such an ulp can move a cached value across an e4m3 rounding step (1/16 of
// it) and the logits by about 1e-3. A product of two floats is exact in a double and a sum
// of k + 1 of them rounds at 2^-53 of the largest, so the float each row ends as
// (round_rows) is the same bits however the terms are grouped over ranks, unless the sum
// lies within that of a float rounding boundary (about one value in 5e8).
static void combine(Workspace& ws, double* acc, int n, int k, int width) {
  kernels::moe_combine(ws.d.data(), width, ws.expert_pos.data(), ws.expert_w.data(), n, k, acc);
}

// The shared expert's rows of this rank, [n, rs.out] at ds, added into the combined rows
// (`width` columns from column `col0` of the hidden state) where its columns fall.
static void add_shared(double* acc, const float* ds, const MlpRows& rs, int n, int width, int col0) {
  for_each_token(n, [&](int t) {
    double* a = acc + size_t(t) * size_t(width) + size_t(rs.out0 - col0);
    const float* d = ds + size_t(t) * size_t(rs.out);
    for (int h = 0; h < rs.out; ++h) a[h] += double(d[h]);
  });
}

// Routes tokens xn [n, hidden]: each token's k experts and weights into ws.expert_ids and
// ws.expert_w. t0: the tokens' first index in the step, for the tap (-1: tokens gathered
// from every data-parallel rank, not the step's).
static void route_tokens(const Step& st, const MoeWeights& w, const float* xn, int layer, int t0, int n, bool decode) {
  const ModelConfig& c = st.m.config;
  Workspace& ws = st.ws;
  const int E = c.n_routed_experts, k = c.num_experts_per_tok;
  const Tap* tap = st.b.tap;
  // Router in f32 (GLM's moe_router_dtype, and what vLLM forces for both families), in
  // the order of the tokens' role like every other product.
  if (decode) kernels::linear_decode(w.gate, xn, n, ws.router.data());
  else kernels::linear(w.gate, xn, n, ws.router.data());
  for (size_t i = 0; i < size_t(n) * size_t(E); ++i) ws.router[i] = 1.0f / (1.0f + std::exp(-ws.router[i]));
  for (int i = 0; i < n; ++i) {
    route(c, &ws.router[size_t(i) * size_t(E)], w.e_score_correction_bias, &ws.expert_ids[size_t(i) * size_t(k)],
          &ws.expert_w[size_t(i) * size_t(k)]);
    if (tap && tap->ints && t0 >= 0)
      tap->ints("moe.experts." + std::to_string(layer), ws.pos[size_t(t0 + i)], &ws.expert_ids[size_t(i) * size_t(k)], k);
  }
}

// Groups the (token, slot) pairs of n routed tokens by expert, so that each expert's weights
// are read once per call; returns the number of this rank's experts with tokens.
static int group_by_expert(const Step& st, int n) {
  Workspace& ws = st.ws;
  const int E = st.m.config.n_routed_experts, k = st.m.config.num_experts_per_tok;
  std::fill(ws.expert_count.begin(), ws.expert_count.begin() + E, 0);
  for (int r = 0; r < n * k; ++r) ++ws.expert_count[size_t(ws.expert_ids[size_t(r)])];
  ws.expert_offset[0] = 0;
  for (int e = 0; e < E; ++e) ws.expert_offset[size_t(e) + 1] = ws.expert_offset[size_t(e)] + ws.expert_count[size_t(e)];
  std::fill(ws.expert_count.begin(), ws.expert_count.begin() + E, 0);
  for (int r = 0; r < n * k; ++r) {
    const int e = ws.expert_ids[size_t(r)];
    ws.expert_rows[size_t(ws.expert_offset[size_t(e)] + ws.expert_count[size_t(e)]++)] = r;
  }
  for (int e = 0; e < E; ++e) {
    const bool mine = st.m.shard.owns(e, E);
    for (int j = 0; j < ws.expert_count[size_t(e)]; ++j) {
      const int g = ws.expert_offset[size_t(e)] + j, r = ws.expert_rows[size_t(g)];
      ws.expert_pos[size_t(r)] = mine ? g : -1;
      ws.expert_token[size_t(g)] = r / k;
    }
  }
  // Every rank routes every token (the router is replicated); each runs only its own experts.
  int n_active = 0;
  for (int e = 0; e < E; ++e)
    if (ws.expert_count[size_t(e)] > 0 && st.m.shard.owns(e, E)) ws.expert_active[size_t(n_active++)] = e;
  return n_active;
}

static int route_and_group(const Step& st, const MoeWeights& w, const float* xn, int layer, int t0, int n, bool decode) {
  route_tokens(st, w, xn, layer, t0, n, decode);
  return group_by_expert(st, n);
}

// The shared expert runs once per token: on member 0 of an expert-parallel stage, whose
// partial output carries it into the all-reduce, or split by rows over a tensor-parallel
// stage's members. Under data-parallel attention each rank runs it for its own tokens
// instead (moe_block_dp).
static bool runs_shared_expert(const Step& st, const MoeWeights& w) {
  return w.has_shared && !st.m.shard.dp && st.m.shard.runs_shared_expert();
}

// A routed expert's rows on this rank: all of them, or a tensor-parallel member's part.
static MlpRows expert_rows(const Step& st, const MoeWeights& w) {
  return mlp_rows(st.m.shard, w.experts.front(), st.m.shard.splits_experts());
}

// Runs jobs through linear_multi, at most kMaxLinearJobs per call (each output the same
// whichever call computes it).
static void run_jobs(const kernels::LinearJob* jobs, int nj) {
  for (int j = 0; j < nj; j += kernels::kMaxLinearJobs) kernels::linear_multi(jobs + j, std::min(kernels::kMaxLinearJobs, nj - j));
}

// Decode tokens: every active expert (with the tokens that picked it) and the shared expert
// in two rounds, gate+up then down, each in as few parallel regions as the job limit
// allows, so each expert's weights stream once per step. Under tensor parallelism each round
// computes this member's rows, the intermediate parts are gathered between the rounds and
// the output's columns after them.
static void experts_decode(const Step& st, const MoeWeights& w, const float* xn, double* acc, int n, int n_active) {
  const ModelConfig& c = st.m.config;
  Workspace& ws = st.ws;
  const int k = c.num_experts_per_tok, H = c.hidden_size;
  const bool shared = runs_shared_expert(st, w);
  const MlpRows re = expert_rows(st, w), rs = shared ? mlp_rows(st.m.shard, w.shared_experts, st.m.shard.splits_mlps()) : MlpRows{};
  const size_t routed = size_t(n) * size_t(k);  // grouped rows; the shared expert's follow
  kernels::LinearJob jobs[2 * kMaxRoutedExperts + 2];
  int nj = 0;
  for (int a = 0; a < n_active; ++a) {
    const int e = ws.expert_active[size_t(a)], cnt = ws.expert_count[size_t(e)], off = ws.expert_offset[size_t(e)];
    const float* xg = gather_tokens(ws, xn, e, H);
    const MlpWeights& ex = w.experts[size_t(e)];
    jobs[nj++] = {&ex.gate_proj, xg, &ws.g[size_t(off) * size_t(re.inter)], cnt, re.inter0, re.inter};
    jobs[nj++] = {&ex.up_proj, xg, &ws.u[size_t(off) * size_t(re.inter)], cnt, re.inter0, re.inter};
  }
  float* gs = &ws.g[routed * size_t(re.inter)];  // the shared expert's intermediate
  if (shared) {
    jobs[nj++] = {&w.shared_experts.gate_proj, xn, gs, n, rs.inter0, rs.inter};
    jobs[nj++] = {&w.shared_experts.up_proj, xn, &ws.u[routed * size_t(re.inter)], n, rs.inter0, rs.inter};
  }
  run_jobs(jobs, nj);
  kernels::silu_mul(ws.g.data(), ws.u.data(), routed * size_t(re.inter) + size_t(n) * size_t(rs.inter), ws.g.data());
  // The whole intermediates (gathered into u when split): routed [routed, inter], shared after.
  const float* act = ws.g.data();
  const float* act_s = gs;
  if (re.split) {
    st.m.shard.gather_columns(ws.g.data(), int(routed), re.full_inter, ws.u.data());
    act = ws.u.data();
  }
  if (shared && rs.split) {
    float* full = &ws.u[routed * size_t(re.full_inter)];
    st.m.shard.gather_columns(gs, n, rs.full_inter, full);
    act_s = full;
  }
  nj = 0;
  for (int a = 0; a < n_active; ++a) {
    const int e = ws.expert_active[size_t(a)], cnt = ws.expert_count[size_t(e)], off = ws.expert_offset[size_t(e)];
    jobs[nj++] = {&w.experts[size_t(e)].down_proj, act + size_t(off) * size_t(re.full_inter), &ws.d[size_t(off) * size_t(re.out)], cnt,
                  re.out0, re.out};
  }
  float* ds = &ws.d[routed * size_t(re.out)];
  if (shared) jobs[nj++] = {&w.shared_experts.down_proj, act_s, ds, n, rs.out0, rs.out};
  run_jobs(jobs, nj);
  // Weighted combine per token, then the shared expert.
  combine(ws, acc, n, k, re.out);
  if (shared) add_shared(acc, ds, rs, n, re.out, re.out0);
}

// A prefill chunk: experts in parallel, one per thread at a time (dynamic: their token
// counts differ), each running its three GEMMs on its own thread: one parallel region per
// layer instead of three per expert, and every expert's rows stay disjoint in xg, g, u, d.
// Tensor-parallel experts take two regions, their intermediate parts gathered between them.
static void experts_prefill(const Step& st, const MoeWeights& w, const float* xn, double* acc, int n, int n_active) {
  const ModelConfig& c = st.m.config;
  Workspace& ws = st.ws;
  const int k = c.num_experts_per_tok, H = c.hidden_size;
  const MlpRows re = expert_rows(st, w);
  auto gate_up = [&](int e) {
    const int cnt = ws.expert_count[size_t(e)], off = ws.expert_offset[size_t(e)];
    const float* xg = gather_tokens(ws, xn, e, H);
    const MlpWeights& ex = w.experts[size_t(e)];
    float* g = &ws.g[size_t(off) * size_t(re.inter)];
    float* u = &ws.u[size_t(off) * size_t(re.inter)];
    kernels::linear(ex.gate_proj, xg, cnt, g, re.inter0, re.inter);
    kernels::linear(ex.up_proj, xg, cnt, u, re.inter0, re.inter);
    kernels::silu_mul(g, u, size_t(cnt) * size_t(re.inter), g);
  };
  auto down = [&](int e, const float* act) {
    const int cnt = ws.expert_count[size_t(e)], off = ws.expert_offset[size_t(e)];
    kernels::linear(w.experts[size_t(e)].down_proj, act + size_t(off) * size_t(re.full_inter), cnt, &ws.d[size_t(off) * size_t(re.out)],
                    re.out0, re.out);
  };
  if (!re.split) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int a = 0; a < n_active; ++a) {
      gate_up(ws.expert_active[size_t(a)]);
      down(ws.expert_active[size_t(a)], ws.g.data());
    }
  } else {
#pragma omp parallel for schedule(dynamic, 1)
    for (int a = 0; a < n_active; ++a) gate_up(ws.expert_active[size_t(a)]);
    st.m.shard.gather_columns(ws.g.data(), n * k, re.full_inter, ws.u.data());
#pragma omp parallel for schedule(dynamic, 1)
    for (int a = 0; a < n_active; ++a) down(ws.expert_active[size_t(a)], ws.u.data());
  }

  combine(ws, acc, n, k, re.out);
  if (runs_shared_expert(st, w)) {
    const MlpRows rs = mlp_rows(st.m.shard, w.shared_experts, st.m.shard.splits_mlps());
    mlp_part(st, w.shared_experts, rs, n, false, xn, ws.d.data());
    add_shared(acc, ws.d.data(), rs, n, re.out, re.out0);
  }
}

// The combined rows [n, re.out] rounded into out [n, hidden]; a tensor-parallel member's
// columns are gathered from every member.
static void round_rows(const Step& st, const MlpRows& re, const double* acc, int n, float* out) {
  float* o = re.split ? st.ws.proj_part.data() : out;
  for_each_token(n, [&](int t) {
    const size_t r = size_t(t) * size_t(re.out);
    for (size_t i = r; i < r + size_t(re.out); ++i) o[i] = float(acc[i]);
  });
  if (re.split) st.m.shard.gather_columns(o, n, st.m.config.hidden_size, out);
}

// Data-parallel attention, dispatch by all-gather: every rank's tokens of the role are
// gathered, each rank routes them all and runs its experts over them, and each token's
// partial outputs are summed onto its own rank (reduce-scatter) into mine [n, hidden].
static void moe_dp_allgather(const Step& st, const MoeWeights& w, int layer, int t0, int total, bool decode, double* mine) {
  Workspace& ws = st.ws;
  const RankShard& sh = st.m.shard;
  const int H = st.m.config.hidden_size;
  const int* rows = ws.dp_rows.data();
  sh.gather_rows(ws.xn.data() + size_t(t0) * size_t(H), rows, H, ws.moe_x.data());
  const int n_active = route_and_group(st, w, ws.moe_x.data(), layer, -1, total, decode);
  if (decode) experts_decode(st, w, ws.moe_x.data(), ws.moe_acc.data(), total, n_active);
  else experts_prefill(st, w, ws.moe_x.data(), ws.moe_acc.data(), total, n_active);
  sh.sum_scatter_rows(ws.moe_acc.data(), rows, H, mine);
}

// Data-parallel attention, dispatch by all-to-all: each rank routes its own n tokens and
// sends each, with its routes, only to the ranks that own one of its experts; they run their
// experts over what they receive and send each token's partial output back, and its rank
// sums the partials in rank order into mine [n, hidden].
static void moe_dp_alltoall(const Step& st, const MoeWeights& w, int layer, int t0, int n, bool decode, double* mine) {
  Workspace& ws = st.ws;
  const RankShard& sh = st.m.shard;
  const ModelConfig& c = st.m.config;
  const int H = c.hidden_size, k = c.num_experts_per_tok, E = c.n_routed_experts, G = sh.group(), R = 2 * k;
  DSA_CHECK(sh.exchange_counts && sh.exchange_rows && sh.exchange_rows_f64, "moe: data-parallel attention without its all-to-all");
  const float* xn = ws.xn.data() + size_t(t0) * size_t(H);
  route_tokens(st, w, xn, layer, t0, n, decode);
  std::copy_n(ws.expert_ids.begin(), size_t(n) * size_t(k), ws.dp_ids.begin());
  auto goes_to = [&](int i, int r) {
    for (int j = 0; j < k; ++j)
      if (sh.expert_owner(ws.dp_ids[size_t(i * k + j)], E) == r) return true;
    return false;
  };
  // Rows for member r in member order: the token's hidden state into xg, its routes (ids
  // exact as floats, weights) into dp_routes_out.
  int sent = 0;
  for (int r = 0; r < G; ++r) {
    ws.dp_send_rows[size_t(r)] = 0;
    for (int i = 0; i < n; ++i) {
      if (!goes_to(i, r)) continue;
      std::copy_n(xn + size_t(i) * size_t(H), H, &ws.xg[size_t(sent) * size_t(H)]);
      float* routes = &ws.dp_routes_out[size_t(sent) * size_t(R)];
      for (int j = 0; j < k; ++j) {
        routes[j] = float(ws.dp_ids[size_t(i * k + j)]);
        routes[k + j] = ws.expert_w[size_t(i * k + j)];
      }
      ++sent;
      ++ws.dp_send_rows[size_t(r)];
    }
  }
  sh.exchange_counts(ws.dp_send_rows.data(), ws.dp_recv_rows.data());
  int m = 0;
  for (int r = 0; r < G; ++r) m += ws.dp_recv_rows[size_t(r)];
  DSA_CHECK(m <= ws.opt.max_tokens, "moe: more tokens received than the ranks hold");
  sh.exchange_rows(ws.xg.data(), ws.dp_send_rows.data(), ws.dp_recv_rows.data(), H, ws.moe_x.data());
  sh.exchange_rows(ws.dp_routes_out.data(), ws.dp_send_rows.data(), ws.dp_recv_rows.data(), R, ws.dp_routes_in.data());
  for (int q = 0; q < m; ++q)
    for (int j = 0; j < k; ++j) {
      ws.expert_ids[size_t(q * k + j)] = int32_t(ws.dp_routes_in[size_t(q * R + j)]);
      ws.expert_w[size_t(q * k + j)] = ws.dp_routes_in[size_t(q * R + k + j)];
    }
  const int n_active = group_by_expert(st, m);
  if (decode) experts_decode(st, w, ws.moe_x.data(), ws.moe_acc.data(), m, n_active);
  else experts_prefill(st, w, ws.moe_x.data(), ws.moe_acc.data(), m, n_active);
  // The partials back to their tokens' ranks (the exchange reversed), summed in rank order.
  sh.exchange_rows_f64(ws.moe_acc.data(), ws.dp_recv_rows.data(), ws.dp_send_rows.data(), H, ws.moe_back.data());
  std::fill(mine, mine + size_t(n) * size_t(H), 0.0);
  const double* back = ws.moe_back.data();
  for (int r = 0; r < G; ++r)
    for (int i = 0; i < n; ++i) {
      if (!goes_to(i, r)) continue;
      double* o = mine + size_t(i) * size_t(H);
      for (int h = 0; h < H; ++h) o[h] += back[h];
      back += H;
    }
}

// All-to-all moves a token only to the ranks of its experts, where the all-gather moves it to
// every rank, but costs two more exchanges (the row counts, the routes) and a per-token
// return. With uniform routing a token reaches a given rank with probability
// 1 - (1 - 1/G)^k: 0.996 for DeepSeek's k = 8 on 2 ranks, 0.9 on 4, 0.66 on 8, 0.4 on 16, so
// all-to-all pays once it saves a quarter of the bytes and the step carries enough tokens
// for bytes, not latency, to set the exchange's cost.
bool moe_alltoall_pays(int ranks, int experts_per_tok, int64_t total_tokens) {
  constexpr int kMinTokens = 64;
  const double reach = 1.0 - std::pow(1.0 - 1.0 / ranks, experts_per_tok);
  return total_tokens >= kMinTokens && reach <= 0.75;
}

static bool dispatch_alltoall(const RankShard& sh, const ModelConfig& c, int total) {
  if (sh.moe_dispatch != MoeDispatch::Auto) return sh.moe_dispatch == MoeDispatch::AllToAll;
  return moe_alltoall_pays(sh.group(), c.num_experts_per_tok, total);
}

// Data-parallel attention: this rank's n tokens of one role are a block of the role's
// tokens over every rank. They meet the experts of every rank by all-gather or all-to-all
// (dispatch_alltoall), then this rank adds its shared expert.
static void moe_block_dp(const Step& st, const MoeWeights& w, int layer, int t0, int n, bool decode) {
  Workspace& ws = st.ws;
  const RankShard& sh = st.m.shard;
  const int H = st.m.config.hidden_size;
  DSA_CHECK(sh.gather_counts && sh.gather_rows && sh.sum_scatter_rows, "moe: data-parallel attention without its exchanges");
  int* rows = ws.dp_rows.data();
  sh.gather_counts(n, rows);
  int total = 0;
  for (int r = 0; r < sh.group(); ++r) total += rows[r];
  if (total == 0) return;
  if (total > ws.opt.max_tokens)  // every rank sees the same counts, so every rank stops here
    throw Error("moe: " + std::to_string(total) + " tokens over the data-parallel ranks, the workspace holds " + std::to_string(ws.opt.max_tokens));
  double* mine = ws.moe_part.data();
  if (dispatch_alltoall(sh, st.m.config, total)) moe_dp_alltoall(st, w, layer, t0, n, decode, mine);
  else moe_dp_allgather(st, w, layer, t0, total, decode, mine);
  if (n == 0) return;
  const size_t nH = size_t(n) * size_t(H);
  if (w.has_shared) {
    mlp_block(st, w.shared_experts, n, decode, ws.xn.data() + size_t(t0) * size_t(H), ws.d.data());
    for (size_t i = 0; i < nH; ++i) mine[i] += double(ws.d[i]);
  }
  round_rows(st, expert_rows(st, w), mine, n, ws.moe_out.data() + size_t(t0) * size_t(H));
}

void moe_block(const Step& st, const MoeWeights& w, int layer, int t0, int n, bool decode) {
  if (st.m.shard.dp) {
    moe_block_dp(st, w, layer, t0, n, decode);
    return;
  }
  Workspace& ws = st.ws;
  const size_t H = size_t(st.m.config.hidden_size);
  const float* xn = ws.xn.data() + size_t(t0) * H;
  double* acc = ws.moe_acc.data();
  const int n_active = route_and_group(st, w, xn, layer, t0, n, decode);
  if (decode) experts_decode(st, w, xn, acc, n, n_active);
  else experts_prefill(st, w, xn, acc, n, n_active);
  // Expert parallelism: one all-reduce of the partial outputs, n x hidden doubles. The
  // alternative, dispatching each token to the ranks of its experts and combining back
  // (all-to-all), moves k x hidden per token and pays off only when attention is split
  // by sequence across ranks; with attention on every rank every token is already
  // everywhere, and the reduce is the one collective.
  if (st.m.shard.ep > 1) {
    DSA_CHECK(st.m.shard.sum_f64, "moe: an expert-parallel model without its all-reduce");
    st.m.shard.sum_f64(acc, size_t(n) * H);
  }
  round_rows(st, expert_rows(st, w), acc, n, ws.moe_out.data() + size_t(t0) * H);
}

}  // namespace dsa
