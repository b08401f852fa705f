// Batched generation with everything resident on the compute device: prefill of ragged
// prompts, then one decode step at a time until every sequence stopped. This is the plain
// in-memory run every offloaded schedule is checked against.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/layers.h"
#include "engine/weights.h"
#include "kernels/backend.h"
#include "policy/eviction/kv_policy.h"

namespace flexh2o::engine {

struct GenerationRequest {
  std::vector<std::vector<std::int32_t>> prompts;  // each non-empty
  std::int64_t max_new_tokens = 32;
  kernels::SamplingParams sampling;
  std::vector<std::uint64_t> streams;  // per prompt sampling stream (default: its index)
  // Called after every step with that step's logits [batch, vocab] (host copy), for tests
  // and quality evaluation; step 0 is the prefill.
  std::function<void(std::int64_t step, std::span<const float> logits)> on_logits;
  // Called after every step (0 is the prefill) with the number of steps the request can take;
  // progress reports, and cancellation by throwing.
  std::function<void(std::int64_t step, std::int64_t max_steps)> on_step;
  // KV eviction (null: the full cache). The budget of a sequence is taken of its prompt +
  // max_new_tokens (+ its forced tokens instead, when forced).
  const policy::KvPolicy* kv = nullptr;
  // Teacher forcing (evaluation): when given, the input after step i of sequence b is
  // forced[b][i] instead of the sampled token, while forced[b] lasts.
  std::vector<std::vector<std::int32_t>> forced;
};

struct GenerationResult {
  std::vector<std::vector<std::int32_t>> tokens;  // generated tokens, stop token included
  double prefill_seconds = 0;
  double decode_seconds = 0;
  std::int64_t prompt_tokens = 0;     // sum of prompt lengths
  std::int64_t generated_tokens = 0;  // sum of generated lengths
  std::int64_t decode_steps = 0;
};

class Generator {
 public:
  // Weights stay where they are on a CPU backend; other backends get a device copy.
  Generator(kernels::Backend& be, const ModelConfig& cfg, const HostWeights& weights);
  GenerationResult generate(const GenerationRequest& req);
  const ModelConfig& config() const { return cfg_; }

 private:
  kernels::Backend& be_;
  ModelConfig cfg_;
  std::vector<kernels::DeviceBuffer> device_copies_;
  DeviceWeights weights_;
  std::vector<std::unique_ptr<Layer>> layers_;
};

// Throws a clear error when a prompt is empty, holds an id outside the vocabulary, or
// prompt + max_new_tokens exceeds the model's positions. `names` (optional, one per
// prompt) say which prompt in the message; otherwise its index does.
void check_prompts(const ModelConfig& cfg, std::span<const std::vector<std::int32_t>> prompts,
                   std::int64_t max_new_tokens, std::span<const std::string> names = {});

}  // namespace flexh2o::engine
