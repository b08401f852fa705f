// One rank's stage of a pipeline-parallel job (policy/pipeline.h): rank s holds a slice of the
// layers in its serving::Engine and keeps M blocks (micro-batches) in flight, the engine's flights.
// Every stage walks the flights in the same order, calling Engine::step on each in turn (the
// same step the one-process run and every data-parallel rank drive): stage s receives the
// block's hidden states from s - 1 GPU batch by GPU batch, runs its layers, and sends them on
// to s + 1 without waiting (MPI_Isend), so that s works on the next flight while s + 1 works on
// this one. The last stage samples; the tokens go to every other stage (the first needs them
// as the next input, all of them to end sequences at the same step), which takes them when the
// flight's turn comes again. Under continuous batching (the default) each flight holds one
// continuous block for the whole job: a sequence that ends frees its row, which takes the job's
// next request at the flight's next step (prefilled beside the decode rows), the flights taking
// requests from the engine's one queue in the order they step. With fixed blocks a finished
// block's flight takes the job's next block at once. Either way every stage decides alike from
// the same tokens, so the stages agree on every step's rows without telling each other, and
// the pipeline does not drain.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/distributed/mpi_comm.h"
#include "engine/serving/engine.h"
#include "engine/serving/request.h"

namespace flexh2o::distributed {

struct StageStats {
  engine::GenerationResult total;  // of the blocks this stage saw (tokens not kept)
  double wall_seconds = 0;
  double wait_seconds = 0;  // waiting for hidden states or tokens from another stage
  bool stopped = false;  // an interrupt ended the job before its last request started
};

// Called when prompts [first, first + result.tokens.size()) are done (a fixed block, or one
// request under continuous batching), in the order they finish.
using PromptsFinished = std::function<void(std::size_t first, const engine::GenerationResult& result)>;

// Runs rank mpi.rank()'s stage of the job's `requests` (the same on every stage, kept alive
// beside it) with `micro_batches` blocks in flight; `engine` holds that stage's layers and makes
// every block's request, so that limits, stop strings and shared prefills are the one-process
// run's. Its interrupts stop the job on every stage at once: a first signal on any stage stops
// taking requests (fixed blocks: whenever a flight would take the job's next block; continuous:
// every few rounds of the flights), and the requests in flight finish; a second abandons them. On
// the first stage the finished results' log-probabilities (sequences whose sampling asks) are
// the last stage's, which sampled. Waits are recorded in the engine's trace (track "pipeline").
StageStats run_pipeline_stage(const Mpi& mpi, serving::Engine& engine, std::span<const serving::Request> requests,
                              std::int64_t micro_batches, const PromptsFinished& finished);

}  // namespace flexh2o::distributed
