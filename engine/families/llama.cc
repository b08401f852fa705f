// Llama 2/3.x (model_type llama): the base decoder, with optional attention/MLP biases,
// explicit head_dim and llama3 (or any other) RoPE scaling.
#include "engine/families/families.h"
#include "engine/families/llama_like.h"

namespace flexh2o::engine {

namespace {

void read(const HfConfig& j, ModelConfig& c) {
  read_llama_like(j, c, /*tie_default=*/false);
  c.qkv_bias = c.o_bias = j.get<bool>("attention_bias", false);
  c.mlp_bias = j.get<bool>("mlp_bias", false);
}

std::vector<HfTensorName> names(const ModelConfig&, const std::string& canonical) {
  return llama_like_names(canonical, llama_layer_names());
}

}  // namespace

const Family kLlamaFamily{"llama", llama_preset, read, names};

}  // namespace flexh2o::engine
