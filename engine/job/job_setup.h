// What every form of a job (one process, data parallel, pipeline) builds the same way: the
// model and backend, the prompts and requests, the policy (given, or planned for the job's
// requests) and the engine's options.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/job/front_end.h"
#include "engine/job/job_options.h"
#include "engine/loaders/model_source.h"
#include "engine/serving/engine.h"
#include "engine/serving/openai_job.h"
#include "engine/serving/prompts.h"
#include "engine/serving/request.h"
#include "kernels/backend.h"
#include "offload/tiers.h"
#include "policy/cost_model.h"
#include "policy/policy.h"

namespace flexh2o::job {

// The new tokens' default for the embedded stories260K, whose stories run longer than the
// default of every other model (policy::kDefaultGenLen).
inline constexpr std::int64_t kEmbeddedGenLen = 256;

struct JobSetup {
  engine::ModelSource model;
  std::unique_ptr<kernels::Backend> backend;
  std::int64_t gen_len = policy::kDefaultGenLen;
  bool placed = false;       // a policy file or placement options were given
  bool auto_policy = false;  // the planner chooses the policy (plan_job)
  policy::Policy policy;     // the given one (auto: set by plan_job)
  offload::TierOptions tiers;  // the tier capacities and offload directory (auto: the profile's capacities)
  std::string compute_why;     // what settle_compute_dtype weighed under compute dtype auto
  std::optional<policy::Estimate> predicted;  // the cost model's estimate of the policy run (planned or checked)
  // Compiles the requests' structured-output constraints; null without a tokenizer.
  std::unique_ptr<serving::JobConstraints> constraints;
};

// A tier's capacity as given ("16GiB"; empty: unlimited), or an error naming `option`.
std::int64_t tier_capacity(const std::string& text, kernels::Option option);

// Checks the options, builds the given policy, opens the model and the backend.
JobSetup open_setup(const JobOptions& o);

// Resolves the compute dtype once for the job, from its policy (a GPU batch's sequences: the rows
// each decode step multiplies), into s.model.config: every step of the job, prefill or decode,
// multiplies in that dtype whatever requests share it. Call once the policy is final.
void settle_compute_dtype(const JobOptions& o, JobSetup& s);

// The job's requests: the prompts file, else the prompt text or synthetic prompts (`count` of
// them), tokenized, each with the new tokens limit and the sampling options, its position in the
// job as its sampling stream; a line's structured-output constraint compiled (an unsupported one
// fails here, naming the line).
std::vector<serving::Request> make_requests(const JobOptions& o, const JobSetup& s, std::int64_t count);

// What an OpenAI batch job's lines are prepared with: the model, its tokenizer and chat
// template (add_generation_prompt), the new tokens limit and the seed. A chat line's error names
// options as `front` does.
serving::OpenAiPromptContext openai_prompt_context(const JobOptions& o, const JobSetup& s, const FrontEnd& front);

// What the planner plans with: the hardware profile given, or this machine (its memory and the
// free disk of the offload directory), capacities lowered by the tier capacities given.
policy::HardwareProfile planning_profile(const JobOptions& o, const JobSetup& s);
// The planner's options for this run: KV eviction, compression, cpu_cache_compute on the CPU
// backend, and blocks of at most `max_block` prompts.
policy::PlanOptions plan_options(const JobOptions& o, const JobSetup& s, std::int64_t max_block);
// What the planner plans a job for: its longest prompt and largest max_tokens (what must fit)
// and, under continuous batching (not in pipeline runs), its requests' lengths (the time), each
// with the prompt tokens it takes from a shared prefix of `cfg`'s run (prefix sharing on: every
// request of a prefix family but the job's first takes the family's prefix), and the prefix
// families a block may hold once (Workload::held).
policy::Workload job_workload(const JobOptions& o, const engine::ModelConfig& cfg,
                              std::span<const serving::Request> requests, std::int64_t gen_len);
// Synthetic prompts: `count` requests of prompt_len tokens and `gen_len` new tokens.
policy::Workload synthetic_workload(const JobOptions& o, std::int64_t count, std::int64_t gen_len);
// A given placement checked, before anything is loaded, against `hw`: what planning_profile
// says this machine (its free memory, within its cgroup) or the profile and capacities given
// have, or a rank's share of it. Throws the planner's "does not fit" naming the tier. The tier
// budgets left unlimited default to those capacities.
void check_placement_fits(const JobOptions& o, JobSetup& s, std::span<const serving::Request> requests,
                          const policy::HardwareProfile& hw);
// Runs a planned policy (with the schedule options) within the profile's capacities.
void adopt_plan(const JobOptions& o, JobSetup& s, const policy::Policy& planned, const policy::HardwareProfile& hw);
// "planned for <hw>: gpu batch ..." (no newline).
std::string planned_line(const policy::HardwareProfile& hw, const policy::Estimate& e);
// The line after it when the rates are not this machine's own (no hardware profile given): how
// to calibrate.
std::string uncalibrated_note(const JobOptions& o);

// The progress line's options (none when quiet): the planner's rate until there is a
// measurement, a bar on a terminal.
std::optional<serving::ProgressOptions> progress_options(const JobOptions& o, const JobSetup& s);

// The engine of this run (serving/engine.h): the policy and tiers of `s`, and what the options
// say of batching, the prefill budget, shared prefills, tracing and stop strings.
serving::EngineOptions engine_options(const JobOptions& o, const JobSetup& s);

}  // namespace flexh2o::job
