// The planner's size formulas against sizes computed by hand, and its search on FlexGen's T4.
#include "policy/cost_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace flexh2o::policy {
namespace {

ModelShape opt_175b() {
  return {"opt-175b", 96, 12288, 49152, 96, 96, 128, 50272, false, true, kernels::DType::F16, kernels::DType::F32, 2050};
}
ModelShape llama_2_70b() {
  return {"llama-2-70b", 80, 8192, 28672, 64, 8, 128, 32000, true, false, kernels::DType::F16, kernels::DType::F32, 0};
}

TEST(CostModel, Opt175bSizesByHand) {
  const ModelSizes z = model_sizes(opt_175b());
  // FlexGen's wi = 8 h^2 + 4 h ffn bytes at fp16.
  EXPECT_EQ(z.layer_weights, 8LL * 12288 * 12288 + 4LL * 12288 * 49152);
  EXPECT_EQ(z.layer_weights, 3'623'878'656LL);
  EXPECT_EQ(z.embedding_weights, (50272LL + 2050) * 12288 * 2);  // tokens + learned positions, head tied
  EXPECT_EQ(z.total_weights, 96 * 3'623'878'656LL + 1'285'865'472LL);
  EXPECT_EQ(z.kv_per_token_layer, 2 * 12288 * 4);  // K and V in fp32
  EXPECT_EQ(z.largest_unit, 2LL * 12288 * 49152 * 2);  // the MLP
}

TEST(CostModel, Llama2_70bSizesByHand) {
  const ModelSizes z = model_sizes(llama_2_70b());
  const std::int64_t attn = (2LL * 8192 * 8192 + 2LL * 8192 * 1024) * 2;  // q, o full; k, v for 8 kv heads
  const std::int64_t mlp = 3LL * 8192 * 28672 * 2;
  EXPECT_EQ(z.layer_weights, attn + mlp);
  EXPECT_EQ(z.layer_weights, 1'711'276'032LL);
  EXPECT_EQ(z.embedding_weights, 2LL * 32000 * 8192 * 2);  // untied head
  EXPECT_EQ(z.total_weights, 80 * 1'711'276'032LL + 1'048'576'000LL);
  EXPECT_EQ(z.kv_per_token_layer, 2 * 1024 * 4);  // GQA: 8 kv heads x 128
}

TEST(CostModel, CompressedSizesByHand) {
  Policy p;
  p.compress_weight = p.compress_cache = true;
  const ModelSizes z = model_sizes(with_compression(opt_175b(), p));
  // A row of 12288 inputs: 6144 bytes of 4-bit codes + 192 groups x (fp16 scale, fp16 min).
  const std::int64_t row_h = 6144 + 192 * 4, row_ffn = 24576 + 768 * 4;
  EXPECT_EQ(z.layer_weights, 4 * 12288 * row_h + 49152 * row_h + 12288 * row_ffn);
  EXPECT_EQ(z.layer_params, 4LL * 12288 * 12288 + 2LL * 12288 * 49152);  // the flops do not shrink
  EXPECT_EQ(z.embedding_weights, (50272LL + 2050) * row_h);
  // K and V of 96 heads, each head_dim 128: 64 bytes of codes + 2 groups x 4 bytes.
  EXPECT_EQ(z.kv_per_token_layer, 2 * 96 * (64 + 2 * 4));
  p.compress_bits = 8;
  EXPECT_EQ(model_sizes(with_compression(opt_175b(), p)).kv_per_token_layer, 2 * 96 * (128 + 2 * 4));
}

TEST(CostModel, KvTokensFollowTheEvictionBudget) {
  const Workload w{512, 32};
  EXPECT_EQ(kv_tokens(opt_175b(), w, parse_kv_spec("full")), 544);
  EXPECT_EQ(kv_tokens(opt_175b(), w, parse_kv_spec("h2o:0.2")), 110);  // round(0.2 * 544) + the incoming slot
  EXPECT_EQ(kv_tokens(opt_175b(), w, parse_kv_spec("local:64")), 65);
}

HardwareProfile t4() {
  return load_hardware_file(std::string(FLEXH2O_SOURCE_DIR) + "/configs/hardware/t4-gcp.yaml");
}

TEST(CostModel, PlansFitTheirTiersAndEvictionGrowsTheBlock) {
  const Workload w{512, 32};
  const ModelShape m{"opt-30b", 48, 7168, 28672, 56, 56, 128, 50272, false, true, kernels::DType::F16, kernels::DType::F32, 2050};
  const Estimate full = plan(m, t4(), w);
  const Estimate h2o = plan(m, t4(), w, {parse_kv_spec("h2o:0.2")});
  for (const Estimate* e : {&full, &h2o}) {
    EXPECT_LE(e->peak_bytes[0], 15'000'000'000 * 0.9 + 1);
    EXPECT_LE(e->peak_bytes[1], 204'000'000'000 * 0.9 + 1);
    EXPECT_GT(e->total_throughput, 0);
    // A fixed policy's estimate agrees with what the search reported for it.
    const auto again = estimate(m, t4(), w, e->policy, {e == &h2o ? parse_kv_spec("h2o:0.2") : parse_kv_spec("full")});
    ASSERT_TRUE(again.has_value());
    EXPECT_NEAR(again->total_throughput, e->total_throughput, 1e-6 * e->total_throughput);
  }
  EXPECT_GT(h2o.policy.block_size(), full.policy.block_size());
  EXPECT_GT(h2o.total_throughput, full.total_throughput);

  // Compression shrinks weights and KV: a larger block, faster, and the plan says so.
  PlanOptions o;
  o.compress_weight = o.compress_cache = true;
  const Estimate q4 = plan(m, t4(), w, o);
  EXPECT_TRUE(q4.policy.compress_weight && q4.policy.compress_cache);
  EXPECT_GT(q4.policy.block_size(), full.policy.block_size());
  EXPECT_GT(q4.total_throughput, full.total_throughput);
  const auto again = estimate(m, t4(), w, q4.policy, o);
  ASSERT_TRUE(again.has_value());
  EXPECT_NEAR(again->total_throughput, q4.total_throughput, 1e-6 * q4.total_throughput);

  // Where the profile says dequantization costs (a CPU), the same policy predicts slower, and
  // the profile round-trips the rate.
  HardwareProfile slow = t4();
  slow.dequant = 2e9;
  const auto paid = estimate(m, slow, w, q4.policy, o);
  ASSERT_TRUE(paid.has_value());
  EXPECT_LT(paid->total_throughput, q4.total_throughput);
  EXPECT_EQ(load_hardware_yaml(hardware_to_yaml(slow), "roundtrip").dequant, 2e9);
  EXPECT_EQ(estimate(m, slow, w, full.policy)->total_throughput, full.total_throughput);  // nothing to expand
}

TEST(CostModel, InfeasibleRequestsNameTheChange) {
  HardwareProfile small = t4();
  small.cpu_mem = 16'000'000'000;
  small.disk_mem = 100'000'000'000;
  try {
    plan(opt_175b(), small, {512, 32});
    FAIL() << "OPT-175B fit 16 GB of CPU memory and 100 GB of disk";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("--disk-mem >="));
  }
  small = t4();
  small.gpu_mem = 100'000'000;
  EXPECT_THROW(plan(opt_175b(), small, {512, 32}), std::invalid_argument);
}

}  // namespace
}  // namespace flexh2o::policy

namespace flexh2o::policy {
namespace {

TEST(CostModel, GemmRateCurveInterpolatesAndRoundTrips) {
  HardwareProfile h = t4();
  EXPECT_EQ(h.gemm_rate(64, 7.0), 7.0);  // no curve: the fallback
  h.gemm_by_rows = {{1, 1e10}, {16, 1.6e11}, {256, 2.56e11}};
  EXPECT_DOUBLE_EQ(h.gemm_rate(1, 0), 1e10);
  EXPECT_NEAR(h.gemm_rate(4, 0), 4e10, 1e3);  // log-log: halfway between 1 and 16 rows
  EXPECT_DOUBLE_EQ(h.gemm_rate(1024, 0), 2.56e11);  // clamped to the ends
  const HardwareProfile back = load_hardware_yaml(hardware_to_yaml(h), "roundtrip");
  EXPECT_EQ(back.gemm_by_rows, h.gemm_by_rows);
  EXPECT_THROW(load_hardware_yaml(hardware_to_yaml(h) + "gemm_tflops_by_rows_x: 1\n", "x"), std::invalid_argument);
}

}  // namespace
}  // namespace flexh2o::policy
