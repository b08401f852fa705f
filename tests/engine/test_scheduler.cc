// The block scheduler against the plain in-memory run: for random policies (tier fractions
// including disk, GPU batch size, number of GPU batches, overlap, sep_layer,
// cpu_cache_compute, staged copies, KV eviction, 4/8-bit compression of weights and KV) the
// generated tokens must be identical to the plain run with the same eviction and compression.
#include <gtest/gtest.h>

#include <random>

#include "engine/block_scheduler.h"
#include "engine/loaders/dummy_weights.h"
#include "engine/model_source.h"
#include "policy/eviction/kv_spec.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

using engine::GenerationRequest;
using engine::ModelConfig;

struct Case {
  policy::Policy policy;
  bool always_stage = false;
  bool force_threads = false;
};

offload::TierFractions random_fractions(std::mt19937_64& rng) {
  // Corners (all on one tier) half of the time, otherwise a random split.
  std::uniform_int_distribution<int> corner(0, 5);
  switch (corner(rng)) {
    case 0: return {1, 0, 0};
    case 1: return {0, 1, 0};
    case 2: return {0, 0, 1};
    default: break;
  }
  std::uniform_real_distribution<double> u(0, 1);
  double a = u(rng), b = u(rng);
  if (a > b) std::swap(a, b);
  return {a, b - a, 1 - b};
}

Case random_case(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Case c;
  auto& p = c.policy;
  p.gpu_batch_size = 1 + static_cast<std::int64_t>(rng() % 4);
  p.num_gpu_batches = 1 + static_cast<std::int64_t>(rng() % 3);
  p.weights = random_fractions(rng);
  p.cache = random_fractions(rng);
  p.activations = random_fractions(rng);
  // Hidden states on disk are rare in practice and slow on small O_DIRECT writes: keep a few.
  if (p.activations.disk > 0 && rng() % 3 != 0) p.activations = {p.activations.gpu + p.activations.disk, p.activations.cpu, 0};
  p.overlap = rng() % 2;
  p.sep_layer = rng() % 2;
  p.cpu_cache_compute = rng() % 2;
  p.pin_weight = rng() % 2;
  // Half the cases evict: the scheduler must make the same (lossy) choices as the plain run.
  const char* kv[] = {"full", "h2o:0.3", "local:0.3", "tova:0.3", "scissorhands:0.3", "pyramid:0.3", "snapkv:0.3",
                      "streaming:0.3"};
  p.kv = rng() % 2 ? "full" : kv[rng() % 8];
  c.always_stage = rng() % 2;
  c.force_threads = rng() % 4 == 0;
  p.compress_weight = rng() % 3 == 0;
  p.compress_cache = rng() % 3 == 0;
  p.compress_bits = rng() % 4 == 0 ? 8 : 4;
  return c;
}

std::string describe(const Case& c) {
  const auto& p = c.policy;
  return "gbs " + std::to_string(p.gpu_batch_size) + " K " + std::to_string(p.num_gpu_batches) + " percent [" +
         [&] {
           std::string s;
           for (double v : p.percent()) s += std::to_string(v) + " ";
           return s;
         }() +
         "] overlap " + std::to_string(p.overlap) + " sep_layer " + std::to_string(p.sep_layer) +
         " cpu_cache_compute " + std::to_string(p.cpu_cache_compute) + " stage " + std::to_string(c.always_stage) +
         " threads " + std::to_string(c.force_threads) + " kv " + p.kv + " compress weight/cache " +
         std::to_string(p.compress_weight) + "/" + std::to_string(p.compress_cache) + " bits " +
         std::to_string(p.compress_bits);
}

std::vector<std::vector<std::int32_t>> random_prompts(const ModelConfig& cfg, std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<std::int32_t>> out;
  for (std::int64_t i = 0; i < n; ++i) {
    std::vector<std::int32_t> p(1 + rng() % 9);
    for (auto& t : p) t = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(cfg.vocab_size));
    out.push_back(p);
  }
  return out;
}

void expect_same_tokens(const Case& c, const ModelConfig& cfg, const engine::WeightSource& src, std::uint64_t seed,
                        float temperature) {
  SCOPED_TRACE("seed " + std::to_string(seed) + ": " + describe(c));
  GenerationRequest req;
  req.prompts = random_prompts(cfg, c.policy.block_size(), seed);
  req.max_new_tokens = 8;
  req.sampling = {temperature, 0.9f, seed};

  auto be = kernels::make_cpu_backend();
  const ModelConfig stored = engine::with_weight_dtype(cfg, c.policy.weight_dtype(cfg.dtype));
  const auto host = engine::load_weights(stored, src);
  engine::Generator plain(*be, stored, host, c.policy.cache_dtype(cfg.dtype));
  const auto kv = c.policy.kv == "full" ? nullptr
                                        : policy::make_kv_policy(policy::parse_kv_spec(c.policy.kv), cfg.n_layers);
  req.kv = kv.get();
  const auto want = plain.generate(req).tokens;
  req.kv = nullptr;  // the scheduler takes it from its policy

  testing::TempDir dir;
  offload::TierOptions to;
  to.offload_dir = dir.path();
  to.force_disk_threads = c.force_threads;
  to.pin_host = c.policy.pin_weight;
  offload::Tiers tiers(*be, to);
  {
    engine::BlockScheduler sched(*be, tiers, cfg, src, c.policy, nullptr, {c.always_stage});
    EXPECT_EQ(sched.generate(req).tokens, want);
  }
  for (offload::Tier t : {offload::Tier::Gpu, offload::Tier::Cpu, offload::Tier::Disk})
    EXPECT_EQ(tiers.budget(t).used(), 0) << tier_name(t);
}

void expect_same_tokens(const ModelConfig& cfg, const engine::WeightSource& src, std::uint64_t seed, float temperature) {
  expect_same_tokens(random_case(seed), cfg, src, seed, temperature);
}

// Compressed weights and KV without eviction, the KV staged from cpu and disk (partial slot
// loads, one slot written back per step), with heads of 128 values: two groups per slot.
TEST(Scheduler, CompressedStagedCacheMatchesInMemoryRun) {
  ModelConfig cfg = testing::tiny_opt_config();
  cfg.hidden = 256;
  cfg.n_heads = cfg.n_kv_heads = 2;
  cfg.head_dim = 128;
  engine::DummyWeights src(cfg, 13);
  for (const int bits : {4, 8}) {
    Case c;
    c.policy.gpu_batch_size = 2;
    c.policy.num_gpu_batches = 2;
    c.policy.weights = {0.3, 0.4, 0.3};
    c.policy.cache = {0.25, 0.25, 0.5};
    c.policy.compress_weight = c.policy.compress_cache = true;
    c.policy.compress_bits = bits;
    c.always_stage = true;
    expect_same_tokens(c, cfg, src, 300 + static_cast<std::uint64_t>(bits), 0.0f);
  }
}

TEST(Scheduler, RandomPoliciesMatchInMemoryRunOpt) {
  const ModelConfig cfg = testing::tiny_opt_config();
  engine::DummyWeights src(cfg, 11);
  for (std::uint64_t seed = 0; seed < 24; ++seed) expect_same_tokens(cfg, src, seed, 0.0f);
}

TEST(Scheduler, RandomPoliciesMatchInMemoryRunLlama) {
  const ModelConfig cfg = testing::tiny_llama_config();
  engine::DummyWeights src(cfg, 12);
  for (std::uint64_t seed = 100; seed < 124; ++seed) expect_same_tokens(cfg, src, seed, 0.8f);
}

TEST(Scheduler, RandomPoliciesMatchInMemoryRunStories260k) {
  auto m = engine::open_model({});
  for (std::uint64_t seed = 200; seed < 210; ++seed) expect_same_tokens(m.config, *m.weights, seed, 0.0f);
}

}  // namespace
}  // namespace flexh2o
