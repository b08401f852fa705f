// The seam between the decision half of a block's steps and the executor (vLLM's scheduler /
// executor seam), as plain values. The serving layer's scheduler (engine/serving/block_run.h)
// decides which sequence each slot runs at each step and which cache rows are copied before it
// (a StepPlan); BlockExecutor::run_step carries it out (the copies, the compute over units x
// GPU batches, the sampling) and returns the tokens each slot sampled (a StepOutput), which
// the scheduler then records. The executor calls nothing of the scheduler's.
#pragma once
#include <cstddef>
#include <cstdint>
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
  // A prefix held once (the scheduler's PrefixPool, placed by BlockExecutor::begin): the pool row holding the first `base`
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

class GenerationLog;

// What the executor runs in one step. The views stay valid through the step.
struct StepInput {
  const StepPlan* plan = nullptr;
  // Per slot: its tokens so far, its prompt first: what Prefill and Extend compute from, and
  // whose last one Decode computes.
  std::span<const std::vector<std::int32_t>> tokens;
  // The sequences' sampling state (GenerationLog::sample_args): their sampling, streams,
  // histories, constraints.
  GenerationLog* log = nullptr;
  bool keep_logits = false;  // hand the step's logits back (StepOutput::logits)
};

// What a step gives back. Valid until the block's next step.
struct StepOutput {
  // Per slot: the token it sampled (idle slots: unchanged; a fork: its own first token, sampled
  // from the logits of the slot it forks). A stage without the head samples nothing: its caller
  // fills them with those the stage with the head sampled.
  std::span<std::int32_t> tokens;
  // keep_logits: per slot, the logits row [slots, vocab] that sampled its token, on the host
  // (a fork's row: unset; it sampled from its parent's); else empty.
  std::span<const float> logits;
  // The prompt rows the step computed (a newcomer's prefill or extension, or a sequence
  // prefilled again); a step with any counts its time as prefill.
  std::int64_t prompt_rows = 0;
  bool prefilled() const { return prompt_rows > 0; }
};

}  // namespace flexh2o::engine
