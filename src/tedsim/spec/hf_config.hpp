#pragma once
// Hugging Face config.json import: the decoder shapes of the MoE and dense architectures people
// train, mapped the way Megatron-Bridge's converters read them (model/hf/*.py there). A config
// carries no training sequence length: the model gets kHfDefaultSeqLen and --seq sets it.
#include <string>
#include <vector>

#include "tedsim/spec/model_spec.hpp"

namespace tedsim {

inline constexpr int kHfDefaultSeqLen = 4096;

struct HfImport {
  ModelSpec model;
  std::string architecture;
  std::vector<std::string> ignored;       // keys that do not change training cost
  std::vector<std::string> approximated;  // understood, but costed more simply (said why)
};

// Reads a config.json; an unknown architecture, a missing or malformed shape key, or a key that
// would change the shape and is not understood is an InputError naming the file and the key.
HfImport import_hf_config(const std::string& path);
HfImport import_hf_config_text(const std::string& text, const std::string& name);  // `name` in messages
ModelSpec load_hf_config(const std::string& path);  // the model of import_hf_config

// The architectures import_hf_config reads, for messages and docs.
const std::vector<std::string>& hf_architectures();

}  // namespace tedsim
