// The state of a job an Engine runs step by step (engine_step.cc): the job's queue and outcome,
// and each flight's block. Private to the engine's sources.
#pragma once
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/serving/block_run.h"
#include "engine/serving/engine.h"

namespace flexh2o::serving {

struct Engine::Flight {
  static constexpr std::size_t kNoRequest = static_cast<std::size_t>(-1);
  engine::GenerationRequest req;   // its block's; the block keeps a reference to it
  engine::GenerationHooks hooks;   // its block's
  std::unique_ptr<SequenceFeed> feed;  // continuous: who its block admits
  std::unique_ptr<BlockRun> run;   // its block (null: none begun)
  engine::StepOutput out;          // of the block's last step
  bool continuous = false;  // its block serves the whole job through its slots
  bool pending = false;     // its block ran a step not recorded yet (out)
  // Fixed blocks: the block's requests (its request keeps a view of them), their indices into
  // the job's and when it began (seconds into the job).
  std::vector<Request> these;
  std::vector<std::size_t> at;
  double begun_at = 0;
  // Continuous: its one block began; under several flights, the request the job's queue gave
  // it, kept until it takes it (with the requests sharing its prefill).
  bool started = false;
  std::size_t given = kNoRequest;
  std::int64_t rows_counted = 0;  // its block's sequence rows the progress line has counted
};

struct Engine::Job {
  std::span<const Request> requests;
  RequestsFinished finished;
  JobFeed feed;
  std::vector<std::unique_ptr<Flight>> flights;
  JobOutcome outcome;
  // The job's first request no flight took yet: fixed blocks, and the queue of several
  // continuous flights.
  std::size_t next = 0;
  bool stop_seen = false;    // continuous: a poll of JobFeed::stop said to stop
  std::chrono::steady_clock::time_point t0;
  std::optional<Progress> progress;
};

}  // namespace flexh2o::serving
