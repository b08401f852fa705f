// A model family: how one family's config.json (both the transformers 4 and 5 spellings) and
// tensor names map onto the generic decoder of ModelConfig. Adding a family is a converter in
// this folder plus its HF-parity fixture; layers, weights and the planner do not change.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/families/hf_config.h"
#include "engine/model/model_config.h"

namespace flexh2o::engine {

// Where a checkpoint keeps a canonical tensor (engine/model/weights.h): all of `name`, or (a part
// of a fused projection such as Phi-3's qkv_proj) its rows [row_offset, row_offset + rows of
// the canonical tensor).
struct HfTensorName {
  std::string name;
  bool part = false;
  std::int64_t row_offset = 0;
};

struct Family {
  const char* name;  // model_type in config.json; `family` in a model YAML
  // The family's features for a config whose shape fields are set (model YAMLs, built-ins).
  void (*preset)(ModelConfig& c);
  // Everything config.json says, shape included. Throws naming a field that changes the math
  // and is not implemented.
  void (*read_config)(const HfConfig& j, ModelConfig& c);
  // The names a canonical tensor may have in a checkpoint, most common first; empty when the
  // family has no such tensor.
  std::vector<HfTensorName> (*tensor_names)(const ModelConfig& c, const std::string& canonical);
};

// The family of a model_type; throws naming `source` and the supported families.
const Family& find_family(const std::string& model_type, const std::string& source);

// A Hugging Face config.json, through its family's converter.
ModelConfig load_hf_config(const std::string& json_text, const std::string& source);

// "layers.7.wq" -> 7 and "wq"; -1 and the whole name for tensors outside the layers.
std::int64_t split_layer_name(const std::string& canonical, std::string& rest);

}  // namespace flexh2o::engine
