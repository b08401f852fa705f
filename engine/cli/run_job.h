// The parts of `flexh2o run` that its one-process form and its MPI forms (run_distributed)
// share: opening the model and backend, the prompts, the policy (given or planned), and what
// a finished prompt becomes in the output.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/cli/run_command.h"
#include "engine/serving/engine.h"
#include "engine/serving/openai_job.h"
#include "engine/serving/request.h"
#include "engine/serving/result_file.h"
#include "engine/loaders/model_source.h"
#include "engine/serving/prompts.h"
#include "kernels/backend.h"
#include "offload/tiers.h"
#include "policy/cost_model.h"
#include "policy/policy.h"

namespace flexh2o::cli {

// --gen-len's default for the embedded stories260K, whose stories run longer than the default
// of every other model (policy::kDefaultGenLen).
inline constexpr std::int64_t kEmbeddedGenLen = 256;

struct RunSetup {
  engine::ModelSource model;
  std::unique_ptr<kernels::Backend> backend;
  std::int64_t gen_len = policy::kDefaultGenLen;
  bool placed = false;       // a policy file or placement flags were given
  bool auto_policy = false;  // the planner chooses the policy (plan_run)
  policy::Policy policy;     // the given one (auto: set by plan_run)
  offload::TierOptions tiers;  // --*-mem and --offload-dir (auto: the profile's capacities)
  std::string compute_why;     // what settle_compute_dtype weighed under --compute-dtype auto
  std::optional<policy::Estimate> predicted;  // the cost model's estimate of the policy run (planned or checked)
  // Compiles the requests' structured-output constraints; null without a tokenizer.
  std::unique_ptr<serving::JobConstraints> constraints;
};

// Checks the flags, builds the given policy, opens the model and the backend.
RunSetup open_run(const RunOptions& o);

// Resolves --compute-dtype once for the job, from its policy (a GPU batch's sequences: the rows
// each decode step multiplies), into s.model.config: every step of the job, prefill or decode,
// multiplies in that dtype whatever requests share it. Call once the policy is final.
void settle_compute_dtype(const RunOptions& o, RunSetup& s);

// The prompts of the job: --prompts, else --prompt or synthetic ones, `count` of them; tokenized.
std::vector<engine::PromptItem> gather_prompts(const RunOptions& o, const engine::ModelSource& m, std::int64_t count);

// What the planner plans with: --hardware, or this machine (its memory and the free disk of
// --offload-dir), capacities lowered by --*-mem.
policy::HardwareProfile planning_profile(const RunOptions& o, const RunSetup& s);
// The planner's options for this run: --kv, compression, cpu_cache_compute on the CPU backend,
// and blocks of at most `max_block` prompts.
policy::PlanOptions plan_options(const RunOptions& o, const RunSetup& s, std::int64_t max_block);
// What the planner plans a job for: its longest prompt and largest max_tokens (what must fit)
// and, under continuous batching (not in pipeline runs), its requests' lengths (the time), each
// with the prompt tokens it takes from a shared prefix of `cfg`'s run (prefix sharing on: every
// request of a prefix family but the job's first takes the family's prefix), and the prefix
// families a block may hold once (Workload::held).
policy::Workload job_workload(const RunOptions& o, const engine::ModelConfig& cfg,
                              std::span<const serving::Request> requests, std::int64_t gen_len);
// Synthetic prompts: `count` requests of --prompt-len tokens and `gen_len` new tokens.
policy::Workload synthetic_workload(const RunOptions& o, std::int64_t count, std::int64_t gen_len);
// Continuous batching's prefill budget: --prefill-budget, else the one the policy run was
// planned or checked with (policy::default_prefill_budget for its GPU batch and the profile).
std::int64_t prefill_budget_of(const RunOptions& o, const RunSetup& s);
// A planned policy with the schedule flags (--overlap, --sep-layer, --pin-weight) applied.
policy::Policy with_schedule_flags(const RunOptions& o, policy::Policy planned);
// A given placement checked, before anything is loaded, against `hw`: what planning_profile
// says this machine (its free memory, within its cgroup) or --hardware and --*-mem have, or a
// rank's share of it. Throws the planner's "does not fit" naming the tier. The tier budgets
// left unlimited default to those capacities.
void check_placement_fits(const RunOptions& o, RunSetup& s, std::span<const serving::Request> requests,
                          const policy::HardwareProfile& hw);
// Runs a planned policy (with the schedule flags) within the profile's capacities.
void adopt_plan(const RunOptions& o, RunSetup& s, const policy::Policy& planned, const policy::HardwareProfile& hw);
// "planned for <hw>: gpu batch ..." (no newline).
std::string planned_line(const policy::HardwareProfile& hw, const policy::Estimate& e);
// The line after it when the rates are not this machine's own (no --hardware): how to calibrate.
std::string uncalibrated_note(const RunOptions& o);

// Opens --out into `out` (nothing without --out), checked before anything loads (serving/result_file.h).
void open_out(const RunOptions& o, std::optional<serving::ResultFile>& out,
              serving::ResultFormat format = serving::ResultFormat::Simple);

// Whether --prompts is an OpenAI batch file (serving/openai_batch.h).
bool is_openai_job(const RunOptions& o);
// What an OpenAI batch job's lines are prepared with: the model, its tokenizer and chat
// template (add_generation_prompt), --gen-len and --seed.
serving::OpenAiPromptContext openai_prompt_context(const RunOptions& o, const RunSetup& s);

// The job's requests: each prompt with --gen-len and the sampling flags, its position in the
// job as its sampling stream.
std::vector<serving::Request> make_requests(const RunOptions& o, const RunSetup& s,
                                        const std::vector<engine::PromptItem>& items);

// What the job writes for one finished request, newline included: its out.jsonl line with
// --out, else the prompt and its continuation (or the token ids without a tokenizer).
std::string result_line(const RunOptions& o, const engine::ModelSource& m, const serving::Request& r,
                        std::span<const std::int32_t> new_tokens);

// An OpenAI batch job (is_openai_job): its lines read and prepared, and the error lines of its
// bad lines not in `out` yet written first.
serving::OpenAiJob open_openai_run(const RunOptions& o, const RunSetup& s, std::optional<serving::ResultFile>& out);

// Whether request r's text so far holds one of its stop strings; null without a tokenizer.
serving::StopStringSeen stop_string_watch(const RunSetup& s);

// The progress line's options (none under --quiet): the planner's rate until there is a
// measurement, a bar on a terminal.
std::optional<serving::ProgressOptions> progress_options(const RunOptions& o, const RunSetup& s);

// The engine of this run (serving/engine.h): the policy and tiers of `s`, and what the flags say of
// batching, the prefill budget, shared prefills, tracing and stop strings.
serving::EngineOptions engine_options(const RunOptions& o, const RunSetup& s);

// Where a job's finished requests go, as they finish (in any order): their result lines (an
// OpenAI line's once its n choices are done) appended to --out and fsynced, or printed.
class JobResults {
 public:
  JobResults(const RunOptions& o, const RunSetup& s, std::optional<serving::ResultFile>& out,
             const serving::OpenAiJob* openai);
  void add(std::span<const serving::Request> done, const engine::GenerationResult& r);

 private:
  const RunOptions& o_;
  const RunSetup& s_;
  std::optional<serving::ResultFile>& out_;
  std::optional<serving::OpenAiCollector> collector_;
};

}  // namespace flexh2o::cli
