#pragma once
// SimModel: a ModelConfig plus the few facts the simulator needs that config.json does not
// carry (whether the model has a lightning indexer at all). Built-in models are stored as
// config.json text and go through ModelConfig::from_json_text, exactly like user checkpoints.
#include <string>
#include <vector>

#include "model/config.h"

namespace dsa::sim {

struct SimModel {
  ModelConfig cfg;
  // false for DeepSeek-V3 / V3.1 (dense MLA over every cached key, no indexer): the model
  // that DeepSeek's published serving figures and the V3.2 paper's baseline belong to.
  bool has_indexer = true;
  std::string name;  // built-in name or the path it was loaded from
};

// Names accepted by load_model(): deepseek-v3.2, deepseek-v3.2-exp, deepseek-v3, glm-5,
// glm-5.2, v32-mini.
std::vector<std::string> builtin_model_names();
std::string builtin_model_json(const std::string& name);  // throws dsa::Error if unknown

// A config.json text. model_type "deepseek_v3" (V3, R1, V3.1) is accepted and becomes a
// SimModel without indexer; its indexer fields are filled with placeholders the simulator
// never reads.
SimModel model_from_json_text(const std::string& text, const std::string& where);
// A built-in name, a model directory or a config.json path.
SimModel load_model(const std::string& name_or_path);
// Wraps a config the engine already parsed (always has an indexer).
SimModel model_from_config(const ModelConfig& cfg, const std::string& name = "model");

}  // namespace dsa::sim
