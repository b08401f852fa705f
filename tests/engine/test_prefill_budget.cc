// Continuous batching's default prefill budget, on the scheduler itself: where the planner's
// profile is a device with its own memory (policy::default_prefill_budget), a uniform job takes
// exactly the steps of fixed blocks, as the planner predicts; the host budget (512 tokens a
// step) takes more once a GPU batch's prompts exceed it. The steps and the report's split of
// them into those that prefilled and those that only decoded are counted.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "engine/loaders/model_source.h"
#include "engine/runtime/block_executor.h"
#include "engine/serving/generate.h"
#include "kernels/backend.h"
#include "offload/tiers.h"
#include "policy/cost_model.h"

namespace flexh2o {
namespace {

struct Job {
  std::int64_t prompts, prompt, gen, gbs, k;
};

struct Steps {
  std::int64_t all = 0, prefilled = 0, decoded = 0;
};

// The job on stories260K under continuous batching in one block of gbs x k slots: its steps.
Steps run_continuous(const Job& j, std::int64_t prefill_budget) {
  auto m = engine::open_model({});
  auto be = kernels::make_cpu_backend();
  offload::Tiers tiers(*be, {});
  policy::Policy p;
  p.gpu_batch_size = j.gbs;
  p.num_gpu_batches = j.k;
  engine::BlockExecutor sched(*be, tiers, m.config, *m.weights, p);
  engine::GenerationRequest req;
  std::mt19937 rng(static_cast<std::uint32_t>(j.prompts * 31 + j.prompt));
  std::uniform_int_distribution<std::int32_t> token(3, static_cast<std::int32_t>(m.config.vocab_size - 1));
  for (std::int64_t i = 0; i < j.prompts; ++i) {
    req.sequences.emplace_back();
    for (std::int64_t t = 0; t < j.prompt; ++t) req.sequences.back().prompt.push_back(token(rng));
  }
  req.max_new_tokens = j.gen;
  req.sampling.ignore_eos = true;  // every request runs to its limit: a uniform job
  req.slots = j.gbs * j.k;
  req.prefill_budget = prefill_budget;
  Steps s;
  engine::GenerationHooks hooks;
  hooks.on_step = [&](std::int64_t, std::int64_t) { ++s.all; };
  const engine::GenerationResult r = serving::generate(sched, req, hooks);
  EXPECT_EQ(r.generated_tokens, j.prompts * j.gen);
  s.prefilled = r.prefill_steps;
  s.decoded = r.decode_steps;
  return s;
}

TEST(PrefillBudget, DeviceDefaultRunsAUniformJobInTheStepsOfFixedBlocks) {
  policy::HardwareProfile device;  // a GPU's profile: the gpu tier is its own memory
  device.gpu_is_host_memory = false;
  for (const Job& j : {Job{8, 200, 5, 4, 1}, Job{10, 60, 4, 2, 2}, Job{6, 300, 3, 3, 1}}) {
    SCOPED_TRACE(std::to_string(j.prompts) + " prompts of " + std::to_string(j.prompt) + " + " + std::to_string(j.gen) +
                 ", gpu batch " + std::to_string(j.gbs) + " x " + std::to_string(j.k));
    const std::int64_t block = j.gbs * j.k, rounds = (j.prompts + block - 1) / block;
    const policy::Workload w = policy::continuous_workload(
        std::vector<policy::RequestLength>(static_cast<std::size_t>(j.prompts), {j.prompt, j.gen}), 0);
    const policy::Workload planned = policy::with_prefill_budget(w, device, j.gbs);
    const Steps s = run_continuous(j, planned.prefill_budget);
    EXPECT_EQ(s.all, rounds * j.gen);  // fixed blocks: each round a prefill and gen - 1 decode steps
    EXPECT_EQ(policy::slot_step(planned, block, j.gbs).steps, static_cast<double>(s.all));  // as planned
    EXPECT_EQ(s.prefilled, rounds);  // a round's newcomers all join in its first step
    EXPECT_EQ(s.prefilled + s.decoded, s.all);
    if (j.gbs * j.prompt > policy::kHostPrefillBudget) {
      const Steps host = run_continuous(j, policy::kHostPrefillBudget);
      EXPECT_GT(host.all, s.all);
      EXPECT_GT(host.prefilled, s.prefilled);
      EXPECT_EQ(host.prefilled + host.decoded, host.all);
    }
  }
}

}  // namespace
}  // namespace flexh2o
