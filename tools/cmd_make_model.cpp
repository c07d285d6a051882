// `dsa make-model`: a random-weight checkpoint in the real layout, with a tokenizer.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <regex>

#include "command.h"
#include "core/error.h"
#include "model/config.h"
#include "model/make_model.h"
#ifdef DSA_HAS_RUNTIME
#include "runtime/synthetic_tokenizer.h"
#include "tokenizer/tokenizer.h"
#endif

namespace {

struct Args {
  dsa::MakeModelOptions opt;
  std::string tokenizer;
  bool force = false;
};

namespace fs = std::filesystem;

// The files make-model writes (model.safetensors or model-NNNNN-of-NNNNN.safetensors and
// the rest): what --force replaces. Other files in the folder are left alone.
bool is_model_file(const std::string& n) {
  static const std::regex shard(R"(model-[0-9]{5}-of-[0-9]{5}\.safetensors)");
  return n == "config.json" || n == "tokenizer.json" || n == "tokenizer_config.json" || n == "model.safetensors.index.json" ||
         n == "model.safetensors" || std::regex_match(n, shard);
}

fs::path tokenizer_source(const std::string& t) {
  return fs::is_directory(t) ? fs::path(t) / "tokenizer.json" : fs::path(t);
}

// Everything is written into OUT.partial first and moved into place only when complete,
// so a failure leaves no half-written checkpoint; an existing checkpoint is replaced only
// with --force (and then its stale shards or index go too).
void run(const Args& a) {
  fs::path out = fs::path(a.opt.out_dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();
  if (out.empty()) throw dsa::Error("--out: an output directory is required");
  if (fs::exists(out) && !fs::is_directory(out)) throw dsa::Error("--out: '" + out.string() + "' exists and is not a directory");
  if (fs::is_directory(out) && !fs::is_empty(out) && !a.force)
    throw dsa::Error("--out: '" + out.string() + "' exists and is not empty (choose a new directory, or pass --force to replace the checkpoint there)");
  if (!a.tokenizer.empty()) {
    const fs::path src = tokenizer_source(a.tokenizer);
    if (!fs::is_regular_file(src)) throw dsa::Error("--tokenizer: '" + src.string() + "' is not a file (expected a tokenizer.json or its folder)");
  }
  // A name of this run's own: nothing a user (or another run) made is removed.
  const fs::path stage = out.parent_path() / (out.filename().string() + ".partial-" + std::to_string(::getpid()));
  if (fs::exists(stage)) throw dsa::Error("make-model: '" + stage.string() + "' already exists; remove it first");
  try {
    dsa::MakeModelOptions opt = a.opt;
    opt.out_dir = stage.string();
    dsa::make_model(opt);
    const int vocab = dsa::ModelConfig::from_file(stage.string()).vocab_size;
    if (!a.tokenizer.empty()) {
      const fs::path src = tokenizer_source(a.tokenizer);
      const fs::path cfg = src.parent_path() / "tokenizer_config.json";
#ifdef DSA_HAS_RUNTIME
      // Parse it now: a bad file or a vocabulary larger than the model's would otherwise
      // only fail at the first prompt.
      const dsa::Tokenizer tok = dsa::Tokenizer::from_file(src.string(), fs::exists(cfg) ? cfg.string() : "");
      if (tok.vocab_size() > vocab)
        throw dsa::Error("--tokenizer: '" + src.string() + "' has " + std::to_string(tok.vocab_size()) + " tokens, more than preset " +
                         a.opt.preset + "'s vocab_size " + std::to_string(vocab) + " (use a preset with the tokenizer's vocabulary, e.g. v32-mini)");
#endif
      fs::copy_file(src, stage / "tokenizer.json");
      if (fs::exists(cfg)) fs::copy_file(cfg, stage / "tokenizer_config.json");
    } else {
#ifdef DSA_HAS_RUNTIME
      // A small byte-level BPE sized to the model's vocabulary, with the DeepSeek-V3.2 and
      // GLM-5 chat tokens, so `dsa run` and `dsa chat` work on the random model.
      dsa::write_synthetic_tokenizer(stage.string(), vocab);
#endif
    }
    if (!fs::exists(out)) {
      fs::rename(stage, out);
    } else {
      for (const auto& e : fs::directory_iterator(out))
        if (is_model_file(e.path().filename().string())) fs::remove_all(e.path());
      for (const auto& e : fs::directory_iterator(stage)) fs::rename(e.path(), out / e.path().filename());
      fs::remove(stage);
    }
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(stage);
    throw dsa::Error("make-model: cannot write '" + out.string() + "': " + e.code().message() + " (" + e.path1().string() + ")");
  } catch (...) {
    std::error_code ec;
    fs::remove_all(stage, ec);
    throw;
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
  cmd->add_option("--config-patch", a->opt.config_patch,
                  "JSON merge patch over the preset's config, e.g. '{\"num_nextn_predict_layers\": 1}' for an MTP layer");
  cmd->add_option("--tokenizer", a->tokenizer, "Copy this tokenizer.json (or folder) instead of generating a small one");
  cmd->add_flag("--force", a->force, "Replace the checkpoint files in an existing --out directory");
  cmd->callback([a] { run(*a); });
}

}  // namespace

DSA_COMMAND(20, setup_make_model);
