#include "engine/serving/block_run.h"

#include <algorithm>
#include <stdexcept>

namespace flexh2o::serving {

using engine::SeqStep;
using engine::SlotStep;

namespace {

void check_hooks(const engine::GenerationRequest& req, const engine::GenerationHooks& hooks) {
  if (req.slots > 0 && hooks.on_logits)
    throw std::invalid_argument("on_logits needs a fixed block; under continuous batching use on_sequence_logits");
  if (hooks.on_logits && std::ranges::any_of(req.sequences, &engine::Sequence::shares_prompt))
    throw std::invalid_argument("on_logits needs each prompt prefilled on its own (no shares_prompt)");
}

}  // namespace

BlockRun::BlockRun(engine::BlockExecutor& exec, const engine::GenerationRequest& req, engine::GenerationHooks hooks,
                   SequenceFeed* feed)
    : exec_(exec),
      req_(req),
      hooks_(std::move(hooks)),
      log_(exec.backend(), exec.config(), req, hooks_),
      sched_(req, exec.policy().gpu_batch_size, exec.shares_prefixes(req), feed) {
  check_hooks(req, hooks_);
  const bool pool = sched_.slots() > 0 && sched_.shares_prefixes() && exec.can_hold_prefixes(req);
  block_ = exec.begin(req, sched_.slots(), pool ? sched_.prefix_pool() : engine::PrefixPool{});
  if (exec.holds_prefixes(*block_)) sched_.hold_prefixes();
  if (sched_.slots() > 0) plan_next();
}

engine::StepInput BlockRun::next_step() {
  if (!active()) throw std::logic_error("BlockRun::next_step on a finished block");
  return {.plan = &plan_, .tokens = sched_.tokens(), .log = &log_, .keep_logits = hooks_.wants_logits()};
}

void BlockRun::update(const engine::StepOutput& out) {
  if (req_.slots > 0) {
    record_slots(out);
  } else {
    record_all(out);
  }
  ++step_;
  if (req_.slots > 0 || log_.active()) plan_next();
}

void BlockRun::record_slots(const engine::StepOutput& out) {
  const auto vocab = static_cast<std::size_t>(exec_.config().vocab_size);
  std::int64_t computed = 0;
  for (std::size_t slot = 0; slot < plan_.slots.size(); ++slot) {
    const SlotStep& planned = plan_.slots[slot];
    // A fork sampled its first token from the prefill of this step it shares.
    if (planned.kind == SeqStep::Idle && planned.fork_of < 0) continue;
    ++computed;
    const auto seq = static_cast<std::size_t>(planned.seq);
    if (hooks_.on_sequence_logits && !out.logits.empty()) {
      const auto row = static_cast<std::size_t>(planned.fork_of >= 0 ? planned.fork_of : static_cast<std::int64_t>(slot));
      hooks_.on_sequence_logits(seq, log_.generated(seq), out.logits.subspan(row * vocab, vocab));
    }
    std::int32_t token = out.tokens[slot];
    const bool ended = log_.record_token(seq, token);
    sched_.record(slot, token, ended);
  }
  log_.end_step(step_, computed, out.prefilled());
}

void BlockRun::record_all(const engine::StepOutput& out) {
  if (hooks_.on_logits && !out.logits.empty()) hooks_.on_logits(step_, out.logits);
  log_.record(step_, out.tokens);  // finished sequences are computed on; forced inputs replace tokens
  sched_.record_all(out.tokens);
}

void BlockRun::plan_next() {
  plan_ = sched_.next_step();
  for (const std::size_t seq : plan_.dropped) log_.drop(seq);
  for (const SlotStep& s : plan_.slots) {
    const auto seq = static_cast<std::size_t>(s.seq);
    if (s.fork_of >= 0) log_.share_prefill(seq);
    if (s.kind == SeqStep::Extend) log_.share_prefix(seq, s.cached);
  }
}

}  // namespace flexh2o::serving
