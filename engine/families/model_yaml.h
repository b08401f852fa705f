// Model configs by name or YAML text: configs/models/*.yaml hold a family (whose preset sets
// the family's features) plus the shape fields.
#pragma once
#include <string>
#include <vector>

#include "engine/model/model_config.h"

namespace flexh2o::engine {

// A model config YAML (configs/models/*.yaml): a family preset plus shape fields. Throws
// naming the file and the field.
ModelConfig load_model_yaml(const std::string& yaml_text, const std::string& source);
// The configs compiled into the binary from configs/models/, by name (e.g. "opt-30b").
std::vector<std::string> builtin_model_names();
// Throws listing the known names when `name` is unknown.
ModelConfig builtin_model(const std::string& name);

}  // namespace flexh2o::engine
