#pragma once
// The decoder's blocks over one step (model/*.cpp), internal to the model library.
#include "model/forward.h"

namespace dsa {

// The step as the blocks see it: tokens [0, n) in ws (decode-role tokens first, [0, nd)),
// sequence i's tokens from ws.seq_first[i], every token's position in ws.pos.
struct Step {
  const Model& m;
  KvCache& kv;
  Workspace& ws;
  const Batch& b;
  int n = 0, nd = 0;
  int first(int s) const { return ws.seq_first[size_t(s)]; }
};

// Per-token work of a few hundred nanoseconds a call (RoPE, fp8 quantization, cache writes,
// row copies) is split across the threads from this many tokens on: every token's result is
// its own, so the split changes no bit, and a prompt chunk no longer runs it on one thread
// while the others wait at the next kernel.
constexpr int kParallelTokens = 16;

// fn(i) for the tokens i in [0, n): across the threads from kParallelTokens tokens on, else
// on the calling thread without entering a parallel region (even an inactive one costs about
// a microsecond, several times per layer of every decode step).
template <class F>
void for_each_token(int n, F&& fn) {
  if (n < kParallelTokens) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; ++i) fn(i);
}

// y = x · W[row0 : row0 + nrows]ᵀ over the step's tokens (x [n, cols], y [n, nrows]; nrows
// < 0: all rows): the decode-role rows [0, nd) through the GEMV order, the rest through the
// GEMM (kernels.h).
void linear_by_role(const Linear& w, const float* x, int n, int nd, float* y, int row0 = 0, int nrows = -1);

void attention_block(const Step& st, const LayerWeights& w, int layer, int cache_layer);
void indexer_block(const Step& st, const LayerWeights& w, int layer, int cache_layer);
// Tokens [t0, t0 + n) of the step, all of one role.
void moe_block(const Step& st, const MoeWeights& w, int layer, int t0, int n, bool decode);

// The rows of an MLP this rank computes: rows [inter0, inter0 + inter) of gate_proj and
// up_proj and [out0, out0 + out) of down_proj. All of them, or under tensor parallelism
// (split) the member's 1/tp of each: the members' intermediate parts are then gathered
// (full_inter wide) before down_proj, and the rank's output is columns [out0, out0 + out)
// of the MLP's.
struct MlpRows {
  bool split = false;
  int inter0 = 0, inter = 0, full_inter = 0, out0 = 0, out = 0;
};
MlpRows mlp_rows(const RankShard& sh, const MlpWeights& w, bool split);
// out [n, r.out] = this rank's rows of down(silu(gate(in)) * up(in)), in [n, hidden];
// uses ws.g and ws.u.
void mlp_part(const Step& st, const MlpWeights& w, const MlpRows& r, int n, bool decode, const float* in, float* out);
// out [n, hidden] = the whole MLP; under tensor parallelism each member computes its rows
// and the parts are gathered, so every output is computed whole in one process's order.
void mlp_block(const Step& st, const MlpWeights& w, int n, bool decode, const float* in, float* out);
void decoder_layer(const Step& st, const LayerWeights& w, int layer, int cache_layer);

}  // namespace dsa
