// What a run reports, as FlexGen does: the model and its sizes as stored, the policy, the peak
// memory of each tier and the throughput; as text on stderr and as the --metrics JSON. The
// pieces (peaks, totals, the policy's own to_text/to_json) are the same in the one-process
// report and in the per-rank reports of MPI runs.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/runtime/block_scheduler.h"
#include "engine/runtime/generator.h"
#include "engine/model/model_config.h"
#include "offload/tiers.h"
#include "policy/cost_model.h"
#include "policy/policy.h"

namespace flexh2o::job {

// "model: NAME (L layers, hidden H, DTYPES weights)"
std::string model_line(const std::string& description, const engine::ModelConfig& stored);

struct TierPeaks {
  std::int64_t gpu = 0, cpu = 0, disk = 0;
};
TierPeaks peaks_of(const offload::Tiers& tiers);
std::string to_text(const TierPeaks& p);  // "gpu X | cpu Y | disk Z"
nlohmann::json to_json(const TierPeaks& p);
TierPeaks peaks_from_json(const nlohmann::json& j);

// prompts, prompt/generated tokens, prefill/decode seconds and the three throughputs.
nlohmann::json to_json(const engine::GenerationResult& r);

// When one request's tokens came, in seconds from the start of the job's loop.
struct RequestTiming {
  std::string id_json;
  std::int64_t prompt_tokens = 0, generated_tokens = 0;
  double first_token = 0, finished = 0;
};

// The p-th percentile (0..100, nearest rank) of `values` (0 for none).
double percentile(std::vector<double> values, double p);

// What the planner predicted for the policy run (its cost model's estimate), to set beside
// what the run measured.
struct Prediction {
  bool continuous = false;
  double throughput = 0;    // generated tokens/s (fixed blocks: FlexGen's total tok/s)
  double step_seconds = 0;  // a decode step of a block (continuous: the mean step)
  double block_seconds = 0; // fixed: one block's prefill + decode; continuous: the job's steps
  TierPeaks peaks;
};
Prediction prediction_of(const policy::Estimate& e);

// One process's run.
struct RunReport {
  std::string model;           // the model's description
  engine::ModelConfig stored;  // its config with the policy's weight dtype
  policy::Policy policy;
  kernels::DType cache_dtype = kernels::DType::F32;
  std::string compute_why;  // what chose stored.compute_dtype under --compute-dtype auto ("": the flag)
  std::int64_t prompts = 0;  // of the job, those done before a resume included
  engine::GenerationResult total;
  std::int64_t cache_bytes = 0;   // the KV cache of a block at its longest
  std::int64_t hidden_bytes = 0;  // a block's hidden states in the prefill
  TierPeaks peaks;
  engine::ExpertLoadStats experts;  // mixture-of-experts: what each step fetched
  std::map<std::string, double> time_by_primitive;
  // How the requests shared the block's slots: "continuous" or "fixed" ("" : not said).
  std::string batching;
  double wall_seconds = 0;              // of the job's loop (0: not measured)
  std::vector<RequestTiming> timings;   // of the finished requests
  std::optional<Prediction> predicted;  // in --metrics; in the text with `explain`
  bool explain = false;

  // The lines for stderr, newline included.
  std::string text() const;
  nlohmann::json to_json() const;

 private:
  std::int64_t decode_expert_bytes_per_token() const;
  // The run's own throughput, step and time in the prediction's terms.
  Prediction measured() const;
  std::string explain_text() const;
};

// The report of a run of `sched` over `tiers` with blocks of prompts up to `longest_prompt`
// tokens generating `gen_len` each; `trace` (may be null) gives the time per primitive.
RunReport make_run_report(const std::string& description, const engine::ModelConfig& cfg, const policy::Policy& pol,
                          std::int64_t prompts, std::int64_t longest_prompt, std::int64_t gen_len,
                          const engine::GenerationResult& total, const offload::Tiers& tiers,
                          const engine::BlockScheduler& sched, const offload::Trace* trace);

}  // namespace flexh2o::job
