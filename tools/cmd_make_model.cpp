// `dsa make-model`: a random-weight checkpoint in the real layout.
#include <cstdio>

#include "command.h"
#include "model/make_model.h"

namespace {

void setup_make_model(CLI::App& app) {
  auto o = std::make_shared<dsa::MakeModelOptions>();
  auto* cmd = app.add_subcommand("make-model", "Write a random-weight checkpoint (config.json + safetensors) to try the engine");
  cmd->add_option("--preset", o->preset, "tiny | tiny-glm | v32-mini (benchmark shape)")->capture_default_str();
  cmd->add_option("--out", o->out_dir, "Output directory")->required();
  cmd->add_option("--dtype", o->dtype, "fp8 (128x128 blocks, e4m3) or bf16")->capture_default_str();
  cmd->add_option("--shards", o->shards, "Number of safetensors shards (with model.safetensors.index.json)")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  cmd->callback([o] {
    dsa::make_model(*o);
    std::fprintf(stderr, "wrote %s (preset %s, %s): RANDOM weights, for trying and benchmarking the engine only\n",
                 o->out_dir.c_str(), o->preset.c_str(), o->dtype.c_str());
  });
}

}  // namespace

DSA_COMMAND(20, setup_make_model);
