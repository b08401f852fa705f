// The planner's size formulas against sizes computed by hand, and its search on FlexGen's T4.
#include "policy/cost_model.h"
#include "kernels/option_error.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <utility>

namespace flexh2o::policy {
namespace {

// OPT shapes (configs/models): layers, hidden, ffn, heads, kv heads, head_dim, vocab, fp16
// weights, learned positions for 2048 tokens, biases everywhere.
ModelShape opt(const char* name, std::int64_t layers, std::int64_t hidden) {
  return {name, layers, hidden, 4 * hidden, hidden / 128, hidden / 128, 128, 50272, false, true,
          kernels::DType::F16, kernels::DType::F32, 2050, true};
}
ModelShape opt_175b() { return opt("opt-175b", 96, 12288); }
ModelShape llama_2_70b() {
  return {"llama-2-70b", 80, 8192, 28672, 64, 8, 128, 32000, true, false, kernels::DType::F16, kernels::DType::F32, 0};
}

TEST(CostModel, Opt175bSizesByHand) {
  const ModelSizes z = model_sizes(opt_175b());
  // FlexGen's wi = 8 h^2 + 4 h ffn bytes at fp16, plus the fp32 norms (2 x weight and bias)
  // and biases (q, k, v, out, fc1, fc2).
  const std::int64_t vectors = 4 * (4 * 12288 + 4 * 12288 + 49152 + 12288);
  EXPECT_EQ(z.layer_weights, 8LL * 12288 * 12288 + 4LL * 12288 * 49152 + vectors);
  EXPECT_EQ(z.layer_weights, 3'624'517'632LL);
  // Tokens + learned positions, the head tied; the final norm.
  EXPECT_EQ(z.embedding_weights, (50272LL + 2050) * 12288 * 2 + 2 * 12288 * 4);
  EXPECT_EQ(z.total_weights, 96 * 3'624'517'632LL + 1'285'963'776LL);
  EXPECT_EQ(z.kv_per_token_layer, 2 * 12288 * 4);  // K and V in fp32
  // The MLP with its norm and biases, each tensor 256-byte aligned in the slot.
  EXPECT_EQ(z.staging_slot(0, true), 2LL * 12288 * 49152 * 2 + 4 * (2 * 12288 + 49152 + 12288));
  EXPECT_EQ(z.staging_slot(0, false), z.layer_weights);  // sep_layer off: attention and MLP in one slot
}

TEST(CostModel, Llama2_70bSizesByHand) {
  const ModelSizes z = model_sizes(llama_2_70b());
  const std::int64_t attn = (2LL * 8192 * 8192 + 2LL * 8192 * 1024) * 2 + 8192 * 4;  // q, o full; k, v for 8 kv heads; norm
  const std::int64_t mlp = 3LL * 8192 * 28672 * 2 + 8192 * 4;
  EXPECT_EQ(z.layer_weights, attn + mlp);
  EXPECT_EQ(z.layer_weights, 1'711'341'568LL);
  EXPECT_EQ(z.embedding_weights, 2LL * 32000 * 8192 * 2 + 8192 * 4);  // untied head, final norm
  EXPECT_EQ(z.total_weights, 80 * 1'711'341'568LL + 1'048'608'768LL);
  EXPECT_EQ(z.kv_per_token_layer, 2 * 1024 * 4);  // GQA: 8 kv heads x 128
}

TEST(CostModel, CompressedSizesByHand) {
  Policy p;
  p.compress_weight = p.compress_cache = true;
  const ModelSizes z = model_sizes(with_compression(opt_175b(), p));
  // A row of 12288 inputs: 6144 bytes of 4-bit codes + 192 groups x (fp16 scale, fp16 min).
  const std::int64_t row_h = 6144 + 192 * 4, row_ffn = 24576 + 768 * 4;
  const std::int64_t vectors = 4 * (4 * 12288 + 4 * 12288 + 49152 + 12288);  // fp32 as before
  EXPECT_EQ(z.layer_weights, 4 * 12288 * row_h + 49152 * row_h + 12288 * row_ffn + vectors);
  EXPECT_EQ(z.layer_params, 4LL * 12288 * 12288 + 2LL * 12288 * 49152);  // the flops do not shrink
  EXPECT_EQ(z.embedding_weights, (50272LL + 2050) * row_h + 2 * 12288 * 4);
  // K and V of 96 heads, each head_dim 128: 64 bytes of codes + 2 groups x 4 bytes.
  EXPECT_EQ(z.kv_per_token_layer, 2 * 96 * (64 + 2 * 4));
  p.compress_bits = 8;
  EXPECT_EQ(model_sizes(with_compression(opt_175b(), p)).kv_per_token_layer, 2 * 96 * (128 + 2 * 4));
}

TEST(CostModel, TheKvCacheDefaultsToTheModelsFloatDtype) {
  Policy p;
  EXPECT_EQ(with_compression(opt_175b(), p).cache_dtype, kernels::DType::F16);
  ModelShape fp32 = opt_175b();
  fp32.weight_dtype = kernels::DType::F32;
  EXPECT_EQ(with_compression(fp32, p).cache_dtype, kernels::DType::F32);
  p.cache_storage = kernels::DType::F32;  // --cache-dtype f32
  EXPECT_EQ(with_compression(opt_175b(), p).cache_dtype, kernels::DType::F32);
  p.cache_storage.reset();
  p.compress_cache = true;
  EXPECT_EQ(with_compression(opt_175b(), p).cache_dtype, kernels::DType::Q4);
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

ModelShape mixtral_8x7b() {
  ModelShape m{"mixtral-8x7b", 32, 4096, 14336, 32, 8, 128, 32000, true, false, kernels::DType::BF16, kernels::DType::F32, 0};
  m.moe_layers = 32;
  m.experts = 8;
  m.top_k = 2;
  m.expert_ffn = 14336;
  return m;
}

TEST(CostModel, MixtralSizesByHand) {
  const ModelSizes z = model_sizes(mixtral_8x7b());
  const std::int64_t attn = (2LL * 4096 * 4096 + 2LL * 4096 * 1024) * 2, norm = 4096 * 4;
  const std::int64_t expert = 3LL * 4096 * 14336 * 2, router = 8LL * 4096 * 2;
  EXPECT_EQ(z.layer_weights, attn + 8 * expert + router + 2 * norm);  // memory holds every expert
  EXPECT_EQ(z.layer_expert_weights, 8 * expert);
  EXPECT_EQ(z.expert_unit, expert);
  EXPECT_EQ(z.staging_slot(8, true), 8 * expert + router + norm);  // a staging slot for every expert
  EXPECT_EQ(z.staging_slot(2, true), 2 * expert + router + norm);   // for two
  EXPECT_EQ(z.staging_slot(2, false), attn + 2 * expert + router + 2 * norm);
  EXPECT_EQ(z.layer_params, 2LL * 4096 * 4096 + 2LL * 4096 * 1024 + (2 * 3 * 14336 + 8) * 4096LL);  // 2 of 8 experts
  EXPECT_NEAR(static_cast<double>(z.total_weights) / 2, 46.7e9, 0.1e9);  // parameters
}

// Decoding one sequence with the weights on the cpu moves the attention and the 2 routed of 8
// experts per layer: about a quarter of what loading every expert (top_k = 8) moves. The
// staging slots hold 2 experts instead of 8.
TEST(CostModel, MoeWeightTransferFollowsTheExpectedActiveExperts) {
  const Workload w{64, 8};
  Policy p;
  p.weights = {0, 1, 0};
  const ModelShape m = mixtral_8x7b();
  ModelShape dense_like = m;
  dense_like.top_k = 8;
  const auto routed = estimate(m, t4(), w, p), all = estimate(dense_like, t4(), w, p);
  ASSERT_TRUE(routed && all);
  const ModelSizes z = model_sizes(m);
  EXPECT_EQ(all->peak_bytes[0] - routed->peak_bytes[0], 2 * 6 * z.expert_unit);
  EXPECT_EQ(routed->peak_bytes[1], all->peak_bytes[1]);
  const double attn = static_cast<double>(z.layer_weights - z.layer_expert_weights);
  const double want = (attn + 0.25 * static_cast<double>(z.layer_expert_weights)) / static_cast<double>(z.layer_weights);
  EXPECT_NEAR(routed->decode_seconds / all->decode_seconds, want, 0.05);
}

// The cpu tier holds each policy's bookkeeping per kept slot: h2o 8 bytes, flex 12 (value
// norm) and 16 with merging (logit bias).
TEST(CostModel, EvictionScoresCountThePolicysBytesPerSlot) {
  const Workload w{512, 32};
  const ModelShape m = opt("opt-30b", 48, 7168);
  // A plan for the largest of the three fits the other two.
  const Estimate flex = plan(m, t4(), w, {parse_kv_spec("flex:0.2")});
  auto scores = [&](const char* kv) {
    const auto e = estimate(m, t4(), w, flex.policy, {parse_kv_spec(kv)});
    EXPECT_TRUE(e.has_value());
    for (const auto& [name, bytes] : e->memory[1])
      if (name == "eviction scores") return static_cast<double>(bytes);
    ADD_FAILURE() << "no eviction scores for " << kv;
    return 0.0;
  };
  const double per8 = scores("h2o:0.2");
  EXPECT_GT(per8, 0);
  EXPECT_NEAR(scores("flex:0.2,merge=0") / per8, 1.5, 1e-6);
  EXPECT_NEAR(scores("flex:0.2") / per8, 2.0, 1e-6);
}

TEST(CostModel, PlansFitTheirTiersAndEvictionGrowsTheBlock) {
  const Workload w{512, 32};
  const ModelShape m = opt("opt-30b", 48, 7168);
  const HardwareProfile hw = t4();
  const Estimate full = plan(m, hw, w);
  const Estimate h2o = plan(m, hw, w, {parse_kv_spec("h2o:0.2")});
  for (const Estimate* e : {&full, &h2o}) {
    EXPECT_LE(e->peak_bytes[0], static_cast<double>(hw.gpu_mem) * hw.memory_safety + 1);
    EXPECT_LE(e->peak_bytes[1], static_cast<double>(hw.cpu_mem) * hw.memory_safety + 1);
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

  // Where dequantization is slower, the same policy predicts slower, and the profile
  // round-trips the rate.
  HardwareProfile slow = t4();
  slow.dequant = hw.dequant / 4;
  const auto paid = estimate(m, slow, w, q4.policy, o);
  ASSERT_TRUE(paid.has_value());
  EXPECT_LT(paid->total_throughput, q4.total_throughput);
  EXPECT_EQ(load_hardware_yaml(hardware_to_yaml(slow), "roundtrip").dequant, slow.dequant);
  EXPECT_EQ(estimate(m, slow, w, full.policy)->total_throughput, full.total_throughput);  // nothing to expand
}

// A T4 whose gpu and cpu tiers hold `gib` GiB each, as one host memory and as two.
std::pair<HardwareProfile, HardwareProfile> host_and_split_t4(std::int64_t gib) {
  HardwareProfile split = t4();
  split.gpu_mem = split.cpu_mem = gib << 30;
  HardwareProfile host = split;
  host.gpu_is_host_memory = true;
  return {host, split};
}

// On the CPU backend the gpu tier is host memory: a plan fits the two tiers into it together,
// and a fixed policy that fits each tier alone but not both is refused, naming both.
TEST(CostModel, HostMemoryHoldsTheGpuAndCpuTiersTogether) {
  const Workload w{512, 32};
  const ModelShape m = opt("opt-6.7b", 32, 4096);
  const auto [host, split] = host_and_split_t4(12);
  const Estimate e = plan(m, host, w);
  EXPECT_LE(static_cast<double>(e.peak_bytes[0] + e.peak_bytes[1]), host.memory_safety * static_cast<double>(host.cpu_mem) + 2);
  Policy p;  // weights (12.4 GiB) half on each tier: each fits, both do not
  p.gpu_batch_size = 8;
  p.set_percent({50, 50, 100, 0, 100, 0});
  EXPECT_TRUE(estimate(m, split, w, p).has_value());
  EXPECT_FALSE(estimate(m, host, w, p).has_value());
  const auto s = shortfall(m, host, w, p);
  ASSERT_TRUE(s.has_value());
  EXPECT_THAT(s->describe(), testing::HasSubstr("gpu and cpu tiers (one host memory) need"));
  EXPECT_THAT(s->describe(), testing::HasSubstr("weights (gpu tier)"));
  EXPECT_TRUE(load_hardware_yaml(hardware_to_yaml(host), "roundtrip").gpu_is_host_memory);
  EXPECT_FALSE(load_hardware_yaml(hardware_to_yaml(split), "roundtrip").gpu_is_host_memory);
}

// On one host (the CPU backend) a disk's reads and writes share the disk and the cores that
// issue them: a decode step that reads and writes the disk pays both; without the disk nothing
// changes.
TEST(CostModel, HostMemorySerialisesDiskReadsAndWrites) {
  const Workload w{512, 32};
  const ModelShape m = opt("opt-6.7b", 32, 4096);
  const auto [host, split] = host_and_split_t4(64);
  Policy disk_kv;
  disk_kv.gpu_batch_size = 8;
  disk_kv.set_percent({100, 0, 0, 0, 100, 0});  // weights on the gpu tier, KV on disk
  Policy no_disk = disk_kv;
  no_disk.set_percent({100, 0, 0, 100, 100, 0});
  Policy in_line = disk_kv;
  in_line.overlap = false;
  const auto step = [&](const HardwareProfile& hw, const Policy& p) { return estimate(m, hw, w, p).value(); };
  EXPECT_GT(step(host, disk_kv).decode_step_seconds, step(split, disk_kv).decode_step_seconds * 1.001);
  EXPECT_LE(step(host, disk_kv).decode_step_seconds, step(host, in_line).decode_step_seconds);
  EXPECT_DOUBLE_EQ(step(host, no_disk).decode_step_seconds, step(split, no_disk).decode_step_seconds);
}

// On one host the small requests of a disk-homed KV take the cores too: with the copies'
// bandwidths out of the way, a prefill that writes its KV to disk takes its compute plus one
// head-row write per (sequence, kv head, K/V) and layer; on a separate GPU it is hidden.
TEST(CostModel, HostMemoryChargesDiskRequestsToCompute) {
  const Workload w{512, 32};
  const ModelShape m = opt("opt-6.7b", 32, 4096);
  auto [host, split] = host_and_split_t4(64);
  for (HardwareProfile* hw : {&host, &split}) {
    hw->disk_to_cpu = hw->cpu_to_disk = hw->gpu_to_cpu = hw->cpu_to_gpu = 1e15;
    hw->disk_rows_write_request = 100e-6;
  }
  Policy disk_kv;
  disk_kv.gpu_batch_size = 8;
  disk_kv.set_percent({100, 0, 0, 0, 100, 0});  // weights on the gpu tier, KV on disk
  Policy no_disk = disk_kv;
  no_disk.set_percent({100, 0, 0, 100, 100, 0});  // the same moves, to the cpu tier
  const auto prefill = [&](const HardwareProfile& hw, const Policy& p) { return estimate(m, hw, w, p)->prefill_seconds; };
  const double requests = 32 * 2 * 8 * 32 * 100e-6;  // layers x K/V x sequences x kv heads
  EXPECT_NEAR(prefill(host, disk_kv), prefill(host, no_disk) + requests, 1e-9 * prefill(host, disk_kv));
  EXPECT_NEAR(prefill(split, disk_kv), prefill(split, no_disk), 1e-9 * prefill(split, disk_kv));
}

TEST(CostModel, InfeasibleRequestsNameTheChange) {
  HardwareProfile small = t4();
  small.cpu_mem = 16'000'000'000;
  small.disk_mem = 100'000'000'000;
  try {
    plan(opt_175b(), small, {512, 32});
    FAIL() << "OPT-175B fit 16 GB of CPU memory and 100 GB of disk";
  } catch (const kernels::OptionError& e) {
    // The planner names the option by its meaning; the CLI says the flag (--disk-mem) there.
    EXPECT_THAT(e.what(), ::testing::HasSubstr("the disk tier's capacity >="));
    EXPECT_THAT(e.text([](kernels::Option o) { return o == kernels::Option::DiskMem ? "--disk-mem" : "?"; }),
                ::testing::HasSubstr("--disk-mem >="));
  }
  small = t4();
  small.gpu_mem = 100'000'000;
  EXPECT_THROW(plan(opt_175b(), small, {512, 32}), std::invalid_argument);
}

}  // namespace
}  // namespace flexh2o::policy

namespace flexh2o::policy {
namespace {

// The curves calibrate --model measures of the engine's own units replace the GEMM curve for
// the decoder layers and the head: a prefill of everything resident on the gpu is the layers
// at prompt x batch rows, the head at one row per sequence, and attention at its own rate.
TEST(CostModel, UnitCurvesChargeTheLayersAndTheHead) {
  const Workload w{64, 2};
  const ModelShape m = opt("opt-125m", 12, 768);
  Policy p;
  p.gpu_batch_size = 4;
  p.cache_storage = kernels::DType::F16;
  HardwareProfile hw = t4();
  hw.gpu_memory = 0;
  hw.gemm_by_rows = {{1, 1e12}, {4096, 1e12}};
  hw.layer_by_rows = {{1, 1e10}, {256, 4e10}};
  hw.head_by_rows = {{1, 1e9}, {16, 4e9}};
  const ModelSizes z = model_sizes(m);
  const double layers = 12 * 2.0 * static_cast<double>(z.layer_params) * 256 / 4e10;
  const double head = 2.0 * 50272 * 768 * 4 / (1e9 * 2);  // log-log: 4 rows is halfway to 16
  const double attention = 12 * 4 * 4.0 * 64 * 64 * 768 / hw.gpu_attn_prefill;
  const auto e = estimate(m, hw, w, p);
  ASSERT_TRUE(e.has_value());
  EXPECT_NEAR(e->prefill_seconds, layers + head + attention, 1e-9 * e->prefill_seconds);
  HardwareProfile no_units = hw;
  no_units.layer_by_rows.clear();
  no_units.head_by_rows.clear();
  EXPECT_LT(estimate(m, no_units, w, p)->prefill_seconds, e->prefill_seconds / 10);  // the 1 PFLOP/s GEMM curve
  const HardwareProfile back = load_hardware_yaml(hardware_to_yaml(hw), "roundtrip");
  EXPECT_EQ(back.layer_by_rows, hw.layer_by_rows);
  EXPECT_EQ(back.head_by_rows, hw.head_by_rows);
}

TEST(CostModel, GemmRateCurveInterpolatesExtendsAndRoundTrips) {
  HardwareProfile h = t4();
  EXPECT_EQ(h.rows_rate({}, 64, 7.0), 7.0);  // no curve: the fallback
  h.gemm_by_rows = {{1, 1e10}, {16, 1.6e11}, {256, 2.56e11}};
  EXPECT_DOUBLE_EQ(h.rows_rate({}, 1, 0), 1e10);
  EXPECT_NEAR(h.rows_rate({}, 4, 0), 4e10, 1e3);  // log-log: halfway between 1 and 16 rows
  // Past the last point along the last segment's slope, log(1.6) / log(16): x1.6 per 16x rows.
  EXPECT_NEAR(h.rows_rate({}, 4096, 0), 2.56e11 * 1.6, 1e3);
  h.gpu_gemm_prefill = 3e11;  // up to the compute peak
  EXPECT_DOUBLE_EQ(h.rows_rate({}, 4096, 0), 3e11);
  h.gpu_gemm_prefill = 1e11;  // a peak below the last point: the last point
  EXPECT_DOUBLE_EQ(h.rows_rate({}, 4096, 0), 2.56e11);
  // A unit's curve where given; one that falls at its end stays at its last point, and one that
  // climbs faster than its rows is taken to grow with them at most.
  h.gpu_gemm_prefill = 1e13;
  h.gemm_by_rows.clear();
  EXPECT_DOUBLE_EQ(h.rows_rate({{1, 2e10}, {4, 1e10}}, 64, 0), 1e10);
  EXPECT_NEAR(h.rows_rate({{1, 1e9}, {2, 4e9}}, 8, 0), 1.6e10, 1e3);
  // Past a unit curve's end, where the GEMM curve goes on, the unit grows as the GEMMs do from
  // there (x1.6 from 16 to 256 rows), and never falls below its last point where they level off.
  h.gemm_by_rows = {{1, 1e10}, {16, 1.6e11}, {256, 2.56e11}};
  EXPECT_NEAR(h.rows_rate({{1, 5e9}, {16, 8e10}}, 256, 0), 8e10 * 1.6, 1e3);
  EXPECT_NEAR(h.rows_rate({{1, 5e9}, {4, 2e10}}, 8, 0), 2e10 * h.rows_rate({}, 8, 0) / 4e10, 1e3);
  h.gemm_by_rows = {{256, 2e11}, {1024, 1.9e11}};
  EXPECT_DOUBLE_EQ(h.rows_rate({{64, 1e11}, {256, 1.2e11}}, 4096, 0), 1.2e11);
  const HardwareProfile back = load_hardware_yaml(hardware_to_yaml(h), "roundtrip");
  EXPECT_EQ(back.gemm_by_rows, h.gemm_by_rows);
  EXPECT_THROW(load_hardware_yaml(hardware_to_yaml(h) + "gemm_tflops_by_rows_x: 1\n", "x"), std::invalid_argument);
}

}  // namespace
}  // namespace flexh2o::policy

namespace flexh2o::policy {
namespace {

const std::string kFlexGenPolicies = std::string(FLEXH2O_SOURCE_DIR) + "/configs/policies/flexgen/";

// FlexGen's published throughput on its T4 for its own policies (docs/planner.md).
struct Published {
  const char* file;
  ModelShape model;
  double tok_s;
};
const Published kPublished[] = {
    {"opt-6.7b.yaml", opt("opt-6.7b", 32, 4096), 25.26},     {"opt-6.7b-4bit.yaml", opt("opt-6.7b", 32, 4096), 29.12},
    {"opt-30b.yaml", opt("opt-30b", 48, 7168), 7.32},        {"opt-30b-4bit.yaml", opt("opt-30b", 48, 7168), 8.38},
    {"opt-175b.yaml", opt("opt-175b", 96, 12288), 0.69},     {"opt-175b-4bit.yaml", opt("opt-175b", 96, 12288), 1.12},
};

// FlexGen's policies fit the T4 profile, the planner predicts each within 30% of what FlexGen
// measured, and its own search finds at least as much under the same compression.
TEST(CostModel, FlexGensPublishedPoliciesFitTheT4AndMatchItsTable) {
  const Workload w{512, 32};
  const HardwareProfile hw = t4();
  for (const Published& row : kPublished) {
    SCOPED_TRACE(row.file);
    const Policy p = load_policy_file(kFlexGenPolicies + row.file);
    const auto s = shortfall(row.model, hw, w, p);
    EXPECT_FALSE(s.has_value()) << s->describe();
    const auto e = estimate(row.model, hw, w, p);
    ASSERT_TRUE(e.has_value());
    EXPECT_NEAR(e->total_throughput / row.tok_s, 1.0, 0.30) << e->total_throughput << " tok/s predicted";
    PlanOptions o;
    o.compress_weight = p.compress_weight;
    o.compress_cache = p.compress_cache;
    EXPECT_GE(plan(row.model, hw, w, o).total_throughput, e->total_throughput);
  }
}

// The tensors of one FlexGen layer (flex_opt.py, init_weight_list), in its order, each placed
// whole on the tier its cumulative-size midpoint falls in, tiers ordered disk, cpu, gpu; the
// parameters that land on the gpu.
std::int64_t flexgen_gpu_params(const std::vector<std::int64_t>& sizes, double gpu_percent, double cpu_percent) {
  const double total = static_cast<double>(std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0}));
  const double disk_percent = 100 - gpu_percent - cpu_percent;
  std::int64_t before = 0, gpu = 0;
  for (std::int64_t size : sizes) {
    const double mid = (static_cast<double>(before) + static_cast<double>(size) / 2) / total * 100;
    if (mid >= disk_percent + cpu_percent) gpu += size;
    before += size;
  }
  return gpu;
}

// configs/policies/flexgen/opt-30b.yaml is FlexGen's --percent 20 80 as FlexGen placed it.
TEST(CostModel, FlexGensThirtyBPolicyIsItsWholeTensorPlacement) {
  const std::int64_t h = 7168, f = 4 * h, v = 50272, pos = 2050, layers = 48;
  const std::vector<std::int64_t> embed = {v * h, pos * h}, head = {h, h, v * h};
  const std::vector<std::int64_t> attn = {h * h, h, h * h, h, h * h, h, h * h, h, h, h};
  const std::vector<std::int64_t> mlp = {f * h, f, h * f, h, h, h};
  const std::int64_t gpu = flexgen_gpu_params(embed, 20, 80) + flexgen_gpu_params(head, 20, 80) +
                           layers * (flexgen_gpu_params(attn, 20, 80) + flexgen_gpu_params(mlp, 20, 80));
  EXPECT_EQ(flexgen_gpu_params(attn, 20, 80), h * h + 3 * h);  // out_proj, its bias and the norm
  EXPECT_EQ(flexgen_gpu_params(mlp, 20, 80), 3 * h);             // fc2's bias and the norm only
  // As a share of the parameters flexh2o holds (the head tied to the token embedding).
  const double total = static_cast<double>(layers * (4 * h * h + 2 * h * f) + (v + pos) * h);
  const Policy p = load_policy_file(kFlexGenPolicies + "opt-30b.yaml");
  EXPECT_NEAR(p.weights.gpu, static_cast<double>(gpu) / total, 0.0005);
  EXPECT_DOUBLE_EQ(p.weights.disk, 0.0);
  // Read as flexh2o's exact row split, FlexGen's command line does not fit the T4, and the
  // error says which tier, how much and what fills it.
  Policy rows = p;
  rows.set_percent({20, 80, 0, 100, 0, 100});
  try {
    estimate_or_throw(opt("opt-30b", 48, 7168), t4(), {512, 32}, rows, {}, "FlexGen's --percent 20 80");
    FAIL() << "20% of OPT-30B's weights fit the T4 beside 48 x 512 tokens of activations";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("does not fit t4-gcp: gpu tier needs"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("(weights 11."));  // the largest item first
    EXPECT_THAT(e.what(), ::testing::HasSubstr("but has 14.25 GiB (95% of 15.00 GiB)"));
  }
}

// The search returns the fastest policy it evaluated: the ranking is ordered, its head is the
// plan, and each ranked policy predicts the same when estimated on its own.
TEST(CostModel, SearchNeverReturnsAPolicySlowerThanOneItEvaluated) {
  const Workload w{512, 32};
  const HardwareProfile hw = t4();
  for (const ModelShape& m : {opt("opt-30b", 48, 7168), opt_175b()}) {
    SCOPED_TRACE(m.name);
    const std::vector<Estimate> ranked = plan_ranked(m, hw, w, {}, 40);
    ASSERT_EQ(ranked.size(), 40u);
    EXPECT_DOUBLE_EQ(plan(m, hw, w).total_throughput, ranked.front().total_throughput);
    // The plan is within 5% of the fastest (the least compute of those that close); the rest
    // follow fastest first.
    const double fastest = std::ranges::max(ranked, {}, &Estimate::total_throughput).total_throughput;
    EXPECT_GE(ranked.front().total_throughput, 0.95 * fastest);
    for (const Estimate& r : ranked) {
      if (r.total_throughput >= 0.95 * fastest) {
        EXPECT_GE(r.compute_per_token(), ranked.front().compute_per_token());
      }
    }
    for (std::size_t i = 2; i < ranked.size(); ++i)
      EXPECT_GE(ranked[i - 1].total_throughput, ranked[i].total_throughput);
    for (const Estimate& r : ranked) {
      const auto again = estimate(m, hw, w, r.policy);
      ASSERT_TRUE(again.has_value());
      EXPECT_NEAR(again->total_throughput, r.total_throughput, 1e-6 * r.total_throughput);
    }
    // FlexGen-shaped blocks (GPU batches of 8 to 64) are among those it weighed.
    std::vector<Estimate> all = plan_ranked(m, hw, w, {}, 100000);
    EXPECT_TRUE(std::ranges::any_of(all, [](const Estimate& e) {
      return e.policy.gpu_batch_size >= 8 && e.policy.gpu_batch_size <= 64 && e.policy.num_gpu_batches > 1;
    }));
  }
}

// Issue 32: a Llama-3.2-1B-shaped f16 model in 1.5 GiB of host memory on the CPU backend, 16
// prompts. The weights stream from disk, which bounds every block alike; the plan must not
// pick 16 GPU batches of one row (each reads the layer's weights from memory again) and never
// homes the hidden states on disk (a small request per batch and layer behind the weights).
TEST(CostModel, OneHostPrefersFewerLargerGpuBatchesAndKeepsHiddenStatesOffDisk) {
  HardwareProfile hw = load_hardware_file(std::string(FLEXH2O_SOURCE_DIR) + "/configs/hardware/ci-cpu.yaml");
  hw.gpu_mem = hw.cpu_mem = std::int64_t{3} << 29;
  hw.gpu_memory = 15e9;  // a one-row GEMM's weight read, as this_machine_profile measures it
  ModelShape m{"llama-1b", 16, 2048, 8192, 32, 8, 64, 49152, true, true, kernels::DType::F16, kernels::DType::F16, 0};
  PlanOptions o;
  o.max_block = 16;
  const Estimate e = plan(m, hw, {64, 32}, o);
  EXPECT_GT(e.policy.gpu_batch_size, 1);
  EXPECT_GT(e.policy.weights.disk, 0.3);
  EXPECT_EQ(e.policy.activations.disk, 0.0);
  for (const Estimate& r : plan_ranked(m, hw, {64, 32}, o, 50)) EXPECT_EQ(r.policy.activations.disk, 0.0);
  // Sixteen batches of one row: the weight reads alone exceed the disk's time.
  Policy ones = e.policy;
  ones.gpu_batch_size = 1;
  ones.num_gpu_batches = 16;
  const auto one_row = estimate(m, hw, {64, 32}, ones, o);
  ASSERT_TRUE(one_row.has_value());
  EXPECT_LT(one_row->total_throughput, e.total_throughput);
  EXPECT_EQ(one_row->bottleneck, "compute");
}

// Overlap off runs every transfer in line with compute: never faster, and slower when the
// weights stream in.
TEST(CostModel, OverlapOffAddsTheTransfers) {
  const Workload w{512, 32};
  const ModelShape m = opt("opt-30b", 48, 7168);
  Policy p = load_policy_file(kFlexGenPolicies + "opt-30b.yaml");
  const double on = estimate(m, t4(), w, p)->total_throughput;
  p.overlap = false;
  EXPECT_LT(estimate(m, t4(), w, p)->total_throughput, on * 0.95);
}

// A decode step at a small batch reads every weight from device memory once: at least
// weights / bandwidth per step, however fast the profile's arithmetic.
TEST(CostModel, SmallBatchDecodeIsBoundByDeviceMemory) {
  const Workload w{512, 32};
  const ModelShape m = opt("opt-6.7b", 32, 4096);
  const Policy p = load_policy_file(kFlexGenPolicies + "opt-6.7b.yaml");
  const HardwareProfile hw = t4();
  const auto e = estimate(m, hw, w, p);
  const double weights = static_cast<double>(model_sizes(with_compression(m, p)).total_weights);
  EXPECT_GE(e->decode_seconds, 31 * weights / hw.gpu_memory);
  HardwareProfile unbounded = hw;
  unbounded.gpu_memory = 0;
  EXPECT_LT(estimate(m, unbounded, w, p)->decode_seconds, e->decode_seconds / 2);
}

// What calibrate measures on a CPU shows where it applies and nowhere else: small disk
// requests cost only policies with the KV on disk, copies that take the compute cores cost
// only policies that copy, the attention curve is read at the decode's cache length.
TEST(CostModel, MeasuredCostsApplyWhereTheEngineIncursThem) {
  const Workload w{512, 32};
  const ModelShape m = opt("opt-30b", 48, 7168);
  const HardwareProfile base = t4();
  Policy kv_disk = load_policy_file(kFlexGenPolicies + "opt-175b.yaml");  // KV on disk
  kv_disk.gpu_batch_size = 8;
  kv_disk.num_gpu_batches = 4;
  Policy kv_cpu = load_policy_file(kFlexGenPolicies + "opt-30b.yaml");  // KV on the cpu
  Policy resident;  // everything on the gpu, one sequence
  resident.cache_storage = kernels::DType::F16;
  const ModelShape small = opt("opt-125m", 12, 768);
  auto total = [&](const HardwareProfile& hw, const Policy& p, const ModelShape& shape) {
    const auto e = estimate(shape, hw, w, p);
    EXPECT_TRUE(e.has_value());
    return e ? e->prefill_seconds + e->decode_seconds : 0.0;
  };

  HardwareProfile requests = base;
  requests.disk_read_request = requests.disk_write_request = requests.disk_rows_write_request = 100e-6;
  EXPECT_GT(total(requests, kv_disk, m), total(base, kv_disk, m));
  EXPECT_DOUBLE_EQ(total(requests, kv_cpu, m), total(base, kv_cpu, m));

  HardwareProfile shared = base;
  shared.copy_overlap = 0;
  EXPECT_GT(total(shared, kv_cpu, m), total(base, kv_cpu, m));
  EXPECT_DOUBLE_EQ(total(shared, resident, small), total(base, resident, small));

  HardwareProfile curve = base;
  curve.gpu_attn_decode_by_len = {{64, base.gpu_attn_decode / 2}, {4096, base.gpu_attn_decode / 2}};
  EXPECT_GT(total(curve, resident, small), total(base, resident, small));
  EXPECT_DOUBLE_EQ(total(curve, kv_cpu, m), total(base, kv_cpu, m));  // its attention runs on the cpu
}

}  // namespace
}  // namespace flexh2o::policy

namespace flexh2o::policy {
namespace {

// Continuous batching at the means: a request of p prompt and g new tokens holds its slot g
// steps: one prefill of p rows (its first token), g - 1 decodes over p + 1 ... p + g - 1 tokens.
TEST(ContinuousPlan, SlotStepAtTheMeansByHand) {
  Workload w{200, 80};
  w.continuous = true;
  w.mean_prompt_len = 100;
  w.mean_gen_len = 50;
  const SlotStep s = slot_step(w, 8, 8);
  EXPECT_DOUBLE_EQ(s.busy, 1);
  EXPECT_DOUBLE_EQ(s.prefill_rows, 100.0 / 50);
  EXPECT_DOUBLE_EQ(s.decode_rows, 49.0 / 50);
  EXPECT_DOUBLE_EQ(s.kv_attended, (49 * 100 + 50 * 49 / 2.0) / 50);  // 122.5: (g - 1)(p + g / 2) / g
  EXPECT_DOUBLE_EQ(s.prompt_sq, 100.0 * 100 / 50);
  EXPECT_EQ(s.steps, 0);  // the job's requests are not known
  EXPECT_EQ(w.sequence_capacity(), 280);  // each slot holds the longest prompt + the largest max_tokens
}

// From the requests: each takes the slot that frees first, in order. Two slots, requests
// (prompt, max_tokens) (10, 4), (20, 2), (5, 3): the first holds slot 0 for steps 0-3, the
// second slot 1 for steps 0-1, the third slot 1 for steps 2-4: 5 steps, 10 slot-steps, 9 busy.
TEST(ContinuousPlan, SlotStepOfTheRequestsByHand) {
  const Workload w = continuous_workload({{10, 4}, {20, 2}, {5, 3}}, 512);
  EXPECT_TRUE(w.continuous);
  EXPECT_EQ(w.prompt_len, 20);
  EXPECT_EQ(w.gen_len, 4);
  EXPECT_DOUBLE_EQ(w.mean_prompt_len, 35.0 / 3);
  EXPECT_DOUBLE_EQ(w.mean_gen_len, 3);
  EXPECT_EQ(w.sequence_capacity(), 22);  // the longest request, prompt + max_tokens (not 20 + 4)
  const SlotStep s = slot_step(w, 2, 2);
  EXPECT_EQ(s.steps, 5);
  EXPECT_DOUBLE_EQ(s.busy, 9.0 / 10);
  EXPECT_DOUBLE_EQ(s.prefill_rows, 35.0 / 10);
  EXPECT_DOUBLE_EQ(s.decode_rows, (3 + 1 + 2) / 10.0);
  // Decodes attend over (11, 12, 13), (21), (6, 7): 36 + 21 + 13.
  EXPECT_DOUBLE_EQ(s.kv_attended, 70.0 / 10);
  EXPECT_DOUBLE_EQ(s.prompt_sq, (100 + 400 + 25) / 10.0);
  // Equal requests: ceil(N / slots) rounds of g steps, every slot busy but in the last round.
  const SlotStep equal = slot_step(continuous_workload(std::vector<RequestLength>(10, {8, 6}), 512), 4, 4);
  EXPECT_EQ(equal.steps, 3 * 6);
  EXPECT_DOUBLE_EQ(equal.busy, 60.0 / (18 * 4));
  // A prefill budget of one prompt: each of two GPU batches of 2 slots takes one newcomer per
  // step, so the second pair starts a step late: 4 steps, not 3.
  const SlotStep budget = slot_step(continuous_workload(std::vector<RequestLength>(4, {8, 3}), 8), 4, 2);
  EXPECT_EQ(budget.steps, 4);
  EXPECT_DOUBLE_EQ(budget.busy, 12.0 / (4 * 4));
  EXPECT_EQ(slot_step(continuous_workload(std::vector<RequestLength>(4, {8, 3}), 16), 4, 2).steps, 3);
}

// Requests taking a shared prefix (RequestLength::shared) prefill only the rest: their rows, their
// attention (c rows after p - c cached: c (2p - c)) and their share of the prefill budget. The
// requests of SlotStepOfTheRequestsByHand with the second taking 15 of its 20 tokens: 10 + 5 + 5
// prefill rows, 100 + 5 x 35 + 25; the decodes attend over the same contexts. With a budget of
// 8 tokens and one GPU batch of 4 slots, four requests of 8 tokens start one a step (6 steps);
// when the last three take 6 of them, those three start together in step 1 (4 steps).
TEST(ContinuousPlan, SharedPrefixesComputeOnlyTheRest) {
  const SlotStep s = slot_step(continuous_workload({{10, 4}, {20, 2, 15}, {5, 3}}, 512), 2, 2);
  EXPECT_EQ(s.steps, 5);
  EXPECT_DOUBLE_EQ(s.prefill_rows, 20.0 / 10);
  EXPECT_DOUBLE_EQ(s.prompt_sq, (100 + 5 * 35 + 25) / 10.0);
  EXPECT_DOUBLE_EQ(s.kv_attended, 70.0 / 10);
  EXPECT_EQ(slot_step(continuous_workload(std::vector<RequestLength>(4, {8, 3}), 8), 4, 4).steps, 6);
  EXPECT_EQ(slot_step(continuous_workload({{8, 3}, {8, 3, 6}, {8, 3, 6}, {8, 3, 6}}, 8), 4, 4).steps, 4);
}

// Prefixes held once (Workload::held): 8 requests of 1000 prompt and 64 new tokens behind one
// 990-token prefix hold, with every KV row on the gpu tier, a pool row of 990 tokens and rows of
// 74 (not 1064) in a block of 8: 990 + 8 x 74 < 8 x 1064; a block of one would hold 990 + 74,
// no less than 1064, so it copies. A placement with the KV on the cpu tier copies too. The
// search evaluates blocks of 8 with the pool: on a gpu tier with room for the weights, the
// pool and rows of 74 but not for rows of 1064, such a block keeps its whole KV on the gpu
// only with the prefix held once.
TEST(ContinuousPlan, HeldPrefixesInTheMemoryTerms) {
  const ModelShape m = opt("opt-125m", 12, 768);
  Workload w = continuous_workload(std::vector<RequestLength>(8, {1000, 64, 990, 0}), 512);
  w.requests.front().shared = 0;  // the family's first computes the prefix
  w.held = {.families = 1, .prefix = 990, .rest = 74, .mean_prefix = 990};
  EXPECT_EQ(w.pool_rows(8, 8), 1);
  EXPECT_EQ(w.pool_rows(1, 1), 0);
  Policy p;
  p.gpu_batch_size = 8;
  const ModelSizes z = model_sizes(with_compression(m, p));
  auto item = [](const Estimate& e, int tier, const std::string& name) {
    for (const auto& [n, bytes] : e.memory[static_cast<std::size_t>(tier)])
      if (n == name) return bytes;
    return std::int64_t{0};
  };
  const auto held = estimate(m, t4(), w, p);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(item(*held, 0, "KV cache"), z.kv_per_token_layer * 12 * 8 * 74);
  EXPECT_EQ(item(*held, 0, "prefixes held once"), z.kv_per_token_layer * 12 * 990);
  p.cache = {0, 1, 0};  // the rows on cpu, the pool still on gpu
  const auto held_cpu = estimate(m, t4(), w, p);
  ASSERT_TRUE(held_cpu.has_value());
  EXPECT_EQ(item(*held_cpu, 1, "KV cache"), z.kv_per_token_layer * 12 * 8 * 74);
  EXPECT_EQ(item(*held_cpu, 0, "prefixes held once"), z.kv_per_token_layer * 12 * 990);
  EXPECT_EQ(item(*held_cpu, 0, "held prefixes staging ring"), 0);
  // The pool on cpu: staged, a ring of three slots of one layer's pool on the gpu tier (none
  // with cpu_cache_compute: read in place); on disk staged too.
  p.prefix_pool = "cpu";
  const auto pool_cpu = estimate(m, t4(), w, p);
  ASSERT_TRUE(pool_cpu.has_value());
  EXPECT_EQ(item(*pool_cpu, 1, "prefixes held once"), z.kv_per_token_layer * 12 * 990);
  EXPECT_EQ(item(*pool_cpu, 0, "prefixes held once"), 0);
  EXPECT_EQ(item(*pool_cpu, 0, "held prefixes staging ring"), z.kv_per_token_layer * 3 * 990);
  p.cpu_cache_compute = true;
  EXPECT_EQ(item(*estimate(m, t4(), w, p), 0, "held prefixes staging ring"), 0);
  p.cpu_cache_compute = false;
  p.prefix_pool = "disk";
  const auto pool_disk = estimate(m, t4(), w, p);
  ASSERT_TRUE(pool_disk.has_value());
  EXPECT_EQ(item(*pool_disk, 2, "prefixes held once"), z.kv_per_token_layer * 12 * 990);
  EXPECT_EQ(item(*pool_disk, 0, "held prefixes staging ring"), z.kv_per_token_layer * 3 * 990);
  // Staged, the pool's rows come in every decode step: slower than in place on the gpu.
  EXPECT_LT(pool_cpu->total_throughput, held_cpu->total_throughput);
  p.prefix_pool = "auto";
  Workload copies = w;
  copies.held = {};
  const auto copied = estimate(m, t4(), copies, p);
  ASSERT_TRUE(copied.has_value());
  EXPECT_EQ(item(*copied, 1, "KV cache"), z.kv_per_token_layer * 12 * 8 * 1064);
  EXPECT_EQ(item(*copied, 0, "prefixes held once"), 0);
  // Room on the gpu tier for the weights, the pool and rows of 74, not rows of 1064.
  HardwareProfile small = t4();
  const std::int64_t rows_held = z.kv_per_token_layer * 12 * (990 + 8 * 74);
  small.gpu_mem = z.total_weights + rows_held + (z.kv_per_token_layer * 12 * 8 * 1064 - rows_held) / 2;
  PlanOptions o;
  o.max_block = 8;
  auto kv_on_gpu_blocks_of_8 = [&](const Workload& job) {
    std::vector<std::int64_t> pools;  // the pool of each block of 8 with its KV wholly on the gpu, on the tier planned
    for (const Estimate& e : plan_ranked(m, small, job, o, 1000)) {
      if (e.policy.block_size() != 8 || e.policy.cache.gpu != 1.0) continue;
      const int tier = e.policy.prefix_pool == "gpu" ? 0 : e.policy.prefix_pool == "cpu" ? 1 : 2;
      EXPECT_NE(e.policy.prefix_pool, "auto");
      pools.push_back(item(e, tier, "prefixes held once"));
    }
    return pools;
  };
  const std::vector<std::int64_t> pools = kv_on_gpu_blocks_of_8(w);
  ASSERT_FALSE(pools.empty());
  for (const std::int64_t pool : pools) EXPECT_EQ(pool, z.kv_per_token_layer * 12 * 990);
  w.held = {};
  EXPECT_TRUE(kv_on_gpu_blocks_of_8(w).empty());
}

// The pool rows are the most families the running requests hold at once, as the engine admits
// them (2 slots: R0 of family 0 at step 0, R1 of family 0 at 1, after R0's prefill of their
// prefix; R1 leaves at 2 for R2 of family 1 while R0 runs: 2 families; R0 leaves at 3 for R3
// of family 1, R2 at 4 for R4 of family 2: 6 steps; one slot: one at a time), where those rows
// save memory (rows of 40 and 2 x 10 < 2 x 53); at the means, as many as the families or the
// slots.
TEST(ContinuousPlan, PoolRowsAreTheFamiliesRunningAtOnce) {
  Workload w = continuous_workload({{50, 3, 0, 0}, {50, 1, 40, 0}, {50, 2, 0, 1}, {50, 2, 40, 1}, {50, 2, 0, 2}}, 512);
  w.held = {.families = 3, .prefix = 40, .rest = 10};
  EXPECT_EQ(slot_step(w, 2, 2).steps, 6);
  EXPECT_EQ(w.pool_rows(2, 2), 2);
  EXPECT_EQ(w.pool_rows(1, 1), 1);
  w.held.rest = 13;  // 2 x 40 + 2 x 13 is no less than 2 x 53
  EXPECT_EQ(w.pool_rows(2, 2), 0);
  Workload means{50, 3};
  means.continuous = true;
  means.held = {.families = 3, .prefix = 40, .rest = 10};
  EXPECT_EQ(means.pool_rows(8, 8), 3);
  EXPECT_EQ(means.pool_rows(2, 2), 2);
  means.continuous = false;
  EXPECT_EQ(means.pool_rows(8, 8), 0);
}

// Rows taken in turn, by hand (3 slots, one GPU batch). Families A, B, C, requests (family,
// max_tokens): A1 A1 B2 C1 B1 A1, each of 50 tokens behind its family's 40. Held in 2 pool
// rows: A0 fills row 0 at step 0 (A1 waits while it fills); at step 1 A1 extends and B0 fills
// row 1; C0 finds no row free (both read by running requests) and waits; at step 2 C0 takes row 0
// (A's, read by none now) and fills it, B1 extends after B's row; A2 waits for a free row and at
// step 3 takes row 0 again (taken before row 1) and computes its whole prompt: 220 prompt rows in
// 4 steps. With 3 rows A2 extends after A's row, still A's: 180 rows in 3 steps. Copied between
// rows, A2's prefix is gone too (the row that held it took B1): 220 rows in 3 steps.
TEST(ContinuousPlan, AFamilyWhoseRowWentToAnotherFillsItAgain) {
  Workload w = continuous_workload(
      {{50, 1, 40, 0}, {50, 1, 40, 0}, {50, 2, 40, 1}, {50, 1, 40, 2}, {50, 1, 40, 1}, {50, 1, 40, 0}}, 512);
  w.held = {.families = 3, .prefix = 40, .rest = 10};
  const SlotStep copied = slot_step(w, 3, 3), held2 = slot_step(w, 3, 3, 2), held3 = slot_step(w, 3, 3, 3);
  EXPECT_EQ(held2.steps, 4);
  EXPECT_NEAR(held2.prefill_rows * 4 * 3, 220, 1e-9);
  EXPECT_EQ(held3.steps, 3);
  EXPECT_NEAR(held3.prefill_rows * 3 * 3, 180, 1e-9);
  EXPECT_EQ(copied.steps, 3);
  EXPECT_NEAR(copied.prefill_rows * 3 * 3, 220, 1e-9);
  EXPECT_EQ(w.pool_rows(3, 3), 3);  // the three families run at once at step 1
}

// A GPU batch's decode rows of one family read its prefix once (cascade attention). By hand, one
// GPU batch of 2 slots, requests (prompt, max_tokens, shared) of family 0: (12, 3, 0) from step
// 0 and (12, 3, 10) from step 1 (after the first's prefill of their prefix; both decode in step
// 2: the second leaves its 10 prefix tokens to the first), then (12, 3, 10) from step 3, beside
// the second's last decode but extending: 10 tokens over 6 x 2 slot-steps.
// Two GPU batches of one slot each, or no family: none. At the means, 2 families spread over a
// GPU batch of 8: 6 of 8 decode rows leave their prefix to another. A block of 8 requests behind
// one 990-token prefix on the gpu tier: the profile's read share of the attention over what
// the decode rows left to another comes off the step's compute.
TEST(ContinuousPlan, AGroupReadsItsPrefixOnce) {
  const Workload w = continuous_workload({{12, 3, 0, 0}, {12, 3, 10, 0}, {12, 3, 10, 0}}, 512);
  const SlotStep s = slot_step(w, 2, 2);
  EXPECT_EQ(s.steps, 6);
  EXPECT_DOUBLE_EQ(s.kv_prefix_read_by_others, 10.0 / 12);
  EXPECT_EQ(slot_step(w, 2, 1).kv_prefix_read_by_others, 0);
  Workload no_family = w;
  for (RequestLength& r : no_family.requests) r.family = -1;
  EXPECT_EQ(slot_step(no_family, 2, 2).kv_prefix_read_by_others, 0);
  Workload steady{1200, 64};
  steady.continuous = true;
  steady.mean_prompt_len = 1100;
  steady.mean_gen_len = 40;
  steady.mean_shared = 1000;
  steady.held.families = 2;
  EXPECT_DOUBLE_EQ(slot_step(steady, 8, 8).kv_prefix_read_by_others, 39.0 / 40 * 1000 * 6 / 8);

  const ModelShape m = opt("opt-125m", 12, 768);
  Workload job = continuous_workload(std::vector<RequestLength>(8, {1000, 64, 990, 0}), 512);
  job.requests.front().shared = 0;
  Policy p;
  p.gpu_batch_size = 8;
  HardwareProfile hw = t4();
  const auto plain = estimate(m, hw, job, p);
  hw.gpu_attn_decode_read_share = 0.5;
  const auto once = estimate(m, hw, job, p);
  ASSERT_TRUE(plain && once);
  const SlotStep ss = slot_step(job, 8, 8);
  ASSERT_GT(ss.kv_prefix_read_by_others, 7 * 990 * ss.decode_rows / 8 * 0.9);
  const double kv_len = ss.kv_attended / ss.decode_rows;
  const double rate = rate_at(hw.gpu_attn_decode_by_len, kv_len, hw.gpu_attn_decode);
  const double saved = 12 * 0.5 * 4 * 8 * ss.kv_prefix_read_by_others * 768 / rate;
  EXPECT_NEAR(plain->decode_step_seconds - once->decode_step_seconds, saved, 1e-9 * plain->decode_step_seconds);
}

// Steady state behind a shared prefix: a newcomer computes the rest of its prompt (c = p - s
// rows, attention c (2p - c)); its decodes attend over the whole context.
TEST(ContinuousPlan, SteadyStateSharedPrefixComputesOnlyTheRest) {
  Workload w{1200, 64};
  w.continuous = true;
  w.mean_prompt_len = 1100;
  w.mean_gen_len = 40;
  w.mean_shared = 1000;
  const SlotStep s = slot_step(w, 8, 8);
  EXPECT_DOUBLE_EQ(s.prefill_rows, 100.0 / 40);
  EXPECT_DOUBLE_EQ(s.prompt_sq, 100.0 * (2 * 1100 - 100) / 40);
  EXPECT_DOUBLE_EQ(s.kv_attended, (39 * 1100 + 40 * 39 / 2.0) / 40);
  EXPECT_DOUBLE_EQ(s.decode_rows, 39.0 / 40);
}

// Rows staged from the cpu tier: a decode step moves each row's KV in (cpu->gpu, ahead of the
// compute), less the mean prefix a request holds in the pool, which is read in place.
TEST(ContinuousPlan, HeldPrefixesMoveOnlyWhatFollowsThem) {
  const ModelShape m = opt("opt-125m", 12, 768);
  Workload w = continuous_workload(std::vector<RequestLength>(8, {1000, 64, 990, 0}), 512);
  w.requests.front().shared = 0;
  w.held = {.families = 1, .prefix = 990, .rest = 74, .mean_prefix = 990};
  Policy p;
  p.gpu_batch_size = 8;
  p.cache = {0, 1, 0};
  const HardwareProfile hw = t4();
  const auto held = estimate(m, hw, w, p);
  Workload copies = w;
  copies.held = {};
  const auto copied = estimate(m, hw, copies, p);
  ASSERT_TRUE(held && copied);
  const SlotStep ss = slot_step(w, 8, 8);
  const double kv_len = ss.kv_attended / ss.decode_rows;
  ASSERT_GT(kv_len, 990);
  const ModelSizes z = model_sizes(with_compression(m, p));
  const double moved_less = 12.0 * static_cast<double>(z.kv_per_token_layer) * 8 * ss.decode_rows * 990;
  EXPECT_NEAR(copied->decode_step_seconds - held->decode_step_seconds, moved_less / hw.cpu_to_gpu,
              1e-9 * copied->decode_step_seconds);
}

// Everything on the gpu tier, no rate curves and no read floor: a mean step per layer is the K
// GPU batches' GEMMs (decode rows at the decode rate, newcomers' prompt rows at the prefill
// rate), the head over the busy rows, decode attention over the mean cached length and the
// newcomers' prefill attention. Memory: every slot's KV at the longest sequence, hidden states
// of a step of gbs - 1 + max(prefill budget, longest prompt) rows per GPU batch.
TEST(ContinuousPlan, MeanStepTermsByHand) {
  const ModelShape m = opt("opt-125m", 12, 768);
  HardwareProfile hw = t4();
  hw.gpu_memory = 0;
  hw.gemm_by_rows.clear();
  hw.layer_by_rows.clear();
  hw.head_by_rows.clear();
  hw.gpu_attn_decode_by_len.clear();
  Workload w{200, 80};
  w.continuous = true;
  w.mean_prompt_len = 100;
  w.mean_gen_len = 50;
  Policy p;
  p.gpu_batch_size = 4;
  p.num_gpu_batches = 2;
  const auto e = estimate(m, hw, w, p);
  ASSERT_TRUE(e.has_value());
  const ModelSizes z = model_sizes(with_compression(m, p));
  const double layer = 2.0 * static_cast<double>(z.layer_params), head = 2.0 * 50272 * 768;
  const double gemm = 2 * (4 * 0.98 * layer / hw.gpu_gemm_decode + 4 * 2.0 * layer / hw.gpu_gemm_prefill);
  const double head_share = 2 * 4 * head / hw.gpu_gemm_decode / 12;
  const double attention = 4 * 8 * 0.98 * 125 * 768 / hw.gpu_attn_decode + 8 * 4 * 200.0 * 768 / hw.gpu_attn_prefill;
  const double step = 12 * (gemm + head_share + attention);
  EXPECT_TRUE(e->continuous);
  EXPECT_NEAR(e->decode_step_seconds, step, 1e-9 * step);
  EXPECT_NEAR(e->total_throughput, 8 / step, 1e-9 * 8 / step);
  EXPECT_NEAR(e->decode_seconds, 50 * step, 1e-9 * step);  // the mean request's steps
  EXPECT_EQ(e->prefill_seconds, 0);
  auto item = [&](const std::string& name) {
    for (const auto& [n, bytes] : e->memory[0])
      if (n == name) return bytes;
    return std::int64_t{0};
  };
  const auto act = static_cast<std::int64_t>(kernels::dtype_size(hw.activation_dtype));
  EXPECT_EQ(item("KV cache"), z.kv_per_token_layer * 12 * 8 * 280);
  EXPECT_EQ(item("hidden states"), 768 * act * 2 * (4 - 1 + 512));
}

// A ShareGPT-like job (replies of 4 to 511 tokens, prompts mostly short, up to 500) with a Llama-3.2-1B-shaped
// model (2 GiB of f16 weights) on a 2-core host of 1.5 GiB, where memory binds: planned for
// every slot at its maximum (fixed blocks, a GPU batch prefilling all its prompts at once:
// 512 rows of activations per sequence) the GPU batches stay small; planned for the tokens in
// flight, a step holds a GPU batch's decode rows and a budget of newcomers' prompt rows, so
// the block is larger and predicts more tokens/s, and it still fits.
TEST(ContinuousPlan, AShareGptLikeJobPlansALargerBlockWhenMemoryBinds) {
  std::vector<RequestLength> requests;
  // Prompts mostly short (every tenth 400 tokens longer), replies of 4 to 511 tokens.
  for (std::int64_t i = 0; i < 1000; ++i)
    requests.push_back({4 + (i * 37) % 97 + (i % 10 == 0 ? 400 : 0), 4 + (i * 101) % 508});
  const Workload continuous = continuous_workload(requests, 512);
  const Workload fixed{continuous.prompt_len, continuous.gen_len};
  const ModelShape m{"llama-1b", 16, 2048, 8192, 32, 8, 64, 49152, true, true, kernels::DType::F16, kernels::DType::F16, 0};
  HardwareProfile hw = load_hardware_file(std::string(FLEXH2O_SOURCE_DIR) + "/configs/hardware/ci-cpu.yaml");
  hw.gpu_mem = hw.cpu_mem = std::int64_t{3} << 29;
  hw.disk_mem = std::int64_t{200} << 30;
  PlanOptions o;
  o.max_block = 1000;
  const Estimate a = plan(m, hw, fixed, o), b = plan(m, hw, continuous, o);
  // (Both blocks hold about 200 sequences: the fixed plan's in GPU batches of 4, since the
  // near tie compares compute per token, and of 2 before, when it compared a block's.)
  EXPECT_GT(b.policy.gpu_batch_size, 8 * a.policy.gpu_batch_size);
  EXPECT_GT(b.total_throughput, a.total_throughput);
  EXPECT_LE(static_cast<double>(b.peak_bytes[0] + b.peak_bytes[1]), hw.memory_safety * static_cast<double>(hw.cpu_mem) + 2);
}

// A tied head's matrix is the input embedding's, held once, but each step stages it twice (the
// input embedding unit and the head unit each fetch it): a step bound by weights streaming
// from disk moves what the untied model moves.
TEST(ContinuousPlan, ATiedHeadIsFetchedForBothUnits) {
  ModelShape tied{"llama-1b", 16, 2048, 8192, 32, 8, 64, 49152, true, true, kernels::DType::F16, kernels::DType::F16, 0};
  ModelShape untied = tied;
  untied.tied_embeddings = false;
  HardwareProfile hw = t4();
  hw.gpu_memory = 0;
  hw.gemm_by_rows.clear();
  hw.layer_by_rows.clear();
  hw.head_by_rows.clear();
  hw.gpu_gemm_prefill = hw.gpu_gemm_decode = hw.gpu_attn_prefill = hw.gpu_attn_decode = 1e18;
  Policy p;
  p.gpu_batch_size = 4;
  p.set_percent({0, 0, 100, 0, 100, 0});  // every weight on disk
  const Workload w{64, 32};
  const auto a = estimate(tied, hw, w, p), b = estimate(untied, hw, w, p);
  ASSERT_TRUE(a && b);
  EXPECT_LT(model_sizes(tied).total_weights, model_sizes(untied).total_weights);
  EXPECT_NEAR(a->decode_step_seconds, b->decode_step_seconds, 1e-9 * b->decode_step_seconds);
  EXPECT_NE(a->bottleneck, "compute");
}

// Issue 32: the tied embedding/head (192 MiB of a Llama-1B shape) kept resident is held once
// and never staged, so the two staging slots shrink to the largest decoder unit (96 MiB) and a
// step streams only the layers. In 1.5 GiB of host memory the plan keeps it resident, and that
// beats the best plan that stages it: the memory freed holds more of the layers.
TEST(ContinuousPlan, ATiedEmbeddingIsKeptResidentWhenWeightsStream) {
  const ModelShape m{"llama-1b", 16, 2048, 8192, 32, 8, 64, 49152, true, true, kernels::DType::F16, kernels::DType::F16, 0};
  const ModelSizes z = model_sizes(m);
  EXPECT_EQ(z.staging_slot(0, true, true), z.head_unit);  // the tied matrix and the final norm
  EXPECT_EQ(z.staging_slot(0, true, false), z.dense_mlp_unit);
  HardwareProfile hw = load_hardware_file(std::string(FLEXH2O_SOURCE_DIR) + "/configs/hardware/ci-cpu.yaml");
  hw.gpu_mem = hw.cpu_mem = std::int64_t{3} << 29;
  hw.gpu_memory = 15e9;
  PlanOptions o;
  o.max_block = 16;
  const Workload w = continuous_workload(std::vector<RequestLength>(16, {64, 32}), 512);
  const std::vector<Estimate> ranked = plan_ranked(m, hw, w, o, 1000);
  const Estimate& e = ranked.front();
  EXPECT_TRUE(e.policy.resident_embeddings);
  const auto staged = std::ranges::find_if(ranked, [](const Estimate& r) { return !r.policy.resident_embeddings; });
  ASSERT_NE(staged, ranked.end());
  EXPECT_GT(e.total_throughput, 1.1 * staged->total_throughput);
  EXPECT_GT(e.policy.weights.gpu + e.policy.weights.cpu, staged->policy.weights.gpu + staged->policy.weights.cpu);
  // The same placement with the embeddings staged: the slots and weights no longer fit.
  Policy p = e.policy;
  p.resident_embeddings = false;
  EXPECT_FALSE(estimate(m, hw, w, p, o).has_value());
}

}  // namespace
}  // namespace flexh2o::policy
