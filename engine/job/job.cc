#include "engine/job/job.h"

#include <fmt/format.h>

#include "engine/distributed/launch.h"
#include "engine/job/file_roles.h"
#include "engine/job/job_results.h"
#include "engine/model/model_shape.h"
#include "engine/serving/engine.h"
#include "engine/serving/interrupts.h"
#if defined(FLEXH2O_HAVE_CUDA) && FLEXH2O_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif
#ifdef FLEXH2O_HAVE_MPI
#include "engine/job/run_ranks.h"
#endif

namespace flexh2o::job {

using kernels::Option;
using kernels::OptionError;

std::string error_text(const FrontEnd& front, const std::exception& e) {
  if (const auto* t = dynamic_cast<const kernels::OptionText*>(&e)) return t->text(front.option_name);
  return e.what();
}

namespace {

// The results file first (checked and locked before anything loads), then the model and backend.
JobSetup open_out_then_setup(const JobOptions& o, bool openai_lines, std::optional<serving::ResultFile>& out) {
  open_out(o, out, openai_lines ? serving::ResultFormat::OpenAi : serving::ResultFormat::Simple);
  return open_setup(o);
}

}  // namespace

Job::Job(const JobOptions& o, const FrontEnd& front) : Job(o, front, is_openai_job(o)) {}

Job::Job(const JobOptions& o, const FrontEnd& front, bool openai_lines)
    : setup(open_out_then_setup(o, openai_lines, out)) {
  if (openai_lines) {
    std::size_t bad_lines = 0;
    openai = open_openai_run(o, setup, front, out, bad_lines);
    if (bad_lines > 0) front.say(fmt::format("{} bad request lines: error result lines written", bad_lines));
    requests = openai->requests;
  } else {
    requests = make_requests(o, setup, o.batch.value_or(setup.placed && !setup.auto_policy ? setup.policy.block_size() : 1));
  }
  serving::check_requests(setup.model.config, requests);  // fail before loading weights
  todo = serving::requests_to_run(requests, out, o.resume, o.out_file);
}

void settle_policy(const JobOptions& o, JobSetup& s, std::span<const serving::Request> requests,
                   const policy::HardwareProfile& hw, const FrontEnd& front) {
  if (!s.auto_policy) return check_placement_fits(o, s, requests, hw);
  // Synthetic prompts (no prompt text, no tokenizer) plan for the prompt length asked for.
  const bool synthetic = o.prompts_file.empty() && o.prompt.empty() && !s.model.tokenizer;
  const auto prompts = static_cast<std::int64_t>(requests.size());
  const policy::Estimate e = policy::plan(
      engine::model_shape(s.model.config), hw,
      synthetic ? synthetic_workload(o, prompts, s.gen_len) : job_workload(o, s.model.config, requests, s.gen_len),
      plan_options(o, s, prompts));
  adopt_plan(o, s, e.policy, hw);
  s.predicted = e;
  front.say(planned_line(hw, e));
  if (o.hardware.empty()) front.say(uncalibrated_note(o));
}

JobPlan plan_job_run(const JobOptions& o, const FrontEnd& front) {
  Job job(o, front);
  JobSetup& s = job.setup;
  const policy::HardwareProfile hw = planning_profile(o, s);
  settle_policy(o, s, job.requests, hw, front);
  settle_compute_dtype(o, s);
  return {.policy = s.policy,
          .hw = hw,
          .estimate = s.predicted,
          .compute_why = s.compute_why,
          .experts = s.model.config.moe.experts,
          .top_k = s.model.config.moe.top_k};
}

namespace {

// How the decode steps ran as CUDA graphs (docs/backends.md, "Decode steps in CUDA graphs"),
// for the GPU runs that measure it; empty on other backends.
std::string graph_steps_line(const kernels::Backend& be) {
#if defined(FLEXH2O_HAVE_CUDA) && FLEXH2O_HAVE_CUDA
  if (const auto* cuda = dynamic_cast<const kernels::cuda::CudaBackend*>(&be)) {
    const kernels::cuda::CudaBackend::GraphCounts c = cuda->graph_counts();
    return fmt::format("cuda graphs: {} decode steps replayed, {} captured, {} recorded, {} missed, {} interrupted\n",
                       c.replayed, c.captured, c.recorded, c.missed, c.interrupted);
  }
#else
  (void)be;
#endif
  return "";
}

// The plan's figures for the requests at the lengths they generated (RunReport::
// predicted_at_lengths); none where the cost model cannot say (it only explains).
std::optional<serving::Prediction> prediction_at_lengths(const JobOptions& o, const JobSetup& s,
                                                         const policy::HardwareProfile& hw,
                                                         std::span<const serving::Request> generated) {
  try {
    return serving::prediction_of(policy::estimate_or_throw(
        engine::model_shape(s.model.config), hw, job_workload(o, s.model.config, generated, s.gen_len),
        s.policy, plan_options(o, s, static_cast<std::int64_t>(generated.size())), "the plan"));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void check_one_process(const JobOptions& o) {
  if (o.pipeline > 1)
    throw OptionError{Option::Pipeline,
                      fmt::format(" {0} runs over {0} ranks: start it with mpirun -np {0} (or srun)", o.pipeline)};
  if (o.micro_batches) throw OptionError{Option::MicroBatches, " is for pipeline runs (", Option::Pipeline, " N under mpirun)"};
}

JobEnd run_in_process(const JobOptions& o, const FrontEnd& front) {
  check_one_process(o);
  const serving::InterruptWatch interrupts;  // before any thread starts
  Job job(o, front);
  JobSetup& s = job.setup;
  if (job.openai && job.openai->requests.empty()) {
    front.say(o.prompts_file + ": no request to run");
    return {};
  }
  const policy::HardwareProfile hw = planning_profile(o, s);
  settle_policy(o, s, job.requests, hw, front);  // within this machine's memory
  settle_compute_dtype(o, s);
  serving::EngineOptions eo = engine_options(o, s);
  eo.progress = progress_options(o, s);
  serving::Engine engine(*s.backend, s.model.config, *s.model.weights, std::move(eo), &interrupts);
  JobResults results(o, s, front, job.out, job.openai ? &*job.openai : nullptr);
  const std::vector<serving::Request>& todo = job.todo;
  std::vector<serving::Request> generated = todo;  // max_tokens: what each generated (as far as it ran)
  const serving::JobOutcome done = engine.run(todo, [&](std::span<const std::size_t> at, const engine::GenerationResult& r) {
    results.add(serving::requests_at(todo, at), r);
    for (std::size_t i = 0; i < at.size(); ++i)
      generated[at[i]].max_tokens = std::max<std::int64_t>(static_cast<std::int64_t>(r.tokens[i].size()), 1);
  });

  JobEnd end{.status = done.stopped ? 130 : 0, .report = engine.report(s.model.description, job.requests, s.gen_len, done)};
  serving::RunReport& report = *end.report;
  report.compute_why = s.compute_why;
  if (s.predicted) report.predicted = serving::prediction_of(*s.predicted);
  if (o.explain && s.predicted && s.predicted->continuous && !done.stopped)
    report.predicted_at_lengths = prediction_at_lengths(o, s, hw, generated);
  report.explain = o.explain;
  if (s.constraints) report.structured_output = s.constraints->report();
  end.text = report.text() + (s.constraints ? s.constraints->summary_line() : "");
  if (o.cuda_graphs == "on") end.text += graph_steps_line(*s.backend);
  if (done.stopped) end.text += serving::stopped_message("the run", done.finished_requests, done.requests, o.out_file);
  report.write_files(o.metrics_file, o.trace_file, engine.trace());
  return end;
}

}  // namespace

JobEnd run_job(const JobOptions& o, const FrontEnd& front) {
  check_job_files_apart(o);
  if (const auto launch = distributed::mpi_launch()) {
#ifdef FLEXH2O_HAVE_MPI
    return run_ranks(o, front, [&] { return run_in_process(o, front); });
#else
    if (launch->ranks != 1 || o.pipeline > 1)
      throw std::invalid_argument("this flexh2o was built without MPI, so under mpirun/srun every rank would run the "
                                  "whole job; rebuild with -DFLEXH2O_MPI=ON (Open MPI: libopenmpi-dev) or run one process");
#endif
  }
  return run_in_process(o, front);
}

}  // namespace flexh2o::job
