#include "engine/distributed/pipeline_rank.h"

#include <cstdio>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace flexh2o::distributed {

PipelineJob share_pipeline_job(const Mpi& mpi, const PipelinePlanning& p, std::span<const serving::Request> todo) {
  const policy::HardwareProfile mine = p.given ? policy::HardwareProfile{} : rank_share(p.host, mpi.ranks_on_host());
  const std::vector<Bytes> capacities = mpi.gather(to_bytes(p.given ? nlohmann::json() : capacities_json(mine)), 0);
  PipelineJob job;
  if (mpi.rank() == 0) {
    std::vector<policy::HardwareProfile> ranks;  // rank 0's rates with each rank's capacities
    for (const Bytes& b : capacities) ranks.push_back(p.given ? mine : with_capacities(mine, from_bytes(b)));
    PipelinePlan plan = plan_stages(p, ranks, todo);
    if (plan.estimate) fmt::print(stderr, "{}\n", pipeline_planned_line(*plan.estimate, p.micro_batches));
    job = {p.micro_batches, std::move(plan.stages), {todo.begin(), todo.end()}};
  }
  return pipeline_job_from_json(from_bytes(mpi.broadcast(mpi.rank() == 0 ? to_bytes(to_json(job)) : Bytes{}, 0)));
}

RanksOutcome run_pipeline_rank(const Mpi& mpi, const RankEngine& e, const PipelineJob& job,
                               const serving::InterruptWatch& interrupts, const PromptsFinished& finished) {
  const policy::StageSlice slice = job.stages.at(static_cast<std::size_t>(mpi.rank())).slice;
  RankEngine stage = on_this_rank(mpi, e);
  stage.options.stage = slice;
  serving::Engine engine(stage.backend, stage.config, stage.weights, std::move(stage.options), &interrupts);
  mpi.barrier();  // every stage loaded: the clocks (and traces) start together
  if (engine.trace()) engine.trace()->reset_clock();

  RanksOutcome done{.requests = job.requests.size()};
  const auto count_finished = [&](std::size_t first, const engine::GenerationResult& r) {
    finished(first, r);
    done.finished_requests += r.tokens.size();
  };
  const StageStats stats = run_pipeline_stage(mpi, engine, job.requests, job.micro_batches, count_finished);
  done.stopped = stats.stopped;
  serving::RunPart part = engine.part(rank_name(mpi), mpi.rank(), mpi.host(), stats.total);
  part.slice = slice;
  part.wall_seconds = stats.wall_seconds;
  part.wait_seconds = stats.wait_seconds;
  const std::vector<Bytes> parts = mpi.gather(to_bytes(serving::to_json(part, true)), 0);
  if (mpi.rank() != 0) return done;
  // Each stage's line, then the pipeline's: rank 0 saw every block (its `total`).
  done.report = ranks_report(serving::RunMode::Pipeline, stage);
  done.report->micro_batches = job.micro_batches;
  done.report->total = stats.total;
  for (const Bytes& b : parts) done.report->parts.push_back(serving::part_from_json(from_bytes(b)));
  return done;
}

}  // namespace flexh2o::distributed
