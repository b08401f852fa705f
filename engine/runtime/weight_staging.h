// The weights of a block schedule in their tiers, and the two device slots that stage them:
// FlexGen's "load weight" of the unit computing and the one being fetched. Tensors wholly on
// the gpu tier are used in place. A slot is keyed by the unit instance it holds (instance =
// step x units + unit), so the instance after the one computing goes to the other slot.
//
// Mixture-of-experts: each expert is its own group of tensors. A slot holds a unit's other
// weights and `expert_slots` sub-slots, each as large as the largest expert. Under routed
// loading a fetch brings the router, norm and shared expert, and prefetch_experts brings the
// experts a GPU batch routes to into free sub-slots while other batches compute; otherwise
// every expert comes with the unit. run_experts runs a batch whose experts do not fit in
// ascending chunks, each fetched over the last, adding up to the same sums as one run.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "engine/model/layers.h"
#include "engine/runtime/gpu_buffer.h"
#include "engine/runtime/units.h"
#include "engine/runtime/tiered_weights.h"
#include "offload/copy_engine.h"

namespace flexh2o::engine {

// Mixture-of-experts weight traffic per token step (index 0: prefill), summed over blocks:
// experts fetched into staging slots (gpu-resident ones are used in place) and the bytes of
// them read from the cpu and disk tiers.
struct ExpertLoadStats {
  std::vector<std::int64_t> experts_by_step, bytes_by_step;
  void add(std::int64_t step, std::int64_t experts, std::int64_t bytes);
  std::int64_t experts() const;
  std::int64_t bytes() const;
};

class WeightStaging {
 public:
  // Allocates the two slots when some weight is not wholly on the gpu tier (BudgetExceeded
  // when they do not fit). `units` and `copies` outlive this.
  WeightStaging(offload::Tiers& tiers, TieredWeights weights, const std::vector<SchedulingUnit>& units,
                std::int64_t expert_slots, offload::CopyEngine& copies, bool overlap);
  ~WeightStaging();

  // Starts fetching unit `unit` as instance `instance` of token step `step` into its slot,
  // unless that slot already holds it. `routed`: its experts come later, as batches route.
  void fetch(std::int64_t unit, std::int64_t instance, std::int64_t step, bool routed);
  // Waits for the weights (all but the experts) of instance `instance` of unit `unit` and returns
  // them, one LayerWeights per layer of the unit.
  const std::vector<LayerWeights>& weights(std::int64_t unit, std::int64_t instance);
  // Whether the slot of `instance` holds it and takes experts as routed.
  bool routes(std::int64_t instance) const;
  // Starts fetching the staged experts of `experts` that instance `instance` lacks, into free
  // sub-slots (the rest are fetched when computed).
  void prefetch_experts(std::int64_t instance, std::span<const std::int32_t> experts);
  // Runs the MoE layer of instance `instance` for one GPU batch routed as `routing`.
  void run_experts(kernels::Backend& be, std::int64_t instance, const ExpertRouting& routing, Activations& act);
  // A new block: instances fetched before (or that failed) are not reused.
  void forget();
  // Whether weights are staged at all (else every tensor is used in place).
  bool staged() const { return !slots_.empty(); }
  const ExpertLoadStats& expert_loads() const { return expert_loads_; }

 private:
  struct Slot;
  // A tensor a fetch copies into a slot (one not wholly on the gpu tier).
  struct StagedTensor {
    const UnitTensor* tensor;
    const offload::TieredTensor* source;
  };
  // Per unit: its typed weights with every tensor wholly on the gpu tier in place (the rest
  // empty until fetched), the tensors to fetch, per expert too, and how many experts are
  // staged and how many sub-slots a slot has for them.
  struct UnitWeights {
    std::vector<LayerWeights> in_place;
    std::vector<StagedTensor> staged;
    std::vector<std::vector<StagedTensor>> staged_experts;
    std::int64_t staged_expert_count = 0, sub_slots = 0;
  };
  Slot& slot_of(std::int64_t instance);
  std::int64_t stage(Slot& slot, const StagedTensor& t, std::byte* dst, std::vector<offload::CopyPiece>& pieces,
                     std::int64_t& moved);
  void fetch_experts(Slot& slot, std::span<const std::int32_t> experts, bool evict);

  offload::Tiers& tiers_;
  TieredWeights weights_;
  const std::vector<SchedulingUnit>& units_;
  offload::CopyEngine& copies_;
  int lane_;
  bool overlap_;
  std::vector<UnitWeights> unit_weights_;
  std::int64_t expert_bytes_ = 0;  // one sub-slot
  std::vector<Slot> slots_;
  ExpertLoadStats expert_loads_;
};

}  // namespace flexh2o::engine
