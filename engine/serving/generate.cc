#include "engine/serving/generate.h"

#include <stdexcept>

#include "engine/serving/step_scheduler.h"

namespace flexh2o::serving {

engine::GenerationResult generate(engine::BlockScheduler& sched, const engine::GenerationRequest& req) {
  if (!sched.holds_input() || !sched.holds_head())
    throw std::logic_error("serving::generate needs the whole model; step a stage's blocks");
  const engine::BlockScheduler::BlockPtr blk = sched.begin(req, make_step_scheduler);
  while (sched.active(*blk)) {
    sched.run_step(*blk);
    sched.end_step(*blk);
  }
  return sched.finish(*blk);
}

}  // namespace flexh2o::serving
