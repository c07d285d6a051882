#pragma once
// A small DSA config whose operator costs are easy to compute by hand:
// 3 layers (layer 0 dense), hidden 256, 4 heads, q_lora 64, kv_lora 128, qk 32+16, v 32,
// 8 experts (2 per token) of 64, 1 shared, indexer 2 heads x 128 with top-k 16, 1 MTP layer.
#include "sim/model.h"

namespace dsa::sim::test {

inline const char* kTinyJson = R"({
  "model_type": "deepseek_v32", "vocab_size": 1000, "hidden_size": 256,
  "intermediate_size": 512, "moe_intermediate_size": 64, "num_hidden_layers": 3,
  "num_attention_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 128,
  "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
  "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
  "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
  "index_n_heads": 2, "index_head_dim": 128, "index_topk": 16,
  "num_nextn_predict_layers": 1
})";

inline SimModel tiny() { return model_from_json_text(kTinyJson, "tiny"); }

}  // namespace dsa::sim::test
