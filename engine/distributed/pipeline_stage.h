// One rank's stage of a pipeline-parallel job (policy/pipeline.h): rank s holds a slice of the
// layers in a BlockScheduler and keeps M blocks (micro-batches) in flight in M slots. Every
// stage walks the slots in the same order, a step of one block at a time: stage s receives the
// block's hidden states from s - 1 GPU batch by GPU batch, runs its layers, and sends them on
// to s + 1 without waiting (MPI_Isend), so that s works on the next slot while s + 1 works on
// this one. The last stage samples; the tokens go to every other stage (the first needs them
// as the next input, all of them to end sequences at the same step), which takes them when the
// slot's turn comes again. A finished block's slot takes the job's next block at once, on every
// stage alike, so the pipeline does not drain between blocks.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/runtime/block_scheduler.h"
#include "engine/distributed/mpi_comm.h"
#include "offload/trace.h"

namespace flexh2o::distributed {

struct PipelineWork {
  std::vector<std::vector<std::int32_t>> prompts;  // the job's prompts, in order
  std::vector<std::uint64_t> streams;              // the sampling stream of each
  std::vector<std::int64_t> max_new_tokens;        // the new tokens limit of each
  std::vector<kernels::SamplingParams> sampling;  // the sampling of each
  // Whether prompt p's sequence ends after `generated` (stop strings; null: none): every stage
  // asks it alike, so that they end sequences at the same step.
  std::function<bool(std::size_t p, std::span<const std::int32_t> generated)> stop_here;
  std::int64_t block = 1;          // prompts per micro-batch (gpu batch size x GPU batches)
  std::int64_t micro_batches = 1;  // blocks in flight
};

struct StageStats {
  engine::GenerationResult total;  // of the blocks this stage saw (tokens not kept)
  double wall_seconds = 0;
  double wait_seconds = 0;  // waiting for hidden states or tokens from another stage
  std::size_t blocks = 0, finished_blocks = 0;  // of the job, and done
  bool stopped = false;  // stop_requested ended the job before its last block
};

// How a stage's job is interrupted (both optional, the same on every stage).
struct StageControl {
  // Asked on every stage at once whenever a slot would take the job's next block: true on any
  // stage ends the job there on all of them (the blocks in flight finish).
  std::function<bool()> stop_requested;
  // Called before each step; may throw to abandon the job.
  std::function<void()> before_step;
};

// Runs rank mpi.rank()'s stage; `sched` holds that stage's layers. `finished(c, result)` is
// called when block c (prompts [c * block, ...)) is done, in the order blocks finish; on the
// first stage its log-probabilities (sequences whose sampling asks) are the last stage's,
// which sampled. Waits are recorded in `trace` (track "pipeline") when given.
StageStats run_pipeline_stage(const Mpi& mpi, engine::BlockScheduler& sched, const PipelineWork& work,
                              offload::Trace* trace,
                              const std::function<void(std::size_t, const engine::GenerationResult&)>& finished,
                              const StageControl& control = {});

}  // namespace flexh2o::distributed
