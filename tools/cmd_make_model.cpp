// `dsa make-model`: a random-weight checkpoint in the real layout, with a tokenizer.
#include <cstdio>
#include <filesystem>

#include "command.h"
#include "core/error.h"
#include "model/config.h"
#include "model/make_model.h"
#ifdef DSA_HAS_RUNTIME
#include "runtime/synthetic_tokenizer.h"
#endif

namespace {

struct Args {
  dsa::MakeModelOptions opt;
  std::string tokenizer;
};

void run(const Args& a) {
  namespace fs = std::filesystem;
  if (!a.tokenizer.empty()) {
    const fs::path src = fs::is_directory(a.tokenizer) ? fs::path(a.tokenizer) / "tokenizer.json" : fs::path(a.tokenizer);
    if (!fs::exists(src)) throw dsa::Error("--tokenizer: '" + src.string() + "' does not exist (expected a tokenizer.json or its folder)");
  }
  dsa::make_model(a.opt);
  const std::string& out = a.opt.out_dir;
  if (!a.tokenizer.empty()) {
    const fs::path src = fs::is_directory(a.tokenizer) ? fs::path(a.tokenizer) / "tokenizer.json" : fs::path(a.tokenizer);
    fs::copy_file(src, fs::path(out) / "tokenizer.json", fs::copy_options::overwrite_existing);
    const fs::path cfg = src.parent_path() / "tokenizer_config.json";
    if (fs::exists(cfg)) fs::copy_file(cfg, fs::path(out) / "tokenizer_config.json", fs::copy_options::overwrite_existing);
  } else {
#ifdef DSA_HAS_RUNTIME
    // A small byte-level BPE sized to the model's vocabulary, with the DeepSeek-V3.2 and
    // GLM-5 chat tokens, so `dsa run` and `dsa chat` work on the random model.
    dsa::write_synthetic_tokenizer(out, dsa::ModelConfig::from_file(out).vocab_size);
#endif
  }
  std::fprintf(stderr, "wrote %s (preset %s, %s): RANDOM weights, for trying and benchmarking the engine only\n",
               out.c_str(), a.opt.preset.c_str(), a.opt.dtype.c_str());
}

void setup_make_model(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("make-model", "Write a random-weight checkpoint (config.json + safetensors + tokenizer) to try the engine");
  cmd->add_option("--preset", a->opt.preset, "tiny | tiny-glm | v32-mini (benchmark shape)")->capture_default_str();
  cmd->add_option("--out", a->opt.out_dir, "Output directory")->required();
  cmd->add_option("--dtype", a->opt.dtype, "fp8 (128x128 blocks, e4m3) or bf16")->capture_default_str();
  cmd->add_option("--shards", a->opt.shards, "Number of safetensors shards (with model.safetensors.index.json)")->capture_default_str();
  cmd->add_option("--seed", a->opt.seed, "Random seed")->capture_default_str();
  cmd->add_option("--tokenizer", a->tokenizer, "Copy this tokenizer.json (or folder) instead of generating a small one");
  cmd->callback([a] { run(*a); });
}

}  // namespace

DSA_COMMAND(20, setup_make_model);
