// SwiGLU MLPs (the dense layers, the shared expert), whole or split by tensor parallelism.
//
// Tensor parallelism splits an MLP by rows twice, as attention's o_proj: each member
// computes its 1/tp of gate_proj's and up_proj's rows, the members' intermediate parts are
// all-gathered, and each computes its 1/tp of down_proj's rows, gathered again. The usual
// split (down_proj by columns, one all-reduce of partial sums) moves fewer bytes, but this
// way every output is a whole dot product in one process's order, as without --tp.
#include "core/error.h"
#include "kernels/kernels.h"
#include "model/blocks.h"

namespace dsa {

MlpRows mlp_rows(const RankShard& sh, const MlpWeights& w, bool split) {
  const int inter = w.gate_proj.rows, out = w.down_proj.rows;
  if (!split || sh.tp <= 1) return {false, 0, inter, inter, 0, out};
  const int m = sh.member();
  return {true, m * (inter / sh.tp), inter / sh.tp, inter, m * (out / sh.tp), out / sh.tp};
}

void mlp_part(const Step& st, const MlpWeights& w, const MlpRows& r, int n, bool decode, const float* in, float* out) {
  Workspace& ws = st.ws;
  if (decode) {
    const kernels::LinearJob gu[] = {{&w.gate_proj, in, ws.g.data(), n, r.inter0, r.inter},
                                     {&w.up_proj, in, ws.u.data(), n, r.inter0, r.inter}};
    kernels::linear_multi(gu, 2);
  } else {
    kernels::linear(w.gate_proj, in, n, ws.g.data(), r.inter0, r.inter);
    kernels::linear(w.up_proj, in, n, ws.u.data(), r.inter0, r.inter);
  }
  kernels::silu_mul(ws.g.data(), ws.u.data(), size_t(n) * size_t(r.inter), ws.g.data());
  const float* act = ws.g.data();
  if (r.split) {
    DSA_CHECK(st.m.shard.gather_columns, "mlp: a tensor-parallel model without its gather");
    st.m.shard.gather_columns(ws.g.data(), n, r.full_inter, ws.u.data());
    act = ws.u.data();
  }
  if (decode) kernels::linear_decode(w.down_proj, act, n, out, r.out0, r.out);
  else kernels::linear(w.down_proj, act, n, out, r.out0, r.out);
}

void mlp_block(const Step& st, const MlpWeights& w, int n, bool decode, const float* in, float* out) {
  const MlpRows r = mlp_rows(st.m.shard, w, st.m.shard.splits_mlps());
  if (!r.split) {
    mlp_part(st, w, r, n, decode, in, out);
    return;
  }
  Workspace& ws = st.ws;
  DSA_CHECK(ws.opt.tp == st.m.shard.tp, "mlp: a tensor-parallel model with a workspace sized for another --tp");
  mlp_part(st, w, r, n, decode, in, ws.proj_part.data());
  st.m.shard.gather_columns(ws.proj_part.data(), n, r.out * st.m.shard.tp, out);
}

}  // namespace dsa
