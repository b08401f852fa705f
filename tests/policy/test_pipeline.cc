// Pipeline planning: the layer split by bytes and time, stage shapes, and the pipeline's time
// and bubble from its stages' times, checked by hand; one stage is the one-process plan.
#include "policy/pipeline.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace flexh2o::policy {
namespace {

ModelShape opt_30b() {
  return {"opt-30b", 48, 7168, 28672, 56, 56, 128, 50272, false, true, kernels::DType::F16, kernels::DType::F32, 2050};
}

HardwareProfile t4() { return load_hardware_file(std::string(FLEXH2O_SOURCE_DIR) + "/configs/hardware/t4-gcp.yaml"); }

void expect_contiguous(const std::vector<StageSlice>& s, std::int64_t layers) {
  std::int64_t next = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(s[i].first_layer, next) << "stage " << i;
    EXPECT_GE(s[i].layers, 1) << "stage " << i;
    EXPECT_EQ(s[i].input, i == 0);
    EXPECT_EQ(s[i].head, i + 1 == s.size());
    next += s[i].layers;
  }
  EXPECT_EQ(next, layers);
}

TEST(Pipeline, SplitIsContiguousAndBalancesBytesAndFlops) {
  const ModelShape m = opt_30b();
  for (std::int64_t n : {1, 2, 3, 4, 7, 48}) expect_contiguous(split_layers(m, n), m.layers);
  // 48 equal layers over 4 stages: the embedding (0.7 GB, ~1/2 layer) and the head (flops of
  // ~0.3 layer) leave the ends a layer short of the middle at most.
  const auto s = split_layers(m, 4);
  EXPECT_EQ(s[1].layers, s[2].layers);
  EXPECT_LE(s[0].layers, s[1].layers);
  EXPECT_LE(s[3].layers, s[1].layers);
  EXPECT_GE(s[0].layers, s[1].layers - 1);

  // A huge vocabulary (a small model with a 256k-token embedding, as Gemma's): the ends hold
  // most of the bytes and flops, so they get fewer decoder layers.
  ModelShape wide = m;
  wide.layers = 12;
  wide.hidden = 1024;
  wide.ffn = 4096;
  wide.heads = wide.kv_heads = 8;
  wide.vocab = 256000;
  wide.tied_embeddings = false;
  wide.extra_embedding_rows = 0;
  const auto w = split_layers(wide, 3);
  expect_contiguous(w, 12);
  EXPECT_LT(w[0].layers, w[1].layers);
  EXPECT_LT(w[2].layers, w[1].layers);

  EXPECT_THROW(split_layers(m, 49), std::invalid_argument);
  EXPECT_THROW(split_layers(m, 0), std::invalid_argument);
}

TEST(Pipeline, StageShapesHoldTheirPartOfTheWeights) {
  const ModelShape m = opt_30b();
  const ModelSizes whole = model_sizes(m);
  const auto s = split_layers(m, 3);
  std::int64_t layers = 0;
  for (const auto& slice : s) {
    const ModelSizes z = model_sizes(stage_shape(m, slice));
    layers += z.total_weights - z.embedding_weights;
  }
  EXPECT_EQ(layers, whole.total_weights - whole.embedding_weights);
  // The first stage holds the embedding and positions; the last the final norm (fp32) and a copy
  // of the tied embedding as its head; the middle neither.
  EXPECT_EQ(model_sizes(stage_shape(m, s[0])).embedding_weights, (50272LL + 2050) * 7168 * 2);
  EXPECT_EQ(model_sizes(stage_shape(m, s[1])).embedding_weights, 0);
  EXPECT_EQ(model_sizes(stage_shape(m, s[2])).embedding_weights, 50272LL * 7168 * 2 + 7168 * 4);
}

Estimate stage(double prefill, double step, std::int64_t block, std::int64_t gen_len) {
  Estimate e;
  e.policy.gpu_batch_size = block;
  e.prefill_seconds = prefill;
  e.decode_step_seconds = step;
  e.decode_seconds = step * static_cast<double>(gen_len - 1);
  return e;
}

TEST(Pipeline, TimesAndBubbleFromTheStagesByHand) {
  const Workload w{8, 11};  // 10 decode steps
  // Two equal stages, one micro-batch: the stages take turns, half of the time is a bubble.
  auto p = combine_stages({{}, {}}, {stage(1, 0.5, 4, 11), stage(1, 0.5, 4, 11)}, w, 1);
  EXPECT_DOUBLE_EQ(p.prefill_seconds, 2);                 // 1 + 1
  EXPECT_DOUBLE_EQ(p.decode_seconds, 10 * 1.0);           // max(1 x 0.5, 0.5 + 0.5) per step
  EXPECT_DOUBLE_EQ(p.bubble_share, 1 - 2 * (1 + 5) / (2.0 * 12));
  EXPECT_DOUBLE_EQ(p.total_throughput, 4 * 11 / 12.0);
  // Two micro-batches fill it: decode has no bubble, prefill fills once (1 + 1, then 1 more).
  p = combine_stages({{}, {}}, {stage(1, 0.5, 4, 11), stage(1, 0.5, 4, 11)}, w, 2);
  EXPECT_DOUBLE_EQ(p.prefill_seconds, 3);
  EXPECT_DOUBLE_EQ(p.decode_seconds, 10 * 1.0);  // max(2 x 0.5, 0.5 + 0.5)
  EXPECT_DOUBLE_EQ(p.bubble_share, 1 - 2 * 2 * (1 + 5) / (2.0 * 13));
  EXPECT_DOUBLE_EQ(p.total_throughput, 2 * 4 * 11 / 13.0);
  // An unbalanced pair: the slow stage sets the pace, the fast one waits.
  p = combine_stages({{}, {}}, {stage(1, 0.2, 4, 11), stage(1, 0.8, 4, 11)}, w, 4);
  EXPECT_DOUBLE_EQ(p.decode_seconds, 10 * 3.2);  // max(4 x 0.8, 1.0)
}

TEST(Pipeline, OneStageIsTheOneProcessPlan) {
  const Workload w{512, 32};
  const ModelShape m = opt_30b();
  const Estimate one = plan(m, t4(), w);
  const std::vector<HardwareProfile> hws{t4()};
  const PipelineEstimate p = plan_pipeline(m, hws, w, 1, {});
  EXPECT_EQ(p.stages.front().policy.block_size(), one.policy.block_size());
  EXPECT_NEAR(p.total_throughput, one.total_throughput, 1e-9 * one.total_throughput);
  EXPECT_NEAR(p.bubble_share, 0, 1e-12);
}

TEST(Pipeline, FourT4sPlanStagesThatFitAndBeatOne) {
  const Workload w{512, 32};
  const ModelShape m = opt_30b();
  const std::vector<HardwareProfile> hws(4, t4());
  const PipelineEstimate p = plan_pipeline(m, hws, w, 4, {});
  ASSERT_EQ(p.stages.size(), 4u);
  for (const Estimate& e : p.stages) {
    EXPECT_EQ(e.policy.block_size(), p.stages.front().policy.block_size());  // the same micro-batch everywhere
    EXPECT_LE(e.peak_bytes[0], static_cast<double>(hws[0].gpu_mem) * hws[0].memory_safety + 1);
    EXPECT_LE(e.peak_bytes[1], static_cast<double>(hws[0].cpu_mem) * hws[0].memory_safety + 1);
  }
  EXPECT_GT(p.total_throughput, plan(m, t4(), w).total_throughput);
  EXPECT_GE(p.bubble_share, 0);
  EXPECT_LT(p.bubble_share, 0.5);
  // A fixed policy on every stage: each stage as estimate() sees its part with 4 blocks in flight.
  Policy all_cpu;
  all_cpu.gpu_batch_size = 2;
  all_cpu.num_gpu_batches = 8;
  all_cpu.cpu_cache_compute = true;
  all_cpu.set_percent({0, 100, 0, 100, 0, 100});
  const PipelineEstimate fixed = estimate_pipeline(m, hws, w, all_cpu, 4, {});
  PlanOptions four;
  four.blocks_in_flight = 4;
  for (std::size_t s = 0; s < 4; ++s) {
    const auto e = estimate(stage_shape(m, fixed.slices[s]), t4(), w, all_cpu, four);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(fixed.stages[s].decode_step_seconds, e->decode_step_seconds);
    EXPECT_EQ(fixed.stages[s].peak_bytes, e->peak_bytes);
  }
  all_cpu.num_gpu_batches = 4096;  // the KV of 4 x 64k sequences fits no CPU
  EXPECT_THAT([&] { estimate_pipeline(m, hws, w, all_cpu, 4, {}); },
              ::testing::ThrowsMessage<std::invalid_argument>(::testing::HasSubstr("pipeline stage 0")));
}

TEST(Pipeline, MicroBatchesInFlightCostMemory) {
  const Workload w{512, 32};
  ModelShape m = opt_30b();
  const auto slice = split_layers(m, 2)[1];
  Policy p;
  p.gpu_batch_size = 8;
  p.num_gpu_batches = 2;
  p.set_percent({0, 100, 0, 100, 0, 100});
  PlanOptions one, three;
  three.blocks_in_flight = 3;
  const auto a = estimate(stage_shape(m, slice), t4(), w, p, one), b = estimate(stage_shape(m, slice), t4(), w, p, three);
  ASSERT_TRUE(a && b);
  // Each further block holds its own KV cache (in the policy's dtype) and prompt hidden states.
  const std::int64_t kv = model_sizes(with_compression(m, p)).kv_per_token_layer * slice.layers * p.block_size() * (512 + 32);
  const std::int64_t hidden = m.hidden * kernels::dtype_size(t4().activation_dtype) * p.block_size() * 512;
  EXPECT_NEAR(static_cast<double>(b->peak_bytes[1] - a->peak_bytes[1]), 2.0 * static_cast<double>(kv + hidden), 16);
  EXPECT_DOUBLE_EQ(a->decode_step_seconds, b->decode_step_seconds);  // time is per block
}

}  // namespace
}  // namespace flexh2o::policy
