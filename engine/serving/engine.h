// The engine every form of `flexh2o run` drives: the one-process run, each rank of a
// data-parallel run and each stage of a pipeline. From its options (what a run means, no flag
// names) it opens the tiers, the trace and the BlockExecutor (a pipeline stage: over its slice
// of the layers); it makes the GenerationRequests of its blocks from the job's requests in one
// place, so that limits, sampling, stop strings and shared prefills (a request's n choices)
// mean the same in every mode; it runs the job a step at a time (Engine::step: each flight's
// BlockRun plans a step, the executor runs it, the BlockRun records it), checks interrupts
// between steps, and fills the RunReport.
//
// A job runs through one or more flights: blocks in flight at once, each stepped in turn (a
// pipeline stage keeps its micro-batches in flight; every other mode has one). A flight runs
// either continuously (the default: its block's slots take the job's next request as soon as
// one ends, and each result is handed on as its request ends) or a fixed block of the policy's
// size at a time (each block runs until its longest request ends, then the flight takes the
// job's next block). Several flights take the job's requests from one queue, in order. A first
// interrupt stops admitting requests (fixed: starting blocks), a second abandons the requests
// under way (checked between steps).
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/serving/interrupts.h"
#include "engine/serving/progress.h"
#include "engine/serving/request.h"
#include "engine/serving/request_source.h"
#include "engine/serving/result_file.h"
#include "engine/serving/run_report.h"
#include "engine/serving/structured_output.h"
#include "engine/runtime/block_executor.h"
#include "offload/tiers.h"
#include "offload/trace.h"
#include "policy/cost_model.h"
#include "policy/pipeline.h"
#include "policy/policy.h"

namespace flexh2o::serving {

// The requests of `all` whose ids are not in `out` yet (all of them without --out); with
// `resuming`, says on stderr how many are done already.
std::vector<Request> requests_to_run(std::span<const Request> all, const std::optional<ResultFile>& out,
                                     bool resuming, const std::string& out_path);

// Whether request r's text so far holds one of its stop strings (text needs the tokenizer).
using StopStringSeen = std::function<bool(const Request& r, std::span<const std::int32_t> generated)>;

// Whether request r ends on a stop string after `generated` (never before its min_tokens), as
// `seen` tells.
bool stop_string_ends(const StopStringSeen& seen, const Request& r, std::span<const std::int32_t> generated);

// Whether request i of `requests` shares the prefill of request i - 1: the n choices of one
// request line (OpenAI's `n`), each after the first. Only those: two lines that happen to hold
// one prompt are two requests, each prefilled.
bool shares_prompt_of_previous(std::span<const Request> requests, std::size_t i);

// Each request's constraint in its start state (null: none), compiled by `constraints`; empty
// when no request has one (Sequence::constraint).
std::vector<std::shared_ptr<const engine::TokenConstraint>> request_constraints(std::span<const Request> requests,
                                                                               JobConstraints* constraints);

struct EngineOptions {
  policy::Policy policy;
  offload::TierOptions tiers;  // capacities and the disk tier's directory (pin_host: the policy's pin_weight)
  bool continuous = true;      // continuous batching, else fixed blocks
  std::int64_t prefill_budget = policy::kHostPrefillBudget;  // continuous: prompt tokens a GPU batch's step prefills
  // A request's n choices share one prefill (Sequence::shares_prompt); false: each
  // prefills its own (the ablation).
  bool share_prefill = true;
  // Continuous batching: prompts take the KV of a prefix a slot's cache holds
  // (GenerationRequest::share_prefixes); false: each computes its whole prompt (the ablation).
  bool share_prefixes = true;
  // Shared prefixes held once where the run allows (GenerationRequest::hold_prefixes); false:
  // each row holds its own copy (the ablation).
  bool hold_prefixes = true;
  // Decode steps wholly on a CUDA device run as CUDA graphs (GenerationRequest::cuda_graphs).
  bool cuda_graphs = false;
  // Compiles the requests' constraints (structured output); needed when any request has one.
  JobConstraints* constraints = nullptr;
  bool trace = false;  // record spans (time per primitive, the Chrome trace)
  // A pipeline stage's slice of the layers; none: the whole model.
  std::optional<policy::StageSlice> stage;
  // Null: stop strings are not watched.
  StopStringSeen stop_string_seen;
  std::string results_in;  // where finished results are, for the messages ("": the output)
  // The progress line on stderr between steps (none: quiet); Engine::start fills in the job's
  // requests and their limits.
  std::optional<ProgressOptions> progress;
};

struct JobOutcome {
  engine::GenerationResult total;  // counts and times of the requests run (tokens not kept)
  std::size_t requests = 0;        // of the job
  std::size_t finished_requests = 0;  // by this engine
  bool stopped = false;  // an interrupt stopped taking requests while some were left
  double wall_seconds = 0;
  std::vector<RequestTiming> timings;  // of the finished requests, in the order they ended
};

// Called with requests that finished (a fixed block's, or a single one under continuous
// batching): their indices into the job's requests, and their result (tokens in that order).
using RequestsFinished = std::function<void(std::span<const std::size_t> at, const engine::GenerationResult&)>;

// How a job's flights take its requests.
struct JobFeed {
  // Blocks in flight at once, each stepped in turn (a pipeline stage's micro-batches); they
  // take the job's requests in order from one queue, as their slots free (continuous) or their
  // blocks start (fixed).
  std::size_t flights = 1;
  // Which requests this engine takes (one flight only); null: all of them, in order.
  RequestSource* source = nullptr;
  // Whether to stop taking requests, asked before free slots take waiting ones (continuous) or
  // before a block starts while requests are left (fixed); null: whether a first interrupt came.
  std::function<bool()> stop;
  // Runs between steps (rank 0 of a data-parallel run takes the other ranks' results there).
  std::function<void()> between_steps;
};

// The requests at indices `at` of `requests`, in that order.
std::vector<Request> requests_at(std::span<const Request> requests, std::span<const std::size_t> at);

// What a step exchanges with the neighbouring stages of a pipeline (none: the whole model here).
struct StepLinks {
  engine::StageLinks hidden;  // GPU batches' hidden states at the slice's ends
  // The stage with the head hands each step's sampled tokens on as soon as they are sampled;
  // the others take them from it before the step is recorded, at their flight's next step.
  std::function<void(std::span<const std::int32_t>)> send_tokens;
  std::function<void(std::span<std::int32_t>)> receive_tokens;
};

// "flexh2o: interrupted: <who> stopped after F of the job's N requests[; rerun ...]" (newline
// included): what every mode says when an interrupt stopped the job.
std::string stopped_message(const std::string& who, std::size_t finished, std::size_t requests,
                            const std::string& results_in);

class Engine {
 public:
  // `weights` and `interrupts` (null: signals keep their default handling) outlive the engine.
  Engine(kernels::Backend& backend, const engine::ModelConfig& config, const engine::WeightSource& weights,
         EngineOptions options, const InterruptWatch* interrupts);
  ~Engine();

  // Runs `requests` (those `source` deals this engine, null: all in order) to the end, a
  // step after another; each finished one goes to `finished`. `between_steps` runs between
  // steps (JobFeed).
  JobOutcome run(std::span<const Request> requests, const RequestsFinished& finished, RequestSource* source = nullptr,
                 const std::function<void()>& between_steps = {});

  // A job run step by step: start it, step its flights (in turn) until none has work, end it.
  // `requests` outlive the job.
  void start(std::span<const Request> requests, RequestsFinished finished, JobFeed feed = {});
  // One step of flight `flight`: records the tokens of its last step (ending requests, handing
  // on their results, planning the next step), finishes its block when no sequence runs,
  // starts its next one when it has none (the job's next fixed block, or its one continuous
  // block), checks the interrupts, and runs the block's planned step on the executor (this
  // engine's layers). False: the flight has no work left (nothing ran).
  bool step(std::size_t flight = 0, const StepLinks& links = {});
  // After every flight's step returned false: the job's outcome.
  JobOutcome end();

  // Between steps: throws Interrupted when a second signal asked to abandon the requests under way.
  void check_abandon() const;
  // Whether a first signal asked to stop taking requests.
  bool stop_requested() const;

  engine::BlockExecutor& executor() { return *exec_; }
  offload::Trace* trace() { return trace_ ? &*trace_ : nullptr; }
  const EngineOptions& options() const { return o_; }

  // The one-process report of `outcome` for a job of `requests` (those done before a resume
  // included) generating up to `gen_len` each unless a request says otherwise.
  RunReport report(const std::string& description, std::span<const Request> requests, std::int64_t gen_len,
                   const JobOutcome& outcome) const;
  // This engine's part of a run over several ranks: its placement (when it loaded), spans.
  RunPart part(const std::string& name, int rank, const std::string& host, const engine::GenerationResult& total) const;

 private:
  struct Flight;
  struct Job;
  class FlightFeed;
  // The request for a fixed block of requests, and for a job under continuous batching (the
  // slots and budget; the queue's feed is the flight's). Both keep `requests`, as do the
  // hooks of either (stop strings; between steps).
  engine::GenerationRequest block_request(std::span<const Request> requests) const;
  engine::GenerationHooks block_hooks(std::span<const Request> requests);
  engine::GenerationRequest continuous_request(std::span<const Request> requests) const;
  // engine_step.cc: a flight's next block (false: none), its end, its step's tokens recorded.
  bool begin_block(Flight& f);
  bool begin_fixed(Flight& f);
  void begin_continuous(Flight& f);
  void finish_block(Flight& f);
  void record_step(Flight& f, const StepLinks& links);
  // Whether to stop taking requests now (JobFeed::stop).
  bool stop_now();
  // Several flights: the request the job's queue gives flight f, asked from `from` on.
  std::size_t queue_next(Flight& f, std::size_t from);
  void between_steps() const;
  // Requests at `at` ended with result r (tokens in that order): the outcome's and the
  // progress line's counts.
  void count_finished(std::span<const std::size_t> at, const engine::GenerationResult& r);

  const engine::ModelConfig& config_;
  EngineOptions o_;
  const InterruptWatch* interrupts_;
  offload::Tiers tiers_;
  std::optional<offload::Trace> trace_;
  kernels::KernelUse kernels_at_start_;  // the backend's kernels before this engine's (the machine's measurement)
  std::unique_ptr<engine::BlockExecutor> exec_;
  std::unique_ptr<Job> job_;  // the job started, until it ends
};

}  // namespace flexh2o::serving
