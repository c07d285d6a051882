#pragma once
// State: one sequence's caches plus every activation buffer a forward call needs,
// sized once from the config and the limits below. Forward calls never allocate.
#include <cstdint>
#include <vector>

#include "kernels/kernels.h"
#include "model/config.h"

namespace dsa {

struct Model;

struct StateOptions {
  int max_ctx = 4096;        // cache capacity in tokens
  int max_tokens = 512;      // tokens per forward call (prefill chunk)
  int max_logit_rows = 1;    // rows of logits a call may return (max_tokens for teacher forcing)
  CacheType cache = CacheType::FP8;
  bool mtp = false;          // also hold the MTP layer's caches and buffers
};

// Per-layer caches: the MLA latent (+ rope key) in the chosen format and, for layers that
// run their own indexer, the fp8 indexer keys with one f32 scale per token (132 bytes).
struct LayerCache {
  std::vector<uint8_t> mla;       // [max_ctx, token_bytes]
  std::vector<uint8_t> index_k;   // [max_ctx, 128] e4m3 codes
  std::vector<float> index_scale; // [max_ctx]
  MlaCacheView view;
};

struct State {
  State(const ModelConfig& cfg, const StateOptions& opt);

  StateOptions opt;
  int n_past = 0;      // tokens already in the main caches
  int mtp_n_past = 0;  // tokens already in the MTP layer's caches
  std::vector<LayerCache> layers;  // num_hidden_layers (+1 for MTP)

  // RoPE tables [max_ctx, rope/2], computed in f64 (YaRN frequencies) then stored f32.
  std::vector<float> rope_cos, rope_sin;

  // Activations for up to max_tokens tokens.
  std::vector<float> x, xn, h_final;         // [T, hidden]: residual, normed input, final-normed
  std::vector<float> qa, qr;                 // [T, q_lora]
  std::vector<float> q;                      // [T, heads * qk_head]
  std::vector<float> kva;                    // [T, kv_lora + rope]
  std::vector<float> latent, k_rope;         // [T, kv_lora], [T, rope]
  std::vector<float> kv;                     // [T, heads * (nope + v)] prefill expansion
  std::vector<float> q_lat, o_lat;           // [T, heads * kv_lora] absorbed decode
  std::vector<float> q_pe;                   // [T, heads * rope] query rope parts, contiguous
  std::vector<float> attn;                   // [T, heads * v]
  std::vector<float> lat_f32;                // [max_ctx, kv_lora + rope] one layer's cache in f32 (chunked prefill)
  std::vector<float> proj;                   // [T, hidden]
  // Indexer
  std::vector<float> iq;                     // [T, index_heads * 128]
  std::vector<uint8_t> iq8;                  // [T, index_heads * 128]
  std::vector<float> iq_scale, iw;           // [T, index_heads]
  std::vector<float> ik;                     // [T, 128]
  std::vector<float> scores;                 // [threads, max_ctx]
  std::vector<int32_t> topk;                 // [T, index_topk], -1 padded
  std::vector<int32_t> topk_n;               // [T]
  // MoE / MLP
  std::vector<float> router;                 // [T, n_routed]
  std::vector<int32_t> expert_ids;           // [T, experts_per_tok]
  std::vector<float> expert_w;               // [T, experts_per_tok]
  std::vector<int32_t> expert_count, expert_offset, expert_rows;  // tokens grouped by expert
  std::vector<int32_t> expert_pos;           // [T * k] row of (token, slot) in the grouped order
  std::vector<int32_t> expert_active;        // [n_routed] experts with tokens in this call
  std::vector<float> xg, g, u, d;            // [T * experts_per_tok, hidden|inter]
  std::vector<float> moe_out;                // [T, hidden]
  // MTP
  std::vector<float> mtp_cat;                // [T, 2 * hidden]
  // Output
  std::vector<float> logits;                 // [max_logit_rows, vocab]
};

// Fills cache positions [0, depth) of every layer with random latents (unit RMS, like
// kv_a_layernorm output), rope keys and fp8 indexer keys, and sets n_past = depth. Used by
// `dsa bench` to measure decode and prefill at depth without a long prefill first: the
// cost of a step does not depend on the cached values (every indexer key is scanned and
// exactly min(index_topk, context) latents are read).
void fill_cache_synthetic(const ModelConfig& cfg, State& s, int depth, uint64_t seed);

// Bytes a decode step reads at `context` cached tokens, counted from the bound weights of
// this model (actual dtypes and scales): attention and indexer projections, the router,
// the shared and num_experts_per_tok routed experts, dense MLPs, lm_head, one embedding
// row, and the cache (all indexer keys, min(index_topk, context) latents per layer).
double decode_bytes_read(const Model& m, const State& s, int64_t context);

}  // namespace dsa
