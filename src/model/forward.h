#pragma once
// Forward: embed -> decoder layers (MLA + lightning indexer + MoE/MLP) -> norm -> lm_head,
// over one step: the new tokens of several sequences at once. Projections, experts and the
// lm_head run over every token of the step together (each weight is read once per step);
// attention, the indexer scan and top-k run per sequence through its block table.
//
// Token roles and batch invariance: a sequence's part of a step is either a prefill chunk
// or decode tokens (one, or the few a speculative verify step checks). Decode tokens go
// through the decode-role kernels (kernels.h: the GEMV order), prefill chunks through the
// GEMM, and every reduction splits in fixed pieces; so a decode token's logits are bitwise
// the same whichever sequences share the step, wherever it sits in it, at any thread count.
// A prefill chunk's results depend on how the prompt was chunked, within the golden
// tolerance, and not on its neighbours either.
#include <cstdint>
#include <functional>
#include <string>

#include "model/kv_cache.h"
#include "model/weights.h"
#include "model/workspace.h"

namespace dsa {

// Optional observer of internals, named as in the golden files: "hidden.{i}" (residual
// after layer i), "indexer.scores.{i}" (row of scores for keys 0..pos),
// "indexer.topk.{i}", "moe.experts.{i}". `pos` is the query's position. Steps with a tap
// run their per-query loops in order on one thread.
struct Tap {
  std::function<void(const std::string& name, int pos, const float* v, int n)> floats;
  std::function<void(const std::string& name, int pos, const int32_t* v, int n)> ints;
};

// One sequence's part of a step: tokens at positions pos0 .. pos0 + n - 1, whose keys go to
// (and are read from) the cache through `blocks` (covering pos0 + n tokens).
struct SeqStep {
  int pos0 = 0, n = 0;
  const int32_t* blocks = nullptr;
  bool decode = false;  // role: decode / verify tokens, else a prefill chunk
  int logits = 1;       // rows of logits returned: 0, 1 (its last token) or n
};

// A step: the sequences' tokens concatenated in `seqs` order, decode sequences first.
struct Batch {
  const int32_t* ids = nullptr;
  const SeqStep* seqs = nullptr;
  int n_seqs = 0;
  const Tap* tap = nullptr;
};

// Returns the logits: the rows the sequences asked for, in order ([rows, vocab] in
// ws.logits). ws.h_final holds every token's final-normed hidden state, in step order.
const float* forward(const Model& m, KvCache& kv, Workspace& ws, const Batch& b);

// The MTP layer (num_nextn_predict_layers = 1) over a step of its own: a sequence's tokens
// are the ids that FOLLOW its positions pos0 .. pos0 + n - 1, and h [T, hidden] the main
// model's final-normed hidden states at those positions (step order). Its keys go to the
// cache's MTP layer. Returns the logits as forward does.
const float* forward_mtp(const Model& m, KvCache& kv, Workspace& ws, const Batch& b, const float* h);

// Bytes a decode step of one sequence reads at `context` cached tokens, counted from the
// bound weights of this model (actual dtypes and scales): attention and indexer
// projections, the router, the shared and num_experts_per_tok routed experts, dense MLPs,
// lm_head, one embedding row, and the cache (all indexer keys, min(index_topk, context)
// latents per layer).
double decode_bytes_read(const Model& m, CacheType cache, int64_t context);

}  // namespace dsa
