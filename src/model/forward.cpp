#include "model/forward.h"

#include <omp.h>

#include <algorithm>
#include <string>

#include "core/error.h"
#include "kernels/kernels.h"
#include "model/blocks.h"

namespace dsa {

void linear_by_role(const Linear& w, const float* x, int n, int nd, float* y, int row0, int nrows) {
  const int rows = nrows < 0 ? w.rows : nrows;
  if (nd > 0) kernels::linear_decode(w, x, nd, y, row0, rows);
  if (n > nd) kernels::linear(w, x + size_t(nd) * size_t(w.cols), n - nd, y + size_t(nd) * size_t(rows), row0, rows);
}

// x[n, H] += y[n, H], the tokens across the threads in a prefill chunk.
static void add_rows(float* x, const float* y, int n, int H) {
  for_each_token(n, [&](int i) {
    float* xi = x + size_t(i) * size_t(H);
    const float* yi = y + size_t(i) * size_t(H);
    for (int h = 0; h < H; ++h) xi[h] += yi[h];
  });
}

void decoder_layer(const Step& st, const LayerWeights& w, int layer, int cache_layer) {
  const ModelConfig& c = st.m.config;
  Workspace& ws = st.ws;
  const int H = c.hidden_size, n = st.n, nd = st.nd;
  const float eps = float(c.rms_norm_eps);

  kernels::rmsnorm(ws.x.data(), w.input_layernorm, n, H, eps, ws.xn.data());
  attention_block(st, w, layer, cache_layer);
  add_rows(ws.x.data(), ws.proj.data(), n, H);

  kernels::rmsnorm(ws.x.data(), w.post_attention_layernorm, n, H, eps, ws.xn.data());
  // The two roles run apart (each expert's weights are read once per role): a decode
  // token's experts go through the GEMV order whatever prefill shares the step.
  const size_t dH = size_t(nd) * size_t(H);
  if (w.is_moe) {
    // Under data-parallel attention every rank joins both roles' exchanges, with or without
    // tokens of its own.
    const bool every = ws.opt.dp_ranks > 1;
    if (nd > 0 || every) moe_block(st, w.moe, layer, 0, nd, true);
    if (n > nd || every) moe_block(st, w.moe, layer, nd, n - nd, false);
  } else {
    if (nd > 0) mlp_block(st, w.mlp, nd, true, ws.xn.data(), ws.moe_out.data());
    if (n > nd) mlp_block(st, w.mlp, n - nd, false, ws.xn.data() + dH, ws.moe_out.data() + dH);
  }
  add_rows(ws.x.data(), ws.moe_out.data(), n, H);

  const Tap* tap = st.b.tap;
  if (tap && tap->floats && layer < c.num_hidden_layers)
    for (int i = 0; i < n; ++i) tap->floats("hidden." + std::to_string(layer), ws.pos[size_t(i)], &ws.x[size_t(i) * size_t(H)], H);
}

namespace {

// Checks the step against the workspace and the cache, lays out its tokens (positions, each
// sequence's first token) and returns the number of logit rows it asks for.
int prepare_step(const Model& m, const KvCache& kv, Workspace& ws, const Batch& b, const int32_t* ids, int* n_tok, int* n_dec) {
  const ModelConfig& c = m.config;
  // Under data-parallel attention a rank may have none of the step's sequences: it still
  // takes part in every MoE layer's exchange.
  if (b.n_seqs < 0 || (b.n_seqs == 0 && ws.opt.dp_ranks <= 1)) throw Error("forward: a step without sequences");
  if (b.n_seqs > ws.opt.max_seqs)
    throw Error("forward: " + std::to_string(b.n_seqs) + " sequences in one step, the workspace holds " + std::to_string(ws.opt.max_seqs));
  int n = 0, nd = 0, rows = 0;
  bool prefill_seen = false;
  for (int s = 0; s < b.n_seqs; ++s) {
    const SeqStep& q = b.seqs[s];
    if (q.n <= 0) throw Error("forward: a sequence with no tokens in the step");
    if (q.pos0 < 0 || q.pos0 + q.n > ws.opt.max_ctx)
      throw Error("forward: context of " + std::to_string(q.pos0 + q.n) + " tokens exceeds the workspace's " + std::to_string(ws.opt.max_ctx));
    if (!q.blocks) throw Error("forward: a sequence without a block table");
    if (q.logits != 0 && q.logits != 1 && q.logits != q.n) throw Error("forward: logits rows must be 0, 1 or the sequence's token count");
    if (q.decode && prefill_seen) throw Error("forward: decode sequences must come before prefill chunks in a step");
    prefill_seen |= !q.decode;
    if (n + q.n > ws.opt.max_tokens)
      throw Error("forward: more than " + std::to_string(ws.opt.max_tokens) + " tokens in one step");
    ws.seq_first[size_t(s)] = n;
    for (int i = 0; i < q.n; ++i) {
      const int64_t blk = (int64_t(q.pos0) + i) / kv.block_size();
      if (q.blocks[blk] < 0 || q.blocks[blk] >= kv.n_blocks()) throw Error("forward: block table entry out of the pool");
      ws.pos[size_t(n + i)] = q.pos0 + i;
      ws.tok_seq[size_t(n + i)] = s;
    }
    n += q.n;
    if (q.decode) nd += q.n;
    rows += q.logits;
  }
  ws.seq_first[size_t(b.n_seqs)] = n;
  if (rows > ws.opt.max_logit_rows)
    throw Error("forward: " + std::to_string(rows) + " logit rows requested, the workspace holds " + std::to_string(ws.opt.max_logit_rows));
  for (int i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= c.vocab_size)
      throw Error("token id " + std::to_string(ids[i]) + " out of range [0, " + std::to_string(c.vocab_size) + ")");
  *n_tok = n;
  *n_dec = nd;
  return rows;
}

// ws.h_rows [rows, hidden] through `head` into ws.logits [rows, vocab], every row by the
// GEMV order whatever its role: one row (a decode token's, a chunk's last) is what the
// lm_head is mostly asked for (the GEMM would unpack all of it for one row), and a row then
// never depends on how many rows its chunk asked for.
void head_rows(const Step& st, const Linear& head, int rows) {
  Workspace& ws = st.ws;
  if (ws.opt.head_ranks > 1) {
    // Vocabulary-parallel head: this rank's rows of it, then every member's columns gathered
    // (each logit is its row's dot product either way: the same bits as one process).
    const RankShard& sh = st.m.shard;
    DSA_CHECK(sh.gather_columns && ws.opt.head_ranks == sh.group(), "forward: a split head without its gather");
    const int V = head.rows, per = V / sh.group();
    kernels::linear_decode(head, ws.h_rows.data(), rows, ws.logits_part.data(), sh.member() * per, per);
    sh.gather_columns(ws.logits_part.data(), rows, V, ws.logits.data());
  } else {
    kernels::linear_decode(head, ws.h_rows.data(), rows, ws.logits.data());
  }
}

// Pipeline parallelism: data[0:n] of the last stage to every other stage. The members of a
// stage agree on them, so member 0 of the last stage broadcasts; under data-parallel
// attention each member's are its own sequences', so each sends them to the same member of
// every other stage.
void from_last_stage(const Step& st, float* data, size_t n) {
  const RankShard& sh = st.m.shard;
  if (!sh.dp) {
    DSA_CHECK(sh.broadcast, "forward: a pipeline-parallel model without its broadcast");
    sh.broadcast(data, n, sh.ranks - sh.group());
    return;
  }
  DSA_CHECK(sh.send && sh.recv, "forward: a pipeline-parallel model without its transfers");
  const int last = (sh.pp - 1) * sh.group() + sh.member();
  if (!sh.last_stage()) {
    sh.recv(data, n * sizeof(float), last);
    return;
  }
  for (int s = 0; s + 1 < sh.pp; ++s) sh.send(data, n * sizeof(float), s * sh.group() + sh.member());
}

// The requested rows of `h` ([n, hidden]) through `head` into ws.logits, in sequence order;
// ws.logit_first says where each sequence's rows are. Under pipeline parallelism only the
// last stage computes them (h is null on the others) and hands them to every rank, so
// that every rank samples the same tokens.
const float* head_logits(const Step& st, const Linear& head, const float* h) {
  Workspace& ws = st.ws;
  const RankShard& sh = st.m.shard;
  const size_t H = size_t(st.m.config.hidden_size);
  int rows = 0;
  for (int s = 0; s < st.b.n_seqs; ++s) {
    const SeqStep& q = st.b.seqs[s];
    const int from = st.first(s) + (q.logits == 1 ? q.n - 1 : 0);
    if (h) std::copy_n(h + size_t(from) * H, size_t(q.logits) * H, &ws.h_rows[size_t(rows) * H]);
    ws.logit_first[size_t(s)] = rows;
    rows += q.logits;
  }
  if (h) head_rows(st, head, rows);
  if (sh.pp > 1) from_last_stage(st, ws.logits.data(), size_t(rows) * size_t(head.rows));
  return ws.logits.data();
}

// Pipeline parallelism: what a stage hands the next (the same member of the next stage)
// for the step's tokens: the residual stream and, when the next stage's first layer reuses
// the previous layer's top-k instead of running an indexer of its own, that top-k.
void pipeline_transfer(const Step& st, int boundary_layer, bool send) {
  const RankShard& sh = st.m.shard;
  const ModelConfig& c = st.m.config;
  Workspace& ws = st.ws;
  DSA_CHECK(sh.send && sh.recv, "forward: a pipeline-parallel model without its transfers");
  const size_t n = size_t(st.n);
  auto move = [&](void* p, size_t bytes) {
    if (send) sh.send(p, bytes, sh.rank + sh.group());
    else sh.recv(p, bytes, sh.rank - sh.group());
  };
  move(ws.x.data(), n * size_t(c.hidden_size) * sizeof(float));
  if (!c.is_indexer_full(boundary_layer)) {
    move(ws.topk.data(), n * size_t(c.index_topk) * sizeof(int32_t));
    move(ws.topk_n.data(), n * sizeof(int32_t));
  }
}

// y [n, hidden] = the tokens' rows of an embedding table. A tensor-parallel stage splits the
// table by vocabulary rows (RankShard::splits_embedding): each member copies the rows it
// holds and zeros the others, and one all-reduce sums them, exactly, each element having a
// single non-zero term.
void embed_tokens(const Step& st, const Linear& table, float* y) {
  const RankShard& sh = st.m.shard;
  if (!sh.splits_embedding(table.rows)) {
    kernels::embed(table, st.b.ids, st.n, y);
    return;
  }
  const int per = table.rows / sh.group(), v0 = sh.member() * per, H = table.cols;
  for (int i = 0; i < st.n; ++i) {  // ids in range: prepare_step checked them
    const int32_t id = st.b.ids[i];
    float* row = y + size_t(i) * size_t(H);
    if (id >= v0 && id < v0 + per) kernels::embed(table, &id, 1, row);
    else std::fill(row, row + H, 0.0f);
  }
  DSA_CHECK(sh.sum, "embedding: a tensor-parallel model without its all-reduce");
  sh.sum(y, size_t(st.n) * size_t(H));
}

// Pipeline micro-batches: a step's sequences in up to pp groups that follow each other
// through the stages, so that stage s runs group i while stage s + 1 runs group i - 1 (a
// stage's blocking send of group i returns once the next stage asks for it, after its
// group i - 1). Each group rereads the stage's weights, which a group of one decode token
// does not earn back: under --pp 2 on one 2-core machine, 2 sequences in two groups tied
// with one group, 4 gained 6%, 16 gained 5%, 64 gained 14% (docs/ENGINE.md). So groups of
// at least kMicroBatchTokens tokens. Whole sequences only: a token's result does not depend
// on the others in its step (decode tokens bitwise, a prefill chunk kept whole), so the
// logits are the same bits as one group's. Not under data-parallel attention, where a
// stage's members hold different sequences and could not agree on the groups.
constexpr int kMicroBatchTokens = 2;

int micro_batch_count(const RankShard& sh, const Batch& b, int n_tokens) {
  if (sh.pp <= 1 || sh.dp || b.n_seqs < 2) return 1;
  const int want = sh.micro_batches > 0 ? sh.micro_batches : std::max(1, std::min(sh.pp, n_tokens / kMicroBatchTokens));
  return std::min(want, b.n_seqs);
}

// The stage's layers for the tokens of st: in from the embedding or the previous stage, out
// to the next stage or, on the last, final-normed into h [st.n, hidden].
void stage_layers(const Step& st, float* h) {
  const ModelConfig& c = st.m.config;
  const RankShard& sh = st.m.shard;
  const int L = c.num_hidden_layers, l0 = sh.first_layer(L), l1 = sh.end_layer(L);
  if (sh.first_stage()) embed_tokens(st, st.m.weights.embed_tokens, st.ws.x.data());
  else pipeline_transfer(st, l0, false);
  for (int l = l0; l < l1; ++l) decoder_layer(st, st.m.weights.layers[size_t(l)], l, l);
  if (sh.last_stage()) kernels::rmsnorm(st.ws.x.data(), st.m.weights.norm, st.n, c.hidden_size, float(c.rms_norm_eps), h);
  else pipeline_transfer(st, l1, true);
}

// The step's sequences in `groups` runs of stage_layers, each group's final hidden states
// at its tokens' rows of ws.h_final; the workspace's layout is then the whole step's again.
void stage_layers_grouped(const Model& m, KvCache& kv, Workspace& ws, const Batch& b, int n, int groups) {
  int s0 = 0, t0 = 0;
  for (int g = 0; g < groups; ++g) {
    // Sequences up to the g+1-th share of the tokens, at least one per group.
    int s1 = s0 + 1, t1 = t0 + b.seqs[s0].n;
    while (s1 < b.n_seqs - (groups - g - 1) && int64_t(t1) * groups < int64_t(n) * (g + 1)) t1 += b.seqs[s1++].n;
    if (g == groups - 1)
      while (s1 < b.n_seqs) t1 += b.seqs[s1++].n;
    const Batch part{b.ids + t0, b.seqs + s0, s1 - s0, b.tap};
    int pn = 0, pnd = 0;
    prepare_step(m, kv, ws, part, part.ids, &pn, &pnd);
    stage_layers(Step{m, kv, ws, part, pn, pnd}, ws.h_final.data() + size_t(t0) * size_t(m.config.hidden_size));
    s0 = s1;
    t0 = t1;
  }
  int all = 0, nd = 0;
  prepare_step(m, kv, ws, b, b.ids, &all, &nd);
}

}  // namespace

const float* forward(const Model& m, KvCache& kv, Workspace& ws, const Batch& b) {
  const ModelConfig& c = m.config;
  const RankShard& sh = m.shard;
  int n = 0, nd = 0;
  prepare_step(m, kv, ws, b, b.ids, &n, &nd);
  const Step st{m, kv, ws, b, n, nd};
  const int groups = micro_batch_count(sh, b, n);
  if (groups > 1) stage_layers_grouped(m, kv, ws, b, n, groups);
  else stage_layers(st, ws.h_final.data());
  const bool last = sh.last_stage();
  const float* logits = head_logits(st, m.weights.lm_head, last ? ws.h_final.data() : nullptr);
  // The MTP layer's inputs on every rank too: callers hand them back to forward_mtp from
  // whichever rank drives the steps.
  if (sh.pp > 1 && ws.opt.mtp) from_last_stage(st, ws.h_final.data(), size_t(n) * size_t(c.hidden_size));
  return logits;
}

const float* forward_mtp(const Model& m, KvCache& kv, Workspace& ws, const Batch& b, const float* h) {
  const ModelConfig& c = m.config;
  if (!m.weights.mtp || !ws.opt.mtp || (m.shard.last_stage() && kv.n_layers() <= c.num_hidden_layers))
    throw Error("forward_mtp: the model, workspace or cache has no MTP layer");
  const MtpWeights& w = *m.weights.mtp;
  const int H = c.hidden_size, L = c.num_hidden_layers;
  const float eps = float(c.rms_norm_eps);
  int n = 0, nd = 0;
  prepare_step(m, kv, ws, b, b.ids, &n, &nd);
  const Step st{m, kv, ws, b, n, nd};
  if (!m.shard.last_stage()) return head_logits(st, w.shared_head_head, nullptr);  // the MTP layer's stage computes them

  // x = eh_proj([enorm(embed(next)) ; hnorm(h)]), the embedding zeroed at position 0 as
  // vLLM does (SGLang keeps it; llama.cpp feeds the pre-norm hidden state instead).
  embed_tokens(st, w.embed_tokens, ws.xn.data());
  for (int i = 0; i < n; ++i) {
    float* cat = &ws.mtp_cat[size_t(i) * 2 * size_t(H)];
    if (ws.pos[size_t(i)] == 0) std::fill(cat, cat + H, 0.0f);
    else kernels::rmsnorm(&ws.xn[size_t(i) * size_t(H)], w.enorm, 1, H, eps, cat);
    kernels::rmsnorm(h + size_t(i) * size_t(H), w.hnorm, 1, H, eps, cat + H);
  }
  linear_by_role(w.eh_proj, ws.mtp_cat.data(), n, nd, ws.x.data());
  decoder_layer(st, w.block, L, L);
  kernels::rmsnorm(ws.x.data(), w.shared_head_norm, n, H, eps, ws.xn.data());
  return head_logits(st, w.shared_head_head, ws.xn.data());
}

double decode_bytes_read(const Model& m, CacheType cache, int64_t context) {
  const ModelConfig& c = m.config;
  const ModelWeights& w = m.weights;
  MlaCacheView fmt;
  fmt.type = cache;
  fmt.kv_lora = c.kv_lora_rank;
  fmt.rope = c.qk_rope_head_dim;
  auto vec_bytes = [](const Vec& v) { return double(v.n) * double(dtype_size(v.dtype)); };
  auto mlp_bytes = [](const MlpWeights& p) { return double(p.gate_proj.bytes() + p.up_proj.bytes() + p.down_proj.bytes()); };
  double b = double(w.embed_tokens.cols) * double(dtype_size(w.embed_tokens.dtype)) + vec_bytes(w.norm) + double(w.lm_head.bytes());
  const double keys = double(std::min<int64_t>(context, c.index_topk));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& L = w.layers[size_t(l)];
    const MlaWeights& a = L.self_attn;
    b += vec_bytes(L.input_layernorm) + vec_bytes(L.post_attention_layernorm) + vec_bytes(a.q_a_layernorm) + vec_bytes(a.kv_a_layernorm);
    b += double(a.q_a_proj.bytes() + a.q_b_proj.bytes() + a.kv_a_proj_with_mqa.bytes() + a.kv_b_proj.bytes() + a.o_proj.bytes());
    if (L.has_indexer) {
      const IndexerWeights& x = L.indexer;
      b += double(x.wq_b.bytes() + x.wk.bytes() + x.weights_proj.bytes()) + vec_bytes(x.k_norm_weight) + vec_bytes(x.k_norm_bias);
      b += double(context) * 132.0;  // every cached indexer key: 128 fp8 + one f32 scale
    }
    b += keys * double(fmt.token_bytes());
    if (L.is_moe) {
      b += double(L.moe.gate.bytes()) + vec_bytes(L.moe.e_score_correction_bias);
      b += double(c.num_experts_per_tok) * mlp_bytes(L.moe.experts[0]);
      if (L.moe.has_shared) b += mlp_bytes(L.moe.shared_experts);
    } else {
      b += mlp_bytes(L.mlp);
    }
  }
  return b;
}

}  // namespace dsa
