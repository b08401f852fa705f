// One rank's stage of a pipeline-parallel job (policy/pipeline.h): rank s holds a slice of the
// layers in a BlockScheduler and keeps M blocks (micro-batches) in flight in M slots. Every
// stage walks the slots in the same order, a step of one block at a time: stage s receives the
// block's hidden states from s - 1 GPU batch by GPU batch, runs its layers, and sends them on
// to s + 1 without waiting (MPI_Isend), so that s works on the next slot while s + 1 works on
// this one. The last stage samples; the tokens go to every other stage (the first needs them
// as the next input, all of them to end sequences at the same step), which takes them when the
// slot's turn comes again. Under continuous batching (the default) each slot holds one
// continuous block for the whole job: a sequence that ends frees its row, which takes the job's
// next request at the slot's next step (prefilled beside the decode rows), the slots taking
// requests from one queue in the order they step. With fixed blocks a finished block's slot
// takes the job's next block at once. Either way every stage decides alike from the same
// tokens, so the stages agree on every step's rows without telling each other, and the
// pipeline does not drain.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
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
  // Prompt p shares the prefill of p - 1 (GenerationRequest::shares_prompt); empty: none does.
  // The job's queue gives a run of them to one slot together.
  std::vector<bool> shares_prompt;
  // Whether prompt p's sequence ends after `generated` (stop strings; null: none): every stage
  // asks it alike, so that they end sequences at the same step.
  std::function<bool(std::size_t p, std::span<const std::int32_t> generated)> stop_here;
  // Structured output: prompt p's constraint (GenerationRequest::constraints; empty: none). Every
  // stage walks it, so that they end sequences at the same step; the head's stage masks with it.
  std::vector<std::shared_ptr<const engine::TokenConstraint>> constraints;
  std::int64_t block = 1;          // prompts per micro-batch (gpu batch size x GPU batches)
  std::int64_t micro_batches = 1;  // blocks in flight
  bool continuous = true;          // continuous batching in each micro-batch, else fixed blocks
  std::int64_t prefill_budget = 512;  // continuous: GenerationRequest::prefill_budget
};

struct StageStats {
  engine::GenerationResult total;  // of the blocks this stage saw (tokens not kept)
  double wall_seconds = 0;
  double wait_seconds = 0;  // waiting for hidden states or tokens from another stage
  bool stopped = false;  // stop_requested ended the job before its last request started
};

// How a stage's job is interrupted (both optional, the same on every stage).
struct StageControl {
  // Asked on every stage at once (fixed blocks: whenever a slot would take the job's next
  // block; continuous: every few rounds of the slots): true on any stage ends the job there on
  // all of them (the requests in flight finish).
  std::function<bool()> stop_requested;
  // Called before each step; may throw to abandon the job.
  std::function<void()> before_step;
};

// Called when prompts [first, first + result.tokens.size()) are done (a fixed block, or one
// request under continuous batching), in the order they finish.
using PromptsFinished = std::function<void(std::size_t first, const engine::GenerationResult& result)>;

// Runs rank mpi.rank()'s stage; `sched` holds that stage's layers. On the first stage the
// finished results' log-probabilities (sequences whose sampling asks) are the last stage's,
// which sampled. Waits are recorded in `trace` (track "pipeline") when given.
StageStats run_pipeline_stage(const Mpi& mpi, engine::BlockScheduler& sched, const PipelineWork& work,
                              offload::Trace* trace, const PromptsFinished& finished,
                              const StageControl& control = {});

}  // namespace flexh2o::distributed
