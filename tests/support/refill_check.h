// Continuous batching against each request alone: a request's tokens under refill (the
// BlockExecutor with GenerationRequest::slots) must be those of its solo in-memory run
// (Generator, the same compression and KV policy). Where a kernel's summation order depends on
// the rows of a step (the CPU GEMM's paths by row count), the logits that picked each token
// must stay within fp32 rounding of the solo run's, and a differing token is accepted only at
// a near-tie, after which that request is not compared further.
#pragma once
#include <cstddef>

#include "engine/runtime/generator.h"
#include "engine/serving/step_scheduler.h"
#include "engine/model/weights.h"
#include "kernels/backend.h"
#include "offload/copy_engine.h"
#include "policy/policy.h"

namespace flexh2o::testing {

struct RefillComparison {
  std::size_t requests = 0;
  std::size_t near_ties = 0;  // requests compared only up to a near-tie
  std::size_t exact = 0;      // requests whose tokens equal the solo run's
  std::size_t bitwise = 0;    // requests whose tokens and the logits that picked them are the solo run's bits
};

// Runs `req` (prompts, limits, sampling, streams) under continuous batching over the policy's
// tiers with block-size slots, each prompt alone in memory, and checks them with gtest
// expectations; under a `feed` only the prompts the run took are compared (the others must
// end without tokens). Needs a CPU backend.
RefillComparison expect_refill_matches_solo(kernels::Backend& be, const engine::ModelConfig& cfg,
                                            const engine::WeightSource& source, const policy::Policy& pol,
                                            const engine::GenerationRequest& req, offload::CopyOptions copy = {},
                                            serving::SequenceFeed* feed = nullptr);

}  // namespace flexh2o::testing
