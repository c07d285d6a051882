#include "model/make_model.h"

#include <omp.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "model/config.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace dsa {
namespace {

json base_v32() {
  return json{{"architectures", {"DeepseekV32ForCausalLM"}}, {"model_type", "deepseek_v32"},
              {"n_group", 4}, {"topk_group", 2}, {"routed_scaling_factor", 2.5}, {"scoring_func", "sigmoid"},
              {"topk_method", "noaux_tc"}, {"norm_topk_prob", true}, {"moe_layer_freq", 1}, {"index_head_dim", 128},
              {"rope_theta", 10000},
              {"rope_scaling", {{"type", "yarn"}, {"factor", 40}, {"original_max_position_embeddings", 4096},
                                {"beta_fast", 32}, {"beta_slow", 1}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}}},
              {"max_position_embeddings", 163840}, {"rms_norm_eps", 1e-6}, {"tie_word_embeddings", false},
              {"bos_token_id", 0}, {"eos_token_id", 1}, {"torch_dtype", "bfloat16"}};
}

json preset_json(const std::string& preset) {
  if (preset == "tiny") {
    json j = base_v32();
    j.update({{"vocab_size", 1024}, {"hidden_size", 256}, {"intermediate_size", 384}, {"moe_intermediate_size", 128},
              {"num_hidden_layers", 3}, {"num_nextn_predict_layers", 1}, {"num_attention_heads", 4},
              {"num_key_value_heads", 4}, {"q_lora_rank", 128}, {"kv_lora_rank", 128}, {"qk_nope_head_dim", 32},
              {"qk_rope_head_dim", 16}, {"v_head_dim", 32}, {"n_routed_experts", 16}, {"n_shared_experts", 1},
              {"num_experts_per_tok", 4}, {"first_k_dense_replace", 1}, {"index_n_heads", 16}, {"index_topk", 8}});
    return j;
  }
  if (preset == "tiny-glm") {
    return json{{"architectures", {"GlmMoeDsaForCausalLM"}}, {"model_type", "glm_moe_dsa"}, {"vocab_size", 1024},
                {"hidden_size", 256}, {"intermediate_size", 384}, {"moe_intermediate_size", 128},
                {"num_hidden_layers", 4}, {"num_nextn_predict_layers", 1}, {"num_attention_heads", 4},
                {"num_key_value_heads", 4}, {"q_lora_rank", 128}, {"kv_lora_rank", 128}, {"qk_nope_head_dim", 48},
                {"qk_rope_head_dim", 16}, {"v_head_dim", 64}, {"n_routed_experts", 16}, {"n_shared_experts", 1},
                {"num_experts_per_tok", 4}, {"n_group", 1}, {"topk_group", 1}, {"routed_scaling_factor", 2.5},
                {"scoring_func", "sigmoid"}, {"topk_method", "noaux_tc"}, {"norm_topk_prob", true},
                {"first_k_dense_replace", 1}, {"moe_layer_freq", 1}, {"index_n_heads", 16}, {"index_head_dim", 128},
                {"index_topk", 8}, {"indexer_rope_interleave", true}, {"index_topk_freq", 2},
                {"index_skip_topk_offset", 2}, {"rope_parameters", {{"rope_theta", 1000000}, {"rope_type", "default"}}},
                {"rope_interleave", true}, {"moe_router_dtype", "float32"}, {"max_position_embeddings", 202752},
                {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", false}, {"bos_token_id", 0}, {"eos_token_id", 1},
                {"torch_dtype", "bfloat16"}};
  }
  if (preset == "v32-mini") {
    // The benchmark shape: DeepSeek-V3.2's per-layer structure at 2048 hidden.
    json j = base_v32();
    j.update({{"vocab_size", 129280}, {"hidden_size", 2048}, {"intermediate_size", 4096},
              {"moe_intermediate_size", 512}, {"num_hidden_layers", 8}, {"num_nextn_predict_layers", 0},
              {"num_attention_heads", 16}, {"num_key_value_heads", 16}, {"q_lora_rank", 512}, {"kv_lora_rank", 512},
              {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64}, {"v_head_dim", 128}, {"n_routed_experts", 64},
              {"n_shared_experts", 1}, {"num_experts_per_tok", 6}, {"n_group", 8}, {"topk_group", 4},
              {"first_k_dense_replace", 1}, {"index_n_heads", 16}, {"index_topk", 2048}});
    return j;
  }
  std::string names;
  for (const auto& p : make_model_presets()) names += (names.empty() ? "" : ", ") + p;
  throw Error("unknown preset '" + preset + "' (expected one of: " + names + ")");
}

// Counter-based random numbers: the value of element i of tensor t depends only on
// (seed, t, i), so any thread split gives the same checkpoint.
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
inline float uniform(uint64_t seed, uint64_t t, uint64_t i) {  // in [-1, 1)
  return float(double(mix(seed ^ mix(t * 0x100000001b3ull + i)) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

struct Writer {
  const MakeModelOptions& opt;
  const ModelConfig& cfg;
  std::vector<TensorBlob> blobs;
  uint64_t tensor_no = 0;

  // Uniform weights with std 1/sqrt(fan_in) (uniform in ±sqrt(3/fan_in)).
  void linear(const std::string& name, int rows, int cols, bool allow_fp8 = true, float gain = 1.0f) {
    const uint64_t t = tensor_no++;
    const float a = gain * std::sqrt(3.0f / float(cols));
    const size_t n = size_t(rows) * size_t(cols);
    if (opt.dtype == "fp8" && allow_fp8) {
      const int br = cfg.quant.block_rows, bc = cfg.quant.block_cols;
      const int sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
      TensorBlob w{name + ".weight", DType::F8_E4M3, {rows, cols}, std::vector<uint8_t>(n)};
      std::vector<float> scale(size_t(sr) * size_t(sc));
#pragma omp parallel for schedule(dynamic, 1)
      for (int b = 0; b < sr * sc; ++b) {
        const int r0 = (b / sc) * br, c0 = (b % sc) * bc;
        const int r1 = std::min(rows, r0 + br), c1 = std::min(cols, c0 + bc);
        // A per-block magnitude between 0.5 and 1.5 so scales differ between blocks.
        const float mag = 1.0f + 0.5f * uniform(opt.seed, t, n + size_t(b));
        float amax = 0;
        for (int r = r0; r < r1; ++r)
          for (int c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(a * mag * uniform(opt.seed, t, size_t(r) * size_t(cols) + size_t(c))));
        const float s = std::max(amax, 1e-12f) / 448.0f;
        scale[size_t(b)] = s;
        for (int r = r0; r < r1; ++r)
          for (int c = c0; c < c1; ++c) {
            const float v = a * mag * uniform(opt.seed, t, size_t(r) * size_t(cols) + size_t(c)) / s;
            w.bytes[size_t(r) * size_t(cols) + size_t(c)] = f32_to_fp8_e4m3(std::clamp(v, -448.0f, 448.0f));
          }
      }
      blobs.push_back(std::move(w));
      blobs.push_back(make_blob_f32(name + ".weight_scale_inv", {sr, sc}, scale.data()));
      return;
    }
    TensorBlob w{name + ".weight", DType::BF16, {rows, cols}, std::vector<uint8_t>(n * 2)};
    uint16_t* p = reinterpret_cast<uint16_t*>(w.bytes.data());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t(n); ++i) p[i] = f32_to_bf16(a * uniform(opt.seed, t, uint64_t(i)));
    blobs.push_back(std::move(w));
  }

  void norm(const std::string& name, int n, float center = 1.0f, float spread = 0.1f, DType dt = DType::BF16) {
    const uint64_t t = tensor_no++;
    std::vector<float> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[size_t(i)] = center + spread * uniform(opt.seed, t, uint64_t(i));
    if (dt == DType::F32) {
      blobs.push_back(make_blob_f32(name, {n}, v.data()));
      return;
    }
    TensorBlob b{name, DType::BF16, {n}, std::vector<uint8_t>(size_t(n) * 2)};
    for (int i = 0; i < n; ++i) {
      const uint16_t h = f32_to_bf16(v[size_t(i)]);
      std::memcpy(&b.bytes[size_t(i) * 2], &h, 2);
    }
    blobs.push_back(std::move(b));
  }

  void mlp(const std::string& p, int inter) {
    linear(p + ".gate_proj", inter, cfg.hidden_size);
    linear(p + ".up_proj", inter, cfg.hidden_size);
    linear(p + ".down_proj", cfg.hidden_size, inter);
  }

  void layer(int i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const int H = cfg.hidden_size, nh = cfg.num_attention_heads;
    norm(p + "input_layernorm.weight", H);
    norm(p + "post_attention_layernorm.weight", H);
    const std::string a = p + "self_attn.";
    linear(a + "q_a_proj", cfg.q_lora_rank, H);
    norm(a + "q_a_layernorm.weight", cfg.q_lora_rank);
    linear(a + "q_b_proj", nh * cfg.qk_head_dim(), cfg.q_lora_rank);
    linear(a + "kv_a_proj_with_mqa", cfg.kv_lora_rank + cfg.qk_rope_head_dim, H);
    norm(a + "kv_a_layernorm.weight", cfg.kv_lora_rank);
    linear(a + "kv_b_proj", nh * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank);
    linear(a + "o_proj", H, nh * cfg.v_head_dim);
    if (cfg.is_indexer_full(i)) {
      linear(a + "indexer.wq_b", cfg.index_n_heads * 128, cfg.q_lora_rank);
      linear(a + "indexer.wk", 128, H);
      norm(a + "indexer.k_norm.weight", 128);
      norm(a + "indexer.k_norm.bias", 128, 0.0f, 0.1f);
      linear(a + "indexer.weights_proj", cfg.index_n_heads, H, false);  // bf16 in the real checkpoints
    }
    if (cfg.is_moe_layer(i)) {
      linear(p + "mlp.gate", cfg.n_routed_experts, H, false, 4.0f);
      norm(p + "mlp.gate.e_score_correction_bias", cfg.n_routed_experts, 0.0f, 0.05f, DType::F32);
      for (int e = 0; e < cfg.n_routed_experts; ++e) mlp(p + "mlp.experts." + std::to_string(e), cfg.moe_intermediate_size);
      if (cfg.n_shared_experts > 0) mlp(p + "mlp.shared_experts", cfg.moe_intermediate_size * cfg.n_shared_experts);
    } else {
      mlp(p + "mlp", cfg.intermediate_size);
    }
  }
};

}  // namespace

std::vector<std::string> make_model_presets() { return {"tiny", "tiny-glm", "v32-mini"}; }

std::string make_model_config(const std::string& preset, const std::string& dtype) {
  json j = preset_json(preset);
  if (dtype == "fp8")
    j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                {"weight_block_size", {128, 128}}, {"scale_fmt", "ue8m0"}};
  else if (dtype != "bf16")
    throw Error("--dtype: expected fp8 or bf16, got '" + dtype + "'");
  return j.dump(2);
}

void make_model(const MakeModelOptions& opt) {
  if (opt.out_dir.empty()) throw Error("--out: an output directory is required");
  if (opt.shards < 1 || opt.shards > 1000) throw Error("--shards: expected 1..1000, got " + std::to_string(opt.shards));
  std::string config_text = make_model_config(opt.preset, opt.dtype);
  if (!opt.config_patch.empty()) {
    auto j = nlohmann::json::parse(config_text);
    j.merge_patch(parse_json_object(opt.config_patch, "config patch"));
    config_text = j.dump(2);
  }
  const ModelConfig cfg = ModelConfig::from_json_text(config_text, "preset '" + opt.preset + "'");
  fs::create_directories(opt.out_dir);

  Writer w{opt, cfg, {}, 0};
  const int H = cfg.hidden_size, V = cfg.vocab_size;
  w.linear("model.embed_tokens", V, H, false, std::sqrt(float(H) / 3.0f));  // unit-scale embeddings
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    if (opt.verbose) std::fprintf(stderr, "\rgenerating layer %d/%d", i + 1, cfg.num_hidden_layers);
    w.layer(i);
  }
  if (cfg.num_nextn_predict_layers > 0) {
    const int l = cfg.num_hidden_layers;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w.norm(p + "enorm.weight", H);
    w.norm(p + "hnorm.weight", H);
    w.linear(p + "eh_proj", H, 2 * H, false);
    w.norm(p + "shared_head.norm.weight", H);
    w.layer(l);
  }
  w.norm("model.norm.weight", H);
  w.linear("lm_head", V, H, false);
  if (opt.verbose) std::fprintf(stderr, "\n");

  // Shards of about equal bytes, in tensor order, with the HF index when sharded.
  size_t total = 0;
  for (const auto& b : w.blobs) total += b.bytes.size();
  const size_t per = total / size_t(opt.shards) + 1;
  std::vector<std::vector<TensorBlob>> shards(size_t(opt.shards));
  size_t acc = 0;
  for (auto& b : w.blobs) {
    const size_t s = std::min(size_t(opt.shards) - 1, acc / per);
    acc += b.bytes.size();
    shards[s].push_back(std::move(b));
  }
  json weight_map = json::object();
  for (int s = 0; s < opt.shards; ++s) {
    char name[64];
    if (opt.shards == 1) std::snprintf(name, sizeof name, "model.safetensors");
    else std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, opt.shards);
    if (opt.verbose) std::fprintf(stderr, "writing %s (%zu tensors)\n", name, shards[size_t(s)].size());
    write_safetensors((fs::path(opt.out_dir) / name).string(), shards[size_t(s)], {{"format", "pt"}});
    for (const auto& b : shards[size_t(s)]) weight_map[b.name] = name;
  }
  if (opt.shards > 1) {
    std::ofstream idx(fs::path(opt.out_dir) / "model.safetensors.index.json");
    idx << json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) << "\n";
  } else {
    fs::remove(fs::path(opt.out_dir) / "model.safetensors.index.json");
  }
  std::ofstream(fs::path(opt.out_dir) / "config.json") << config_text << "\n";
}

}  // namespace dsa
