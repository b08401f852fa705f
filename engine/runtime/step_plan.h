// The seam between the decision half of a block's steps and the executor (vLLM's scheduler /
// executor seam). A StepPlanner decides which sequence each slot runs at each step and which
// cache rows are copied before it, from what the request says and from which sequences ended;
// BlockScheduler executes each plan (the copies, the compute over units x GPU batches, the
// sampling) and reports back the tokens each slot sampled and which sequences ended. The
// plans are plain values. The serving layer implements the planner
// (engine/serving/step_scheduler.h); the executor knows only this interface.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/model/step.h"

namespace flexh2o::engine {

struct GenerationRequest;

// What one slot does in a step.
struct SlotStep {
  SeqStep kind = SeqStep::Idle;  // Prefill, Extend, Decode or Idle
  std::int64_t seq = -1;         // the request's sequence it runs (-1: none)
  // The tokens its cache row holds before the step: Extend: the shared prefix it took (it
  // computes the rest of its prompt); Decode: all but the last (the one it computes).
  std::int64_t cached = 0;
  // An idle fork: the slot whose prefill of this step it shares (samples its first token from
  // that slot's logits; its row is copied from that one after the step).
  std::int64_t fork_of = -1;
  // Decode and Extend under shared prefixes: the slots of one GPU batch whose cache rows hold
  // the same KV bytes in their first prefix_len slots (copies of one computation, none
  // rewritten since) share prefix_group, the group's first slot; their attention may read
  // those slots once for all (cascade attention). -1: none.
  std::int64_t prefix_group = -1, prefix_len = 0;
  // A prefix held once (StepPlanner::hold_prefixes): the pool row holding the first `base`
  // tokens of its sequence, its own row holding the tokens from `base` on; -1: its row holds
  // all. A Prefill with a pool row writes its first `base` tokens there (filling the row for
  // its family); Extend and Decode read them from there (prefix_len = base).
  std::int64_t pool_row = -1, base = 0;
  bool operator==(const SlotStep&) const = default;
};

// Prefixes held once (docs/prefix-sharing.md, "Holding a prefix once"): the job's `families`
// prefixes in `rows` pool rows of `capacity` KV slots beside the slots' rows, which then hold at
// most row_capacity slots each (a sequence's tokens after its held prefix). rows == 0: none,
// every row holds its sequence.
struct PrefixPool {
  std::int64_t families = 0, rows = 0, capacity = 0, row_capacity = 0;
  bool operator==(const PrefixPool&) const = default;
};

// The first `tokens` KV slots of cache row `from` copied into row `to`.
struct RowCopy {
  std::int64_t from = 0, to = 0, tokens = 0;
  bool operator==(const RowCopy&) const = default;
};

struct StepPlan {
  // Before the step, in this order: the last step's prefills copied into the rows of their
  // forks, then the shared prefixes the newcomers take (each such slot extends; a newcomer
  // whose own row holds its prefix copies nothing).
  std::vector<RowCopy> forks, prefixes;
  std::vector<std::size_t> dropped;  // sequences that will never run (passed over, or admission stopped)
  std::vector<SlotStep> slots;       // per slot: GPU batch k holds slots [k, k + 1) x gpu_batch_size
  bool operator==(const StepPlan&) const = default;
};

// What the executor asks of the planner of one block.
class StepPlanner {
 public:
  virtual ~StepPlanner() = default;
  // The block's slots: min(req.slots, prompts) under continuous batching, else every prompt.
  virtual std::size_t slots() const = 0;
  // The plan of the next step (the first call: step 0).
  virtual StepPlan next_step() = 0;
  // Continuous batching, after the step planned last: slot `slot` computed `token` (the
  // sampled one, or a forced input in its place); `ended`: that ended its sequence.
  virtual void record(std::size_t slot, std::int32_t token, bool ended) = 0;
  // A fixed block, after the step: every slot's next input (its finished sequences compute on).
  virtual void record_all(std::span<const std::int32_t> next) = 0;
  // Slot `slot`'s tokens so far, its prompt first: what Prefill and Extend compute from, and
  // whose last one Decode computes.
  virtual const std::vector<std::int32_t>& tokens(std::size_t slot) const = 0;
  // Asked once, before step 0, where the executor can hold prefixes once (the attention reading
  // shared prefixes apart): the pool the plans would use (SlotStep::pool_row), none by default.
  virtual PrefixPool prefix_pool() { return {}; }
  // Then, where the executor placed that pool: the plans use it from step 0 on (else they
  // copy prefixes between rows, as without it).
  virtual void hold_prefixes() {}
};

// Makes the planner of a block of `req` (which outlives it) over GPU batches of
// gpu_batch_size; share_prefixes: newcomers may take prompt prefixes the rows hold (the
// executor knows when the model allows it: prefix_sharing_off_reason).
using PlannerFactory = std::function<std::unique_ptr<StepPlanner>(const GenerationRequest& req,
                                                                  std::int64_t gpu_batch_size, bool share_prefixes)>;

}  // namespace flexh2o::engine
