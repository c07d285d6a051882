#pragma once
// Workspace: every activation buffer one forward step needs, sized once for the largest
// step (tokens, sequences, logit rows, context) so that steps never allocate. It holds no
// sequence's state: the caches live in KvCache, positions and block tables come with each
// step's Batch.
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace dsa {

struct WorkspaceOptions {
  int max_tokens = 512;     // tokens per step, over all its sequences
  int max_seqs = 1;         // sequences per step
  int max_logit_rows = 1;   // rows of logits a step may return
  int max_ctx = 4096;       // longest sequence (RoPE tables, indexer scores, one layer's f32 latents)
  bool mtp = false;         // also size the MTP layer's buffers
  bool chunk_latents = true;  // room to dequantize one layer's cache for a chunk after a prefix
  int head_ranks = 1;         // ranks splitting the head's vocabulary rows (RankShard::splits_head)
  int tp = 1;                 // tensor-parallel ranks splitting the attention heads (RankShard::tp)
  int dp_ranks = 1;           // ranks attending for sequences of their own (RankShard::dp_ranks); a
                              // step's tokens over all of them stay within max_tokens
};

struct Workspace {
  Workspace(const ModelConfig& cfg, const WorkspaceOptions& opt);

  WorkspaceOptions opt;

  // RoPE tables [max_ctx, rope/2], computed in f64 (YaRN frequencies) then stored f32.
  std::vector<float> rope_cos, rope_sin;

  // Per token of the step
  std::vector<int32_t> pos;                  // [T] position in its sequence
  std::vector<int32_t> tok_seq;              // [T] its sequence's index in the step
  std::vector<int32_t> ids;                  // [T] the step's token ids, decode sequences first
  std::vector<int32_t> seq_first;            // [max_seqs + 1] each sequence's first token in the step
  std::vector<float> x, xn, h_final;         // [T, hidden]: residual, normed input, final-normed
  std::vector<float> qa, qr;                 // [T, q_lora]
  std::vector<float> q;                      // [T, heads * qk_head]
  std::vector<float> kva;                    // [T, kv_lora + rope]
  std::vector<float> latent, k_rope;         // [T, kv_lora], [T, rope]
  std::vector<float> q_lat, o_lat;           // [T, heads * kv_lora] absorbed decode
  std::vector<float> q_pe;                   // [T, heads * rope] query rope parts, contiguous
  std::vector<float> attn;                   // [T, heads * v] (this rank's heads under tensor parallelism)
  std::vector<float> attn_all, proj_part;    // tensor parallelism: [T, heads * v] every rank's, [T, hidden / tp]
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
  std::vector<int32_t> expert_pos;           // [T * k] row of (token, slot) in the grouped order, -1: another rank's expert
  std::vector<int32_t> expert_token;         // [T * k] token of each grouped row
  std::vector<int32_t> expert_active;        // [n_routed] experts with tokens in this call
  std::vector<float> xg, g, u, d;            // [T * experts_per_tok, hidden|inter]
  std::vector<float> moe_out;                // [T, hidden]
  std::vector<double> moe_acc;               // [T, hidden] expert outputs summed before rounding (moe.cpp)
  // Data-parallel attention: every rank's tokens [T, hidden], this rank's tokens' sums over
  // the ranks [T, hidden], and the partial sums an all-to-all returns [T * min(ranks, k), hidden].
  std::vector<float> moe_x;
  std::vector<double> moe_part, moe_back;
  std::vector<int32_t> dp_rows;              // [dp_ranks] each rank's tokens (or rows) in an exchange
  // Data-parallel MoE by all-to-all (moe.cpp): rows sent to and received from each rank, this
  // rank's tokens' routes, and each sent row's routes out and each received row's in.
  std::vector<int32_t> dp_send_rows, dp_recv_rows;  // [dp_ranks]
  std::vector<int32_t> dp_ids;               // [T, experts_per_tok]
  std::vector<float> dp_routes_out;          // [T * experts_per_tok, 2 * experts_per_tok] ids (as floats), weights
  std::vector<float> dp_routes_in;           // [T, 2 * experts_per_tok]
  // MTP
  std::vector<float> mtp_cat;                // [T, 2 * hidden]
  // Output
  std::vector<float> h_rows;                 // [max_logit_rows, hidden] the rows whose logits are returned
  std::vector<float> logits;                 // [max_logit_rows, vocab]
  std::vector<float> logits_part;            // [max_logit_rows, vocab / head_ranks] this rank's columns
  std::vector<int32_t> logit_first;          // [max_seqs] each sequence's first row in logits
};

}  // namespace dsa
