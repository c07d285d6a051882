#include "sim/model.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mmap_file.h"
#include "io/json.h"
#include "model/make_model.h"

using nlohmann::json;

namespace dsa::sim {
namespace {

// Values from docs CHECKPOINTS.md §1 (DeepSeek-V3.2 config.json, verbatim) and §3 (GLM-5
// family table). Only fields ModelConfig reads are kept.
constexpr const char* kDeepseekV32 = R"({
  "model_type": "deepseek_v32", "vocab_size": 129280, "hidden_size": 7168,
  "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
  "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
  "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
  "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
  "topk_method": "noaux_tc", "norm_topk_prob": true, "first_k_dense_replace": 3,
  "moe_layer_freq": 1, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048,
  "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-6, "max_position_embeddings": 163840,
  "bos_token_id": 0, "eos_token_id": 1, "rope_theta": 10000,
  "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                   "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
  "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                          "weight_block_size": [128, 128]}
})";

// GLM-5 / 5.1 (CHECKPOINTS.md §3): no YaRN, no group limiting, 32 indexer heads, all layers full.
constexpr const char* kGlm5 = R"({
  "model_type": "glm_moe_dsa", "vocab_size": 154880, "hidden_size": 6144,
  "intermediate_size": 12288, "moe_intermediate_size": 2048, "num_hidden_layers": 78,
  "num_attention_heads": 64, "q_lora_rank": 2048, "kv_lora_rank": 512,
  "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256,
  "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
  "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
  "topk_method": "noaux_tc", "norm_topk_prob": true, "first_k_dense_replace": 3,
  "moe_layer_freq": 1, "index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048,
  "indexer_rope_interleave": true, "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-5,
  "max_position_embeddings": 202752, "eos_token_id": [154820, 154827, 154829],
  "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
  "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
})";

std::string with_fields(const char* base, const json& patch) {
  json j = json::parse(base);
  for (auto it = patch.begin(); it != patch.end(); ++it) j[it.key()] = it.value();
  return j.dump();
}

}  // namespace

std::vector<std::string> builtin_model_names() {
  return {"deepseek-v3.2", "deepseek-v3.2-exp", "deepseek-v3", "glm-5", "glm-5.2", "v32-mini"};
}

std::string builtin_model_json(const std::string& name) {
  if (name == "deepseek-v3.2" || name == "deepseek-v3.2-exp") return kDeepseekV32;  // identical outside quantization_config
  if (name == "deepseek-v3")  // V3 / V3.1: the same network with dense MLA and no indexer
    return with_fields(kDeepseekV32, {{"model_type", "deepseek_v3"}});
  if (name == "glm-5") return kGlm5;
  if (name == "glm-5.2")  // 21 full indexer layers of 78 (freq 4, offset 3), rope theta 8e6, 1M positions
    return with_fields(kGlm5, {{"index_topk_freq", 4}, {"index_skip_topk_offset", 3},
                               {"max_position_embeddings", 1048576},
                               {"rope_parameters", {{"rope_theta", 8000000}, {"rope_type", "default"}}}});
  // The engine's CPU benchmark model: the very config `dsa make-model --preset v32-mini`
  // writes, so the planner and the benchmark cannot drift apart.
  if (name == "v32-mini") return make_model_config("v32-mini", "fp8");
  std::string list;
  for (const auto& n : builtin_model_names()) list += (list.empty() ? "" : ", ") + n;
  throw Error("unknown model '" + name + "' (built-in models: " + list + "; or give a model directory or config.json)");
}

SimModel model_from_json_text(const std::string& text, const std::string& where) {
  json j = parse_json_object(text, where);
  SimModel m;
  m.name = where;
  if (j.value("model_type", "") == "deepseek_v3") {
    // Dense-MLA DeepSeek: the parser knows the DSA families only, so describe it as one whose
    // indexer is never costed. The placeholders satisfy validation and are never read.
    m.has_indexer = false;
    j["model_type"] = "deepseek_v32";
    if (!j.contains("index_n_heads")) j["index_n_heads"] = 64;
    if (!j.contains("index_head_dim")) j["index_head_dim"] = 128;
    if (!j.contains("index_topk")) j["index_topk"] = 2048;
  }
  m.cfg = ModelConfig::from_json_text(j.dump(), where);
  return m;
}

SimModel load_model(const std::string& name_or_path) {
  for (const auto& n : builtin_model_names()) {
    if (n == name_or_path) {
      SimModel m = model_from_json_text(builtin_model_json(n), "built-in " + n);
      m.name = n;
      return m;
    }
  }
  std::filesystem::path p(name_or_path);
  if (!std::filesystem::exists(p)) builtin_model_json(name_or_path);  // throws the "unknown model" message
  if (std::filesystem::is_directory(p)) p /= "config.json";
  if (!std::filesystem::exists(p)) throw Error("cannot open '" + p.string() + "' (expected a model directory with config.json)");
  SimModel m = model_from_json_text(read_text_file(p.string(), "model config", size_t(16) << 20), p.string());
  m.name = name_or_path;
  return m;
}

SimModel model_from_config(const ModelConfig& cfg, const std::string& name) {
  SimModel m;
  m.cfg = cfg;
  m.name = name;
  return m;
}

}  // namespace dsa::sim
