// What a run reports, as FlexGen does: the model and its sizes as stored, the policy, the peak
// memory of each tier and the throughput; as text on stderr and as the --metrics JSON. One
// RunReport renders every mode: the one-process run, and a run over several ranks (data
// parallel or pipeline) with each rank's part in it.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/runtime/block_executor.h"
#include "engine/runtime/generator.h"
#include "engine/serving/kv_report.h"
#include "engine/model/model_config.h"
#include "offload/tiers.h"
#include "offload/trace.h"
#include "policy/cost_model.h"
#include "policy/pipeline.h"
#include "policy/policy.h"

namespace flexh2o::serving {

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
  // The phases of block_seconds: fixed, one block's prefill and decode; continuous, the steps
  // that prefilled and those that only decoded (measured only: the cost model predicts the
  // mean step, prefill rows and decode rows together).
  double prefill_seconds = 0, decode_seconds = 0;
  TierPeaks peaks;
};
Prediction prediction_of(const policy::Estimate& e);

// Where one rank's run placed the model: its policy (as the metrics record it) and the peak
// memory of its tiers.
struct Placement {
  nlohmann::json policy;
  std::string policy_text;
  TierPeaks peaks;
};

// A rank's part of a run over several ranks: a data-parallel rank or a pipeline stage. Each
// rank sends its part to rank 0 as JSON (to_json, with its spans and policy text).
struct RunPart {
  std::string name;  // "rank R (host)"
  int rank = 0;
  std::string host;
  std::optional<Placement> placement;  // none: a data-parallel rank that had no request to run
  engine::GenerationResult result;     // counts and times of the requests it ran
  engine::KvReads kv_reads;            // the KV its attention read (of its layers)
  engine::KvCopies kv_copies;          // the KV its row copies moved (of its layers)
  engine::KvHeld kv_held;              // the KV cache it held with prefixes held once (of its layers)
  std::size_t finished_requests = 0;   // data parallel: the requests it finished
  bool stopped = false;                // data parallel: an interrupt stopped it taking requests
  std::optional<policy::StageSlice> slice;  // pipeline: the stage's layers
  double wall_seconds = 0, wait_seconds = 0;  // pipeline: the stage's time, and what it waited on the others
  std::vector<offload::Span> spans;    // its trace
};
// `with_trace`: the spans and the policy text too (what goes to rank 0); else as --metrics has it.
nlohmann::json to_json(const RunPart& p, bool with_trace);
RunPart part_from_json(const nlohmann::json& j);
nlohmann::json to_json(const policy::StageSlice& s);
policy::StageSlice slice_from_json(const nlohmann::json& j);
// "decoder layers 0-3 + input embedding"
std::string slice_text(const policy::StageSlice& s);

// The modes of a run.
enum class RunMode { OneProcess, DataParallel, Pipeline };

// A run's report.
struct RunReport {
  RunMode mode = RunMode::OneProcess;
  std::vector<RunPart> parts;      // over several ranks: each rank's part, in rank order
  std::int64_t micro_batches = 0;  // pipeline: blocks in flight

  std::string model;           // the model's description
  engine::ModelConfig stored;  // its config with the policy's weight dtype
  policy::Policy policy;
  kernels::DType cache_dtype = kernels::DType::F32;
  std::string compute_why;  // what chose stored.compute_dtype under --compute-dtype auto ("": the flag)
  std::int64_t prompts = 0;  // of the job, those done before a resume included
  engine::GenerationResult total;
  std::int64_t cache_bytes = 0;   // the KV cache of a block at its longest (its budget under a KV policy)
  std::int64_t hidden_bytes = 0;  // a block's hidden states in the prefill
  TierPeaks peaks;
  engine::ExpertLoadStats experts;  // mixture-of-experts: what each step fetched
  engine::KvReads kv_reads;         // one process: the KV its attention read (else the parts')
  engine::KvCopies kv_copies;       // one process: the KV its row copies moved (else the parts')
  engine::KvHeld kv_held;           // one process: the KV cache held with held prefixes (else the parts')
  std::map<std::string, double> time_by_primitive;
  // How the requests shared the block's slots: "continuous" or "fixed" ("" : not said).
  std::string batching;
  double wall_seconds = 0;              // of the job's loop (0: not measured)
  std::vector<RequestTiming> timings;   // of the finished requests
  std::optional<Prediction> predicted;  // in --metrics; in the text with `explain`
  // Continuous batching: the planner's figures for the job's requests at the lengths they
  // generated (the plan counts each to its max_tokens; stop ids end them earlier), so that
  // the cost model's error shows apart from the lengths it could not know.
  std::optional<Prediction> predicted_at_lengths;
  bool explain = false;
  nlohmann::json structured_output;  // JobConstraints::report() in --metrics (null: none)
  kernels::KernelUse kernels;        // one process: what the backend's kernels ran (a line, "kernels")

  // The lines for stderr, newline included.
  std::string text() const;
  nlohmann::json to_json() const;
  // --metrics (when `metrics_path` is not empty) and the Chrome trace of `spans` (one process)
  // or of the parts' spans (when `trace_path` is not empty).
  void write_files(const std::string& metrics_path, const std::string& trace_path, const offload::Trace* trace) const;

 private:
  std::string one_process_text() const;
  std::string data_parallel_text() const;
  std::string pipeline_text() const;
  nlohmann::json one_process_json() const;
  nlohmann::json data_parallel_json() const;
  nlohmann::json pipeline_json() const;
  double slowest_part_seconds() const;  // data parallel: the longest prefill + decode of a rank
  double longest_wall() const;          // pipeline: the longest stage
  double bubble_share() const;          // pipeline: the time the stages waited on each other
  std::int64_t decode_expert_bytes_per_token() const;
  engine::KvReads all_kv_reads() const;  // one process: kv_reads; else the parts' sum
  engine::KvCopies all_kv_copies() const;  // one process: kv_copies; else the parts' sum
  engine::KvHeld all_kv_held() const;      // one process: kv_held; else the parts' sum
  std::int64_t steps() const { return total.prefill_steps + total.decode_steps; }
  // The run's own throughput, step and time in the prediction's terms.
  Prediction measured() const;
  std::string explain_text() const;
};

// The report of a run of `sched` over `tiers` with blocks of prompts up to `longest_prompt`
// tokens generating `gen_len` each; `trace` (may be null) gives the time per primitive.
RunReport make_run_report(const std::string& description, const engine::ModelConfig& cfg, const policy::Policy& pol,
                          std::int64_t prompts, std::int64_t longest_prompt, std::int64_t gen_len,
                          const engine::GenerationResult& total, const offload::Tiers& tiers,
                          const engine::BlockExecutor& sched, const offload::Trace* trace);

}  // namespace flexh2o::serving
