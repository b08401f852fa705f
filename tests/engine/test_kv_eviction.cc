// KV eviction in generation: with a budget that covers the sequence every policy generates
// the tokens of the full cache; with small budgets the cache really shrinks and generation
// still runs (the policies' selections are checked in tests/policy/test_eviction.cc).
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace flexh2o
