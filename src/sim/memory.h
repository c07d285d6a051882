#pragma once
// Memory planner: weights per device under a layout, cache bytes per token, activation
// workspace, reserve, and what is left for the KV cache.
#include <cstdint>

#include "sim/cost.h"
#include "sim/hardware.h"

namespace dsa::sim {

struct WeightBytes {
  double attention = 0;       // MLA projections (q_b, kv_b, o split by tp; q_a, kv_a replicated)
  double indexer = 0;         // full indexer layers (replicated: the indexer is not split by tp)
  double dense_mlp = 0;       // first_k_dense_replace layers (split by tp)
  double routed_experts = 0;  // E/ep experts per device, each split moe_tp ways
  double shared_experts = 0;  // split by tp
  double router = 0;          // bf16 gate + fp32 correction bias
  double embed_head = 0;      // bf16 embedding and lm_head (vocab split by tp)
  double norms = 0;
  double mtp = 0;             // the MTP layer, eh_proj and its head (only when mtp > 0)
  double total() const {
    return attention + indexer + dense_mlp + routed_experts + shared_experts + router + embed_head + norms + mtp;
  }
};

// Weight bytes held by one device. Layers are divided evenly over pipeline stages; the
// embedding and head are counted on every device (they sit on the first and last stage).
WeightBytes weight_bytes_per_device(const SimModel& m, const Layout& l, const Options& o);

// Activation workspace of one device: the largest step's live activations (`step_tokens`
// tokens), its logits, and the indexer's fp32 logits for a prefill chunk of `prefill_tokens`
// new tokens over `prefill_context` cached ones (computed 8192 queries at a time).
double activation_workspace_bytes(const SimModel& m, const Layout& l, const Options& o, int64_t step_tokens,
                                  int64_t prefill_tokens, int64_t prefill_context);

struct MemoryPlan {
  double capacity_bytes = 0;  // per device
  double usable_bytes = 0;    // capacity * memory_usable_fraction
  double reserve_bytes = 0;
  WeightBytes weights;
  double workspace_bytes = 0;
  double cache_budget_bytes = 0;  // usable - reserve - weights - workspace (may be negative)
  double cache_bytes_per_token = 0;             // whole model
  double cache_bytes_per_token_per_device = 0;  // a stage's layers; tp replicates the latent
  int64_t max_cached_tokens_per_device = 0;
  bool fits = false;  // weights + workspace + reserve fit
  // Sequences of `tokens` cached tokens that one device's cache holds (a tp group shares them).
  int64_t max_seqs_per_device(int64_t tokens, int tp) const;
};

MemoryPlan plan_memory(const SimModel& m, const Hardware& hw, const Layout& l, const Options& o, int64_t step_tokens,
                       int64_t prefill_tokens, int64_t prefill_context);

}  // namespace dsa::sim
