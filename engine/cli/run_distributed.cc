#include "engine/cli/run_distributed.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/cli/option_flags.h"
#include "engine/cli/run_job.h"
#include "engine/distributed/data_parallel.h"
#include "engine/distributed/mpi_comm.h"
#include "engine/distributed/pipeline_rank.h"
#include "engine/distributed/rank_plan.h"
#include "engine/model/model_shape.h"
#include "engine/serving/progress.h"
#include "engine/serving/run_report.h"

namespace flexh2o::cli {

using namespace flexh2o::engine;
using distributed::Mpi;
using distributed::rank_name;

namespace {

// A rank's job: every rank's model and policy; rank 0's --out, requests and results. Rank 0
// opens the job before the others open the model, so that an error every rank would meet is
// said once: the requests a one-process run of these flags would make (an OpenAI batch file's,
// its bad lines' error lines written first), checked against the model before any rank loads
// weights, less those --resume finds done.
struct RankJob {
  std::optional<RunSetup> setup;
  std::optional<serving::ResultFile> out;
  std::optional<serving::OpenAiJob> openai;
  std::vector<serving::Request> todo;
  std::optional<JobResults> results;
  // Data parallel: rank 0's line over every rank's finished requests (a pipeline's is rank 0's
  // engine's: it steps every block).
  std::optional<serving::Progress> progress;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();

  void open_on_rank_zero(const RunOptions& o);
  // Where rank 0 writes requests [first, first + r.tokens.size()) of `requests` once finished.
  distributed::PromptsFinished writer(const RunOptions& o, std::span<const serving::Request> requests) {
    results.emplace(o, *setup, out, openai ? &*openai : nullptr);
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
  for (const serving::Request& r : requests) po.max_new_tokens += r.max_tokens;
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

void RankJob::open_on_rank_zero(const RunOptions& o) {
  open_out(o, out, is_openai_job(o) ? serving::ResultFormat::OpenAi : serving::ResultFormat::Simple);
  const RunSetup& s = setup.emplace(open_run(o));
  std::vector<serving::Request> requests;
  if (is_openai_job(o)) {
    openai = open_openai_run(o, s, out);
    requests = openai->requests;
  } else {
    const std::int64_t count = o.batch.value_or(s.placed && !s.auto_policy ? s.policy.block_size() : 1);
    requests = make_requests(o, s, gather_prompts(o, s.model, count));
  }
  serving::check_requests(s.model.config, requests);
  todo = serving::requests_to_run(requests, out, o.resume, o.out_file);
}

// What the ranks plan within: --hardware, or this machine's (what planning_profile says),
// whose capacities the ranks on it share but those --*-mem give each rank.
distributed::HostProfile host_profile(const RunOptions& o, const RunSetup& s) {
  return {.hw = planning_profile(o, s),
          .shared = o.hardware.empty(),
          .gpu_per_rank = !o.gpu_mem.empty(),
          .cpu_per_rank = !o.cpu_mem.empty(),
          .disk_per_rank = !o.disk_mem.empty()};
}

// The job's engine: the model, and the options of the rank's policy and of the flags.
distributed::RankEngine job_engine(const RunOptions& o, const RunSetup& s) {
  return {*s.backend, s.model.config, *s.model.weights, engine_options(o, s)};
}

// Rank 0's report of the ranks' parts, on stderr and in --metrics and --trace; where an interrupt
// stopped the job, says how far it got and gives the interrupted run's exit status (130) as the
// one-process run does.
int finish_ranks(const RunOptions& o, const RunSetup& s, distributed::RanksOutcome done) {
  if (serving::RunReport* r = done.report ? &*done.report : nullptr) {
    r->model = s.model.description;
    fmt::print(stderr, "{}{}", r->text(), s.constraints ? s.constraints->summary_line() : "");
    r->write_files(o.metrics_file, o.trace_file, nullptr);
    const char* what = r->mode == serving::RunMode::Pipeline ? "the pipeline" : "the ranks";
    if (done.stopped)
      fmt::print(stderr, "{}", serving::stopped_message(what, done.finished_requests, done.requests, o.out_file));
  }
  return done.stopped ? 130 : 0;
}

// With an automatic policy each rank plans for the job's requests on its part of the machine (in
// blocks of at most its share of them, whatever plan_options' max_block); a given placement is
// checked against that part before anything loads.
void plan_rank(const Mpi& mpi, const RunOptions& o, RunSetup& s, std::span<const serving::Request> todo) {
  if (todo.empty()) return;
  const policy::HardwareProfile hw = distributed::rank_share(host_profile(o, s), mpi.ranks_on_host());
  if (!s.auto_policy) return check_placement_fits(o, s, todo, hw);
  const policy::Estimate e = distributed::plan_data_parallel_rank(model_shape(s.model.config), hw,
                                                                  job_workload(o, s.model.config, todo, s.gen_len), plan_options(o, s, 1),
                                                                  todo.size(), mpi.size());
  adopt_plan(o, s, e.policy, hw);
  s.predicted = e;
  fmt::print(stderr, "{}: {}\n", rank_name(mpi), planned_line(hw, e));
}

int run_data_parallel(const Mpi& mpi, const RunOptions& o) {
  const serving::InterruptWatch interrupts;  // each rank stops or abandons its own requests
  RankJob job;
  if (mpi.rank() == 0) {
    if (o.micro_batches) throw std::invalid_argument("--micro-batches is for pipeline runs (--pipeline N)");
    job.open_on_rank_zero(o);
    // A given placement that fits no rank is one error here, before any rank loads.
    if (RunSetup& s = *job.setup; !s.auto_policy && !job.todo.empty())
      check_placement_fits(o, s, job.todo, distributed::rank_share(host_profile(o, s), mpi.ranks_on_host()));
  }
  const std::vector<serving::Request> todo = distributed::share_requests(mpi, job.todo);
  if (mpi.rank() != 0) job.setup.emplace(open_run(o));
  RunSetup& s = *job.setup;
  plan_rank(mpi, o, s, todo);
  settle_compute_dtype(o, s);
  if (const auto po = progress_options(o, s); po && mpi.rank() == 0) job.start_progress(*po, todo);
  distributed::RanksOutcome done =
      distributed::run_data_parallel(mpi, job_engine(o, s), todo, interrupts, job.writer(o, todo));
  job.end_progress();
  return finish_ranks(o, s, std::move(done));
}

// The stages' plan: the given policy, or the planner's over every rank's part of the machine,
// with --micro-batches (default: a block per stage) in flight.
distributed::PipelinePlanning pipeline_planning(const Mpi& mpi, const RunOptions& o, const RunSetup& s) {
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

int run_pipeline(const Mpi& mpi, const RunOptions& o) {
  const serving::InterruptWatch interrupts;
  RankJob job;
  if (mpi.rank() == 0) {
    if (o.pipeline != mpi.size())
      throw std::invalid_argument(fmt::format(
          "--pipeline {0} needs {0} ranks but the launcher started {1}; use mpirun -np {0}", o.pipeline, mpi.size()));
    job.open_on_rank_zero(o);  // every stage steps every prompt: checked here
  }
  mpi.broadcast({}, 0);  // rank 0 took the job: the others open the model now
  if (mpi.rank() != 0) job.setup.emplace(open_run(o));
  RunSetup& s = *job.setup;
  const distributed::PipelinePlanning planning = pipeline_planning(mpi, o, s);
  const distributed::PipelineJob pipeline = distributed::share_pipeline_job(mpi, planning, job.todo);
  // This rank's stage: a planned one runs within the rank's part of the machine.
  s.policy = pipeline.stages.at(static_cast<std::size_t>(mpi.rank())).policy;
  if (s.auto_policy) adopt_plan(o, s, s.policy, distributed::rank_share(planning.host, mpi.ranks_on_host()));
  settle_compute_dtype(o, s);
  distributed::RankEngine stage = job_engine(o, s);
  if (mpi.rank() == 0) stage.options.progress = progress_options(o, s);  // its engine steps every block
  return finish_ranks(o, s, distributed::run_pipeline_rank(mpi, stage, pipeline, interrupts,
                                                           job.writer(o, pipeline.requests)));
}

}  // namespace

int run_distributed(const RunOptions& o, const std::function<int()>& one_process) {
  Mpi mpi;
  if (mpi.size() == 1 && o.pipeline == 1) return one_process();
  try {
    return o.pipeline > 1 || mpi.size() == 1 ? run_pipeline(mpi, o) : run_data_parallel(mpi, o);
  } catch (const std::exception& e) {
    // Unwinding removed this rank's offload files; the launcher ends the others (SIGTERM: they
    // remove theirs).
    fmt::print(stderr, "flexh2o: error: {}: {}\n", rank_name(mpi), error_text(e));
    std::fflush(stderr);
    mpi.abort(1);
  }
}

}  // namespace flexh2o::cli
