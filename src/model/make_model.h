#pragma once
// Writes random-weight checkpoints in the real Hugging Face layout (config.json +
// safetensors shards + index), so the engine can be tried and benchmarked without
// downloading the real models. The weights are random: the text they produce is noise.
#include <cstdint>
#include <string>
#include <vector>

namespace dsa {

struct MakeModelOptions {
  std::string preset = "tiny";   // see make_model_presets()
  std::string out_dir;
  std::string dtype = "fp8";     // fp8 (128x128 block e4m3 + weight_scale_inv) | bf16
  int shards = 1;
  uint64_t seed = 0;
  bool verbose = true;
  std::string config_patch;      // JSON merge patch over the preset's config (tests: odd shapes)
};

std::vector<std::string> make_model_presets();
// config.json text of a preset (throws dsa::Error for an unknown name).
std::string make_model_config(const std::string& preset, const std::string& dtype);
void make_model(const MakeModelOptions& opt);

}  // namespace dsa
