// The shape and conventions of a decoder-only transformer: the OPT and LLaMA families.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/rope.h"

namespace flexh2o::engine {

enum class Family : std::uint8_t {
  Opt,    // learned positions (offset 2), LayerNorm, ReLU MLP, MHA, biases, tied lm_head
  Llama,  // RoPE, RMSNorm, SwiGLU MLP, GQA, no biases
};

struct ModelConfig {
  std::string name;
  Family family = Family::Llama;
  std::int64_t n_layers = 0;
  std::int64_t hidden = 0;
  std::int64_t ffn = 0;
  std::int64_t n_heads = 0;
  std::int64_t n_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t vocab_size = 0;
  std::int64_t max_positions = 0;
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  kernels::RopeLayout rope_layout = kernels::RopeLayout::RotateHalf;
  bool tie_embeddings = false;
  kernels::DType dtype = kernels::DType::F16;  // storage dtype of the weight matrices
  std::int32_t bos_id = -1;                    // -1: none
  std::vector<std::int32_t> stop_ids;          // generation ends at any of these

  bool has_bias() const { return family == Family::Opt; }
  // Bytes of all weights at `dtype` (matrices) and fp32 (vectors).
  std::int64_t weight_bytes() const;
  // Throws std::invalid_argument naming `source` and the field that is inconsistent.
  void validate(const std::string& source) const;
};

// The same model with its weight matrices stored as `dtype` (compress_weight: q4).
inline ModelConfig with_weight_dtype(ModelConfig c, kernels::DType dtype) {
  c.dtype = dtype;
  return c;
}

std::string family_name(Family f);

// A model config YAML (configs/models/*.yaml). Throws naming the file and the field.
ModelConfig load_model_yaml(const std::string& yaml_text, const std::string& source);
// A Hugging Face config.json (model_type opt or llama).
ModelConfig load_hf_config(const std::string& json_text, const std::string& source);
// The configs compiled into the binary from configs/models/, by name (e.g. "opt-30b").
std::vector<std::string> builtin_model_names();
// Throws listing the known names when `name` is unknown.
ModelConfig builtin_model(const std::string& name);

}  // namespace flexh2o::engine
