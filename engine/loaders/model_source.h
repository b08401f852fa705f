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
// What --compute-dtype auto weighs on a backend for matrices of one dtype: whether it multiplies
// bf16 natively, and from how many activation rows its bf16 GEMMs beat its f32 kernels for those
// matrices (1: at every size; none: never, e.g. the CPU's int8 path for q4/q8 matrices).
struct Bf16Speed {
  bool native = false;
  std::optional<std::int64_t> faster_from_rows = 1;
};
Bf16Speed bf16_speed(const kernels::Backend& be, kernels::DType matrices);

// --compute-dtype of a job whose GPU batches hold `batch_rows` sequences (each decode step
// multiplies that many rows): "f32", "bf16", or "auto": bf16 for 16-bit or quantized weights
// where the backend multiplies bf16 natively and `batch_rows` reach its crossover, else f32
// (fp32 weights keep fp32: e.g. stories260K's exact text). Resolved once per job from its
// configuration, never from a step's rows: under continuous batching those follow which
// requests share the step, and a request's tokens must not.
struct ComputeChoice {
  kernels::DType dtype = kernels::DType::F32;
  std::string why;  // under auto, what decided (for the run report); "" when the flag named the dtype
};
ComputeChoice job_compute_dtype(const std::string& flag, kernels::DType weights, const Bf16Speed& bf16,
                                std::int64_t batch_rows);

// A tokenizer file as --tokenizer names it: tokenizer.json, a directory with tokenizer.json or
// vocab.json + merges.txt, or a llama2.c tok*.bin (which needs the model's vocab_size).
std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path, std::optional<std::int64_t> vocab_size);
// Whether `model` (as --model takes it) names weights: the embedded default, a checkpoint
// directory or file; not a model YAML or a built-in config name.
bool names_weights(const std::string& model);

}  // namespace flexh2o::engine
