#include "engine/job/run_ranks.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/distributed/data_parallel.h"
#include "engine/distributed/mpi_comm.h"
#include "engine/distributed/pipeline_rank.h"
#include "engine/distributed/rank_plan.h"
#include "engine/job/job_results.h"
#include "engine/model/model_shape.h"
#include "engine/serving/progress.h"
#include "engine/serving/run_report.h"

namespace flexh2o::job {

using namespace flexh2o::engine;
using distributed::Mpi;
using distributed::rank_name;
using kernels::Option;
using kernels::OptionError;

namespace {

// A rank's job: every rank's model and policy; rank 0's results file, requests and results.
// Rank 0 opens the job (Job) before the others open the model, so that an error every
// rank would meet is said once: the requests a one-process run of these options would make,
// checked against the model before any rank loads weights, less those already done.
struct RankJob {
  std::optional<Job> job;  // rank 0's; the other ranks' hold only the setup
  std::optional<JobSetup> setup;
  std::optional<JobResults> results;
  // Data parallel: rank 0's line over every rank's finished requests (a pipeline's is rank 0's
  // engine's: it steps every block).
  std::optional<serving::Progress> progress;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();

  JobSetup& setup_of(const JobOptions& o) { return job ? job->setup : (setup ? *setup : setup.emplace(open_setup(o))); }
  std::vector<serving::Request> todo() const { return job ? job->todo : std::vector<serving::Request>{}; }
  // Where rank 0 writes requests [first, first + r.tokens.size()) of `requests` once finished.
  distributed::PromptsFinished writer(const JobOptions& o, const FrontEnd& front, std::span<const serving::Request> requests) {
    if (!job) return [](std::size_t, const GenerationResult&) {};
    results.emplace(o, job->setup, front, job->out, job->openai ? &*job->openai : nullptr);
    return [this, requests](std::size_t first, const GenerationResult& r) {
      results->add(requests.subspan(first, r.tokens.size()), r);
      if (progress) count(requests.subspan(first, r.tokens.size()), r);
    };
  }
  void start_progress(const serving::ProgressOptions& po, std::span<const serving::Request> requests);
  void count(std::span<const serving::Request> done, const GenerationResult& r);
  void end_progress() {
    if (progress) progress->close(seconds());
  }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};

void RankJob::start_progress(const serving::ProgressOptions& options, std::span<const serving::Request> requests) {
  serving::ProgressOptions po = options;
  po.requests = requests.size();
  for (const serving::Request& r : requests) po.limits.push_back(r.max_tokens);
  t0 = std::chrono::steady_clock::now();
  progress.emplace(po, stderr);
}

// The other ranks' tokens are seen when their requests end: each counts then.
void RankJob::count(std::span<const serving::Request> done, const GenerationResult& r) {
  const double now = seconds();
  for (std::size_t i = 0; i < done.size(); ++i) {
    const auto generated = static_cast<std::int64_t>(r.tokens[i].size());
    progress->sampled(generated, now);
    progress->finished(static_cast<std::int64_t>(done[i].prompt.size()), generated, done[i].max_tokens, now);
  }
  progress->show(now);
}

// What the ranks plan within: the hardware profile given, or this machine's (what
// planning_profile says), whose capacities the ranks on it share but those given per rank.
distributed::HostProfile host_profile(const JobOptions& o, const JobSetup& s) {
  return {.hw = planning_profile(o, s),
          .shared = o.hardware.empty(),
          .gpu_per_rank = !o.gpu_mem.empty(),
          .cpu_per_rank = !o.cpu_mem.empty(),
          .disk_per_rank = !o.disk_mem.empty()};
}

// The job's engine: the model, and the options of the rank's policy and of the job.
distributed::RankEngine job_engine(const JobOptions& o, const JobSetup& s) {
  return {*s.backend, s.model.config, *s.model.weights, engine_options(o, s)};
}

// Rank 0's report of the ranks' parts (and --metrics, --trace); where an interrupt stopped the
// job, how far it got, with the interrupted run's exit status (130) as one process gives.
JobEnd finish_ranks(const JobOptions& o, const JobSetup& s, distributed::RanksOutcome done) {
  JobEnd end{.status = done.stopped ? 130 : 0, .report = std::move(done.report)};
  if (serving::RunReport* r = end.report ? &*end.report : nullptr) {
    r->model = s.model.description;
    end.text = r->text() + (s.constraints ? s.constraints->summary_line() : "");
    r->write_files(o.metrics_file, o.trace_file, nullptr);
    const char* what = r->mode == serving::RunMode::Pipeline ? "the pipeline" : "the ranks";
    if (done.stopped) end.text += serving::stopped_message(what, done.finished_requests, done.requests, o.out_file);
  }
  return end;
}

// With an automatic policy each rank plans for the job's requests on its part of the machine (in
// blocks of at most its share of them, whatever plan_options' max_block); a given placement is
// checked against that part before anything loads.
void plan_rank(const Mpi& mpi, const JobOptions& o, JobSetup& s, std::span<const serving::Request> todo,
               const FrontEnd& front) {
  if (todo.empty()) return;
  const policy::HardwareProfile hw = distributed::rank_share(host_profile(o, s), mpi.ranks_on_host());
  if (!s.auto_policy) return check_placement_fits(o, s, todo, hw);
  const policy::Estimate e = distributed::plan_data_parallel_rank(model_shape(s.model.config), hw,
                                                                  job_workload(o, s.model.config, todo, s.gen_len),
                                                                  plan_options(o, s, 1), todo.size(), mpi.size());
  adopt_plan(o, s, e.policy, hw);
  s.predicted = e;
  front.say(fmt::format("{}: {}", rank_name(mpi), planned_line(hw, e)));
}

JobEnd run_data_parallel(const Mpi& mpi, const JobOptions& o, const FrontEnd& front) {
  const serving::InterruptWatch interrupts;  // each rank stops or abandons its own requests
  if (mpi.rank() == 0 && o.micro_batches)
    throw OptionError{Option::MicroBatches, " is for pipeline runs (", Option::Pipeline, " N)"};
  RankJob rj;
  if (mpi.rank() == 0) {
    Job& job = rj.job.emplace(o, front);
    // A given placement that fits no rank is one error here, before any rank loads.
    if (!job.setup.auto_policy && !job.todo.empty())
      check_placement_fits(o, job.setup, job.todo,
                           distributed::rank_share(host_profile(o, job.setup), mpi.ranks_on_host()));
  }
  const std::vector<serving::Request> todo = distributed::share_requests(mpi, rj.todo());
  JobSetup& s = rj.setup_of(o);
  plan_rank(mpi, o, s, todo, front);
  settle_compute_dtype(o, s);
  if (const auto po = progress_options(o, s); po && mpi.rank() == 0) rj.start_progress(*po, todo);
  distributed::RanksOutcome done =
      distributed::run_data_parallel(mpi, job_engine(o, s), todo, interrupts, rj.writer(o, front, todo));
  rj.end_progress();
  return finish_ranks(o, s, std::move(done));
}

// The stages' plan: the given policy, or the planner's over every rank's part of the machine,
// with the micro-batches asked for (default: a block per stage) in flight.
distributed::PipelinePlanning pipeline_planning(const Mpi& mpi, const JobOptions& o, const JobSetup& s) {
  distributed::PipelinePlanning p{.shape = model_shape(s.model.config),
                                  .micro_batches = o.micro_batches.value_or(mpi.size()),
                                  .gen_len = s.gen_len};
  if (!s.auto_policy) p.given = s.policy;
  else {
    p.host = host_profile(o, s);
    p.options = plan_options(o, s, 1);  // max_block: a micro-batch's requests (plan_stages)
  }
  return p;
}

JobEnd run_pipeline(const Mpi& mpi, const JobOptions& o, const FrontEnd& front) {
  const serving::InterruptWatch interrupts;
  if (mpi.rank() == 0 && o.pipeline != mpi.size())
    throw OptionError{Option::Pipeline,
                      fmt::format(" {0} needs {0} ranks but the launcher started {1}; use mpirun -np {0}", o.pipeline,
                                  mpi.size())};
  RankJob rj;
  if (mpi.rank() == 0) rj.job.emplace(o, front);  // every stage steps every prompt: checked here
  mpi.broadcast({}, 0);  // rank 0 took the job: the others open the model now
  JobSetup& s = rj.setup_of(o);
  const distributed::PipelinePlanning planning = pipeline_planning(mpi, o, s);
  const distributed::PipelineJob pipeline = distributed::share_pipeline_job(mpi, planning, rj.todo());
  // This rank's stage: a planned one runs within the rank's part of the machine.
  s.policy = pipeline.stages.at(static_cast<std::size_t>(mpi.rank())).policy;
  if (s.auto_policy) adopt_plan(o, s, s.policy, distributed::rank_share(planning.host, mpi.ranks_on_host()));
  settle_compute_dtype(o, s);
  distributed::RankEngine stage = job_engine(o, s);
  if (mpi.rank() == 0) stage.options.progress = progress_options(o, s);  // its engine steps every block
  return finish_ranks(o, s, distributed::run_pipeline_rank(mpi, stage, pipeline, interrupts,
                                                           rj.writer(o, front, pipeline.requests)));
}

}  // namespace

JobEnd run_ranks(const JobOptions& o, const FrontEnd& front, const std::function<JobEnd()>& one_process) {
  Mpi mpi;
  if (mpi.size() == 1 && o.pipeline == 1) return one_process();
  try {
    return o.pipeline > 1 || mpi.size() == 1 ? run_pipeline(mpi, o, front) : run_data_parallel(mpi, o, front);
  } catch (const std::exception& e) {
    // Unwinding removed this rank's offload files; the launcher ends the others (SIGTERM: they
    // remove theirs).
    front.say(fmt::format("flexh2o: error: {}: {}", rank_name(mpi), error_text(front, e)));
    std::fflush(stderr);
    mpi.abort(1);
  }
}

}  // namespace flexh2o::job
