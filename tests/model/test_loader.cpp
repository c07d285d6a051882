// Config and checkpoint loading: the happy paths (single file, sharded, fp8, bf16) and
// every error path, each of which must name the thing that is wrong.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "fixtures.h"
#include "io/safetensors.h"
#include "model/make_model.h"
#include "runtime/teacher_forcing.h"

namespace fs = std::filesystem;
using namespace dsa;

namespace {

std::string tmpdir(const std::string& name) {
  const fs::path p = test::scratch(name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::string make(const std::string& name, const std::string& preset, const std::string& dtype, int shards) {
  MakeModelOptions o;
  o.preset = preset;
  o.dtype = dtype;
  o.shards = shards;
  o.seed = 5;
  o.verbose = false;
  o.out_dir = tmpdir(name);
  make_model(o);
  return o.out_dir;
}

// Expects load to throw a dsa::Error whose message contains every needle.
void expect_load_error(const std::string& dir, std::initializer_list<std::string> needles) {
  try {
    Model::load(dir, true);
    FAIL() << "loading " << dir << " should have failed";
  } catch (const Error& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "message: " << e.what() << "\nmissing: " << n;
  }
}

std::vector<TensorBlob> blobs_of(const std::string& file) {
  const auto st = SafeTensors::open(file);
  std::vector<TensorBlob> out;
  for (const auto& [name, t] : st.tensors()) out.push_back({name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)});
  return out;
}

void set_config(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(dir + "/config.json");
  auto j = nlohmann::json::parse(in);
  edit(j);
  std::ofstream(dir + "/config.json") << j.dump(2);
}

TEST(Loader, ShardedBf16AndFp8CheckpointsLoadAndAgree) {
  const std::string one = make("one", "tiny", "fp8", 1), three = make("three", "tiny", "fp8", 3);
  EXPECT_TRUE(fs::exists(three + "/model.safetensors.index.json"));
  auto a = Model::load(one, true), b = Model::load(three, true);
  EXPECT_EQ(b->files.num_files(), 3u);
  EXPECT_EQ(a->weights.layers[1].self_attn.q_a_proj.dtype, DType::F8_E4M3);
  const std::vector<int32_t> ids = {5, 9, 100, 7, 300, 2, 17, 44, 8, 901, 3, 12};
  const auto ra = run_teacher_forced(*a, ids, 7, CacheType::FP8, true, false);
  const auto rb = run_teacher_forced(*b, ids, 7, CacheType::FP8, true, false);
  EXPECT_EQ(ra.logits, rb.logits);
  EXPECT_EQ(ra.mtp_logits, rb.mtp_logits);
  for (float v : ra.logits) ASSERT_TRUE(std::isfinite(v));

  const std::string bf = make("bf16", "tiny-glm", "bf16", 2);
  auto c = Model::load(bf, true);
  EXPECT_EQ(c->weights.layers[1].self_attn.q_a_proj.dtype, DType::BF16);
  EXPECT_FALSE(c->weights.layers[2].has_indexer);  // GLM schedule: layer 2 is shared
  const auto rc = run_teacher_forced(*c, ids, 12, CacheType::BF16, true, false);
  for (float v : rc.logits) ASSERT_TRUE(std::isfinite(v));
}

// Expert-parallel ranks: each reads the same share of the routed experts and of the heads'
// vocabulary rows, and all of the rest; experts and heads are split exactly (nothing read
// twice, nothing left out).
TEST(Loader, RankShardsSplitTheExpertsAndTheHeadAndShareTheRest) {
  const auto cases = test::golden_cases();
  ASSERT_TRUE(test::golden_cases_complete(cases));
  for (const auto& name : cases) {
    SCOPED_TRACE(name);
    auto m = Model::load(test::golden_dir() + "/" + name + "/model", true, false, false);
    const int E = m->config.n_routed_experts;
    if (E < 2) continue;
    size_t total = 0, experts = 0, heads = 0, shared = 0;
    const std::string mtp_head = "model.layers." + std::to_string(m->config.num_hidden_layers) + ".shared_head.head.weight";
    for (const auto& [tname, t] : m->files.tensors()) {
      total += t.nbytes;
      if (tname.find(".mlp.experts.") != std::string::npos) experts += t.nbytes;
      if (tname.find(".mlp.shared_experts.") != std::string::npos) shared += t.nbytes;
      if (tname == "lm_head.weight" || tname == mtp_head) heads += t.nbytes;
    }
    ASSERT_GT(heads, 0u);
    ASSERT_GT(experts, 0u);
    // One process reads every tensor it maps.
    EXPECT_EQ(m->read_weights(2), total);
    for (int ranks : {2, E}) {
      if (E % ranks != 0) continue;
      RankShard s;
      s.ranks = s.ep = ranks;
      EXPECT_NO_THROW(s.validate(m->config));
      // The heads split by vocabulary rows where the ranks divide the vocabulary.
      const size_t head_share = s.splits_head(m->config.vocab_size) ? heads / size_t(ranks) : heads;
      // The shared expert runs on member 0 alone.
      size_t sum = 0;
      for (int r = 0; r < ranks; ++r) {
        s.rank = r;
        const size_t b = shard_bytes(m->files, m->config, s);
        EXPECT_EQ(b, total - experts - heads - shared + experts / size_t(ranks) + head_share + (r == 0 ? shared : 0))
            << "rank " << r << " of " << ranks;
        sum += b;
      }
      EXPECT_EQ(sum, size_t(ranks) * (total - experts - heads - shared) + experts + shared + size_t(ranks) * head_share);
    }
    RankShard two;
    two.ranks = two.ep = 2;
    two.rank = 1;
    TensorInfo t;
    t.nbytes = 4096;
    EXPECT_EQ(two.owned_bytes("model.layers.3.mlp.experts.0.up_proj.weight", t, m->config).second, 0u);
    EXPECT_EQ(two.owned_bytes("model.layers.3.mlp.experts." + std::to_string(E - 1) + ".up_proj.weight_scale_inv", t, m->config).second, 4096u);
    EXPECT_EQ(two.owned_bytes("model.layers.3.mlp.shared_experts.up_proj.weight", t, m->config).second, 0u);
    two.rank = 0;
    EXPECT_EQ(two.owned_bytes("model.layers.3.mlp.shared_experts.up_proj.weight", t, m->config).second, 4096u);
    RankShard odd;
    odd.ranks = odd.ep = E + 1;
    EXPECT_THROW(odd.validate(m->config), Error);
  }
}

// check(model) on every golden case's model (mapped, nothing read); a missing case fails.
template <class F>
void for_every_golden_model(F check) {
  const auto cases = test::golden_cases();
  ASSERT_TRUE(test::golden_cases_complete(cases));
  for (const auto& name : cases) {
    SCOPED_TRACE(name);
    check(*Model::load(test::golden_dir() + "/" + name + "/model", true, false, false));
  }
}

// Pipeline stages: every tensor is read by exactly one stage (the main embedding by the
// first, and by the last too when the MTP layer has no embedding of its own), each stage
// the tensors of its own layers.
TEST(Loader, PipelineStagesReadDisjointLayers) {
  for_every_golden_model([](const Model& m) {
    RankShard s = m.shard;
    s.ranks = s.pp = 2;
    ASSERT_NO_THROW(s.validate(m.config));
    const int L = m.config.num_hidden_layers;
    for (const auto& [tname, t] : m.files.tensors()) {
      int readers = 0;
      for (s.rank = 0; s.rank < 2; ++s.rank) {
        const auto [off, len] = s.owned_bytes(tname, t, m.config);
        EXPECT_TRUE(len == 0 || (off == 0 && len == t.nbytes)) << tname;
        readers += len > 0;
        if (len > 0 && tname.rfind("model.layers.", 0) == 0) {
          const int l = std::stoi(tname.substr(13));
          EXPECT_TRUE(l >= s.first_layer(L) && (l < s.end_layer(L) || (l == L && s.last_stage()))) << tname << " on stage " << s.rank;
        }
      }
      const bool shared_embedding = tname == "model.embed_tokens.weight" && s.mtp_uses_main_embedding;
      EXPECT_EQ(readers, shared_embedding ? 2 : 1) << tname;
    }
    RankShard deep = m.shard;
    deep.ranks = deep.pp = L + 1;
    EXPECT_THROW(deep.validate(m.config), Error);
  });
}

// Tensor-parallel ranks: q_b_proj, kv_b_proj and o_proj split by rows into equal, disjoint
// ranges covering the tensor, and so is every MLP weight (gate_proj, up_proj, down_proj of
// the dense layers, the shared expert and each routed expert); with --ep as well the routed
// experts are split whole instead; the heads and the embeddings by vocabulary rows;
// everything else read whole by every rank.
TEST(Loader, TensorParallelRanksSplitTheAttentionAndMlpRows) {
  for_every_golden_model([](const Model& m) {
    const ModelConfig& c = m.config;
    for (const bool with_ep : {false, true}) {
      SCOPED_TRACE(with_ep ? "--tp 2 --ep 2" : "--tp 2");
      RankShard s = m.shard;
      s.ranks = s.tp = 2;
      s.ep = with_ep ? 2 : 1;
      ASSERT_NO_THROW(s.validate(c));
      int split = 0, mlp_split = 0, mlp_weights = 0;
      for (const auto& [tname, t] : m.files.tensors()) {
        const bool weight = tname.find("_scale_inv") == std::string::npos;
        const bool attn_rows = tname.find("q_b_proj.weight") != std::string::npos || tname.find("kv_b_proj.weight") != std::string::npos ||
                               tname.find("o_proj.weight") != std::string::npos;
        const bool mlp = tname.find(".mlp.") != std::string::npos &&
                         (tname.find("gate_proj.weight") != std::string::npos || tname.find("up_proj.weight") != std::string::npos ||
                          tname.find("down_proj.weight") != std::string::npos);
        const bool expert = tname.find(".mlp.experts.") != std::string::npos;
        // The heads and the embeddings, by vocabulary rows.
        const bool head = tname == "lm_head.weight" || tname.find("shared_head.head.weight") != std::string::npos ||
                          tname.find("embed_tokens.weight") != std::string::npos;
        s.rank = 0;
        const auto a = s.owned_bytes(tname, t, c);
        s.rank = 1;
        const auto b = s.owned_bytes(tname, t, c);
        mlp_weights += mlp && weight && !expert;
        if (((attn_rows || (mlp && !(expert && with_ep))) && weight) || head) {
          EXPECT_EQ(a.first, 0u) << tname;
          EXPECT_EQ(a.second, b.second) << tname;
          EXPECT_EQ(b.first, a.second) << tname;
          EXPECT_EQ(a.second + b.second, t.nbytes) << tname;
          split += attn_rows;
          mlp_split += mlp && !expert;
        } else if (expert && with_ep) {
          EXPECT_TRUE(a.second == 0 || b.second == 0) << tname;
          EXPECT_EQ(a.second + b.second, t.nbytes) << tname;
        } else {
          EXPECT_EQ(a, (std::pair<size_t, size_t>{0, t.nbytes})) << tname;
          EXPECT_EQ(b, a) << tname;
        }
      }
      EXPECT_EQ(split, 3 * (c.num_hidden_layers + (m.weights.mtp ? 1 : 0)));
      EXPECT_GT(mlp_weights, 0);
      EXPECT_EQ(mlp_split, mlp_weights);
    }
    RankShard wide = m.shard;
    wide.ranks = wide.tp = c.num_attention_heads + 1;
    EXPECT_THROW(wide.validate(c), Error);
    // An MLP whose intermediate the ranks do not divide is refused, naming the width.
    RankShard two = m.shard;
    two.ranks = two.tp = 2;
    ModelConfig odd = c;
    odd.moe_intermediate_size += 1;
    try {
      two.validate(odd);
      ADD_FAILURE() << "an odd moe_intermediate_size split over --tp 2";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("moe_intermediate_size " + std::to_string(odd.moe_intermediate_size)), std::string::npos) << e.what();
    }
  });
}

TEST(Loader, MissingTensorIsNamed) {
  const std::string dir = make("missing", "tiny", "fp8", 1);
  auto bl = blobs_of(dir + "/model.safetensors");
  std::erase_if(bl, [](const TensorBlob& b) { return b.name == "model.layers.1.self_attn.indexer.wk.weight_scale_inv"; });
  write_safetensors(dir + "/model.safetensors", bl);
  expect_load_error(dir, {"model.layers.1.self_attn.indexer.wk.weight_scale_inv", "missing"});
}

TEST(Loader, WrongShapeAndDtypeAreNamed) {
  const std::string dir = make("shape", "tiny", "fp8", 1);
  auto bl = blobs_of(dir + "/model.safetensors");
  for (auto& b : bl)
    if (b.name == "model.layers.0.self_attn.o_proj.weight") b.shape = {b.shape[1], b.shape[0]};
  write_safetensors(dir + "/model.safetensors", bl);
  // o_proj is [256, 128] for tiny (hidden 256, 4 heads x v 32), so the swap changes it.
  expect_load_error(dir, {"model.layers.0.self_attn.o_proj.weight", "[128, 256]", "expected [256, 128]"});

  const std::string d2 = make("dtype", "tiny", "fp8", 1);
  auto b2 = blobs_of(d2 + "/model.safetensors");
  for (auto& b : b2)
    if (b.name == "model.layers.0.self_attn.q_a_proj.weight_scale_inv") {
      b.dtype = DType::I32;
    }
  write_safetensors(d2 + "/model.safetensors", b2);
  expect_load_error(d2, {"q_a_proj.weight_scale_inv", "I32", "expected F32"});

  const std::string d3 = make("nanscale", "tiny", "fp8", 1);  // a corrupt block scale
  auto b3 = blobs_of(d3 + "/model.safetensors");
  for (auto& b : b3)
    if (b.name == "model.layers.1.self_attn.o_proj.weight_scale_inv") {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(b.bytes.data() + 4, &nan, 4);
    }
  write_safetensors(d3 + "/model.safetensors", b3);
  expect_load_error(d3, {"model.layers.1.self_attn.o_proj.weight_scale_inv", "nan", "block 1,0"});
}

TEST(Loader, TruncatedAndMalformedFiles) {
  const std::string dir = make("trunc", "tiny", "fp8", 1);
  const std::string f = dir + "/model.safetensors";
  fs::resize_file(f, fs::file_size(f) - 1000);
  expect_load_error(dir, {"model.safetensors", "outside the data region"});

  fs::resize_file(f, 5);
  expect_load_error(dir, {"model.safetensors", "truncated"});

  {  // header length pointing past the end
    std::ofstream o(f, std::ios::binary | std::ios::trunc);
    const uint64_t n = 1 << 30;
    o.write(reinterpret_cast<const char*>(&n), 8);
    o << "{}";
  }
  expect_load_error(dir, {"model.safetensors", "header length"});

  {  // header that is not JSON
    std::ofstream o(f, std::ios::binary | std::ios::trunc);
    const std::string h = "{\"a\": [1, 2";
    const uint64_t n = h.size();
    o.write(reinterpret_cast<const char*>(&n), 8);
    o << h;
  }
  expect_load_error(dir, {"model.safetensors", "malformed"});

  {  // offsets out of range and a size that does not match the shape
    std::ofstream o(f, std::ios::binary | std::ios::trunc);
    const std::string h = R"({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}})";
    const uint64_t n = h.size();
    o.write(reinterpret_cast<const char*>(&n), 8);
    o << h << std::string(12, '\0');
  }
  expect_load_error(dir, {"'x'", "12 bytes stored", "needs 16"});

  fs::remove(f);
  expect_load_error(dir, {"expected model.safetensors.index.json or model.safetensors"});
}

TEST(Loader, ShardIndexErrors) {
  const std::string dir = make("idx", "tiny", "fp8", 2);
  fs::remove(dir + "/model-00002-of-00002.safetensors");
  expect_load_error(dir, {"model-00002-of-00002.safetensors"});
  std::ofstream(dir + "/model.safetensors.index.json") << "{ not json";
  expect_load_error(dir, {"model.safetensors.index.json", "malformed JSON"});
}

TEST(Config, ErrorsNameTheField) {
  const std::string dir = make("cfg", "tiny", "fp8", 1);
  set_config(dir, [](auto& j) { j["model_type"] = "llama"; });
  expect_load_error(dir, {"model_type", "llama", "deepseek_v32"});
  set_config(dir, [](auto& j) { j["model_type"] = "deepseek_v32"; j.erase("kv_lora_rank"); });
  expect_load_error(dir, {"kv_lora_rank", "missing"});
  set_config(dir, [](auto& j) { j["kv_lora_rank"] = 128; j["index_head_dim"] = 64; });
  expect_load_error(dir, {"index_head_dim", "128"});
  set_config(dir, [](auto& j) { j["index_head_dim"] = 128; j["hidden_size"] = "big"; });
  expect_load_error(dir, {"hidden_size", "integer"});
  set_config(dir, [](auto& j) { j["hidden_size"] = 256; j["n_group"] = 3; });
  expect_load_error(dir, {"n_group", "divide"});
  set_config(dir, [](auto& j) { j["n_group"] = 4; j["rope_scaling"]["type"] = "dynamic"; });
  expect_load_error(dir, {"rope_scaling", "dynamic"});
  set_config(dir, [](auto& j) { j["rope_scaling"]["type"] = "yarn"; j["indexer_types"] = {"full", "shared"}; });
  expect_load_error(dir, {"indexer_types", "3"});
  set_config(dir, [](auto& j) { j["indexer_types"] = {"shared", "full", "full"}; });
  expect_load_error(dir, {"indexer_types", "layer 0"});
  std::ofstream(dir + "/config.json") << "{\"model_type\": ";
  expect_load_error(dir, {"config.json", "malformed JSON"});
  fs::remove(dir + "/config.json");
  expect_load_error(dir, {"config.json"});
  expect_load_error(dir + "/nope", {"does not exist"});
}

TEST(Config, ValuesThatWouldWrapOrPoisonAreRefused) {
  auto base = nlohmann::json::parse(make_model_config("tiny", "fp8"));
  auto expect_error = [&](const std::function<void(nlohmann::json&)>& edit, std::initializer_list<std::string> needles) {
    auto j = base;
    edit(j);
    try {
      ModelConfig::from_json_text(j.dump());
      FAIL() << "accepted: " << j.dump();
    } catch (const Error& e) {
      for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << "\nmissing: " << n;
    }
  };
  // 2^32 + 256 must not become 256, nor 2^31 a negative number.
  expect_error([](auto& j) { j["hidden_size"] = 4294967552ull; }, {"hidden_size", "out of range"});
  expect_error([](auto& j) { j["n_shared_experts"] = 2147483648ll; }, {"n_shared_experts", "out of range"});
  expect_error([](auto& j) { j["num_hidden_layers"] = -1; }, {"num_hidden_layers"});
  expect_error([](auto& j) { j["num_hidden_layers"] = 100000000; }, {"num_hidden_layers"});
  expect_error([](auto& j) { j["index_topk"] = 1000000000; }, {"index_topk", "at most"});
  // Values that turn every logit into NaN.
  expect_error([](auto& j) { j["rms_norm_eps"] = -1; }, {"rms_norm_eps", "> 0"});
  expect_error([](auto& j) { j["rope_theta"] = 0; }, {"rope_theta", "> 0"});
  expect_error([](auto& j) { j["rope_scaling"]["factor"] = 0; }, {"rope_scaling.factor"});
  expect_error([](auto& j) { j["rope_scaling"]["type"] = 5; }, {"rope_scaling.type", "string"});
  expect_error([](auto& j) { j["routed_scaling_factor"] = -1; }, {"routed_scaling_factor"});
  expect_error([](auto& j) { j["routed_scaling_factor"] = 1e39; }, {"routed_scaling_factor"});
  expect_error([](auto& j) { j["rope_scaling"]["mscale"] = 1e20; }, {"rope_scaling.mscale"});
  expect_error([](auto& j) { j["index_topk_freq"] = 0; }, {"index_topk_freq"});
  expect_error([](auto& j) { j["first_k_dense_replace"] = -1; }, {"first_k_dense_replace"});
  {  // past the last layer: every layer dense, as in HF
    auto j = base;
    j["first_k_dense_replace"] = 99;
    EXPECT_FALSE(ModelConfig::from_json_text(j.dump()).is_moe_layer(2));
  }
  expect_error([](auto& j) { j["n_routed_experts"] = -16; }, {"n_routed_experts"});
  EXPECT_NO_THROW(ModelConfig::from_json_text(base.dump()));
}

// Few heads and a wide latent: the absorbed path's scratch ([n, nope + kv_lora + v]) is
// larger than the expanded one ([n, heads * (nope + v)]); it used to abort on a check.
TEST(Loader, OneHeadWideLatentRuns) {
  MakeModelOptions o;
  o.preset = "tiny";
  o.seed = 3;
  o.verbose = false;
  o.out_dir = tmpdir("onehead");
  o.config_patch = R"({"num_attention_heads": 1})";
  make_model(o);
  auto m = Model::load(o.out_dir, false);
  ASSERT_EQ(m->config.num_attention_heads, 1);
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6};
  for (CacheType cache : {CacheType::F32, CacheType::FP8}) {
    const TeacherForcedResult r = run_teacher_forced(*m, ids, 4, cache, false, false);
    for (float v : r.logits) ASSERT_TRUE(std::isfinite(v));
  }
}

// More expert groups than the routing code once kept on the stack (256): 300 groups of two
// experts, 4 kept. Each token's experts are distinct, in range, and come from at most
// topk_group groups (the sanitizer build catches any write past the scratch).
TEST(Loader, ManyExpertGroupsRouteWithinTheKeptGroups) {
  MakeModelOptions o;
  o.preset = "tiny";
  o.seed = 4;
  o.verbose = false;
  o.out_dir = tmpdir("groups");
  o.config_patch = R"({"n_group": 300, "n_routed_experts": 600, "topk_group": 4, "moe_intermediate_size": 16})";
  make_model(o);
  auto m = Model::load(o.out_dir, false);
  const ModelConfig& c = m->config;
  ASSERT_EQ(c.n_group, 300);
  const int per = c.n_routed_experts / c.n_group, k = c.num_experts_per_tok;
  const TeacherForcedResult r = run_teacher_forced(*m, {5, 9, 2, 7, 1, 3}, 4, CacheType::F32, false, true);
  int layers = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    ++layers;
    const auto& ex = r.ints.at("moe.experts." + std::to_string(l)).v;
    ASSERT_EQ(ex.size(), size_t(r.T) * size_t(k));
    for (int t = 0; t < r.T; ++t) {
      std::set<int32_t> experts, groups;
      for (int j = 0; j < k; ++j) {
        const int32_t e = ex[size_t(t * k + j)];
        ASSERT_TRUE(e >= 0 && e < c.n_routed_experts) << "layer " << l << " token " << t << ": expert " << e;
        experts.insert(e);
        groups.insert(e / per);
      }
      EXPECT_EQ(int(experts.size()), k) << "layer " << l << " token " << t << " repeats an expert";
      EXPECT_LE(int(groups.size()), c.topk_group) << "layer " << l << " token " << t;
    }
  }
  EXPECT_GT(layers, 0);
}

// A weight block wider than the kernels' per-block scratch is refused by name.
TEST(Config, WeightBlockBeyondTheKernelsIsRefused) {
  auto j = nlohmann::json::parse(make_model_config("tiny", "fp8"));
  j["quantization_config"]["weight_block_size"] = {128, 1024};
  try {
    (void)ModelConfig::from_json_text(j.dump());
    ADD_FAILURE() << "a 1024-column weight block was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight_block_size"), std::string::npos) << e.what();
  }
}

TEST(Loader, ConfigThatDoesNotDescribeTheCheckpointFails) {
  // tiny: 3 main layers (layer 0 dense) + the MTP layer 3.
  const std::string dir = make("mismatch", "tiny", "fp8", 1);
  set_config(dir, [](auto& j) { j["num_hidden_layers"] = 4; });
  expect_load_error(dir, {"layer 3", "MTP"});
  set_config(dir, [](auto& j) { j["num_hidden_layers"] = 2; });
  expect_load_error(dir, {"decoder layer 2", "num_hidden_layers = 2"});
  set_config(dir, [](auto& j) { j["num_hidden_layers"] = 3; j["n_shared_experts"] = 0; });
  expect_load_error(dir, {"shared_experts", "n_shared_experts = 0"});
  set_config(dir, [](auto& j) { j["n_shared_experts"] = 1; });
  EXPECT_NO_THROW(Model::load(dir, true));
}

TEST(Loader, CorruptHeadersAndSpecialFiles) {
  const std::string dir = make("corrupt", "tiny", "fp8", 1);
  const std::string f = dir + "/model.safetensors";
  auto write_raw = [&](const std::string& h, size_t data) {
    std::ofstream o(f, std::ios::binary | std::ios::trunc);
    const uint64_t n = h.size();
    o.write(reinterpret_cast<const char*>(&n), 8);
    o << h << std::string(data, '\0');
  };
  write_raw(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", 24);
  expect_load_error(dir, {"'a'", "'b'", "overlap"});
  write_raw(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "a": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}})", 32);
  expect_load_error(dir, {"'a'", "twice"});
  write_raw(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", 0);
  expect_load_error(dir, {"'a'", "too large"});
  write_raw("{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}", 0);
  expect_load_error(dir, {"model.safetensors", "nested deeper"});
  // A FIFO must be refused, not waited on.
  fs::remove(f);
  ASSERT_EQ(::mkfifo(f.c_str(), 0600), 0);
  expect_load_error(dir, {"model.safetensors", "not a regular file"});
  fs::remove(f);
  fs::remove(dir + "/config.json");
  fs::create_directory(dir + "/config.json");
  expect_load_error(dir, {"config.json", "not a regular file"});
}

TEST(Config, IndexerScheduleAndRopeVariants) {
  auto base = nlohmann::json::parse(make_model_config("tiny", "fp8"));
  base["num_hidden_layers"] = 8;
  auto c = ModelConfig::from_json_text(base.dump());
  EXPECT_EQ(c.indexer_schedule_str(), "FFFFFFFF");  // DeepSeek: all full
  base["index_topk_freq"] = 4;
  base["index_skip_topk_offset"] = 3;
  EXPECT_EQ(ModelConfig::from_json_text(base.dump()).indexer_schedule_str(), "FFFSSSFS");  // GLM-5.2 rule
  base["index_topk_pattern"] = "FSFSFSFS";
  EXPECT_EQ(ModelConfig::from_json_text(base.dump()).indexer_schedule_str(), "FSFSFSFS");
  base["indexer_types"] = {"full", "full", "shared", "shared", "full", "shared", "shared", "shared"};
  EXPECT_EQ(ModelConfig::from_json_text(base.dump()).indexer_schedule_str(), "FFSSFSSS");  // explicit list wins

  // YaRN scale: (nope + rope)^-0.5 * (0.1 ln 40 + 1)^2 for the released DeepSeek config.
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c.softmax_scale(), std::pow(48.0, -0.5) * m * m, 1e-12);
  auto glm = nlohmann::json::parse(make_model_config("tiny-glm", "fp8"));
  const auto g = ModelConfig::from_json_text(glm.dump());
  EXPECT_FALSE(g.rope.yarn);
  EXPECT_EQ(g.rope.theta, 1e6);
  EXPECT_NEAR(g.softmax_scale(), std::pow(64.0, -0.5), 1e-12);
  EXPECT_TRUE(g.indexer_rope_interleave);
  EXPECT_EQ(ModelConfig::mla_cache_bytes_fp8(512, 64), 656);
  EXPECT_EQ(ModelConfig::indexer_cache_bytes(128), 132);
}

}  // namespace

// Regression tests for inputs found by the fuzz targets (fuzz/), each reproduced literally.
namespace {

// A .safetensors image: 8-byte little-endian header length, the header, `data` zero bytes.
std::vector<uint8_t> safetensors_image(const std::string& header, size_t data) {
  std::vector<uint8_t> img(8 + header.size() + data, 0);
  const uint64_t n = header.size();
  std::memcpy(img.data(), &n, 8);
  std::memcpy(img.data() + 8, header.data(), header.size());
  return img;
}

void expect_header_error(const std::string& header, size_t data, std::initializer_list<std::string> needles) {
  const auto img = safetensors_image(header, data);
  try {
    parse_safetensors(img.data(), img.size(), "x.safetensors");
    FAIL() << "header should have been refused: " << header;
  } catch (const Error& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "message: " << e.what() << "\nmissing: " << n;
  }
}

// Shape entries and offsets that are not non-negative integers were converted with
// get<int64_t>() / get<uint64_t>(): 1e300 or -1.5 is undefined behaviour (UBSan), and a zero
// dimension hid an int64 overflow of [2^62, 2] from the byte count (numel() overflowed).
TEST(Loader, SafetensorsNumbersThatAreNotSizes) {
  expect_header_error(R"({"a": {"dtype": "F32", "shape": [1e300], "data_offsets": [0, 0]}})", 0, {"'a'", "shape", "1e+300"});
  expect_header_error(R"({"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}})", 8, {"'a'", "shape"});
  expect_header_error(R"({"a": {"dtype": "F32", "shape": 4, "data_offsets": [0, 16]}})", 16, {"'a'", "shape must be a list"});
  expect_header_error(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [-1.5, 1]}})", 1, {"'a'", "data_offsets"});
  expect_header_error(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [-1, 0]}})", 1, {"'a'", "data_offsets"});
  expect_header_error(R"({"a": {"dtype": "U8", "shape": [4611686018427387904, 2, 0], "data_offsets": [0, 0]}})", 0, {"'a'", "too large"});
  expect_header_error(R"({"a": {"dtype": 7, "shape": [1], "data_offsets": [0, 1]}})", 1, {"'a'", "dtype must be a string"});
  // Still accepted: an empty tensor and a scalar.
  const auto ok = safetensors_image(R"({"e": {"dtype": "F32", "shape": [0, 5], "data_offsets": [0, 0]}, "s": {"dtype": "I64", "shape": [], "data_offsets": [0, 8]}})", 8);
  const auto ts = parse_safetensors(ok.data(), ok.size(), "ok.safetensors");
  ASSERT_EQ(ts.size(), 2u);
  EXPECT_EQ(ts[0].numel(), 0);
  EXPECT_EQ(ts[1].nbytes, 8u);
}

// An index that names, for a tensor, a shard other than the one holding it was accepted
// because some other listed shard had the name (fuzz_safetensors_index).
TEST(Loader, IndexMustNameTheShardHoldingEachTensor) {
  const std::string dir = tmpdir("index_shard");
  const float v[2] = {1, 2};
  write_safetensors(dir + "/shard2.safetensors", {make_blob_f32("c", {2}, v)});
  write_safetensors(dir + "/shard3.safetensors", {make_blob_f32("a", {2}, v)});
  std::ofstream(dir + "/model.safetensors.index.json") << R"({"weight_map":{"a":"shard2.safetensors","c":"shard3.safetensors"}})";
  try {
    SafeTensors::open(dir);
    FAIL() << "index naming the wrong shards should have been refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'a'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("missing from shard 'shard2.safetensors' (it is in 'shard3.safetensors')"), std::string::npos) << e.what();
  }
  std::ofstream(dir + "/model.safetensors.index.json") << R"({"weight_map":{"a":"shard3.safetensors","c":"shard2.safetensors"}})";
  EXPECT_EQ(SafeTensors::open(dir).num_files(), 2u);
}

// Shard names are opened beside the index: "", ".", ".." and names with a NUL (which open()
// would cut short) are refused like names with a '/'.
TEST(Loader, ShardNamesMustBePlainFileNames) {
  for (const std::string name : {R"("")", R"(".")", R"("..")", R"("a\u0000b.safetensors")", R"("../x.safetensors")"}) {
    try {
      parse_safetensors_index(R"({"weight_map":{"t":)" + name + "}}", "model.safetensors.index.json");
      FAIL() << "shard name " << name << " should have been refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("must be a plain file name"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parse_safetensors_index("[1]", "i.json"), Error);
  EXPECT_THROW(parse_safetensors_index(R"({"weight_map":{"t":3}})", "i.json"), Error);
  EXPECT_EQ(parse_safetensors_index(R"({"weight_map":{"t":"m.safetensors"}})", "i.json").at("t"), "m.safetensors");
}

}  // namespace

namespace {

// fuzz_config: qk_nope_head_dim 2^31-1 passed validation, and qk_head_dim() (nope + rope, in
// int) overflowed in softmax_scale(). Head dims are now bounded like the other sizes.
TEST(Config, HeadDimsThatWouldOverflowAreRefused) {
  for (const char* field : {"qk_nope_head_dim", "v_head_dim"}) {
    auto j = nlohmann::json::parse(make_model_config("tiny", "fp8"));
    j[field] = 2147483647;
    try {
      ModelConfig::from_json_text(j.dump());
      FAIL() << field << " = 2^31-1 should have been refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("at most 4096"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
