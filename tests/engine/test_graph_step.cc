// Which steps the executors offer as CUDA graphs and their keys (engine/runtime/graph_step.h):
// steps that only decode (or idle), keyed by rows and idle pattern, not by tokens or lengths.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "engine/runtime/graph_step.h"

namespace flexh2o::engine {
namespace {

StepBatch decode_step(const std::vector<std::int32_t>& tokens, const std::vector<std::int64_t>& cached) {
  return StepBatch::make_decode(tokens, cached);
}

TEST(GraphStepKey, DecodeStepsOnlyKeyedByTheirShape) {
  const auto a = decode_graph_key(decode_step({5, 6, 7}, {10, 20, 30}));
  ASSERT_TRUE(a.has_value());
  // Other tokens, longer contexts: the same shape, the same key (the backend checks the rest).
  EXPECT_EQ(decode_graph_key(decode_step({1, 2, 3}, {11, 21, 31})), a);
  EXPECT_NE(decode_graph_key(decode_step({1, 2}, {11, 21})), a);

  StepBatch idle;  // the same rows with an idle slot in the middle: another op sequence
  idle.add_decode(5, 10);
  idle.add_idle();
  idle.add_decode(6, 20);
  idle.add_decode(7, 30);
  StepBatch idle_last;
  idle_last.add_decode(5, 10);
  idle_last.add_decode(6, 20);
  idle_last.add_decode(7, 30);
  idle_last.add_idle();
  ASSERT_TRUE(decode_graph_key(idle).has_value());
  EXPECT_NE(decode_graph_key(idle), decode_graph_key(idle_last));
  EXPECT_NE(decode_graph_key(idle), a);
}

TEST(GraphStepKey, StepsWithPromptRowsAreNotOffered) {
  const std::vector<std::vector<std::int32_t>> prompts{{1, 2, 3}, {4, 5}};
  EXPECT_FALSE(decode_graph_key(StepBatch::make_prefill(prompts)).has_value());
  StepBatch mixed;  // continuous batching: a newcomer prefills beside a decoding slot
  mixed.add_decode(5, 10);
  mixed.add_prefill(prompts[0]);
  EXPECT_FALSE(decode_graph_key(mixed).has_value());
  StepBatch extend;  // the rest of a prompt after a shared prefix
  extend.add_decode(5, 10);
  extend.add_extend(prompts[0], 1);
  EXPECT_FALSE(decode_graph_key(extend).has_value());
  StepBatch all_idle;
  all_idle.add_idle();
  EXPECT_FALSE(decode_graph_key(all_idle).has_value());
}

}  // namespace
}  // namespace flexh2o::engine
