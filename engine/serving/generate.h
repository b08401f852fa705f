// One block of a BlockExecutor run to its end, its steps planned and recorded by a BlockRun:
// what the tests and benchmarks call for a whole request at once (the Engine steps its blocks
// itself).
#pragma once
#include "engine/runtime/block_executor.h"
#include "engine/runtime/generator.h"
#include "engine/serving/step_scheduler.h"

namespace flexh2o::serving {

// Generates for one block of `exec` (whole model only): at most gpu_batch_size x
// num_gpu_batches prompts, cut into GPU batches in order. Same tokens as Generator::generate
// on the same request. With req.slots > 0 (continuous batching) any number of prompts flow
// through that many slots (those `feed` admits; null: all, in order); each sequence gets the
// tokens it would get alone (up to rounding where a kernel's summation order depends on the
// rows of a step).
engine::GenerationResult generate(engine::BlockExecutor& exec, const engine::GenerationRequest& req,
                                  const engine::GenerationHooks& hooks = {}, SequenceFeed* feed = nullptr);

}  // namespace flexh2o::serving
