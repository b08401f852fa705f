// Batched generation with everything resident on the compute device: prefill of ragged
// prompts, then one decode step at a time until every sequence stopped. This is the plain
// in-memory run every offloaded schedule is checked against.
#pragma once
#include <memory>
#include <vector>

#include "engine/model/layers.h"
#include "engine/model/weights.h"
#include "engine/runtime/generation.h"
#include "engine/runtime/generation_log.h"
#include "kernels/backend.h"

namespace flexh2o::engine {

class Generator {
 public:
  // Weights stay where they are on a CPU backend; other backends get a device copy, in the
  // dtype they hold it in for cfg.compute_dtype (held_dtype: rounded once here). The KV cache
  // is kept in `cache_dtype` (q4/q8: compress_cache).
  Generator(kernels::Backend& be, const ModelConfig& cfg, const HostWeights& weights,
            kernels::DType cache_dtype = kernels::DType::F32);
  GenerationResult generate(const GenerationRequest& req, const GenerationHooks& hooks = {});
  const ModelConfig& config() const { return cfg_; }
  kernels::DType cache_dtype() const { return cache_dtype_; }

 private:
  kernels::Backend& be_;
  ModelConfig cfg_;
  kernels::DType cache_dtype_;
  std::vector<kernels::DeviceBuffer> device_copies_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<LayerWeights> weights_;  // per layer
};

}  // namespace flexh2o::engine
