// A data-parallel job over the ranks: each rank runs its own serving::Engine (the whole model) over
// the requests rank 0 deals it from the job's queue as its slots free (job_queue.h), so that a
// rank whose requests end early takes more; every finished request goes to rank 0, which
// writes it, and every rank's part of the report (serving::RunPart) too.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/distributed/job_queue.h"
#include "engine/distributed/mpi_comm.h"
#include "engine/serving/engine.h"
#include "engine/serving/request.h"
#include "engine/serving/run_report.h"

namespace flexh2o::distributed {

// "rank R (host)": how messages and reports name a rank.
std::string rank_name(const Mpi& mpi);

// Rank 0's requests on every rank.
std::vector<serving::Request> share_requests(const Mpi& mpi, const std::vector<serving::Request>& todo);

// What a rank's engine runs: the model and the job's engine options (the rank's policy and tiers).
struct RankEngine {
  kernels::Backend& backend;
  const engine::ModelConfig& config;
  const engine::WeightSource& weights;
  serving::EngineOptions options;
};

// The engine as this rank runs it: its disk tier in its own directory under the job's (created
// and removed by it), so that ranks on one host do not share files.
RankEngine on_this_rank(const Mpi& mpi, RankEngine job);

// The report of a run over several ranks in `mode`, its parts and totals aside: the model as `e`
// stores it, how it batched, and the structured-output constraints its options compiled (rank
// 0's: it reads every request). The model's description is the caller's.
serving::RunReport ranks_report(serving::RunMode mode, const RankEngine& e);

// How a rank's part of a run over several ranks ended; rank 0 holds the report of every part.
struct RanksOutcome {
  std::optional<serving::RunReport> report;  // rank 0: the mode, the ranks' parts and the job's totals
  std::size_t requests = 0, finished_requests = 0;  // rank 0: of the job
  bool stopped = false;  // an interrupt stopped the job (rank 0: or some request did not finish)
};

// Every rank's part of the job (`todo`: its requests, alike on every rank): rank 0 deals them
// and hands every finished one (its own and the other ranks', by index into `todo`) to
// `finished` as it comes; the others run what they are dealt.
RanksOutcome run_data_parallel(const Mpi& mpi, const RankEngine& job, std::span<const serving::Request> todo,
                               const serving::InterruptWatch& interrupts, const RootQueue::Finished& finished);

}  // namespace flexh2o::distributed
