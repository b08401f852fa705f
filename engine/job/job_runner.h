// The block loop of a batch job, which every `run` form drives: the one-process run over the
// whole job, and each rank of a data-parallel run over the requests rank 0 deals it from the
// job's queue (a RequestSource). (Pipeline stages step their micro-batches in their own slot
// order, distributed/pipeline_stage.h.) Requests run in order
// through one BlockScheduler, either continuously (the default: the block's slots take the
// next request as soon as one ends, and each result is handed on as its request ends) or a
// fixed block of the policy's size at a time (each block runs until its longest request
// ends). A first interrupt stops admitting requests (fixed: starting blocks), a second
// abandons the requests under way (checked between steps); progress is shown between steps.
#pragma once
#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/runtime/block_scheduler.h"
#include "engine/job/interrupts.h"
#include "engine/job/request.h"
#include "engine/job/request_source.h"
#include "engine/job/result_file.h"
#include "engine/job/run_report.h"
#include "engine/job/structured_output.h"

namespace flexh2o::job {

// The requests of `all` whose ids are not in `out` yet (all of them without --out); with
// `resuming`, says on stderr how many are done already.
std::vector<Request> requests_to_run(std::span<const Request> all, const std::optional<ResultFile>& out,
                                     bool resuming, const std::string& out_path);

struct BlockLoopOptions {
  std::size_t block = 1;  // requests per block: the policy's block size
  bool continuous = true;  // --batching continuous (else fixed)
  std::int64_t prefill_budget = 512;  // continuous: prompt tokens a GPU batch's step prefills for newcomers
  // Which of the requests this runner takes (null: all, in order).
  RequestSource* source = nullptr;
  // Neighbouring requests with the same prompt and limit (a request's n choices) share one
  // prefill (GenerationRequest::shares_prompt); false: each prefills its own (the ablation).
  bool share_prefill = true;
  // First signal: no block starts after it; second: the block under way is abandoned (throws
  // Interrupted). Null: signals keep their default handling.
  const InterruptWatch* interrupts = nullptr;
  std::string results_in;  // where finished results are, for the messages ("" : the output)
  bool progress = false;   // "block b/B, step s/S" on stderr between steps
  // Between steps (rank 0 of a data-parallel run takes the other ranks' results here).
  std::function<void()> between_steps;
  // Whether a request with stop strings has generated one (text needs the tokenizer): the
  // sequence then ends there. Null: stop strings are not watched.
  std::function<bool(const Request&, std::span<const std::int32_t> generated)> stop_string_seen;
  // Compiles the requests' constraints (structured output); needed when any request has one.
  JobConstraints* constraints = nullptr;
};

// Whether request r ends on a stop string after `generated` (never before its min_tokens), as
// `seen` tells; what a runner's stop_here asks.
bool stop_string_ends(const std::function<bool(const Request&, std::span<const std::int32_t>)>& seen,
                      const Request& r, std::span<const std::int32_t> generated);

// Whether request i of `requests` shares the prefill of request i - 1: the n choices of one
// request line (OpenAI's `n`), each after the first. Only those: two lines that happen to hold
// one prompt are two requests, each prefilled. Runs of them in a GenerationRequest are its
// shares_prompt.
bool shares_prompt_of_previous(std::span<const Request> requests, std::size_t i);

// Each request's constraint in its start state (null: none), compiled by `constraints`; empty
// when no request has one (GenerationRequest::constraints).
std::vector<std::shared_ptr<const engine::TokenConstraint>> request_constraints(std::span<const Request> requests,
                                                                               JobConstraints* constraints);

struct JobOutcome {
  engine::GenerationResult total;  // counts and times of the requests run (tokens not kept)
  std::size_t requests = 0;        // of the job
  std::size_t finished_requests = 0;  // by this runner
  bool stopped = false;  // an interrupt stopped taking requests while some were left
  double wall_seconds = 0;
  std::vector<RequestTiming> timings;  // of the finished requests, in the order they ended
};

// Called with requests that finished (a block's, or a single one under continuous batching)
// and their result (tokens in request order).
using BlockFinished = std::function<void(std::span<const Request>, const engine::GenerationResult&)>;

JobOutcome run_blocks(engine::BlockScheduler& sched, std::span<const Request> requests, const BlockLoopOptions& opt,
                      const BlockFinished& finished);

}  // namespace flexh2o::job
