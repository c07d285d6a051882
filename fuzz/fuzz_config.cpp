// config.json: parsing and validation (ModelConfig::from_json_text), on the input text and on
// type-confused variants of it (fuzz_util.h). A config that is accepted must pass validate()
// again and give finite derived values for every layer, since the loader, the planner and
// the forward pass use them without further checks.
#include <cmath>
#include <string>

#include "core/error.h"
#include "fuzz_util.h"
#include "io/json.h"
#include "model/config.h"

namespace {

void check(const std::string& text) {
  const dsa::ModelConfig c = dsa::ModelConfig::from_json_text(text, "fuzz/config.json");  // dsa::Error: refused
  try {
    c.validate();
  } catch (const dsa::Error& e) {
    FUZZ_CHECK(false, std::string("accepted config fails validate(): ") + e.what());
  }
  FUZZ_CHECK(c.family == dsa::Family::DeepseekV32 || c.family == dsa::Family::GlmMoeDsa, c.model_type);
  FUZZ_CHECK(int(c.indexer_full.size()) == c.num_hidden_layers, "indexer schedule length");
  FUZZ_CHECK(c.indexer_schedule_str().size() == c.indexer_full.size(), "schedule string");
  FUZZ_CHECK(c.num_full_indexer_layers() >= 1 && c.is_indexer_full(0), "layer 0 needs its own indexer");
  for (int l = 0; l <= c.num_hidden_layers; ++l) {
    (void)c.is_moe_layer(l);
    (void)c.is_indexer_full(l);
  }
  FUZZ_CHECK(c.qk_head_dim() > 0, "qk_head_dim");
  const double s = c.softmax_scale(), r = c.rope_attention_factor();
  FUZZ_CHECK(std::isfinite(s) && s > 0, "softmax_scale " + std::to_string(s));
  FUZZ_CHECK(std::isfinite(r) && r > 0, "rope_attention_factor " + std::to_string(r));
  FUZZ_CHECK(dsa::ModelConfig::mla_cache_bytes_fp8(c.kv_lora_rank, c.qk_rope_head_dim) > 0, "cache bytes");
  FUZZ_CHECK(dsa::ModelConfig::indexer_cache_bytes(c.index_head_dim) > 0, "indexer cache bytes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dsa::fuzz::run_json_text(dsa::fuzz::as_view(data, size), 32, check);
  return 0;
}
