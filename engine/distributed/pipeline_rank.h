// A rank's part of a pipeline-parallel job around its stage (pipeline_stage.h): the plan's
// exchange (each rank's capacities to rank 0, rank 0's plan and requests to every rank), then
// the stage's run and every stage's part of the report to rank 0.
#pragma once
#include <span>

#include "engine/distributed/data_parallel.h"
#include "engine/distributed/mpi_comm.h"
#include "engine/distributed/pipeline_stage.h"
#include "engine/distributed/rank_plan.h"
#include "engine/serving/interrupts.h"
#include "engine/serving/request.h"

namespace flexh2o::distributed {

// Every rank's part of the job's plan: each sends rank 0 its share of `p.host` (when planned),
// rank 0 plans the stages for its `todo` and sends every rank the plan and the requests.
PipelineJob share_pipeline_job(const Mpi& mpi, const PipelinePlanning& p, std::span<const serving::Request> todo);

// Runs this rank's stage of `job` with the job's engine `e` on this rank (on_this_rank), holding
// the stage's slice, once every stage has loaded; every stage's part goes to rank 0, whose
// outcome holds the report.
RanksOutcome run_pipeline_rank(const Mpi& mpi, const RankEngine& e, const PipelineJob& job,
                               const serving::InterruptWatch& interrupts, const PromptsFinished& finished);

}  // namespace flexh2o::distributed
