// The planner's memory model against what the engine allocates: for fixed policies on a small
// model, the peak bytes the cost model predicts per tier equal the peaks of the engine's tier
// budgets after a generation (the CPU backend, whose activations are fp32), up to what the
// model leaves out on purpose: a tensor split over tiers rounds each tier's share to whole
// rows (at most one row per tier), and the disk store rounds each extent up to 4 KiB.
#include <gtest/gtest.h>

#include <string>

#include "engine/runtime/block_executor.h"
#include "engine/serving/generate.h"
#include "engine/loaders/dummy_weights.h"
#include "engine/model/model_shape.h"
#include "engine/serving/prompts.h"
#include "engine/model/weights.h"
#include "offload/disk_store.h"
#include "policy/cost_model.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

policy::HardwareProfile roomy_cpu_profile() {
  policy::HardwareProfile hw;
  hw.name = "test";
  hw.gpu_mem = hw.cpu_mem = hw.disk_mem = std::int64_t{1} << 40;
  hw.cpu_to_gpu = hw.gpu_to_cpu = hw.disk_to_cpu = hw.cpu_to_disk = 1e9;
  hw.gpu_gemm_prefill = hw.gpu_gemm_decode = hw.gpu_attn_prefill = hw.gpu_attn_decode = 1e10;
  hw.cpu_gemm = hw.cpu_attn_decode = 1e10;
  hw.activation_dtype = kernels::DType::F32;
  return hw;
}

struct Case {
  const char* name;
  std::int64_t gbs, k;
  std::array<double, 6> percent;
  bool ccc = false, compress = false;
  std::optional<kernels::DType> cache = {};
  std::int64_t expert_slots = 0;  // MoE: the policy's (0: from the block)
  bool resident_embeddings = false;
};

void expect_peaks_within_slack(const engine::ModelConfig& cfg, const policy::Policy& p, const policy::Estimate& est,
                               const offload::Tiers& tiers, std::int64_t capacity);

void expect_planned_peaks(const engine::ModelConfig& cfg, const Case& c) {
  SCOPED_TRACE(std::string(cfg.name) + ": " + c.name);
  policy::Policy p;
  p.gpu_batch_size = c.gbs;
  p.num_gpu_batches = c.k;
  p.set_percent(c.percent);
  p.cpu_cache_compute = c.ccc;
  p.compress_weight = p.compress_cache = c.compress;
  p.cache_storage = c.cache;
  p.expert_slots = c.expert_slots;
  p.resident_embeddings = c.resident_embeddings;
  const std::int64_t prompt = 12, gen = 5;
  const auto est = policy::estimate(engine::model_shape(cfg), roomy_cpu_profile(), {prompt, gen}, p);
  ASSERT_TRUE(est.has_value());

  engine::DummyWeights src(cfg, 3);
  auto be = kernels::make_cpu_backend();
  offload::Tiers tiers(*be, {});
  engine::BlockExecutor sched(*be, tiers, cfg, src, p);
  engine::GenerationRequest req;
  req.sequences = engine::sequences_of(engine::synthetic_prompts(p.block_size(), prompt, cfg.vocab_size));
  req.max_new_tokens = gen;
  serving::generate(sched, req);

  expect_peaks_within_slack(cfg, p, *est, tiers, prompt + gen);
}

// The planner's peaks against the engine's after a run of policy p with KV slots of `capacity`
// tokens. The slack per tier: one row of every tensor whose kind is split over tiers, and 4 KiB
// per extent on disk.
void expect_peaks_within_slack(const engine::ModelConfig& cfg, const policy::Policy& p, const policy::Estimate& est,
                               const offload::Tiers& tiers, std::int64_t capacity) {
  std::array<std::int64_t, 3> slack{};
  auto allow = [&](const offload::TierFractions& f, std::int64_t tensors, std::int64_t row_bytes) {
    const int homes = (f.gpu > 0) + (f.cpu > 0) + (f.disk > 0);
    for (offload::Tier t : {offload::Tier::Gpu, offload::Tier::Cpu, offload::Tier::Disk}) {
      if (f.of(t) == 0) continue;
      auto& s = slack[static_cast<std::size_t>(t)];
      if (homes > 1) s += tensors * row_bytes;
      if (t == offload::Tier::Disk) s += tensors * (offload::DiskStore::kAlignment - 1);
    }
  };
  const engine::ModelConfig stored = engine::with_weight_dtype(cfg, p.weight_dtype(cfg.dtype));
  for (const auto& w : engine::weight_specs(stored))
    allow(p.resident_embeddings && w.layer < 0 ? offload::TierFractions{1, 0, 0} : p.weights, 1,
          kernels::row_bytes(w.dtype(stored), w.cols));
  allow(p.cache, 2 * cfg.n_layers * p.num_gpu_batches,
        cfg.n_kv_heads * capacity * kernels::kv_slot_bytes(p.cache_dtype(cfg.dtype), cfg.head_dim));
  allow(p.activations, p.num_gpu_batches, cfg.hidden * static_cast<std::int64_t>(sizeof(float)));
  for (offload::Tier t : {offload::Tier::Gpu, offload::Tier::Cpu, offload::Tier::Disk}) {
    const auto i = static_cast<std::size_t>(t);
    EXPECT_NEAR(static_cast<double>(est.peak_bytes[i]), static_cast<double>(tiers.budget(t).peak()),
                static_cast<double>(slack[i]) + 1)
        << offload::tier_name(t);
  }
}

const Case kCases[] = {
    {"all on the gpu", 4, 1, {100, 0, 100, 0, 100, 0}},
    {"weights split over three tiers, KV half on the cpu", 2, 3, {20, 50, 50, 50, 100, 0}},
    {"weights and KV on the cpu, hidden states on the cpu", 3, 2, {0, 100, 0, 100, 0, 100}},
    {"KV on the cpu attended there", 2, 2, {0, 100, 0, 100, 100, 0}, true},
    {"KV and weights on disk", 2, 2, {0, 0, 0, 0, 100, 0}},
    {"an fp16 KV", 2, 2, {100, 0, 50, 50, 100, 0}, false, false, kernels::DType::F16},
    {"4-bit weights and KV, half on disk", 2, 2, {50, 0, 50, 0, 100, 0}, false, true},
    {"layers over three tiers, embeddings and head resident", 2, 2, {20, 30, 50, 50, 100, 0}, false, false, {}, 0,
     true},
    {"layers on disk, embeddings and head resident", 3, 1, {0, 0, 100, 0, 100, 0}, false, false, {}, 0, true},
};

TEST(PlanMemory, PredictedPeaksAreTheEnginesOpt) {
  for (const Case& c : kCases) expect_planned_peaks(testing::tiny_opt_config(), c);
}

TEST(PlanMemory, PredictedPeaksAreTheEnginesLlama) {
  for (const Case& c : kCases) expect_planned_peaks(testing::tiny_llama_config(), c);
}

// Mixture-of-experts: the staging slots hold the experts a decode step of the block is expected
// to route to (5 or 6 of 6 in kCases, 2 for one sequence) or expert_slots, the memory model's
// size too; the router's logits and the expert kernel's scratch count.
TEST(PlanMemory, PredictedPeaksAreTheEnginesMoe) {
  const Case moe_cases[] = {
      {"one sequence, weights on the cpu: slots for 2 experts", 1, 1, {0, 100, 100, 0, 100, 0}},
      {"slots for 1 expert, weights on cpu and disk", 2, 2, {0, 50, 100, 0, 100, 0}, false, false, {}, 1},
      {"slots for 3 experts, weights over three tiers", 3, 1, {30, 30, 50, 50, 0, 100}, false, false, {}, 3},
  };
  for (const Case& c : kCases) expect_planned_peaks(testing::tiny_moe_config(), c);
  for (const Case& c : moe_cases) expect_planned_peaks(testing::tiny_moe_config(), c);
}

// Continuous batching: the requests of a job of different lengths flow through the slots, and
// the planner's peaks (every slot's KV at the longest request, a step's hidden states and
// activations of gbs - 1 + max(prefill budget, longest prompt) rows) are the engine's.
TEST(PlanMemory, PredictedPeaksAreTheEnginesUnderContinuousBatching) {
  const engine::ModelConfig cfg = testing::tiny_llama_config();
  const Case cases[] = {
      {"all on the gpu", 3, 1, {100, 0, 100, 0, 100, 0}},
      {"weights and KV split, hidden states on the cpu", 2, 2, {20, 50, 50, 50, 0, 100}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    policy::Policy p;
    p.gpu_batch_size = c.gbs;
    p.num_gpu_batches = c.k;
    p.set_percent(c.percent);
    engine::GenerationRequest req;
    std::vector<policy::RequestLength> lengths;
    for (std::int64_t i = 0; i < 9; ++i) {
      const std::int64_t prompt = 3 + (i * 5) % 11, gen = 2 + (i * 3) % 7;
      req.sequences.push_back(
          {.prompt = engine::synthetic_prompts(1, prompt, cfg.vocab_size)[0], .max_new_tokens = gen});
      lengths.push_back({prompt, gen});
    }
    req.max_new_tokens = 8;
    req.slots = p.block_size();
    req.prefill_budget = 6;
    const auto est = policy::estimate(engine::model_shape(cfg), roomy_cpu_profile(),
                                      policy::continuous_workload(lengths, req.prefill_budget), p);
    ASSERT_TRUE(est.has_value());
    engine::DummyWeights src(cfg, 3);
    auto be = kernels::make_cpu_backend();
    offload::Tiers tiers(*be, {});
    engine::BlockExecutor sched(*be, tiers, cfg, src, p);
    serving::generate(sched, req);
    std::int64_t longest = 0;
    for (const auto& l : lengths) longest = std::max(longest, l.prompt + l.gen);
    expect_peaks_within_slack(cfg, p, *est, tiers, longest);
  }
}

}  // namespace
}  // namespace flexh2o
