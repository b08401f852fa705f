// Test helpers shared by the engine tests: temp dirs, tiny model configs, a Hugging Face
// exporter, and an independent straightforward forward pass to check the engine against.
#pragma once
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace flexh2o::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void write_file(const std::string& path, const std::string& bytes);
std::string read_file(const std::string& path);

// n token ids drawn from [3, vocab) (past the special ids the test models reserve).
std::vector<std::int32_t> random_tokens(std::mt19937_64& rng, std::size_t n, std::int64_t vocab);

engine::ModelConfig tiny_opt_config();    // 2 layers, hidden 64, 4 heads
engine::ModelConfig tiny_llama_config();  // 3 layers, hidden 48, 6 heads, 2 kv heads (GQA)
// tiny_llama_config with 6 experts, top 2 (weights not renormalised), a shared expert, and a
// dense middle layer (Qwen2-MoE's mlp_only_layers).
engine::ModelConfig tiny_moe_config();

// Writes config.json + safetensors (one file, or `shards` files with an index) with Hugging
// Face tensor names. With from_interleaved, q/k rows are permuted from llama2.c's
// interleaved-pair RoPE order to HF's rotate-half order (what HF's conversion script does).
void export_hf_checkpoint(const std::string& dir, const engine::ModelConfig& cfg, const engine::HostWeights& w,
                          kernels::DType file_dtype, bool from_interleaved, int shards = 1);

// Logits [tokens][vocab] of one sequence by a plain double-precision full forward pass
// (no KV cache, no batching), written from the model definitions, not from engine code.
std::vector<std::vector<double>> reference_logits(const engine::ModelConfig& cfg, const engine::HostWeights& w,
                                                  const std::vector<std::int32_t>& tokens);

// Tolerances of whole forward passes (tests/support/fp_tolerance.h for the arithmetic).
// Two passes of the same fp32 model that differ only in the order of their sums (another BLAS
// kernel, the rotate-half vs interleaved RoPE layout, a double reference): each of the
// 2 * layers + 1 sublayers (attention, MLP, head) chains about four reductions (norm
// statistics, projection, scores, weighted values) of length at most
// max(hidden, ffn, q width, tokens), each adding an independent relative error of about
// u * sqrt(length) to the residual stream, so they add in quadrature. Compared at the
// logits' own magnitude: a logit's error comes from the whole stream, not from its size.
double forward_tolerance(const engine::ModelConfig& cfg, std::int64_t tokens, std::span<const float> logits);
// The same model with its weights rounded to a type of unit roundoff u_w (fp16, bf16): each
// sublayer's output moves by about u_w relative (independent roundings of its weights), and
// the 2 * layers + 1 sublayers add in quadrature; the fp32 arithmetic on top is far smaller.
double rounded_weights_tolerance(const engine::ModelConfig& cfg, double u_w, std::span<const float> logits);

}  // namespace flexh2o::testing
