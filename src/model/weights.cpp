#include "model/weights.h"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/threads.h"

namespace dsa {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

struct Binder {
  const ModelConfig& cfg;
  const SafeTensors& st;
  std::set<std::string> used = {};  // every tensor bound, for the consistency check

  const TensorInfo& tensor(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorInfo* t = st.find(name);
    if (!t) throw Error("missing tensor '" + name + "' (expected shape " + shape_str(shape) + ")");
    used.insert(name);
    if (t->shape != shape)
      throw Error("tensor '" + name + "' has shape " + t->shape_str() + ", expected " + shape_str(shape));
    return *t;
  }

  Linear linear(const std::string& name, int64_t rows, int64_t cols) {
    const TensorInfo& t = tensor(name + ".weight", {rows, cols});
    Linear l;
    l.dtype = t.dtype;
    l.data = t.data;
    l.rows = int(rows);
    l.cols = int(cols);
    if (t.dtype == DType::F8_E4M3) {
      l.block_rows = cfg.quant.block_rows;
      l.block_cols = cfg.quant.block_cols;
      const int64_t sr = (rows + l.block_rows - 1) / l.block_rows, sc = (cols + l.block_cols - 1) / l.block_cols;
      const TensorInfo& s = tensor(name + ".weight_scale_inv", {sr, sc});
      if (s.dtype != DType::F32)
        throw Error("tensor '" + name + ".weight_scale_inv' has dtype " + dtype_name(s.dtype) + ", expected F32");
      if (reinterpret_cast<uintptr_t>(s.data) % 4)
        throw Error("tensor '" + name + ".weight_scale_inv' is not 4-byte aligned in '" + s.file + "'");
      l.scale = reinterpret_cast<const float*>(s.data);
      // One pass over the scales (1/16384 of the weights): a NaN, infinite or negative
      // block scale is a corrupt checkpoint, not a model to run (zero: an all-zero block).
      for (int64_t k = 0; k < sr * sc; ++k)
        if (!(l.scale[k] >= 0.0f) || !std::isfinite(l.scale[k]))
          throw Error("tensor '" + name + ".weight_scale_inv' holds " + std::to_string(l.scale[k]) + " at block " + std::to_string(k / sc) + "," +
                      std::to_string(k % sc) + " (expected finite scales >= 0)");
    } else if (!is_float(t.dtype)) {
      throw Error("tensor '" + name + ".weight' has dtype " + dtype_name(t.dtype) + ", expected F8_E4M3, BF16, F16 or F32");
    }
    return l;
  }

  Vec vec(const std::string& name, int64_t n) {
    const TensorInfo& t = tensor(name, {n});
    if (!is_float(t.dtype)) throw Error("tensor '" + name + "' has dtype " + dtype_name(t.dtype) + ", expected BF16, F16 or F32");
    return Vec{t.dtype, t.data, int(n)};
  }

  MlpWeights mlp(const std::string& p, int inter) {
    const int H = cfg.hidden_size;
    return {linear(p + ".gate_proj", inter, H), linear(p + ".up_proj", inter, H), linear(p + ".down_proj", H, inter)};
  }

  LayerWeights layer(int i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const int H = cfg.hidden_size, nh = cfg.num_attention_heads;
    LayerWeights L;
    L.input_layernorm = vec(p + "input_layernorm.weight", H);
    L.post_attention_layernorm = vec(p + "post_attention_layernorm.weight", H);
    auto& a = L.self_attn;
    const std::string ap = p + "self_attn.";
    a.q_a_proj = linear(ap + "q_a_proj", cfg.q_lora_rank, H);
    a.q_a_layernorm = vec(ap + "q_a_layernorm.weight", cfg.q_lora_rank);
    a.q_b_proj = linear(ap + "q_b_proj", int64_t(nh) * cfg.qk_head_dim(), cfg.q_lora_rank);
    a.kv_a_proj_with_mqa = linear(ap + "kv_a_proj_with_mqa", cfg.kv_lora_rank + cfg.qk_rope_head_dim, H);
    a.kv_a_layernorm = vec(ap + "kv_a_layernorm.weight", cfg.kv_lora_rank);
    a.kv_b_proj = linear(ap + "kv_b_proj", int64_t(nh) * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank);
    a.o_proj = linear(ap + "o_proj", H, int64_t(nh) * cfg.v_head_dim);
    // Shared-indexer layers carry no indexer tensors; extra ones are reported (check_layers_match).
    L.has_indexer = cfg.is_indexer_full(i);
    if (L.has_indexer) {
      const std::string ip = ap + "indexer.";
      auto& x = L.indexer;
      x.wq_b = linear(ip + "wq_b", int64_t(cfg.index_n_heads) * cfg.index_head_dim, cfg.q_lora_rank);
      x.wk = linear(ip + "wk", cfg.index_head_dim, H);
      x.k_norm_weight = vec(ip + "k_norm.weight", cfg.index_head_dim);
      x.k_norm_bias = vec(ip + "k_norm.bias", cfg.index_head_dim);
      x.weights_proj = linear(ip + "weights_proj", cfg.index_n_heads, H);
    }
    L.is_moe = cfg.is_moe_layer(i);
    if (L.is_moe) {
      auto& m = L.moe;
      m.gate = linear(p + "mlp.gate", cfg.n_routed_experts, H);
      if (m.gate.dtype == DType::F8_E4M3) throw Error("tensor '" + p + "mlp.gate.weight': the router must be BF16/F16/F32, got F8_E4M3");
      m.e_score_correction_bias = vec(p + "mlp.gate.e_score_correction_bias", cfg.n_routed_experts);
      m.experts.reserve(size_t(cfg.n_routed_experts));
      for (int e = 0; e < cfg.n_routed_experts; ++e)
        m.experts.push_back(mlp(p + "mlp.experts." + std::to_string(e), cfg.moe_intermediate_size));
      m.has_shared = cfg.n_shared_experts > 0;
      if (m.has_shared) m.shared_experts = mlp(p + "mlp.shared_experts", cfg.moe_intermediate_size * cfg.n_shared_experts);
    } else {
      L.mlp = mlp(p + "mlp", cfg.intermediate_size);
    }
    return L;
  }
};

// Layer index of "model.layers.{i}.…", or -1.
int layer_of(const std::string& name) {
  static const std::string pre = "model.layers.";
  if (name.compare(0, pre.size(), pre) != 0) return -1;
  int i = 0;
  size_t k = pre.size();
  if (k >= name.size() || !std::isdigit(static_cast<unsigned char>(name[k]))) return -1;
  for (; k < name.size() && std::isdigit(static_cast<unsigned char>(name[k])) && i < 1000000; ++k) i = i * 10 + (name[k] - '0');
  return k < name.size() && name[k] == '.' ? i : -1;
}

// A config.json that does not describe the checkpoint must fail, not run a different model:
// an MTP layer taken for a decoder layer, decoder layers past num_hidden_layers, or
// shared / routed experts that the config leaves out. Other unread tensors of the main
// layers get one warning (for example indexer weights on a layer the schedule says shares).
void check_layers_match(const ModelConfig& cfg, const SafeTensors& st, const std::set<std::string>& used) {
  const int L = cfg.num_hidden_layers;
  auto is_mtp = [&](int i) { return st.has("model.layers." + std::to_string(i) + ".eh_proj.weight"); };
  for (int i = 0; i < L; ++i)
    if (is_mtp(i))
      throw Error("config.json says num_hidden_layers = " + std::to_string(L) + ", but layer " + std::to_string(i) +
                  " of the checkpoint is an MTP layer (it has eh_proj): the config does not match the checkpoint");
  size_t unused = 0;
  std::string first_unused;
  for (const auto& [name, t] : st.tensors()) {
    const int i = layer_of(name);
    if (i < 0) continue;
    if (i >= L) {
      if (is_mtp(i)) continue;  // an MTP layer, loaded only when asked for
      throw Error("the checkpoint has decoder layer " + std::to_string(i) + " ('" + name + "'), but config.json says num_hidden_layers = " +
                  std::to_string(L) + ": the config does not match the checkpoint");
    }
    if (used.count(name)) continue;
    if (name.find(".mlp.shared_experts.") != std::string::npos || name.find(".mlp.experts.") != std::string::npos)
      throw Error("tensor '" + name + "' is not part of the model config.json describes (n_routed_experts = " +
                  std::to_string(cfg.n_routed_experts) + ", n_shared_experts = " + std::to_string(cfg.n_shared_experts) +
                  ", first_k_dense_replace = " + std::to_string(cfg.first_k_dense_replace) + "): the config does not match the checkpoint");
    if (unused++ == 0) first_unused = name;
  }
  if (unused)
    std::fprintf(stderr, "warning: %zu tensor(s) of the main layers are not used (first: '%s'); check that config.json matches the checkpoint\n",
                 unused, first_unused.c_str());
}

}  // namespace

ModelWeights ModelWeights::bind(const ModelConfig& cfg, const SafeTensors& st, bool load_mtp) {
  Binder b{cfg, st};
  ModelWeights w;
  const int H = cfg.hidden_size, V = cfg.vocab_size;
  w.embed_tokens = b.linear("model.embed_tokens", V, H);
  if (w.embed_tokens.dtype == DType::F8_E4M3) throw Error("tensor 'model.embed_tokens.weight': expected BF16/F16/F32, got F8_E4M3");
  w.norm = b.vec("model.norm.weight", H);
  w.lm_head = cfg.tie_word_embeddings && !st.has("lm_head.weight") ? w.embed_tokens : b.linear("lm_head", V, H);
  for (int i = 0; i < cfg.num_hidden_layers; ++i) w.layers.push_back(b.layer(i));
  check_layers_match(cfg, st, b.used);
  if (load_mtp && cfg.num_nextn_predict_layers > 0) {
    const int l = cfg.num_hidden_layers;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    MtpWeights m;
    m.enorm = b.vec(p + "enorm.weight", H);
    m.hnorm = b.vec(p + "hnorm.weight", H);
    m.eh_proj = b.linear(p + "eh_proj", H, 2 * H);
    m.shared_head_norm = b.vec(p + "shared_head.norm.weight", H);
    // GLM checkpoints carry no copies of the head and embedding: use the main ones.
    m.shared_head_head = st.has(p + "shared_head.head.weight") ? b.linear(p + "shared_head.head", V, H) : w.lm_head;
    m.embed_tokens = st.has(p + "embed_tokens.weight") ? b.linear(p + "embed_tokens", V, H) : w.embed_tokens;
    m.block = b.layer(l);
    w.mtp = std::move(m);
  }
  return w;
}

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Rows [row0, row0 + n) of a 2-D tensor with `rows` rows (its weight, not its block scales).
std::pair<size_t, size_t> row_range(const TensorInfo& t, int64_t rows, int64_t row0, int64_t n) {
  if (t.shape.size() != 2 || t.shape[0] != rows) return {0, t.nbytes};
  const size_t row = t.nbytes / size_t(rows);
  return {size_t(row0) * row, size_t(n) * row};
}

}  // namespace

std::pair<size_t, size_t> RankShard::owned_bytes(const std::string& tensor, const TensorInfo& t, const ModelConfig& c) const {
  if (ranks <= 1) return {0, t.nbytes};
  const int L = c.num_hidden_layers, layer = layer_of(tensor);
  const size_t none = 0;
  const bool mtp_embedding = tensor == "model.layers." + std::to_string(L) + ".embed_tokens.weight";
  if (tensor == "model.embed_tokens.weight" || mtp_embedding) {
    const bool held = mtp_embedding ? last_stage() : first_stage() || (last_stage() && mtp_uses_main_embedding);
    if (!held) return {0, none};
    if (!splits_embedding(c.vocab_size)) return {0, t.nbytes};
    const int64_t per = c.vocab_size / group();
    return row_range(t, c.vocab_size, member() * per, per);
  }
  if (layer >= 0 && !owns_layer(layer, L)) return {0, 0};
  if (layer < 0 && !last_stage()) return {0, 0};  // model.norm, lm_head
  const size_t at = tensor.find(".mlp.experts.");
  const bool expert = at != std::string::npos;
  if (expert) {
    const char* p = tensor.c_str() + at + 13;
    char* end = nullptr;
    const long e = std::strtol(p, &end, 10);
    const bool foreign = end != p && e >= 0 && e < c.n_routed_experts && !owns(int(e), c.n_routed_experts);
    if (foreign) return {0, none};
  }
  const bool shared = tensor.find(".mlp.shared_experts.") != std::string::npos;
  if (shared && !dp && !runs_shared_expert()) return {0, none};
  // A split MLP: this member's 1/tp of gate_proj's and up_proj's rows (the intermediate)
  // and of down_proj's (the output).
  const bool mlp_weight = tensor.find(".mlp.") != std::string::npos &&
                          (ends_with(tensor, "gate_proj.weight") || ends_with(tensor, "up_proj.weight") || ends_with(tensor, "down_proj.weight"));
  if (mlp_weight && (expert ? splits_experts() : splits_mlps()) && t.shape.size() == 2) {
    const int64_t rows = t.shape[0], per = rows / tp;
    return row_range(t, rows, member() * per, per);
  }
  if (expert) return {0, t.nbytes};
  const bool head = tensor == "lm_head.weight" || tensor == "model.layers." + std::to_string(L) + ".shared_head.head.weight";
  if (head && splits_head(c.vocab_size)) {
    const int64_t per = c.vocab_size / group();
    return row_range(t, c.vocab_size, member() * per, per);
  }
  if (tp > 1 && tensor.find(".self_attn.") != std::string::npos) {
    const int64_t h0 = head0(c.num_attention_heads), nh = n_heads(c.num_attention_heads);
    const int64_t qk = c.qk_head_dim(), kvb = c.qk_nope_head_dim + c.v_head_dim, H = c.hidden_size;
    if (ends_with(tensor, ".self_attn.q_b_proj.weight") || ends_with(tensor, ".self_attn.q_proj.weight"))
      return row_range(t, int64_t(c.num_attention_heads) * qk, h0 * qk, nh * qk);
    if (ends_with(tensor, ".self_attn.kv_b_proj.weight"))
      return row_range(t, int64_t(c.num_attention_heads) * kvb, h0 * kvb, nh * kvb);
    if (ends_with(tensor, ".self_attn.o_proj.weight")) return row_range(t, H, member() * (H / tp), H / tp);
  }
  return {0, t.nbytes};
}

void RankShard::validate_layout() const {
  if (ep < 1 || tp < 1 || pp < 1) throw Error("parallel layout: --ep, --tp and --pp must be positive");
  if (ep > 1 && tp > 1 && ep != tp)
    throw Error(describe() + ": expert and tensor parallelism split the same ranks of a stage, so --ep and --tp are 1 or equal");
  if (dp && (ep < 2 || tp != 1))
    throw Error(describe() + ": data-parallel attention (--dp) splits the sequences of an expert-parallel job, so it needs --ep > 1 "
                "with --tp 1");
  const int64_t want = int64_t(pp) * std::max(ep, tp);
  if (want != ranks)
    throw Error(describe() + ": expected " + std::to_string(want) + " processes (pp x max(ep, tp)), the job has " + std::to_string(ranks));
}

void RankShard::validate(const ModelConfig& c) const {
  const auto flag = [](const char* name, int v) { return std::string("--") + name + " " + std::to_string(v); };
  validate_layout();
  if (ep > 1 && c.n_routed_experts == 0)
    throw Error(flag("ep", ep) + ": the model has no routed experts to split (n_routed_experts = 0)");
  if (ep > 1 && c.n_routed_experts % ep != 0)
    throw Error(flag("ep", ep) + ": does not divide the model's " + std::to_string(c.n_routed_experts) + " routed experts");
  if (pp > c.num_hidden_layers)
    throw Error(flag("pp", pp) + ": more pipeline stages than the model's " + std::to_string(c.num_hidden_layers) + " layers");
  if (tp > 1 && (c.num_attention_heads % tp != 0 || c.hidden_size % tp != 0))
    throw Error(flag("tp", tp) + ": does not divide the model's " + std::to_string(c.num_attention_heads) + " attention heads and hidden size " +
                std::to_string(c.hidden_size));
  // Every MLP is split by rows of its intermediate (see above).
  if (tp > 1 && (c.intermediate_size % tp != 0 || c.moe_intermediate_size % tp != 0))
    throw Error(flag("tp", tp) + ": does not divide the model's MLP widths (intermediate_size " + std::to_string(c.intermediate_size) +
                ", moe_intermediate_size " + std::to_string(c.moe_intermediate_size) + ")");
}

std::string RankShard::describe() const {
  return "ep " + std::to_string(ep) + " x pp " + std::to_string(pp) + " x tp " + std::to_string(tp) + (dp ? " + dp attention" : "");
}

size_t shard_bytes(const SafeTensors& files, const ModelConfig& c, const RankShard& shard) {
  size_t n = 0;
  for (const auto& [name, t] : files.tensors())
    n += shard.owned_bytes(name, t, c).second;
  return n;
}

std::unique_ptr<Model> Model::load(const std::string& dir, bool load_mtp, bool verbose, bool prefetch, const RankShard& shard) {
  if (!std::filesystem::exists(dir)) throw Error("model directory '" + dir + "' does not exist");
  if (!std::filesystem::is_directory(dir)) throw Error("'" + dir + "' is not a directory (expected the model folder holding config.json)");
  auto m = std::make_unique<Model>();
  m->config = ModelConfig::from_file(dir);
  shard.validate(m->config);
  m->shard = shard;
  if (verbose) std::fprintf(stderr, "loading %s: mapping safetensors ...\n", dir.c_str());
  m->files = SafeTensors::open(dir);
  if (verbose) std::fprintf(stderr, "loading %s: %zu file(s), %zu tensors, binding weights ...\n", dir.c_str(), m->files.num_files(), m->files.tensors().size());
  m->weights = ModelWeights::bind(m->config, m->files, load_mtp);
  m->shard.mtp_uses_main_embedding =
      load_mtp && m->weights.mtp && !m->files.has("model.layers." + std::to_string(m->config.num_hidden_layers) + ".embed_tokens.weight");
  if (prefetch) {
    // Only what fits: a checkpoint larger than the machine's memory would evict its own
    // first pages while reading the last ones; it is then read on demand, as mapped.
    const size_t total = shard_bytes(m->files, m->config, m->shard);
    const double ram = physical_memory_bytes();
    if (double(total) < 0.9 * ram) {
      const bool tty = verbose && ::isatty(STDERR_FILENO);
      const size_t n = m->files.num_files();
      auto mine = [&](const std::string& name, const TensorInfo& t) { return m->shard.owned_bytes(name, t, m->config); };
      m->files.populate(mine, [&](size_t files_done, size_t bytes_done) {
        if (tty)
          std::fprintf(stderr, "\rloading %s: reading weights %zu/%zu file(s), %.2f/%.2f GB", dir.c_str(), files_done, n,
                       double(bytes_done) / 1e9, double(total) / 1e9);
      });
      if (tty) std::fprintf(stderr, "\n");
      else if (verbose) std::fprintf(stderr, "loading %s: read %.2f GB of weights\n", dir.c_str(), double(total) / 1e9);
    } else if (verbose) {
      std::fprintf(stderr, "loading %s: %.1f GB of weights exceed 90%% of this machine's %.1f GB of memory: read on demand\n",
                   dir.c_str(), double(total) / 1e9, ram / 1e9);
    }
  }
  return m;
}

namespace {
volatile uint64_t g_read_sink = 0;
}

size_t Model::read_weights(int passes) const {
  std::vector<std::pair<const uint8_t*, size_t>> ranges;
  size_t total = 0;
  for (const auto& [name, t] : files.tensors()) {
    const auto [off, len] = shard.owned_bytes(name, t, config);
    if (len == 0) continue;
    ranges.emplace_back(t.data + off, len);
    total += len;
  }
  uint64_t acc = 0;
  for (int p = 0; p < passes; ++p)
    for (const auto& range : ranges) {
      // Plain names, not structured bindings: clang before 16 cannot use those in the
      // OpenMP region below.
      const uint8_t* base = range.first;
      const auto n = int64_t(range.second / 64);
#pragma omp parallel for schedule(static) reduction(^ : acc)
      for (int64_t i = 0; i < n; ++i) {
        uint64_t v;
        std::memcpy(&v, base + i * 64, sizeof v);  // tensors need not be 8-byte aligned
        acc ^= v;
      }
    }
  g_read_sink = g_read_sink ^ acc;  // keeps the loads
  return total;
}

uint64_t Model::parameter_count() const {
  uint64_t n = 0;
  for (const auto& [name, t] : files.tensors())
    if (name.size() < 16 || name.compare(name.size() - 16, 16, "weight_scale_inv") != 0) n += uint64_t(t.numel());
  return n;
}

}  // namespace dsa
