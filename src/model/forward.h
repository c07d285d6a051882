#pragma once
// Forward: embed -> decoder layers (MLA + lightning indexer + MoE/MLP) -> norm -> lm_head,
// over `n` new tokens appended at position state.n_past. One call with n > 1 is a
// prefill chunk; n == 1 is a decode step. Both read attention keys from the cache.
#include <cstdint>
#include <functional>
#include <string>

#include "model/state.h"
#include "model/weights.h"

namespace dsa {

// Optional observer of internals, named as in the golden files: "hidden.{i}" (residual
// after layer i), "indexer.scores.{i}" (row of scores for keys 0..pos),
// "indexer.topk.{i}", "moe.experts.{i}". `pos` is the query's position.
struct Tap {
  std::function<void(const std::string& name, int pos, const float* v, int n)> floats;
  std::function<void(const std::string& name, int pos, const int32_t* v, int n)> ints;
};

struct ForwardOptions {
  bool all_logits = false;  // logits for every token (teacher forcing) or only the last
  const Tap* tap = nullptr;
};

// Returns the logits buffer: [n or 1, vocab] rows in state.logits.
const float* forward(const Model& m, State& s, const int32_t* ids, int n, const ForwardOptions& opt = {});

// The MTP layer (num_nextn_predict_layers = 1) over n positions starting at
// state.mtp_n_past: h_final [n, hidden] are the main model's final-normed hidden states
// at those positions and next_ids [n] the tokens that follow them. Returns [n or 1, vocab].
const float* forward_mtp(const Model& m, State& s, const float* h_final, const int32_t* next_ids, int n,
                         const ForwardOptions& opt = {});

// Blocks, shared by the main layers and the MTP layer (model/*.cpp). `cache_layer`
// indexes state.layers; `pos0` is the first token's position.
void attention_block(const Model& m, const LayerWeights& w, State& s, int layer, int cache_layer, int pos0, int n,
                     const Tap* tap);
// `projected`: s.iq (wq_b), s.ik (wk) and s.iw (weights_proj) already hold this call's
// projections (decode computes them together with the attention projections).
void indexer_block(const Model& m, const LayerWeights& w, State& s, int layer, int cache_layer, int pos0, int n,
                   const Tap* tap, bool projected = false);
void moe_block(const Model& m, const MoeWeights& w, State& s, int layer, int pos0, int n, const Tap* tap);
void mlp_block(const MlpWeights& w, State& s, int n, const float* in, float* out);
void decoder_layer(const Model& m, const LayerWeights& w, State& s, int layer, int cache_layer, int pos0, int n,
                   const Tap* tap);

}  // namespace dsa
