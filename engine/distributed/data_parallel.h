// A data-parallel job over the ranks: each rank runs its own serving::Engine (the whole model) over
// the requests rank 0 deals it from the job's queue as its slots free (job_queue.h), so that a
// rank whose requests end early takes more; every finished request goes to rank 0, which
// writes it, and every rank's part of the report (serving::RunPart) too.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/distributed/job_queue.h"
#include "engine/distributed/mpi_comm.h"
#include "engine/serving/engine.h"
#include "engine/serving/request.h"

namespace flexh2o::distributed {

// "rank R (host)": how messages and reports name a rank.
std::string rank_name(const Mpi& mpi);

// Rank 0's requests on every rank.
std::vector<serving::Request> share_requests(const Mpi& mpi, const std::vector<serving::Request>& todo);

// What a rank's engine runs: the model and the engine's options (this rank's policy and tiers).
struct RankEngine {
  kernels::Backend& backend;
  const engine::ModelConfig& config;
  const engine::WeightSource& weights;
  serving::EngineOptions options;
};

// A rank other than 0: runs what rank 0 deals it of `todo` (the job's requests, alike on every
// rank), sends back each finished request, then its part of the report, which it returns
// (`stopped`: an interrupt stopped it taking requests).
serving::RunPart run_dealt_rank(const Mpi& mpi, const RankEngine& e, std::span<const serving::Request> todo,
                            const serving::InterruptWatch& interrupts);

// Rank 0: deals `todo`, runs its own share, and hands every finished request (its own and the
// other ranks', by index into `todo`) to `finished` as it comes. Returns every rank's part, in
// rank order.
std::vector<serving::RunPart> run_dealing_rank(const Mpi& mpi, const RankEngine& e, std::span<const serving::Request> todo,
                                           const serving::InterruptWatch& interrupts, const RootQueue::Finished& finished);

}  // namespace flexh2o::distributed
