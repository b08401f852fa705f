// KV eviction in generation: with a budget that covers the sequence every policy generates
// the tokens of the full cache; with small budgets the cache really shrinks and generation
// still runs (the policies' selections are checked in tests/policy/test_eviction.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "engine/runtime/block_executor.h"
#include "engine/serving/generate.h"
#include "engine/runtime/generator.h"
#include "engine/runtime/kv_quality.h"
#include "engine/loaders/dummy_weights.h"
#include "engine/loaders/model_source.h"
#include "policy/eviction/kv_spec.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

const char* kPolicies[] = {"local", "streaming", "h2o", "tova", "scissorhands", "pyramid", "snapkv", "flex"};

engine::GenerationRequest request(const engine::ModelConfig& cfg, std::int64_t gen) {
  engine::GenerationRequest req;
  for (std::int32_t b = 0; b < 3; ++b) {
    std::vector<std::int32_t> p;
    for (std::int32_t t = 0; t < 5 + 7 * b; ++t) p.push_back((t * 31 + b * 7 + 1) % static_cast<std::int32_t>(cfg.vocab_size));
    req.sequences.push_back({.prompt = p});
  }
  req.max_new_tokens = gen;
  req.sampling = {.temperature = 0.7f, .top_p = 0.95f, .seed = 5};
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

// layerwise=1 ranks by the attention summed over a layer's kv heads: with one kv head that is
// each head's own ranking, so nothing changes; with two the heads choose together, and what
// attention reads differs (for some policies: on this random model h2o's and snapkv's heads
// happen to agree).
TEST(KvEviction, LayerwiseScoresSumTheLayersHeads) {
  engine::ModelConfig one_head = testing::tiny_llama_config();
  one_head.n_kv_heads = 1;
  for (const engine::ModelConfig& cfg : {one_head, testing::tiny_llama_config()}) {
    engine::DummyWeights src(cfg, 21);
    auto be = kernels::make_cpu_backend();
    const auto w = engine::load_weights(cfg, src);
    engine::Generator gen(*be, cfg, w);
    auto req = request(cfg, 40);
    int differing = 0;
    for (const char* name : {"h2o", "tova", "scissorhands", "pyramid", "snapkv"}) {
      SCOPED_TRACE(std::to_string(cfg.n_kv_heads) + " kv heads, " + name);
      const auto own = policy::make_kv_policy(policy::parse_kv_spec(std::string(name) + ":0.3"), cfg.n_layers);
      const auto summed =
          policy::make_kv_policy(policy::parse_kv_spec(std::string(name) + ":0.3,layerwise=1"), cfg.n_layers);
      req.kv = own.get();
      const auto alone = gen.generate(req).tokens;
      req.kv = summed.get();
      const auto together = gen.generate(req).tokens;
      if (cfg.n_kv_heads == 1) {
        EXPECT_EQ(together, alone);
      }
      differing += together != alone;
    }
    if (cfg.n_kv_heads > 1) {
      EXPECT_GE(differing, 1);
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
  // The KV cache's bytes, as the cpu tier that holds it (and nothing else) saw them at most.
  const auto cache_peak = [&](const std::string& kv) {
    policy::Policy p;
    p.gpu_batch_size = static_cast<std::int64_t>(req.sequences.size());
    p.set_percent({100, 0, 0, 100, 100, 0});
    p.kv = kv;
    offload::Tiers tiers(*be, {});
    engine::BlockExecutor sched(*be, tiers, m.config, *m.weights, p);
    engine::GenerationRequest tiered = req;
    tiered.kv = nullptr;  // the scheduler takes the policy's kv
    serving::generate(sched, tiered);
    return tiers.budget(offload::Tier::Cpu).peak();
  };
  const std::int64_t full_cache = cache_peak("full");
  for (const char* name : kPolicies) {
    std::int64_t previous = 0;
    for (const char* budget : {":0.2", ":0.6"}) {
      SCOPED_TRACE(std::string(name) + budget);
      const auto policy = policy::make_kv_policy(policy::parse_kv_spec(std::string(name) + budget), m.config.n_layers);
      req.kv = policy.get();
      const auto got = gen.generate(req).tokens;
      ASSERT_EQ(got.size(), full.size());
      for (const auto& t : got) EXPECT_FALSE(t.empty());
      const std::int64_t cache = cache_peak(std::string(name) + budget);
      EXPECT_LT(cache, full_cache) << "the cache did not shrink";
      EXPECT_GT(cache, previous) << "a larger budget kept no more";
      previous = cache;
    }
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
  for (std::int64_t b = 0; b < B; ++b)
    req.sequences.push_back({.prompt = std::vector<std::int32_t>(prompt, static_cast<std::int32_t>(3 + b))});
  req.max_new_tokens = gen;
  auto bytes_per_token = [&](const std::string& kv, std::optional<kernels::DType> storage, bool compress) {
    policy::Policy p;
    p.gpu_batch_size = B;
    p.set_percent({100, 0, 0, 100, 100, 0});
    p.kv = kv;
    p.cache_storage = storage;
    p.compress_cache = compress;
    offload::Tiers tiers(*be, {});
    engine::BlockExecutor sched(*be, tiers, cfg, src, p);
    serving::generate(sched, req);
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

// ---------------------------------------------------------------- eval protocol (kv_quality)

// Chunks of token ids, BOS first, of varied lengths.
std::vector<std::vector<std::int32_t>> eval_chunks(const engine::ModelConfig& cfg) {
  std::vector<std::vector<std::int32_t>> chunks;
  for (std::int32_t c = 0; c < 5; ++c) {
    std::vector<std::int32_t> ids = {cfg.bos_id};
    for (std::int32_t t = 0; t < 30 + 17 * c; ++t)
      ids.push_back(3 + (t * 37 + c * 11 + t * t) % static_cast<std::int32_t>(cfg.vocab_size - 3));
    chunks.push_back(ids);
  }
  return chunks;
}

TEST(KvQualityProtocol, PromptSplitParsesFractionsAndTokenCounts) {
  const auto half = engine::parse_prompt_split("0.5");
  ASSERT_TRUE(half.fraction);
  EXPECT_EQ(half.prompt_tokens(11), 6);  // round(5.5)
  EXPECT_EQ(half.prompt_tokens(2), 1);   // at least one prompt token and one predicted
  EXPECT_EQ(engine::parse_prompt_split("0.99").prompt_tokens(10), 9);
  const auto t = engine::parse_prompt_split("32");
  EXPECT_FALSE(t.fraction);
  EXPECT_EQ(t.prompt_tokens(100), 32);
  EXPECT_EQ(t.prompt_tokens(20), 19);
  EXPECT_EQ(engine::PromptSplit{}.prompt_tokens(50), 1);  // the default: BOS only
  for (const char* bad : {"", "0", "0.0", "1.0", "1.5", "-1", "abc", "0.5x", "1e3", "99999999999999999999"})
    EXPECT_THROW(engine::parse_prompt_split(bad), std::invalid_argument) << bad;
}

// flex merges each evicted token into a kept one (merge=1, its default): the generation then
// differs from dropping it, on an f32 and on a compressed cache alike, and with a budget that
// covers the sequence nothing is evicted or merged.
TEST(KvEviction, FlexMergingChangesWhatEvictionLeaves) {
  auto m = engine::open_model({});
  auto be = kernels::make_cpu_backend();
  const auto w = engine::load_weights(m.config, *m.weights);
  for (const kernels::DType cache : {kernels::DType::F32, kernels::DType::Q8}) {
    SCOPED_TRACE(kernels::dtype_name(cache));
    engine::Generator gen(*be, m.config, w, cache);
    const auto chunks = eval_chunks(m.config);
    std::vector<engine::EvalVariant> variants;
    for (const char* text : {"flex:0.2", "flex:0.2,merge=0", "flex:1.0"})
      variants.push_back({text, policy::parse_kv_spec(text), &gen});
    const auto q = engine::evaluate_variants(gen, chunks, variants, 2);
    EXPECT_GT(q[0].mean_kl, 0.0);
    EXPECT_NE(q[0].mean_kl, q[1].mean_kl);
    if (cache == kernels::DType::F32) {
      EXPECT_EQ(q[2].mean_kl, 0.0);
    }
  }
}

TEST(KvQualityProtocol, PrefillSplitScoresOnlyTheTokensAfterThePrompt) {
  auto m = engine::open_model({});
  auto be = kernels::make_cpu_backend();
  const auto w = engine::load_weights(m.config, *m.weights);
  engine::Generator gen(*be, m.config, w);
  const auto chunks = eval_chunks(m.config);
  std::vector<engine::EvalVariant> variants;
  for (const char* text : {"full", "h2o:0.2", "snapkv:0.2", "pyramid:0.2", "flex:0.2", "local:8"})
    variants.push_back({text, policy::parse_kv_spec(text), &gen});
  const auto count = [&](const engine::PromptSplit& split) {
    std::int64_t n = 0;
    for (const auto& c : chunks) n += static_cast<std::int64_t>(c.size()) - split.prompt_tokens(static_cast<std::int64_t>(c.size()));
    return n;
  };

  // Default: BOS is the prompt, every other token is decoded and scored. snapkv and pyramid act
  // at prefill only, so with a one-token prompt snapkv is exactly h2o.
  const auto decode = engine::evaluate_variants(gen, chunks, variants, 2);
  const auto decode_explicit = engine::evaluate_variants(gen, chunks, variants, 2, engine::parse_prompt_split("1"));
  for (std::size_t i = 0; i < variants.size(); ++i) {
    EXPECT_EQ(decode[i].tokens, count({}));
    EXPECT_EQ(decode[i].mean_kl, decode_explicit[i].mean_kl) << variants[i].label;
  }
  EXPECT_EQ(decode[0].mean_kl, 0.0);
  EXPECT_EQ(decode[1].mean_kl, decode[2].mean_kl);
  EXPECT_GT(decode[1].mean_kl, 0.0);

  // Half of each chunk prefilled: fewer tokens scored, and the prefill rules now choose.
  const auto half_split = engine::parse_prompt_split("0.5");
  const auto half = engine::evaluate_variants(gen, chunks, variants, 2, half_split);
  for (const auto& q : half) EXPECT_EQ(q.tokens, count(half_split));
  EXPECT_EQ(half[0].mean_kl, 0.0);
  EXPECT_NE(half[1].mean_kl, half[2].mean_kl);  // snapkv's window and pooling keep other tokens than h2o
  EXPECT_NE(half[1].mean_kl, half[3].mean_kl);

  // Everything but the last token is the prompt: the one prediction comes from the prefill,
  // whose attention sees the whole prompt before any eviction, so every policy matches full.
  const engine::PromptSplit all{1000, std::nullopt};
  for (const auto& q : engine::evaluate_variants(gen, chunks, variants, 2, all)) {
    EXPECT_EQ(q.tokens, static_cast<std::int64_t>(chunks.size())) << q.label;
    EXPECT_EQ(q.mean_kl, 0.0) << q.label;
    EXPECT_EQ(q.top1_agreement, 1.0) << q.label;
  }
}

}  // namespace
}  // namespace flexh2o
