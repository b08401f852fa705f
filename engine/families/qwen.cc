// Qwen2/2.5 (model_type qwen2): Llama with q/k/v biases; Qwen3 (qwen3): attention biases as
// configured (default none), RMSNorm of every q and k head before RoPE, head_dim 128 by default.
// Both slide only with use_sliding_window, on the layers from max_window_layers on (or as
// layer_types says).
#include "engine/families/families.h"
#include "engine/families/llama_like.h"

namespace flexh2o::engine {

namespace {

bool slides(const HfConfig& j, std::int64_t layer) {
  return j.get<bool>("use_sliding_window", false) && layer >= j.get<std::int64_t>("max_window_layers", 0);
}

void read_windows(const HfConfig& j, ModelConfig& c) {
  // transformers drops the window when use_sliding_window is false, layer_types or not.
  if (j.get<bool>("use_sliding_window", false)) c.layer_window = read_layer_windows(j, c.n_layers, slides);
}

void qwen2_preset(ModelConfig& c) {
  llama_preset(c);
  c.qkv_bias = true;
}

void read_qwen2(const HfConfig& j, ModelConfig& c) {
  read_llama_like(j, c, /*tie_default=*/false);
  c.qkv_bias = true;  // hard-wired in Qwen2Attention, not a config field
  read_windows(j, c);
}

void qwen3_preset(ModelConfig& c) {
  llama_preset(c);
  c.qk_norm = true;
}

void read_qwen3(const HfConfig& j, ModelConfig& c) {
  read_llama_like(j, c, /*tie_default=*/false, /*head_dim_default=*/128);
  c.qkv_bias = c.o_bias = j.get<bool>("attention_bias", false);
  c.qk_norm = true;
  read_windows(j, c);
}

std::vector<HfTensorName> names(const ModelConfig&, const std::string& canonical) {
  return llama_like_names(canonical, llama_layer_names());
}

}  // namespace

const Family kQwen2Family{"qwen2", qwen2_preset, read_qwen2, names};
const Family kQwen3Family{"qwen3", qwen3_preset, read_qwen3, names};

}  // namespace flexh2o::engine
