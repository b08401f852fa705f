// One block's decision half, beside the BlockExecutor that runs it (vLLM's scheduler beside
// its executor). A step reads as three calls: next_step() gives the plan the StepScheduler
// decided (which sequence each slot runs, which cache rows are copied), the executor's
// run_step carries it out and returns the sampled tokens, and update() records them in the
// block's GenerationLog (each sequence's tokens and its end: a stop id, a stop string, its
// limit, its constraint; forced inputs), tells the scheduler which slots ended, and plans the
// next step. The hooks (stop strings, logits, progress, finished sequences) are called from
// here and the log, never from the executor.
#pragma once
#include <cstdint>

#include "engine/runtime/block_executor.h"
#include "engine/runtime/generator.h"
#include "engine/runtime/step_plan.h"
#include "engine/serving/step_scheduler.h"

namespace flexh2o::serving {

class BlockRun {
 public:
  // Checks `req`, begins its block on `exec` (placed, with a pool of prefixes held once where
  // the executor can and the scheduler finds it pays; throws BudgetExceeded) and plans its
  // first step. `exec`, `req` and `feed` (null: every sequence in order) outlive the run.
  BlockRun(engine::BlockExecutor& exec, const engine::GenerationRequest& req, engine::GenerationHooks hooks = {},
           SequenceFeed* feed = nullptr);
  BlockRun(const BlockRun&) = delete;
  BlockRun& operator=(const BlockRun&) = delete;

  // Whether a sequence is still running or waiting: the block has a step to run.
  bool active() const { return log_.active(); }
  // The sequence rows the block's steps computed so far (each sampled a token).
  std::int64_t rows_computed() const { return log_.rows_computed(); }
  // Per running sequence: its tokens so far, limit and prompt (the progress line's time left).
  std::vector<engine::RunningSequence> running() const { return log_.running(); }
  engine::BlockExecutor::Block& block() { return *block_; }
  // What the executor runs next (valid until update).
  engine::StepInput next_step();
  // Records the step the executor ran (its tokens: sampled, or on a stage without the head
  // received from the one with it) and plans the next one.
  void update(const engine::StepOutput& out);
  // The block's result; its executor memory is released with the run.
  engine::GenerationResult finish() { return log_.finish(); }

 private:
  // Continuous batching: each slot that computed records its token (ending its sequence or
  // not) in the log and the scheduler. A fixed block: every sequence's token at once.
  void record_slots(const engine::StepOutput& out);
  void record_all(const engine::StepOutput& out);
  // The scheduler's next plan; the sequences it drops and the prefills and prefixes its
  // newcomers share go to the log.
  void plan_next();

  engine::BlockExecutor& exec_;
  const engine::GenerationRequest& req_;
  engine::GenerationHooks hooks_;
  engine::GenerationLog log_;  // keeps references to req_ and hooks_
  StepScheduler sched_;
  engine::BlockExecutor::BlockPtr block_;
  engine::StepPlan plan_;
  std::int64_t step_ = 0;
};

}  // namespace flexh2o::serving
