// The schedulable units of a model (FlexGen's layer list): InputEmbed, then Attention and
// Mlp per decoder block, then OutputEmbed. Each lists the tensors it needs (policy/unit_weights)
// and computes one step of one batch in place on the hidden states from its typed weights.
#pragma once
#include <memory>
#include <string>
#include <functional>
#include <vector>

#include "engine/model/layer_weights.h"
#include "engine/model/model_config.h"
#include "engine/model/step.h"
#include "kernels/backend.h"

namespace flexh2o::engine {

// The keys and values of one decoder layer for a batch, as the compute device sees them:
// consecutive runs of sequences, each laid out [seqs, kv_heads, capacity, slot] (slots of
// kernels::kv_slot_bytes(dtype, head_dim): fp32, or compressed with compress_cache). A run
// can be resident (gpu tier), staged from cpu/disk, or (cpu_cache_compute) host memory
// computed on by `backend`.
struct KvPart {
  std::int64_t seq_begin = 0, seq_end = 0;
  void* k = nullptr;
  void* v = nullptr;
};
class KvEvictionLayer;  // engine/model/kv_eviction.h
struct KvView {
  std::int64_t capacity = 0;
  kernels::DType dtype = kernels::DType::F32;
  std::vector<KvPart> parts;
  // Set when a KV policy evicts: the cache then holds only the kept tokens of each
  // (sequence, kv head), in slots the policy picks. Needs a single part.
  KvEvictionLayer* eviction = nullptr;
  // Prefixes held once (StepBatch::pool_row): the pool's rows of this layer, laid out as a part's
  // with their own capacity, on the device.
  struct Pool {
    void* k = nullptr;
    void* v = nullptr;
    std::int64_t capacity = 0;
  } pool;
};

// A cache owned in device memory, all sequences in one part (the plain in-memory run).
struct KvCache {
  KvCache(kernels::Backend& be, const ModelConfig& cfg, std::int64_t batch, std::int64_t capacity,
          kernels::DType dtype = kernels::DType::F32);
  kernels::DeviceBuffer k, v;
  KvView view;
};

// Device buffers for one batch's step, sized for at most `max_rows` rows and `max_batch` sequences.
struct Activations {
  Activations(kernels::Backend& be, const ModelConfig& cfg, std::int64_t max_rows, std::int64_t max_batch);
  // The buffers' bytes, plus the most scratch the backend's ops allocate while they run (GEMM
  // conversion panels, attention partials) in such a step over a KV cache of `capacity` slots,
  // with the eviction scores when `scores`.
  static std::int64_t bytes(const kernels::Backend& be, const ModelConfig& cfg, std::int64_t max_rows,
                            std::int64_t max_batch, std::int64_t capacity, bool scores);
  // The buffers' bytes alone.
  static std::int64_t buffer_bytes(const ModelConfig& cfg, std::int64_t max_rows, std::int64_t max_batch);
  std::int64_t max_rows, max_batch;
  float* hidden = nullptr;       // [rows, hidden]: the residual stream, owned by the caller
  // fp32 buffers; normed and ffn_a hold their rows in bf16 (ffn_a: in the first half of each
  // row) where the projections that read them take bf16 inputs (layers.cc, GemmInput).
  kernels::DeviceBuffer normed;  // [rows, hidden]
  kernels::DeviceBuffer q, k, v, attn;  // [rows, heads * head_dim] (k, v: kv heads)
  kernels::DeviceBuffer ffn_a, ffn_b;   // [rows, ffn] (ffn_b: gated MLPs)
  kernels::DeviceBuffer embed;          // [max(rows, batch), embedding width] when it is not hidden
  kernels::DeviceBuffer router;         // [rows, experts]: router logits (MoE)
  // The head's rows: the sequences that predict a token (StepBatch::predicting), in batch
  // order; an idle slot has none, so a step of a few requests in many slots multiplies few rows.
  kernels::DeviceBuffer last;           // [predicting, hidden]
  kernels::DeviceBuffer logits;         // [predicting, vocab]
};

// A mixture-of-experts layer's routing of one step's rows: each row's experts and weights
// (per_row of them: top_k, and the shared expert last where there is one) and the distinct
// routed experts, ascending (the shared one not among them).
struct ExpertRouting {
  std::vector<std::int32_t> expert_of;
  std::vector<float> weight_of;
  std::int64_t per_row = 0;
  std::vector<std::int32_t> routed;
};

class Layer {
 public:
  explicit Layer(std::vector<policy::TensorSpec> tensors, std::vector<std::vector<policy::TensorSpec>> experts = {})
      : tensors_(std::move(tensors)), experts_(std::move(experts)) {}
  virtual ~Layer() = default;
  virtual std::string name() const = 0;
  // The layer's tensors (policy/unit_weights), a MoE layer's routed experts apart.
  const std::vector<policy::TensorSpec>& tensors() const { return tensors_; }
  // Mixture-of-experts: each routed expert's tensors, by expert (empty for other layers). A
  // scheduler may load only the experts rows route to.
  const std::vector<std::vector<policy::TensorSpec>>& expert_tensors() const { return experts_; }
  // Weights of this layer's kind with every field empty, for set_weight to fill.
  virtual LayerWeights empty_weights() const = 0;
  // The decoder layer whose KV cache forward() needs, or -1.
  virtual std::int64_t cache_index() const { return -1; }
  // Routes the rows of `step` from act.hidden: needs the weights of tensors(), not the experts';
  // overwrites act's scratch (act.normed then holds the experts' input).
  virtual ExpertRouting route_experts(kernels::Backend&, const LayerWeights&, const StepBatch&, Activations&) const {
    return {};
  }
  // Adds the terms of the experts in [begin, end) (the shared expert is number `experts`) to
  // act.hidden for `routing`, the last route_experts of this step with act.normed untouched
  // since; only those experts' weights are read. Chunks in ascending order add up to forward().
  virtual void forward_experts(kernels::Backend&, const LayerWeights&, const ExpertRouting&, Activations&,
                               std::int64_t /*begin*/, std::int64_t /*end*/) const {}
  // `cache` is this layer's KV cache (Attention only; null for the others).
  virtual void forward(kernels::Backend& be, const LayerWeights& w, const StepBatch& step, Activations& act,
                       const KvView* cache) const = 0;

 private:
  std::vector<policy::TensorSpec> tensors_;
  std::vector<std::vector<policy::TensorSpec>> experts_;
};

// The layer's weights with every tensor (the experts' included) from `find`.
LayerWeights resolve_weights(const Layer& layer, const std::function<MatrixRef(const policy::TensorSpec&)>& find);

// The model as a flat list of layers in execution order.
std::vector<std::unique_ptr<Layer>> build_layers(const ModelConfig& cfg);

}  // namespace flexh2o::engine
