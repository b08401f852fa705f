// KV eviction in generation: with a budget that covers the sequence every policy generates
// the tokens of the full cache; with small budgets the cache really shrinks and generation
// still runs (the policies' selections are checked in tests/policy/test_eviction.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "engine/block_scheduler.h"
#include "engine/generator.h"
#include "engine/loaders/dummy_weights.h"
#include "engine/model_source.h"
#include "policy/eviction/kv_spec.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

const char* kPolicies[] = {"local", "streaming", "h2o", "tova", "scissorhands", "pyramid", "snapkv"};

engine::GenerationRequest request(const engine::ModelConfig& cfg, std::int64_t gen) {
  engine::GenerationRequest req;
  for (std::int32_t b = 0; b < 3; ++b) {
    std::vector<std::int32_t> p;
    for (std::int32_t t = 0; t < 5 + 7 * b; ++t) p.push_back((t * 31 + b * 7 + 1) % static_cast<std::int32_t>(cfg.vocab_size));
    req.prompts.push_back(p);
  }
  req.max_new_tokens = gen;
  req.sampling = {0.7f, 0.95f, 5};
  return req;
}

TEST(KvEviction, BudgetCoveringTheSequenceGeneratesWhatFullDoes) {
  for (const engine::ModelConfig& cfg : {testing::tiny_opt_config(), testing::tiny_llama_config()}) {
    engine::DummyWeights src(cfg, 21);
    auto be = kernels::make_cpu_backend();
    const auto w = engine::load_weights(cfg, src);
    engine::Generator gen(*be, cfg, w);
    auto req = request(cfg, 12);
    const auto want = gen.generate(req).tokens;
    for (const char* name : kPolicies) {
      SCOPED_TRACE(std::string(cfg.name) + " " + name);
      const auto policy = policy::make_kv_policy(policy::parse_kv_spec(std::string(name) + ":1.0"), cfg.n_layers);
      req.kv = policy.get();
      EXPECT_EQ(gen.generate(req).tokens, want);
    }
  }
}

TEST(KvEviction, SmallBudgetsEvictAndKeepGenerating) {
  auto m = engine::open_model({});
  auto be = kernels::make_cpu_backend();
  const auto w = engine::load_weights(m.config, *m.weights);
  engine::Generator gen(*be, m.config, w);
  // Long enough (> 64 tokens) that pyramid's budgets differ between layers.
  auto req = request(m.config, 120);
  const auto full = gen.generate(req).tokens;
  for (const char* name : kPolicies)
    for (const char* budget : {":0.2", ":0.6"}) {
      SCOPED_TRACE(std::string(name) + budget);
      const auto policy = policy::make_kv_policy(policy::parse_kv_spec(std::string(name) + budget), m.config.n_layers);
      req.kv = policy.get();
      const auto got = gen.generate(req).tokens;
      ASSERT_EQ(got.size(), full.size());
      for (const auto& t : got) EXPECT_FALSE(t.empty());
    }
}

// KV bytes per token as the tier budgets see them: with the whole cache on the cpu tier and
// everything else on the gpu tier, the cpu tier's peak is exactly the K and V tensors. For a
// head_dim of 64, 4-bit groups store 36 bytes per head and token against fp16's 128, and
// h2o:0.2 keeps a fifth of the tokens: together at most 1/16 of the full fp16 cache
// (Scissorhands-class compression).
TEST(KvEviction, BytesPerTokenFromTheTierBudgets) {
  engine::ModelConfig cfg = testing::tiny_opt_config();
  cfg.hidden = 128;
  cfg.n_heads = cfg.n_kv_heads = 2;
  cfg.head_dim = 64;
  cfg.max_positions = 160;
  engine::DummyWeights src(cfg, 5);
  auto be = kernels::make_cpu_backend();
  const std::int64_t B = 4, prompt = 100, gen = 28, tokens = prompt + gen;
  engine::GenerationRequest req;
  for (std::int64_t b = 0; b < B; ++b) req.prompts.emplace_back(prompt, static_cast<std::int32_t>(3 + b));
  req.max_new_tokens = gen;
  auto bytes_per_token = [&](const std::string& kv, std::optional<kernels::DType> storage, bool compress) {
    policy::Policy p;
    p.gpu_batch_size = B;
    p.set_percent({100, 0, 0, 100, 100, 0});
    p.kv = kv;
    p.cache_storage = storage;
    p.compress_cache = compress;
    offload::Tiers tiers(*be, {});
    engine::BlockScheduler sched(*be, tiers, cfg, src, p);
    sched.generate(req);
    const std::int64_t slots = kv == "full" ? tokens : policy::kv_slot_capacity(std::llround(0.2 * tokens));
    const std::int64_t want = 2 * cfg.n_layers * B * cfg.n_kv_heads * slots * kernels::kv_slot_bytes(p.cache_dtype(cfg.dtype), 64);
    EXPECT_EQ(tiers.budget(offload::Tier::Cpu).peak(), want) << kv << " " << kernels::dtype_name(p.cache_dtype(cfg.dtype));
    return static_cast<double>(tiers.budget(offload::Tier::Cpu).peak()) / static_cast<double>(B * tokens);
  };
  const double f32 = bytes_per_token("full", kernels::DType::F32, false);
  const double f16 = bytes_per_token("full", kernels::DType::F16, false);
  const double q4 = bytes_per_token("full", std::nullopt, true);
  const double h2o_q4 = bytes_per_token("h2o:0.2", std::nullopt, true);
  EXPECT_DOUBLE_EQ(f32, 2 * f16);
  EXPECT_NEAR(f16 / q4, 128.0 / 36.0, 1e-9);
  EXPECT_GE(f16 / h2o_q4, 16.0);
}

}  // namespace
}  // namespace flexh2o
