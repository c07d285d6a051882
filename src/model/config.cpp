#include "model/config.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mmap_file.h"
#include "io/json.h"

using nlohmann::json;

namespace dsa {
namespace {

struct Reader {
  const json& j;
  std::string where;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(where + ": field '" + key + "': " + what);
  }
  bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  // An integer that fits in int.
  int as_int(const json& v, const std::string& k) const {
    if (!v.is_number_integer()) fail(k, "expected an integer, got " + v.dump());
    if (!json_int_in(v, INT32_MIN, INT32_MAX)) fail(k, "integer out of range, got " + v.dump());
    return int(v.get<int64_t>());
  }
  int req_int(const char* k) const {
    if (!has(k)) fail(k, "missing (required, no default)");
    return as_int(j[k], k);
  }
  int opt_int(const char* k, int def) const {
    if (!has(k)) return def;
    return as_int(j[k], k);
  }
  double opt_num(const json& o, const char* k, double def, const std::string& prefix = "") const {
    if (!o.contains(k) || o[k].is_null()) return def;
    if (!o[k].is_number()) fail(prefix + k, "expected a number, got " + o[k].dump());
    return o[k].get<double>();
  }
  // A finite number > 0 (norm epsilons, RoPE bases, scaling factors): zero, negative or
  // infinite values would turn every logit into NaN downstream.
  double opt_pos(const json& o, const char* k, double def, const std::string& prefix = "") const {
    const double v = opt_num(o, k, def, prefix);
    if (!(v > 0) || !std::isfinite(v)) fail(prefix + k, "must be a finite number > 0, got " + o[k].dump());
    return v;
  }
  double req_num(const char* k) const {
    if (!has(k)) fail(k, "missing (required, no default)");
    if (!j[k].is_number()) fail(k, "expected a number, got " + j[k].dump());
    return j[k].get<double>();
  }
  bool opt_bool(const char* k, bool def) const {
    if (!has(k)) return def;
    if (!j[k].is_boolean()) fail(k, "expected true or false, got " + j[k].dump());
    return j[k].get<bool>();
  }
  std::string opt_str(const char* k, const std::string& def) const {
    if (!has(k)) return def;
    if (!j[k].is_string()) fail(k, "expected a string, got " + j[k].dump());
    return j[k].get<std::string>();
  }
};

void parse_rope(const Reader& r, ModelConfig& c) {
  // Legacy DeepSeek: rope_theta + rope_scaling {type: yarn, ...}. Re-saved configs (GLM,
  // transformers 5.x): rope_parameters {rope_theta, rope_type, ...}.
  c.rope.theta = r.opt_pos(r.j, "rope_theta", 10000.0);
  const json* scaling = nullptr;
  std::string key;
  if (r.has("rope_scaling")) { scaling = &r.j["rope_scaling"]; key = "rope_scaling"; }
  if (r.has("rope_parameters")) {
    const json& p = r.j["rope_parameters"];
    if (!p.is_object()) r.fail("rope_parameters", "expected an object");
    c.rope.theta = r.opt_pos(p, "rope_theta", c.rope.theta, "rope_parameters.");
    if (!scaling) { scaling = &p; key = "rope_parameters"; }
  }
  if (!scaling) return;
  if (!scaling->is_object()) r.fail(key, "expected an object");
  std::string type;
  for (const char* k : {"type", "rope_type"}) {
    if (!scaling->contains(k) || (*scaling)[k].is_null()) continue;
    if (!(*scaling)[k].is_string()) r.fail(key + "." + k, "expected a string (yarn or default), got " + (*scaling)[k].dump());
    type = (*scaling)[k].get<std::string>();
  }
  if (type.empty() || type == "default") return;
  if (type != "yarn" && type != "deepseek_yarn") r.fail(key + ".type", "unsupported rope type '" + type + "' (expected yarn or default)");
  c.rope.yarn = true;
  const std::string pre = key + ".";
  c.rope.factor = r.opt_pos(*scaling, "factor", 1.0, pre);
  c.rope.original_max_position = r.opt_pos(*scaling, "original_max_position_embeddings", 4096, pre);
  c.rope.beta_fast = r.opt_pos(*scaling, "beta_fast", 32, pre);
  c.rope.beta_slow = r.opt_pos(*scaling, "beta_slow", 1, pre);
  c.rope.mscale = r.opt_num(*scaling, "mscale", 1.0, pre);
  c.rope.mscale_all_dim = r.opt_num(*scaling, "mscale_all_dim", 0.0, pre);
  // Released configs use 0.707-1; far larger values only overflow the softmax scale.
  for (const auto& [name, v] : {std::pair{"mscale", c.rope.mscale}, std::pair{"mscale_all_dim", c.rope.mscale_all_dim}})
    if (!(v >= 0 && v <= 100)) r.fail(pre + name, "must be a number in [0, 100], got " + (*scaling)[name].dump());
  if (c.rope.factor > 1e6) r.fail(pre + "factor", "must be at most 1e6, got " + (*scaling)["factor"].dump());
}

void parse_indexer_schedule(const Reader& r, ModelConfig& c) {
  // Precedence as in transformers / vLLM / SGLang / MAX: indexer_types, then
  // index_topk_pattern ("F"/"S"), then index_topk_freq + index_skip_topk_offset.
  const int n = c.num_hidden_layers;
  c.indexer_full.assign(size_t(n), true);
  if (r.has("indexer_types")) {
    const json& t = r.j["indexer_types"];
    if (!t.is_array() || int(t.size()) != n)
      r.fail("indexer_types", "expected a list of " + std::to_string(n) + " entries \"full\"/\"shared\"");
    for (int i = 0; i < n; ++i) {
      const std::string s = t[size_t(i)].is_string() ? t[size_t(i)].get<std::string>() : "";
      if (s != "full" && s != "shared") r.fail("indexer_types", "entry " + std::to_string(i) + " must be \"full\" or \"shared\"");
      c.indexer_full[size_t(i)] = s == "full";
    }
  } else if (r.has("index_topk_pattern")) {
    const json& p = r.j["index_topk_pattern"];
    std::string s;
    if (p.is_string()) s = p.get<std::string>();
    else if (p.is_array()) {
      for (const auto& e : p) {
        if (!e.is_string()) r.fail("index_topk_pattern", "list entries must be strings");
        const std::string v = e.get<std::string>();
        s += (v == "full" || v == "F") ? 'F' : (v == "shared" || v == "S") ? 'S' : '?';
      }
    } else r.fail("index_topk_pattern", "expected a string of F/S or a list");
    if (int(s.size()) != n) r.fail("index_topk_pattern", "expected " + std::to_string(n) + " entries, got " + std::to_string(s.size()));
    for (int i = 0; i < n; ++i) {
      if (s[size_t(i)] != 'F' && s[size_t(i)] != 'S') r.fail("index_topk_pattern", "entries must be F or S");
      c.indexer_full[size_t(i)] = s[size_t(i)] == 'F';
    }
  } else {
    const int freq = r.opt_int("index_topk_freq", 1);
    const int offset = r.opt_int("index_skip_topk_offset", 2);
    if (freq < 1) r.fail("index_topk_freq", "must be >= 1, got " + std::to_string(freq));
    if (offset < 0) r.fail("index_skip_topk_offset", "must be >= 0, got " + std::to_string(offset));
    for (int i = 0; i < n; ++i) c.indexer_full[size_t(i)] = std::max(i - offset + 1, 0) % freq == 0;
  }
  if (n > 0 && !c.indexer_full[0]) r.fail("indexer_types", "layer 0 must run its own indexer (\"full\"): a shared layer needs an earlier full layer");
}

Family parse_family(const Reader& r, const std::string& model_type) {
  if (model_type == "deepseek_v32") return Family::DeepseekV32;
  if (model_type == "glm_moe_dsa") return Family::GlmMoeDsa;
  if (model_type.empty()) r.fail("model_type", "missing (expected \"deepseek_v32\" or \"glm_moe_dsa\")");
  r.fail("model_type", "unknown model_type '" + model_type + "' (expected \"deepseek_v32\" or \"glm_moe_dsa\")");
}

// eos_token_id: one id or a list of them.
void parse_eos(const Reader& r, ModelConfig& c) {
  if (!r.has("eos_token_id")) return;
  const json& e = r.j["eos_token_id"];
  if (e.is_number_integer()) c.eos_token_ids.push_back(r.as_int(e, "eos_token_id"));
  else if (e.is_array())
    for (const auto& x : e) c.eos_token_ids.push_back(r.as_int(x, "eos_token_id"));
  else r.fail("eos_token_id", "expected an integer or a list of integers");
}

void parse_moe(const Reader& r, ModelConfig& c) {
  c.n_routed_experts = r.opt_int("n_routed_experts", 0);
  c.n_shared_experts = r.opt_int("n_shared_experts", 0);
  c.moe_intermediate_size = c.n_routed_experts > 0 ? r.req_int("moe_intermediate_size") : r.opt_int("moe_intermediate_size", 0);
  c.num_experts_per_tok = c.n_routed_experts > 0 ? r.req_int("num_experts_per_tok") : 0;
  c.n_group = r.opt_int("n_group", 1);
  c.topk_group = r.opt_int("topk_group", 1);
  c.routed_scaling_factor = r.opt_pos(r.j, "routed_scaling_factor", 1.0);
  if (c.routed_scaling_factor > 1e4)
    r.fail("routed_scaling_factor", "must be at most 1e4 (released models use 1-2.5), got " + r.j["routed_scaling_factor"].dump());
  c.scoring_func = r.opt_str("scoring_func", "sigmoid");
  c.topk_method = r.opt_str("topk_method", "noaux_tc");
  c.norm_topk_prob = r.opt_bool("norm_topk_prob", true);
  c.first_k_dense_replace = r.opt_int("first_k_dense_replace", 0);
  c.moe_layer_freq = r.opt_int("moe_layer_freq", 1);
  c.moe_router_dtype = r.opt_str("moe_router_dtype", "");
}

// quantization_config: fp8 e4m3 in blocks, with power-of-two (ue8m0) scales or plain f32 ones.
void parse_quantization(const Reader& r, ModelConfig& c) {
  if (!r.has("quantization_config")) return;
  const json& q = r.j["quantization_config"];
  if (!q.is_object()) r.fail("quantization_config", "expected an object");
  const Reader qr{q, r.where};
  const std::string method = qr.opt_str("quant_method", "");
  if (method != "fp8") r.fail("quantization_config.quant_method", "unsupported '" + method + "' (expected \"fp8\")");
  const std::string fmt = qr.opt_str("fmt", "e4m3");
  if (fmt != "e4m3") r.fail("quantization_config.fmt", "unsupported '" + fmt + "' (expected \"e4m3\")");
  c.quant.fp8 = true;
  if (q.contains("weight_block_size")) {
    const json& b = q["weight_block_size"];
    if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer())
      r.fail("quantization_config.weight_block_size", "expected [rows, cols]");
    c.quant.block_rows = r.as_int(b[0], "quantization_config.weight_block_size");
    c.quant.block_cols = r.as_int(b[1], "quantization_config.weight_block_size");
  }
  if (q.contains("scale_fmt") && !q["scale_fmt"].is_null()) {
    const std::string sf = q["scale_fmt"].is_string() ? q["scale_fmt"].get<std::string>() : "";
    if (sf != "ue8m0") r.fail("quantization_config.scale_fmt", "unsupported " + q["scale_fmt"].dump() + " (expected \"ue8m0\" or absent)");
    c.quant.scale_ue8m0 = true;
  }
}

}  // namespace

ModelConfig ModelConfig::from_json_text(const std::string& text, const std::string& where) {
  const json j = parse_json_object(text, where);
  Reader r{j, where};
  ModelConfig c;
  c.model_type = r.opt_str("model_type", "");
  c.family = parse_family(r, c.model_type);
  c.vocab_size = r.req_int("vocab_size");
  c.hidden_size = r.req_int("hidden_size");
  c.intermediate_size = r.req_int("intermediate_size");
  c.num_hidden_layers = r.req_int("num_hidden_layers");
  // Checked here, before the indexer schedule is sized by it.
  if (c.num_hidden_layers <= 0 || c.num_hidden_layers > kMaxLayers)
    r.fail("num_hidden_layers", "must be in [1, " + std::to_string(kMaxLayers) + "], got " + std::to_string(c.num_hidden_layers));
  c.num_attention_heads = r.req_int("num_attention_heads");
  c.q_lora_rank = r.req_int("q_lora_rank");
  c.kv_lora_rank = r.req_int("kv_lora_rank");
  c.qk_nope_head_dim = r.req_int("qk_nope_head_dim");
  c.qk_rope_head_dim = r.req_int("qk_rope_head_dim");
  c.v_head_dim = r.req_int("v_head_dim");
  c.rms_norm_eps = r.opt_pos(j, "rms_norm_eps", 1e-6);
  c.max_position_embeddings = r.opt_int("max_position_embeddings", 163840);
  c.tie_word_embeddings = r.opt_bool("tie_word_embeddings", false);
  c.bos_token_id = r.opt_int("bos_token_id", -1);
  parse_eos(r, c);
  parse_moe(r, c);
  c.index_n_heads = r.req_int("index_n_heads");
  c.index_head_dim = r.req_int("index_head_dim");
  c.index_topk = r.req_int("index_topk");
  c.indexer_rope_interleave = r.opt_bool("indexer_rope_interleave", false);
  c.num_nextn_predict_layers = r.opt_int("num_nextn_predict_layers", 0);
  parse_rope(r, c);
  parse_indexer_schedule(r, c);
  parse_quantization(r, c);
  c.validate();
  return c;
}

void ModelConfig::validate() const {
  auto bad = [](const std::string& field, const std::string& what) { throw Error("config.json: field '" + field + "': " + what); };
  auto pos = [&](const char* f, int v) { if (v <= 0) bad(f, "must be positive, got " + std::to_string(v)); };
  pos("vocab_size", vocab_size);
  pos("hidden_size", hidden_size);
  pos("num_hidden_layers", num_hidden_layers);
  pos("num_attention_heads", num_attention_heads);
  pos("q_lora_rank", q_lora_rank);
  pos("kv_lora_rank", kv_lora_rank);
  if (kv_lora_rank > kMaxKvLoraRank) bad("kv_lora_rank", "at most " + std::to_string(kMaxKvLoraRank) + " supported, got " + std::to_string(kv_lora_rank));
  pos("qk_nope_head_dim", qk_nope_head_dim);
  pos("v_head_dim", v_head_dim);
  for (const auto& [field, v] : {std::pair{"qk_nope_head_dim", qk_nope_head_dim}, std::pair{"v_head_dim", v_head_dim}})
    if (v > kMaxHeadDim) bad(field, "at most " + std::to_string(kMaxHeadDim) + " supported, got " + std::to_string(v));
  pos("index_n_heads", index_n_heads);
  pos("index_topk", index_topk);
  // Generous bounds far above any released model, so that a typo fails here instead of
  // as an allocation of many gigabytes (the top-k rows are sized by index_topk).
  if (index_topk > kMaxIndexTopk) bad("index_topk", "at most " + std::to_string(kMaxIndexTopk) + " supported, got " + std::to_string(index_topk));
  pos("max_position_embeddings", max_position_embeddings);
  if (n_shared_experts < 0 || n_shared_experts > 64) bad("n_shared_experts", "must be in [0, 64], got " + std::to_string(n_shared_experts));
  if (n_routed_experts < 0) bad("n_routed_experts", "must be >= 0, got " + std::to_string(n_routed_experts));
  // Larger than num_hidden_layers is valid: every layer is dense (HF: MoE from that index on).
  if (first_k_dense_replace < 0) bad("first_k_dense_replace", "must be >= 0, got " + std::to_string(first_k_dense_replace));
  pos("moe_layer_freq", moe_layer_freq);
  if (qk_rope_head_dim <= 0 || qk_rope_head_dim % 2) bad("qk_rope_head_dim", "must be a positive even number, got " + std::to_string(qk_rope_head_dim));
  if (index_head_dim != 128) bad("index_head_dim", "must be 128 (Hadamard-128 and one fp8 block per head), got " + std::to_string(index_head_dim));
  if (qk_rope_head_dim > index_head_dim) bad("qk_rope_head_dim", "larger than index_head_dim");
  if (first_k_dense_replace > 0 || n_routed_experts == 0) pos("intermediate_size", intermediate_size);
  if (n_routed_experts > 0) {
    pos("moe_intermediate_size", moe_intermediate_size);
    pos("num_experts_per_tok", num_experts_per_tok);
    if (num_experts_per_tok > kMaxExpertsPerTok) bad("num_experts_per_tok", "at most " + std::to_string(kMaxExpertsPerTok) + " supported, got " + std::to_string(num_experts_per_tok));
    if (n_routed_experts > kMaxRoutedExperts) bad("n_routed_experts", "at most " + std::to_string(kMaxRoutedExperts) + " supported, got " + std::to_string(n_routed_experts));
    if (num_experts_per_tok > n_routed_experts) bad("num_experts_per_tok", "larger than n_routed_experts");
    if (n_group <= 0 || n_routed_experts % n_group) bad("n_group", "must divide n_routed_experts (" + std::to_string(n_routed_experts) + "), got " + std::to_string(n_group));
    if (topk_group <= 0 || topk_group > n_group) bad("topk_group", "must be in [1, n_group], got " + std::to_string(topk_group));
    if (n_group > 1 && n_routed_experts / n_group < 2) bad("n_group", "each group needs at least 2 experts (groups are scored by their two best)");
    if (n_group > 1 && topk_group * (n_routed_experts / n_group) < num_experts_per_tok) bad("topk_group", "the kept groups hold fewer experts than num_experts_per_tok");
    if (scoring_func != "sigmoid") bad("scoring_func", "unsupported '" + scoring_func + "' (expected \"sigmoid\")");
    if (topk_method != "noaux_tc") bad("topk_method", "unsupported '" + topk_method + "' (expected \"noaux_tc\")");
  }
  if (num_nextn_predict_layers < 0 || num_nextn_predict_layers > 1) bad("num_nextn_predict_layers", "supported values are 0 and 1, got " + std::to_string(num_nextn_predict_layers));
  if (quant.fp8 && (quant.block_rows <= 0 || quant.block_cols <= 0 || quant.block_rows > kMaxWeightBlock || quant.block_cols > kMaxWeightBlock))
    bad("quantization_config.weight_block_size", "each side must be in [1, " + std::to_string(kMaxWeightBlock) + "], got [" +
        std::to_string(quant.block_rows) + ", " + std::to_string(quant.block_cols) + "]");
  if (int(indexer_full.size()) != num_hidden_layers) bad("indexer_types", "schedule length does not match num_hidden_layers");
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "config.json";
  if (!std::filesystem::exists(p)) throw Error("cannot open '" + p.string() + "' (expected a model directory with config.json)");
  return from_json_text(read_text_file(p.string(), "model config", size_t(16) << 20), p.string());
}

int ModelConfig::num_full_indexer_layers() const {
  int n = 0;
  for (bool f : indexer_full) n += f;
  return n;
}

static double yarn_mscale(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

double ModelConfig::softmax_scale() const {
  double s = 1.0 / std::sqrt(double(qk_head_dim()));
  // HF / vLLM: multiply by mscale(factor, mscale_all_dim)^2 only when mscale_all_dim is set.
  if (rope.yarn && rope.mscale_all_dim != 0.0) {
    const double m = yarn_mscale(rope.factor, rope.mscale_all_dim);
    s *= m * m;
  }
  return s;
}

double ModelConfig::rope_attention_factor() const {
  if (!rope.yarn) return 1.0;
  return yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor, rope.mscale_all_dim);
}

std::string ModelConfig::indexer_schedule_str() const {
  std::string s;
  for (bool f : indexer_full) s += f ? 'F' : 'S';
  return s;
}

}  // namespace dsa
