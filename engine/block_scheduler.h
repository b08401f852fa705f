// FlexGen's zig-zag block schedule over the tiers: a block of gpu_batch_size x num_gpu_batches
// sequences runs token step i x scheduling unit j x GPU batch k. With overlap on, the next
// unit's weights are fetched while the K batches of this unit compute, and batch k+1's
// activations/KV are fetched (batch k-1's written back) while batch k computes, each on its
// own copy lane; tickets order them (no global barrier). With overlap off the same copies
// run in line before and after each compute (the ablation baseline).
//
// Compression (compress_weight / compress_cache): weight matrices and KV slots are stored as
// 4- or 8-bit groups in every tier, copied compressed, and dequantized by the compute kernels.
//
// Placement: weights, each batch's KV cache and its hidden states are TieredTensors split
// by the policy's fractions. Weights not wholly on the gpu tier are staged into two device
// slots (the unit computing and the one being fetched). KV is split by sequence: gpu-homed
// sequences are attended in place, cpu/disk-homed ones are staged through a ring of three
// device slots (fetching, computing, writing back); with cpu_cache_compute the cpu-homed
// sequences are attended where they live, in host memory. (On the CPU backend that is the
// compute backend itself; a device backend will hand those parts to a CPU backend.)
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "engine/layers.h"
#include "engine/tiered_weights.h"
#include "offload/copy_engine.h"
#include "offload/trace.h"
#include "policy/policy.h"

namespace flexh2o::engine {

class BlockScheduler {
 public:
  // Loads the weights into their tiers. Throws BudgetExceeded when they do not fit.
  BlockScheduler(kernels::Backend& be, offload::Tiers& tiers, const ModelConfig& cfg, const WeightSource& source,
                 const policy::Policy& policy, offload::Trace* trace = nullptr, offload::CopyOptions copy = {});
  ~BlockScheduler();

  // Generates for one block: at most gpu_batch_size x num_gpu_batches prompts, cut into GPU
  // batches in order. Same tokens as Generator::generate on the same request.
  GenerationResult generate(const GenerationRequest& req);

  const ModelConfig& config() const { return cfg_; }
  const policy::Policy& policy() const { return policy_; }

 private:
  struct Unit;
  struct WeightSlot;
  struct RingSlot;
  struct Batch;
  struct BlockState;

  void issue_weights(std::int64_t unit, std::int64_t seq);
  void issue_loads(BlockState& st, std::int64_t unit, std::int64_t k, RingSlot& slot);
  void compute(BlockState& st, std::int64_t unit, std::int64_t k, RingSlot& slot, std::int64_t weight_seq);
  void issue_stores(BlockState& st, std::int64_t unit, std::int64_t k, RingSlot& slot);

  kernels::Backend& be_;
  offload::Tiers& tiers_;
  ModelConfig cfg_;  // weight matrices in q4 under compress_weight
  policy::Policy policy_;
  kernels::DType cache_dtype_;  // q4 under compress_cache
  offload::Trace* trace_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Unit> units_;
  TieredWeights weights_;
  DeviceWeights resident_;  // tensors wholly on the gpu tier, used in place
  std::vector<WeightSlot> weight_slots_;
  std::unique_ptr<policy::KvPolicy> kv_policy_;  // from policy_.kv; null for the full cache
  // Declared last: destroyed first, so queued copies finish before the memory they touch goes.
  std::unique_ptr<offload::CopyEngine> copies_;
  int lane_weights_ = 0, lane_cache_in_ = 0, lane_cache_out_ = 0, lane_hidden_in_ = 0, lane_hidden_out_ = 0;
};

}  // namespace flexh2o::engine
