// Before a step of a block: the executor's side of a StepPlan. apply_plan makes its copies (the
// forks of the last step's shared prefills, then the shared prompt prefixes of its newcomers;
// docs/prefix-sharing.md), starts the KV policy over in a newcomer's slot, and lays out every
// GPU batch's StepBatch from it.
#include <span>
#include <string>

#include "engine/model/kv_eviction.h"
#include "engine/model/rope_scaling.h"
#include "engine/runtime/block_state.h"
#include "engine/runtime/prefill_fork.h"

namespace flexh2o::engine {

void BlockExecutor::apply_plan(BlockState& st, const StepInput& in) {
  const StepPlan& plan = *in.plan;
  copy_rows(st, plan.forks, st.evicting, "fork_cache", kv_copies_.forks);
  const auto gbs = static_cast<std::size_t>(policy_.gpu_batch_size);
  for (std::size_t slot = 0; slot < plan.slots.size(); ++slot) {
    const SlotStep& s = plan.slots[slot];
    if (s.kind != SeqStep::Prefill) continue;
    if (s.pool_row >= 0) ++kv_held_.fills;
    // A newcomer's KV policy starts over in its slot.
    if (st.continuous)
      for (auto& e : st.batches[slot / gbs].eviction)
        e->reset(static_cast<std::int64_t>(slot % gbs), sequence_tokens(*st.req, static_cast<std::size_t>(s.seq)));
  }
  copy_rows(st, plan.prefixes, false, "share_prefix", kv_copies_.prefixes);
  for (GpuBatch& b : st.batches) b.step = lay_out(st, b, in);
}

StepBatch BlockExecutor::lay_out(const BlockState& st, const GpuBatch& b, const StepInput& in) const {
  const auto slots = std::span(in.plan->slots).subspan(static_cast<std::size_t>(b.first_sequence),
                                                      static_cast<std::size_t>(b.n));
  // Phi-3 prefills a sequence whole again when it outgrows the original context; a fixed
  // block prefills the whole batch again then.
  std::vector<std::int64_t> cached;
  for (const SlotStep& s : slots)
    if (s.kind == SeqStep::Decode) cached.push_back(s.cached);
  const bool batch_reprefills = !st.continuous && rope_reprefills(cfg_, cached);
  StepBatch step;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const SlotStep& s = slots[i];
    const std::vector<std::int32_t>& tokens = in.tokens[static_cast<std::size_t>(b.first_sequence) + i];
    if (s.kind == SeqStep::Idle) {
      step.add_idle();
    } else if (s.kind == SeqStep::Extend) {
      step.add_extend(tokens, s.cached);
    } else if (s.kind == SeqStep::Prefill || batch_reprefills ||
               (st.continuous && rope_reprefills(cfg_, std::span(&s.cached, 1)))) {
      step.add_prefill(tokens);
    } else {
      step.add_decode(tokens.back(), s.cached);
    }
    const SeqStep kind = step.kinds.back();
    if (s.pool_row >= 0 && kind != SeqStep::Idle) step.hold_prefix(static_cast<std::int64_t>(i), s.pool_row, s.base);
    if (s.prefix_group >= 0 && (kind == SeqStep::Decode || kind == SeqStep::Extend))
      step.share_prefix(static_cast<std::int64_t>(i), s.prefix_group, s.prefix_len);
  }
  return step;
}

// Each copy, in order, before any compute of the step can write either row: under a KV
// policy the whole row and its policy state (forks), else the first copy.tokens slots.
void BlockExecutor::copy_rows(BlockState& st, std::span<const RowCopy> copies, bool evicting, const char* what,
                               KvCopyBytes& moved) {
  const std::int64_t gbs = policy_.gpu_batch_size;
  auto slot_of = [&](std::int64_t s) { return ForkSlot{&st.batch(s / gbs), s % gbs}; };
  for (const RowCopy& c : copies) {
    const ForkExtent extent{c.tokens, st.capacity, cfg_.n_kv_heads, kernels::kv_slot_bytes(cache_dtype_, cfg_.head_dim),
                            evicting};
    offload::ScopedSpan span(trace_, "compute", what, "slot " + std::to_string(c.from) + " to " + std::to_string(c.to));
    moved.add(fork_slot(tiers_, *host_staging_, copies_->options(), units_.cache_layers, slot_of(c.from), slot_of(c.to),
                        extent));
  }
}

}  // namespace flexh2o::engine
