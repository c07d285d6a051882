#pragma once
// ModelConfig: every config.json field the forward pass uses, for both DSA families.
// Parsing fills defaults only where the HF code has one; anything else missing or
// inconsistent is an error naming the field.
#include <string>
#include <vector>

namespace dsa {

enum class Family { DeepseekV32, GlmMoeDsa };

struct RopeConfig {
  double theta = 10000.0;
  bool yarn = false;               // rope_scaling / rope_parameters with type "yarn"
  double factor = 1.0;
  double original_max_position = 4096;
  double beta_fast = 32, beta_slow = 1;
  double mscale = 1.0;             // YaRN mscale (cos/sin magnitude numerator)
  double mscale_all_dim = 0.0;     // 0 = not set
};

struct QuantConfig {
  bool fp8 = false;                // quantization_config.quant_method == "fp8"
  int block_rows = 128, block_cols = 128;
  bool scale_ue8m0 = false;        // scale_fmt == "ue8m0": power-of-two activation/KV scales
};

// Bounds far above any released model (61-78 layers, top-k 2048): a typo fails in
// validation, not as a multi-gigabyte allocation or an endless plan.
inline constexpr int kMaxLayers = 1024;
inline constexpr int kMaxIndexTopk = 1 << 16;
// Per-head dims (released: nope 128/192, v 128/256): qk_head_dim() adds nope and rope in int,
// so an unbounded nope of 2^31-1 overflowed there.
inline constexpr int kMaxHeadDim = 4096;
// The routing and kernel code keeps per-token scratch on the stack, sized by these; validation
// refuses any config beyond them (released models: 256 experts in 8 groups, 8 per token,
// 128x128 weight blocks, kv_lora_rank 512).
inline constexpr int kMaxRoutedExperts = 1024;
inline constexpr int kMaxExpertGroups = kMaxRoutedExperts / 2;  // each group holds at least 2
inline constexpr int kMaxExpertsPerTok = 64;
inline constexpr int kMaxKvLoraRank = 1024;
inline constexpr int kMaxWeightBlock = 512;

struct ModelConfig {
  Family family = Family::DeepseekV32;
  std::string model_type;          // "deepseek_v32" | "glm_moe_dsa"

  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;       // dense SwiGLU layers
  int moe_intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  double rms_norm_eps = 1e-6;
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;

  // MoE (noaux_tc)
  int n_routed_experts = 0;
  int n_shared_experts = 0;
  int num_experts_per_tok = 0;
  int n_group = 1;
  int topk_group = 1;
  double routed_scaling_factor = 1.0;
  std::string scoring_func = "sigmoid";
  std::string topk_method = "noaux_tc";
  bool norm_topk_prob = true;
  int first_k_dense_replace = 0;
  int moe_layer_freq = 1;
  std::string moe_router_dtype;    // "" or "float32": we always route in f32

  // Lightning indexer
  int index_n_heads = 0;
  int index_head_dim = 128;
  int index_topk = 0;
  bool indexer_rope_interleave = false;  // GLM: interleaved; DeepSeek: half-split (NeoX)
  std::vector<bool> indexer_full;        // per main layer: runs its own indexer

  int num_nextn_predict_layers = 0;
  RopeConfig rope;
  QuantConfig quant;

  // Derived
  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool is_moe_layer(int layer) const {  // layer == num_hidden_layers is the MTP layer
    return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  bool is_indexer_full(int layer) const {  // the MTP layer always runs its own indexer
    return layer >= num_hidden_layers || indexer_full[size_t(layer)];
  }
  int num_full_indexer_layers() const;
  double softmax_scale() const;          // (nope+rope)^-0.5 * mscale^2 under YaRN
  double rope_attention_factor() const;  // cos/sin magnitude under YaRN (1.0 for released configs)
  std::string indexer_schedule_str() const;  // e.g. "FFSF"

  // Bytes per cached token for one layer.
  static int mla_cache_bytes_fp8(int kv_lora_rank, int rope_dim) {  // 656 for 512 + 64
    return kv_lora_rank + 4 * ((kv_lora_rank + 127) / 128) + 2 * rope_dim;
  }
  static int indexer_cache_bytes(int head_dim) { return head_dim + 4 * ((head_dim + 127) / 128); }  // 132

  // Throws dsa::Error naming the field.
  static ModelConfig from_json_text(const std::string& text, const std::string& where = "config.json");
  static ModelConfig from_file(const std::string& path);  // a config.json or a model directory
  void validate() const;
};

}  // namespace dsa
