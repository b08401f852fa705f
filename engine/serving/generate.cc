#include "engine/serving/generate.h"

#include <stdexcept>

#include "engine/serving/block_run.h"

namespace flexh2o::serving {

engine::GenerationResult generate(engine::BlockExecutor& exec, const engine::GenerationRequest& req,
                                  const engine::GenerationHooks& hooks, SequenceFeed* feed) {
  if (!exec.holds_input() || !exec.holds_head())
    throw std::logic_error("serving::generate needs the whole model; step a stage's blocks");
  BlockRun run(exec, req, hooks, feed);
  while (run.active()) run.update(exec.run_step(run.block(), run.next_step()));
  return run.finish();
}

}  // namespace flexh2o::serving
