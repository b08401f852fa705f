// Test helpers shared by the engine tests: temp dirs, tiny model configs, a Hugging Face
// exporter, and an independent straightforward forward pass to check the engine against.
#pragma once
#include <string>
#include <vector>

#include "engine/model_config.h"
#include "engine/weights.h"

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

engine::ModelConfig tiny_opt_config();    // 2 layers, hidden 64, 4 heads
engine::ModelConfig tiny_llama_config();  // 3 layers, hidden 48, 6 heads, 2 kv heads (GQA)

// Writes config.json + safetensors (one file, or `shards` files with an index) with Hugging
// Face tensor names. With from_interleaved, q/k rows are permuted from llama2.c's
// interleaved-pair RoPE order to HF's rotate-half order (what HF's conversion script does).
void export_hf_checkpoint(const std::string& dir, const engine::ModelConfig& cfg, const engine::HostWeights& w,
                          kernels::DType file_dtype, bool from_interleaved, int shards = 1);

// Logits [tokens][vocab] of one sequence by a plain double-precision full forward pass
// (no KV cache, no batching), written from the model definitions, not from engine code.
std::vector<std::vector<double>> reference_logits(const engine::ModelConfig& cfg, const engine::HostWeights& w,
                                                  const std::vector<std::int32_t>& tokens);

}  // namespace flexh2o::testing
