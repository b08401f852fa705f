// FlexGen-style pipeline parallelism (docs/distributed.md; flexgen.dist_flex_opt): N ranks
// hold contiguous slices of the decoder layers (the first also the input embedding, the last
// the output head), hidden states go rank to rank, and M micro-batches (blocks of gbs x K
// sequences, each in the zig-zag order on every stage) are in flight so that the stages work
// at the same time. Each stage places its own slice over its own tiers.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "policy/cost_model.h"

namespace flexh2o::policy {

struct StageSlice {
  std::int64_t first_layer = 0, layers = 0;  // decoder layers [first_layer, first_layer + layers)
  bool input = false, head = false;          // holds the input embedding / the output head
};

// Contiguous slices for `stages` ranks, each at least one decoder layer, split by bytes and
// time: the split that minimises the largest share any stage holds of either the weight bytes
// or the flops per token, so that neither one rank's memory nor its compute sets the pace.
// Throws when there are fewer decoder layers than stages.
std::vector<StageSlice> split_layers(const ModelShape& m, std::int64_t stages);

// The part of `m` one stage holds, as the cost model sees it.
ModelShape stage_shape(const ModelShape& m, const StageSlice& s);

struct PipelineEstimate {
  std::vector<StageSlice> slices;
  std::vector<Estimate> stages;  // per stage: its policy (the same gbs and K everywhere) and times of one block
  std::int64_t micro_batches = 1;
  // One round: M micro-batches of gbs x K sequences through prefill and gen_len - 1 decode
  // steps. Prefill fills the pipeline once (the sum over the stages, then the slowest stage per
  // further micro-batch); a decode step takes the longer of M x the slowest stage and one
  // micro-batch's way through all stages (its token returns to the first stage). Transfers
  // between ranks are not modelled (the profiles have no network).
  double prefill_seconds = 0, decode_seconds = 0;
  double prefill_throughput = 0, decode_throughput = 0, total_throughput = 0;
  // Share of the ranks' time spent waiting for a neighbour: 1 - busy / (stages x round time).
  double bubble_share = 0;
};

// Combines the stages' estimates (same gbs and K) as above.
PipelineEstimate combine_stages(std::vector<StageSlice> slices, std::vector<Estimate> stages, const Workload& w,
                                std::int64_t micro_batches);

// The best pipeline of len(hws) stages (stage s runs on hws[s]) with M micro-batches: gbs and K
// searched as plan() does, each stage's placement by its own LP with M blocks in flight.
// Throws naming the stage and tier when no batch fits.
PipelineEstimate plan_pipeline(const ModelShape& m, std::span<const HardwareProfile> hws, const Workload& w,
                               std::int64_t micro_batches, const PlanOptions& o);
// A fixed policy on every stage; throws naming the stage that does not fit.
PipelineEstimate estimate_pipeline(const ModelShape& m, std::span<const HardwareProfile> hws, const Workload& w,
                                   const Policy& p, std::int64_t micro_batches, const PlanOptions& o);

}  // namespace flexh2o::policy
