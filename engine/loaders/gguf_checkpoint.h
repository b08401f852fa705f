// GGUF checkpoints (llama.cpp's model files) as a WeightSource.
//
// Config: `general.architecture` (llama, incl. Llama-3 and Mistral converted as llama; qwen2;
// qwen3; phi3; gemma2) picks the engine family, whose preset gives the features; shape, norm
// epsilon, RoPE (base, partial rotary, linear/YaRN scaling keys, Llama-3's rope_freqs and
// Phi-3's rope_factors_long/short tensors), windows, soft-caps and special token ids come from
// the `<arch>.*` and `tokenizer.ggml.*` keys. llama.cpp's converter permutes the q/k rows of
// the llama architecture into interleaved RoPE pairs, so those run with the interleaved layout
// (as llama2.c files do); the others keep rotate-half. It also adds 1 to Gemma-2's norm weights,
// so those run without the (1 + w) offset.
//
// Tensors: canonical names (engine/model/weights.h) map to llama.cpp's (token_embd, blk.N.attn_q,
// ..., output_norm; no `output`: tied embeddings; Phi-3's fused attn_qkv and ffn_up as row
// ranges). Rows are read on demand into the requested dtype: dequantized (every type of
// engine/loaders/gguf_blocks.h), or, for the matrices stored as Q4_0/Q4_1/Q8_0 when the weights
// are compressed, repacked into q4g32/q8g32 without loss (ModelConfig::stored_group_formats).
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/loaders/gguf_file.h"
#include "engine/model/weights.h"

namespace flexh2o::engine {

// The model config a GGUF header describes. `read_f32(tensor)` returns a small 1-D tensor's
// values (RoPE factor tensors). Throws std::runtime_error naming the file and the key.
ModelConfig gguf_model_config(const GgufHeader& h, const std::function<std::vector<float>(const GgufTensor&)>& read_f32);

class GgufCheckpoint final : public WeightSource {
 public:
  // Reads the header and the config, and checks that every tensor the config needs is in the
  // file, with its shape and a type flexh2o reads. Throws naming the file, key or tensor.
  explicit GgufCheckpoint(const std::string& path);

  const ModelConfig& config() const { return config_; }
  const GgufFile& file() const { return file_; }

  std::optional<std::vector<std::int64_t>> shape(const std::string& name) const override;
  std::string origin(const std::string& name) const override;
  void read_rows(const std::string& name, std::int64_t row_begin, std::int64_t row_end, void* dst,
                 kernels::DType to) const override;

 private:
  struct Located {
    const GgufTensor* tensor;
    bool part;  // rows [row_offset, row_offset + the canonical rows) of a fused tensor
    std::int64_t row_offset;
  };
  std::optional<Located> locate(const std::string& canonical) const;

  GgufFile file_;
  ModelConfig config_;
  std::map<std::string, WeightSpec> specs_;
};

}  // namespace flexh2o::engine
