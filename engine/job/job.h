// A batch job below any front end: opened the same way in every run mode (one process, data
// parallel, pipeline), planned or checked, run, reported. The CLI (`flexh2o run`) and the
// Python API fill a JobOptions, hand it here and show what comes back.
#pragma once
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/job/job_options.h"
#include "engine/job/job_setup.h"
#include "engine/serving/openai_job.h"
#include "engine/serving/request.h"
#include "engine/serving/result_file.h"
#include "engine/serving/run_report.h"
#include "kernels/option_error.h"

namespace flexh2o::job {

// What `e` says, each option it names by `front`'s name for it.
std::string error_text(const FrontEnd& front, const std::exception& e);

// A job, opened before any weight loads: the results file (checked and locked), the model and
// backend, the requests (an OpenAI batch file's bad lines get their error lines first), checked
// against the model, less those the results file already has when resuming.
struct Job {
  Job(const JobOptions& o, const FrontEnd& front);

 private:
  Job(const JobOptions& o, const FrontEnd& front, bool openai_lines);  // the file's first line read once

 public:
  std::optional<serving::ResultFile> out;  // first: opened before the model (setup)
  JobSetup setup;
  std::optional<serving::OpenAiJob> openai;  // an OpenAI batch file's lines
  std::vector<serving::Request> requests;    // every request of the job
  std::vector<serving::Request> todo;        // those the results file does not have yet
};

// The policy the job runs for `requests` on `hw`: the planner's (an automatic policy; said in a
// notice) within hw's capacities, or the given one checked to fit hw.
void settle_policy(const JobOptions& o, JobSetup& s, std::span<const serving::Request> requests,
                   const policy::HardwareProfile& hw, const FrontEnd& front);

// What a job would run with, decided as run_job decides it, nothing run: the policy (planned
// for the job's requests, or the one given, checked), the profile it was planned or checked on
// and the cost model's estimate.
struct JobPlan {
  policy::Policy policy;
  policy::HardwareProfile hw;
  std::optional<policy::Estimate> estimate;
  std::string compute_why;  // the compute dtype chosen, and why
  std::int64_t experts = 0, top_k = 0;  // the model's routed experts (0: dense), for policy::to_json
};
JobPlan plan_job_run(const JobOptions& o, const FrontEnd& front);

// How a job ended: its exit status (0, or 130 when an interrupt stopped it), its report where
// this process has one (rank 0 of several), and what the user reads at the end (the report,
// how far an interrupted job got). --metrics and --trace are written.
struct JobEnd {
  int status = 0;
  std::optional<serving::RunReport> report;
  std::string text;
};

// Runs the job in this process, or over the ranks a launcher (mpirun, srun) started, its output
// files first checked apart from its inputs (file_roles.h).
JobEnd run_job(const JobOptions& o, const FrontEnd& front);

}  // namespace flexh2o::job
