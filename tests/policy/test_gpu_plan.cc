// The planner on a GPU (issue 43), with the profile calibrated on an H200
// (tests/data/hardware/h200.yaml): defaults that fill the card, and continuous batching's
// default prefill budget, which lets a uniform job take no more steps than fixed blocks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "policy/cost_model.h"
#include "policy/hardware_profile.h"

namespace flexh2o::policy {
namespace {

HardwareProfile h200() { return load_hardware_file(std::string(FLEXH2O_TEST_DATA_DIR) + "/hardware/h200.yaml"); }

// OPT-1.3B (configs/models): 24 layers, hidden 2048, ffn 8192, 32 heads of 64, f16, learned
// positions for 2048 tokens, biases everywhere, the head tied to the embedding.
ModelShape opt_1_3b() {
  return {"opt-1.3b", 24, 2048, 8192, 32, 32, 64, 50272, false, true, kernels::DType::F16, kernels::DType::F16, 2050, true};
}

Workload uniform(std::int64_t prompts, std::int64_t prompt, std::int64_t gen, bool continuous) {
  if (continuous) return continuous_workload(std::vector<RequestLength>(static_cast<std::size_t>(prompts), {prompt, gen}), 0);
  return {prompt, gen};
}

void expect_all_on_the_gpu(const Policy& p) {
  EXPECT_EQ(p.weights.gpu, 1.0);
  EXPECT_EQ(p.cache.gpu, 1.0);
  EXPECT_EQ(p.activations.gpu, 1.0);
}

// OPT-1.3B, prompt 512 + 32, 64 or 256 prompts on the 139 GiB card: one GPU batch of all of
// them, everything on the GPU (measured there: 1,201 tok/s at 64 x 1 and 1,339 at 256 x 1,
// against 500 and 674 at the 12 and 16 the planner chose before). A curve point's rate held
// beyond the last measured rows made every row past 64 cost a layer as much as the 64th, so
// all batches from 16 up predicted alike and the near tie took the smallest block's compute.
TEST(GpuPlan, OneGpuBatchOfTheWholeJobFillsTheCard) {
  const HardwareProfile hw = h200();
  for (const bool continuous : {false, true})
    for (const std::int64_t prompts : {64, 256}) {
      SCOPED_TRACE((continuous ? "continuous, " : "fixed, ") + std::to_string(prompts) + " prompts");
      PlanOptions o;
      o.max_block = prompts;
      o.allow_cpu_cache_compute = false;  // as run plans on a device
      const Estimate e = plan(opt_1_3b(), hw, uniform(prompts, 512, 32, continuous), o);
      EXPECT_EQ(e.policy.gpu_batch_size, prompts);
      EXPECT_EQ(e.policy.num_gpu_batches, 1);
      expect_all_on_the_gpu(e.policy);
    }
}

// Where the profile's curves stop, a larger GPU batch predicts at least the throughput of a
// smaller one in memory (its rows never cost more), and the plan's near tie compares compute
// per generated token, not per block (a block of 256 computes 4x a block of 64's tokens).
TEST(GpuPlan, LargerGpuBatchesNeverPredictSlowerInMemory) {
  const HardwareProfile hw = h200();
  const Workload w = uniform(256, 512, 32, false);
  double last = 0;
  for (const std::int64_t gbs : {8, 16, 32, 64, 128, 256}) {
    Policy p;
    p.gpu_batch_size = gbs;
    const auto e = estimate(opt_1_3b(), hw, w, p);
    ASSERT_TRUE(e.has_value()) << gbs;
    EXPECT_GE(e->total_throughput, last) << gbs;
    last = e->total_throughput;
  }
}

// The default budget on a device is a GPU batch of the job's mean prompts: a uniform job under
// continuous batching admits a whole GPU batch in the step its slots free, so it takes the
// steps of fixed blocks (measured on the H200 at 512 tokens a step: 95 steps for 64 prompts
// of 512 + 32 in one GPU batch, 664 tok/s, against 32 steps and 1,201 tok/s as a fixed block).
TEST(GpuPlan, DefaultPrefillBudgetTakesTheStepsOfFixedBlocks) {
  const HardwareProfile hw = h200();
  struct Job {
    std::int64_t prompts, prompt, gen, gbs, k;
  };
  for (const Job& j : {Job{64, 512, 32, 64, 1}, Job{256, 512, 32, 256, 1}, Job{256, 512, 32, 64, 2},
                       Job{100, 37, 9, 8, 3}, Job{7, 2000, 5, 4, 1}}) {
    SCOPED_TRACE(std::to_string(j.prompts) + " prompts of " + std::to_string(j.prompt) + " + " + std::to_string(j.gen) +
                 ", gpu batch " + std::to_string(j.gbs) + " x " + std::to_string(j.k));
    const Workload w = uniform(j.prompts, j.prompt, j.gen, true);
    const std::int64_t block = j.gbs * j.k, fixed_steps = (j.prompts + block - 1) / block * j.gen;
    const Workload resolved = with_prefill_budget(w, hw, j.gbs);
    EXPECT_EQ(resolved.prefill_budget, std::max(kHostPrefillBudget, j.gbs * j.prompt));
    EXPECT_EQ(slot_step(resolved, block, j.gbs).steps, static_cast<double>(fixed_steps));
    Policy p;
    p.gpu_batch_size = j.gbs;
    p.num_gpu_batches = j.k;
    const auto e = estimate(opt_1_3b(), hw, w, p);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->prefill_budget, resolved.prefill_budget);
    EXPECT_NEAR(e->decode_seconds / e->decode_step_seconds, static_cast<double>(fixed_steps), 1e-9 * fixed_steps);
  }
  // The old fixed 512 tokens a step: 64 prompts of 512 join one a step.
  Workload w512 = uniform(64, 512, 32, true);
  w512.prefill_budget = 512;
  EXPECT_EQ(slot_step(w512, 64, 64).steps, 63 + 32);
  // A budget given is kept.
  EXPECT_EQ(with_prefill_budget(w512, hw, 64).prefill_budget, 512);
}

// Where the gpu tier is host memory (the CPU backend) the default stays kHostPrefillBudget.
TEST(GpuPlan, HostMemoryKeepsTheHostPrefillBudget) {
  HardwareProfile cpu = h200();
  cpu.gpu_is_host_memory = true;
  EXPECT_EQ(default_prefill_budget(cpu, uniform(64, 512, 32, true), 64), kHostPrefillBudget);
  EXPECT_EQ(default_prefill_budget(h200(), uniform(64, 512, 32, true), 64), 64 * 512);
  // The mean prompt, not the longest, and at least kHostPrefillBudget.
  Workload mixed = continuous_workload({{100, 8}, {300, 8}, {20, 8}}, 0);
  EXPECT_EQ(default_prefill_budget(h200(), mixed, 16), 16 * 140);
  EXPECT_EQ(default_prefill_budget(h200(), mixed, 2), kHostPrefillBudget);
}

}  // namespace
}  // namespace flexh2o::policy
