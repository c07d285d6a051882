#pragma once
// Weights: typed views into the mmapped checkpoint, bound by their Hugging Face names
// with a dtype and full-shape check. Nothing is converted or copied.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "kernels/kernels.h"
#include "model/config.h"

namespace dsa {

struct MlaWeights {
  Linear q_a_proj;            // [q_lora_rank, hidden]
  Vec q_a_layernorm;          // [q_lora_rank]
  Linear q_b_proj;            // [heads * (nope + rope), q_lora_rank], per head [nope | rope]
  Linear kv_a_proj_with_mqa;  // [kv_lora_rank + rope, hidden] = [latent | k_rope]
  Vec kv_a_layernorm;         // [kv_lora_rank]
  Linear kv_b_proj;           // [heads * (nope + v), kv_lora_rank], per head [k_nope | v]
  Linear o_proj;              // [hidden, heads * v]
};

struct IndexerWeights {       // only for layers that run their own indexer
  Linear wq_b;                // [index_heads * 128, q_lora_rank], per head [rope | nope]
  Linear wk;                  // [128, hidden]
  Vec k_norm_weight, k_norm_bias;  // LayerNorm [128]
  Linear weights_proj;        // [index_heads, hidden]
};

struct MlpWeights {           // SwiGLU: down(silu(gate(x)) * up(x))
  Linear gate_proj, up_proj;  // [inter, hidden]
  Linear down_proj;           // [hidden, inter]
};

struct MoeWeights {
  Linear gate;                    // router [n_routed_experts, hidden]
  Vec e_score_correction_bias;    // [n_routed_experts], selection only
  std::vector<MlpWeights> experts;
  bool has_shared = false;
  MlpWeights shared_experts;      // inter = moe_intermediate_size * n_shared_experts
};

struct LayerWeights {
  Vec input_layernorm, post_attention_layernorm;  // [hidden]
  MlaWeights self_attn;
  bool has_indexer = false;
  IndexerWeights indexer;
  bool is_moe = false;
  MlpWeights mlp;   // dense layers
  MoeWeights moe;   // MoE layers
};

struct MtpWeights {  // layer index num_hidden_layers
  Vec enorm, hnorm;             // [hidden]
  Linear eh_proj;               // [hidden, 2 * hidden] over [enorm(emb) ; hnorm(h)]
  Vec shared_head_norm;         // [hidden]
  Linear shared_head_head;      // [vocab, hidden]; the main lm_head when absent (GLM)
  Linear embed_tokens;          // [vocab, hidden]; the main embedding when absent
  LayerWeights block;
};

struct ModelWeights {
  Linear embed_tokens;          // [vocab, hidden]
  Vec norm;                     // [hidden]
  Linear lm_head;               // [vocab, hidden]
  std::vector<LayerWeights> layers;
  std::optional<MtpWeights> mtp;

  // Binds every tensor of `cfg` from `st`; throws dsa::Error naming the tensor with
  // expected vs actual dtype/shape. The MTP layer is bound only when `load_mtp`.
  static ModelWeights bind(const ModelConfig& cfg, const SafeTensors& st, bool load_mtp);
};

// This process's part of an expert-parallel layout (a constant of the loaded model). Routed
// expert e belongs to rank e * ranks / n_routed_experts: contiguous ranges, so that when
// the ranks divide n_group each rank holds whole expert groups and a DeepSeek token, which
// picks at most topk_group groups, touches at most that many ranks. The head (lm_head and
// the MTP layer's) is split by vocabulary rows when the ranks divide the vocabulary: it is
// the largest tensor every rank would otherwise read each step. Everything else (attention,
// dense layers, the shared expert, the embedding) is on every rank.
struct RankShard {
  int rank = 0, ranks = 1;
  // Adds the ranks' partial MoE outputs in place (every rank receives the sum).
  void (*sum)(float* data, size_t n) = nullptr;
  // Each rank's [rows, cols / ranks] block of head logits into its columns of out [rows, cols]
  // on every rank. Both set by the runtime when ranks > 1.
  void (*gather_columns)(const float* part, int rows, int cols, float* out) = nullptr;
  bool owns(int expert, int n_experts) const { return int(int64_t(expert) * ranks / n_experts) == rank; }
  bool splits_head(int vocab) const { return ranks > 1 && vocab % ranks == 0; }
  // The bytes of a tensor this rank reads: all of it, none (another rank's expert) or its
  // rows of a head.
  std::pair<size_t, size_t> owned_bytes(const std::string& tensor, const TensorInfo& t, const ModelConfig& c) const;
  // Throws when the layout does not fit the model (checked before any weight is read).
  void validate(const ModelConfig& c) const;
};

// Bytes of the checkpoint's tensors a rank of `shard` maps and reads.
size_t shard_bytes(const SafeTensors& files, const ModelConfig& c, const RankShard& shard);

// A loaded model: config, the mapped files and the bound weights.
struct Model {
  ModelConfig config;
  SafeTensors files;
  ModelWeights weights;
  RankShard shard;

  // prefetch: map every weight page at load (with progress when verbose) when the files fit
  // in this machine's memory, so that the first tokens do not pay a page fault per 64 KB.
  // With shard.ranks > 1 only this rank's tensors are read (the others stay mapped, unread).
  static std::unique_ptr<Model> load(const std::string& dir, bool load_mtp = true, bool verbose = false, bool prefetch = true,
                                     const RankShard& shard = {});
  uint64_t parameter_count() const;  // tensors bound from the files (weights, not scales)
};

}  // namespace dsa
