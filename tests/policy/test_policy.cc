#include "policy/policy.h"
#include "policy/policy_text.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

namespace flexh2o::policy {
namespace {

using ::testing::HasSubstr;

TEST(Policy, PercentSplitsEachPairWithTheRestOnDisk) {
  Policy p;
  p.set_percent({20, 30, 0, 100, 100, 0});
  EXPECT_DOUBLE_EQ(p.weights.gpu, 0.2);
  EXPECT_DOUBLE_EQ(p.weights.cpu, 0.3);
  EXPECT_DOUBLE_EQ(p.weights.disk, 0.5);
  EXPECT_DOUBLE_EQ(p.cache.cpu, 1.0);
  EXPECT_DOUBLE_EQ(p.cache.disk, 0.0);
  EXPECT_THROW(p.set_percent({80, 30, 0, 0, 0, 0}), std::invalid_argument);
  EXPECT_THROW(p.set_percent({-1, 30, 0, 0, 0, 0}), std::invalid_argument);
}

TEST(Policy, YamlRoundTrips) {
  Policy p;  // every field off its default, so that a loader ignoring one fails
  p.gpu_batch_size = 48;
  p.num_gpu_batches = 3;
  p.set_percent({20, 80, 0, 100, 100, 0});
  p.overlap = false;
  p.sep_layer = false;
  p.pin_weight = false;
  p.cpu_cache_compute = true;
  p.kv = "h2o:heavy=0.1,recent=0.1";
  p.compress_weight = true;
  p.compress_cache = true;
  p.compress_bits = 8;
  p.expert_loading = "routed";
  p.expert_slots = 3;
  p.prefix_pool = "cpu";
  const Policy q = load_policy_yaml(policy_to_yaml(p), "roundtrip");
  EXPECT_EQ(q.gpu_batch_size, 48);
  EXPECT_EQ(q.num_gpu_batches, 3);
  EXPECT_EQ(q.percent(), p.percent());
  EXPECT_FALSE(q.overlap);
  EXPECT_FALSE(q.sep_layer);
  EXPECT_FALSE(q.pin_weight);
  EXPECT_TRUE(q.cpu_cache_compute);
  EXPECT_EQ(q.kv, "h2o:heavy=0.1,recent=0.1");
  EXPECT_TRUE(q.compress_weight);
  EXPECT_TRUE(q.compress_cache);
  EXPECT_EQ(q.compress_bits, 8);
  EXPECT_EQ(q.expert_loading, "routed");
  EXPECT_EQ(q.expert_slots, 3);
  EXPECT_EQ(q.prefix_pool, "cpu");
  // No cache_dtype: the KV takes the model's float dtype, and the file says nothing.
  Policy r;
  const Policy plain = load_policy_yaml(policy_to_yaml(r), "roundtrip");
  EXPECT_FALSE(plain.cache_storage.has_value());
  EXPECT_EQ(plain.cache_dtype(kernels::DType::BF16), kernels::DType::BF16);
  EXPECT_THAT(policy_to_yaml(r), ::testing::Not(HasSubstr("cache_dtype")));
  EXPECT_THAT(policy_to_yaml(r), ::testing::Not(HasSubstr("prefix_pool")));  // auto
  r.cache_storage = kernels::DType::F32;  // --cache-dtype f32 on an f16 model
  EXPECT_EQ(load_policy_yaml(policy_to_yaml(r), "roundtrip").cache_dtype(kernels::DType::F16), kernels::DType::F32);
}

// The one wording and JSON of a policy that run, plan, bench and the MPI runs all print.
TEST(Policy, TextAndJsonNameEveryFieldARunUses) {
  Policy p;
  p.gpu_batch_size = 4;
  p.num_gpu_batches = 2;
  p.set_percent({20, 80, 0, 100, 100, 0});
  p.kv = "h2o:0.2";
  EXPECT_EQ(percent_text(p), "20 80 0 100 100 0");
  EXPECT_EQ(percent_text(p, 1), "20.0 80.0 0.0 100.0 100.0 0.0");
  EXPECT_EQ(to_text(p), "gpu batch 4 x 2 batches, percent [20 80 0 100 100 0], overlap true, sep_layer true, "
                        "cpu_cache_compute false, kv h2o:0.2");
  p.prefix_pool = "disk";
  EXPECT_THAT(to_text(p), HasSubstr("kv h2o:0.2, prefix pool on disk"));
  const nlohmann::json j = to_json(p, 8, 2);
  for (const char* key : {"gpu_batch_size", "num_gpu_batches", "percent", "overlap", "sep_layer", "pin_weight",
                          "cpu_cache_compute", "kv", "compress_weight", "compress_cache", "compress_bits",
                          "expert_loading", "expert_slots", "prefix_pool"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["expert_slots"], p.expert_slot_count(8, 2));
  EXPECT_EQ(to_json(p, 0, 0)["expert_slots"], 0);  // a dense model stages no experts
}

// Auto loads only the routed experts while fewer than E - 0.5 are expected active, or while
// the staging slots hold fewer than all experts.
TEST(Policy, ExpertLoadingFollowsTheExpectedActiveExperts) {
  EXPECT_DOUBLE_EQ(expected_active_experts(8, 2, 1), 2.0);
  EXPECT_NEAR(expected_active_experts(8, 2, 8), 8 * (1 - std::pow(0.75, 8)), 1e-12);
  EXPECT_DOUBLE_EQ(expected_active_experts(8, 8, 3), 8.0);
  Policy p;
  p.gpu_batch_size = 8;  // 7.2 experts expected: slots for all 8
  EXPECT_TRUE(p.routed_expert_loading(8, 2, 8));    // 7.2 expected
  EXPECT_FALSE(p.routed_expert_loading(8, 2, 10));  // 7.55 expected
  p.gpu_batch_size = 1;  // slots for 2 of 8: routed, in chunks, however many rows
  EXPECT_TRUE(p.routed_expert_loading(8, 2, 10));
  EXPECT_TRUE(p.routed_expert_loading(128, 8, 32));
  p.expert_loading = "routed";
  EXPECT_TRUE(p.routed_expert_loading(8, 2, 1000));
  p.expert_loading = "all";
  EXPECT_FALSE(p.routed_expert_loading(8, 2, 1));
}

// The staging slots hold the experts a decode step of the block is expected to route to,
// rounded up, at least top_k and at most all; expert_slots overrides that; `all` needs all.
TEST(Policy, ExpertSlotsFollowTheBlocksDecodeRows) {
  Policy p;
  EXPECT_EQ(p.expert_slot_count(8, 2), 2);  // one row: its top 2
  EXPECT_EQ(p.expert_slot_count(0, 0), 0);  // a dense model
  p.gpu_batch_size = 2;
  EXPECT_EQ(p.expert_slot_count(8, 2), 4);  // 3.5 expected
  p.num_gpu_batches = 2;
  EXPECT_EQ(p.expert_slot_count(8, 2), 6);  // 5.47 expected
  p.gpu_batch_size = 32;
  EXPECT_EQ(p.expert_slot_count(8, 2), 8);
  EXPECT_EQ(p.expert_slot_count(128, 8), 126);  // 125.9 expected for 64 rows
  p.gpu_batch_size = 1;
  p.num_gpu_batches = 1;
  EXPECT_EQ(p.expert_slot_count(128, 8), 8);
  p.expert_slots = 3;
  EXPECT_EQ(p.expert_slot_count(8, 2), 3);
  p.expert_slots = 1;  // below top_k: every row runs in chunks
  EXPECT_EQ(p.expert_slot_count(8, 2), 1);
  p.expert_slots = 20;
  EXPECT_EQ(p.expert_slot_count(8, 2), 8);
  p.expert_loading = "all";
  EXPECT_EQ(p.expert_slot_count(8, 2), 8);
  p.expert_slots = 4;
  EXPECT_THROW(p.expert_slot_count(8, 2), std::invalid_argument);
  p.expert_slots = -1;
  EXPECT_THROW(p.validate(), std::invalid_argument);
  p.expert_slots = 5;
  p.expert_loading = "routed";
  EXPECT_EQ(load_policy_yaml(policy_to_yaml(p), "roundtrip").expert_slots, 5);
}

TEST(Policy, BadYamlNamesTheFileAndField) {
  auto error_of = [](const std::string& text) {
    try {
      load_policy_yaml(text, "p.yaml");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(error_of("gpu_batch_size: [1"), HasSubstr("p.yaml: not valid YAML"));
  EXPECT_THAT(error_of("- 1\n- 2\n"), HasSubstr("p.yaml: expected a mapping"));
  EXPECT_THAT(error_of("gpu_batch_sise: 4\n"), HasSubstr("unknown field 'gpu_batch_sise'"));
  EXPECT_THAT(error_of("gpu_batch_size: many\n"), HasSubstr("'gpu_batch_size' has the wrong type"));
  EXPECT_THAT(error_of("gpu_batch_size: 0\n"), HasSubstr("gpu_batch_size must be at least 1"));
  EXPECT_THAT(error_of("percent: [1, 2, 3]\n"), HasSubstr("needs 6 numbers"));
  EXPECT_THAT(error_of("percent: [90, 20, 0, 0, 0, 0]\n"), HasSubstr("weight percentages"));
  EXPECT_THAT(error_of("compress_bits: 3\n"), HasSubstr("compress_bits must be 4 or 8"));
  EXPECT_EQ(error_of("compress_cache: true\ncompress_bits: 8\n"), "no error");
  EXPECT_THAT(error_of("cache_dtype: q4\n"), HasSubstr("cache_dtype must be f32, f16 or bf16"));
  EXPECT_THAT(error_of("cache_dtype: f16\ncompress_cache: true\n"), HasSubstr("no effect with compress_cache"));
  EXPECT_THAT(error_of("cache_dtype: f32\ncompress_cache: true\n"), HasSubstr("no effect with compress_cache"));
  EXPECT_THAT(error_of("cache_dtype: f8\n"), HasSubstr("field 'cache_dtype'"));
  EXPECT_THAT(error_of("expert_loading: some\n"), HasSubstr("expert_loading must be auto, routed or all"));
  EXPECT_THAT(error_of("prefix_pool: nvme\n"), HasSubstr("prefix_pool must be auto, gpu, cpu or disk, got 'nvme'"));
  EXPECT_EQ(error_of("num_gpu_batches: 2\n"), "no error");
}

}  // namespace
}  // namespace flexh2o::policy
