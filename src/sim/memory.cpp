#include "sim/memory.h"

#include <algorithm>
#include <cmath>

namespace dsa::sim {
namespace {

// One decoder layer's weights on one device, added into `w`.
void add_layer(const SimModel& m, const Layout& l, const Options& o, int li, double scale, WeightBytes& w) {
  const auto& c = m.cfg;
  const double h = c.hidden_size, ql = c.q_lora_rank, kvl = c.kv_lora_rank, rope = c.qk_rope_head_dim;
  const double H = double(c.num_attention_heads) / l.tp;
  const double aw = weight_bytes_per_elem(o.weight == WeightDtype::BF16 ? WeightDtype::BF16 : WeightDtype::FP8);
  const double mw = weight_bytes_per_elem(o.weight);
  w.attention += scale * aw *
                 (h * ql + h * (kvl + rope) + ql * H * c.qk_head_dim() + kvl * H * (c.qk_nope_head_dim + c.v_head_dim) +
                  H * c.v_head_dim * h);
  w.norms += scale * 2.0 * (2 * h + ql + kvl);
  if (m.has_indexer && c.is_indexer_full(li)) {
    const double IH = c.index_n_heads, D = c.index_head_dim;
    w.indexer += scale * (aw * (ql * IH * D + h * D) + 2.0 * h * IH + 4.0 * 2 * D);
  }
  if (c.is_moe_layer(li)) {
    const double mI = c.moe_intermediate_size, E = c.n_routed_experts;
    w.router += scale * (2.0 * E * h + 4.0 * E);
    w.routed_experts += scale * mw * 3.0 * h * mI * ((E + l.redundant_experts) / l.ep) / l.moe_tp();
    w.shared_experts += scale * mw * 3.0 * h * mI * c.n_shared_experts / l.tp;
  } else {
    w.dense_mlp += scale * mw * 3.0 * h * double(c.intermediate_size) / l.tp;
  }
}

}  // namespace

WeightBytes weight_bytes_per_device(const SimModel& m, const Layout& l, const Options& o) {
  l.validate();
  const auto& c = m.cfg;
  WeightBytes w;
  for (int li = 0; li < c.num_hidden_layers; ++li) add_layer(m, l, o, li, 1.0 / l.pp, w);
  const double h = c.hidden_size, V = c.vocab_size;
  // Replicas (Layout::rep) split the head by vocabulary rows, not the embedding.
  w.embed_head = 2.0 * V * h / l.tp * (c.tie_word_embeddings ? 1.0 : 1.0 + 1.0 / l.rep);
  w.norms += 2.0 * h;
  if (o.mtp > 0 && c.num_nextn_predict_layers > 0) {
    WeightBytes t;
    add_layer(m, l, o, c.num_hidden_layers, 1.0, t);
    // eh_proj (bf16 [h, 2h]), enorm/hnorm/shared_head.norm, and the MTP head (DeepSeek ships its own).
    w.mtp = t.total() + 2.0 * h * 2 * h + 3 * 2.0 * h + 2.0 * V * h / (l.tp * l.rep);
  }
  return w;
}

double activation_workspace_bytes(const SimModel& m, const Layout& l, const Options& o, int64_t step_tokens,
                                  int64_t prefill_tokens, int64_t prefill_context) {
  const auto& c = m.cfg;
  const double h = c.hidden_size, H = double(c.num_attention_heads) / l.tp;
  const double mlp = std::max(2.0 * c.intermediate_size / l.tp, 2.0 * c.num_experts_per_tok * c.moe_intermediate_size);
  // Residual, normed input, q, latent, attention output, MLP intermediate (bf16), plus the
  // MoE dispatch/combine buffers (k bf16 copies of the hidden state).
  const double per_token = 2.0 * (4 * h + H * c.qk_head_dim() + (c.kv_lora_rank + c.qk_rope_head_dim) +
                                  H * c.v_head_dim + mlp) +
                           2.0 * c.num_experts_per_tok * h;
  const double tokens = double(std::max(step_tokens, prefill_tokens));
  double ws = tokens * per_token;
  ws += double(step_tokens) * c.vocab_size / l.tp * 4.0;  // fp32 logits
  if (m.has_indexer)
    ws += double(std::min<int64_t>(prefill_tokens, 8192)) * double(prefill_context + prefill_tokens) * 4.0;
  (void)o;
  return ws;
}

int64_t MemoryPlan::max_seqs_per_device(int64_t tokens, int tp) const {
  if (tokens <= 0 || max_cached_tokens_per_device <= 0) return 0;
  return max_cached_tokens_per_device / tokens / std::max(tp, 1);
}

MemoryPlan plan_memory(const SimModel& m, const Hardware& hw, const Layout& l, const Options& o, int64_t step_tokens,
                       int64_t prefill_tokens, int64_t prefill_context) {
  MemoryPlan p;
  p.capacity_bytes = hw.memory_bytes();
  p.usable_bytes = p.capacity_bytes * hw.memory_usable_fraction;
  p.reserve_bytes = hw.memory_reserve_gib * 1024.0 * 1024.0 * 1024.0;
  p.weights = weight_bytes_per_device(m, l, o);
  p.workspace_bytes = activation_workspace_bytes(m, l, o, step_tokens, prefill_tokens, prefill_context);
  p.cache_budget_bytes = p.usable_bytes - p.reserve_bytes - p.weights.total() - p.workspace_bytes;
  p.cache_bytes_per_token = cache_bytes_per_token(m, o);
  // MLA has one latent "head": tensor parallelism cannot split it, so every rank of a tp
  // group holds the whole cache of its sequences. Pipeline stages split it by layers.
  p.cache_bytes_per_token_per_device = p.cache_bytes_per_token / l.pp;
  p.fits = p.cache_budget_bytes > 0;
  p.max_cached_tokens_per_device = p.fits ? int64_t(std::floor(p.cache_budget_bytes / p.cache_bytes_per_token_per_device)) : 0;
  return p;
}

}  // namespace dsa::sim
