// Resolves what `--model` names into a config, a weight source and a tokenizer:
// nothing (the embedded stories260K), a Hugging Face directory, a GGUF file (by its .gguf
// extension or its magic), a llama2.c .bin file, a model YAML, or a built-in config name (the
// last two need --dummy).
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "engine/model/model_config.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/model/weights.h"
#include "kernels/backend.h"

namespace flexh2o::engine {

struct ModelOptions {
  std::string model;      // empty: the embedded stories260K
  std::string tokenizer;  // optional explicit tokenizer file
  bool dummy = false;     // random weights of the model's shape
  std::uint64_t seed = 0;
  std::optional<kernels::DType> dtype;  // storage dtype override for the weight matrices
};

struct ModelSource {
  ModelConfig config;
  std::unique_ptr<WeightSource> weights;
  std::unique_ptr<Tokenizer> tokenizer;  // null when the model ships none
  std::string description;               // for reports
};

ModelSource open_model(const ModelOptions& opt);
// --compute-dtype: "f32", "bf16", or "auto": bf16 for 16-bit weights where the backend
// multiplies bf16 natively, else f32 (fp32 weights keep fp32: e.g. stories260K's exact text).
kernels::DType choose_compute_dtype(const std::string& flag, kernels::DType weights, const kernels::Backend& be);
// Sets c's compute dtype as choose_compute_dtype does (from c.dtype) and, under auto, the rows
// from which bf16 is the faster on this backend (fewer, e.g. decode on a CPU, multiply in f32).
void set_compute_dtype(const std::string& flag, ModelConfig& c, const kernels::Backend& be);

// A tokenizer file as --tokenizer names it: tokenizer.json, a directory with tokenizer.json or
// vocab.json + merges.txt, or a llama2.c tok*.bin (which needs the model's vocab_size).
std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path, std::optional<std::int64_t> vocab_size);
// Whether `model` (as --model takes it) names weights: the embedded default, a checkpoint
// directory or file; not a model YAML or a built-in config name.
bool names_weights(const std::string& model);

}  // namespace flexh2o::engine
