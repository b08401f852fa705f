// The schedulable units of a model (FlexGen's layer list): InputEmbed, then Attention and
// Mlp per decoder block, then OutputEmbed. Each names the weights it needs and computes
// one step of one batch in place on the hidden states.
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/model_config.h"
#include "engine/step.h"
#include "kernels/backend.h"

namespace flexh2o::engine {

// Weights on the compute device, by canonical name (vectors as [n, 1] fp32 matrices).
using DeviceWeights = std::unordered_map<std::string, kernels::MatrixRef>;

// The keys and values of one decoder layer for a batch: [B, kv_heads, capacity, head_dim].
struct KvCache {
  kernels::DeviceBuffer k, v;
  std::int64_t capacity = 0;
};

// Device buffers for one batch's step, sized for at most `max_rows` rows and `max_batch` sequences.
struct Activations {
  Activations(kernels::Backend& be, const ModelConfig& cfg, std::int64_t max_rows, std::int64_t max_batch);
  std::int64_t max_rows, max_batch;
  kernels::DeviceBuffer hidden;  // [rows, hidden]: the residual stream between layers
  kernels::DeviceBuffer normed;  // [rows, hidden]
  kernels::DeviceBuffer q, k, v, attn;  // [rows, heads * head_dim] (k, v: kv heads)
  kernels::DeviceBuffer ffn_a, ffn_b;   // [rows, ffn]
  kernels::DeviceBuffer last;           // [batch, hidden]
  kernels::DeviceBuffer logits;         // [batch, vocab]
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string name() const = 0;
  virtual std::vector<std::string> weight_names() const = 0;
  // The decoder layer whose KV cache forward() needs, or -1.
  virtual std::int64_t cache_index() const { return -1; }
  // `cache` is this layer's KV cache (Attention only; null for the others).
  virtual void forward(kernels::Backend& be, const DeviceWeights& w, const StepBatch& step, Activations& act,
                       KvCache* cache) const = 0;
};

// The model as a flat list of layers in execution order.
std::vector<std::unique_ptr<Layer>> build_layers(const ModelConfig& cfg);

}  // namespace flexh2o::engine
