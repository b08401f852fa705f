// n samples of a prompt sharing one prefill (Sequence::shares_prompt): each choice's
// tokens are those of the same request with a prefill of its own (log-probabilities within
// fp32 rounding of a forward pass, as the steps' rows differ), under
// continuous batching and fixed blocks, in memory and with the KV cache over gpu/cpu/disk
// (staged or attended in place), with every --kv policy and a compressed cache; each choice
// also matches its solo in-memory run; and the prompt is computed once per run of choices
// admitted together.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "engine/runtime/block_executor.h"
#include "engine/serving/generate.h"
#include "engine/runtime/prefill_fork.h"
#include "engine/loaders/model_source.h"
#include "engine/loaders/dummy_weights.h"
#include "tests/support/refill_check.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

using engine::GenerationRequest;
using engine::GenerationResult;
using engine::ModelConfig;

// Lines of a batch file as requests: line l's prompt (3 to 12 random tokens) and limit (1 to
// 10 tokens) repeated choices[l] times, each choice with its own sampling stream, sampled at
// temperature 0.8 with the 2 most likely alternatives' log-probabilities (line 1: greedy).
GenerationRequest choices_request(const ModelConfig& cfg, std::span<const std::int64_t> choices, std::uint64_t seed,
                                  bool share) {
  std::mt19937_64 rng(seed);
  GenerationRequest req;
  req.max_new_tokens = 0;
  for (std::size_t l = 0; l < choices.size(); ++l) {
    std::vector<std::int32_t> prompt(3 + rng() % 10);
    for (auto& t : prompt) t = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(cfg.vocab_size));
    const auto limit = 1 + static_cast<std::int64_t>(rng() % 10);
    const kernels::SamplingParams sampling{
        .temperature = l == 1 ? 0.0f : 0.8f, .top_p = 0.9f, .seed = seed, .logprobs = 2};
    for (std::int64_t c = 0; c < choices[l]; ++c) {
      req.sequences.push_back({.prompt = prompt,
                               .max_new_tokens = limit,
                               .sampling = sampling,
                               .stream = 100 * l + static_cast<std::uint64_t>(c),
                               .shares_prompt = share && c > 0});
      req.max_new_tokens = std::max(req.max_new_tokens, limit);
    }
  }
  return req;
}

// Prompt tokens a run prefills: each line's prompt once per run of at most `slots` choices.
std::int64_t prefilled_once(const GenerationRequest& req, std::span<const std::int64_t> choices, std::int64_t slots) {
  std::int64_t tokens = 0, first = 0;
  for (const std::int64_t n : choices) {
    const auto prompt = static_cast<std::int64_t>(req.sequences[static_cast<std::size_t>(first)].prompt.size());
    tokens += prompt * ((n + slots - 1) / slots);
    first += n;
  }
  return tokens;
}

struct Placement {
  policy::Policy policy;
  bool always_stage = false;
  std::string name;
};

GenerationResult run_scheduler(const ModelConfig& cfg, const engine::WeightSource& src, const Placement& s,
                               const GenerationRequest& req, const engine::GenerationHooks& hooks = {}) {
  auto be = kernels::make_cpu_backend();
  testing::TempDir dir;
  offload::TierOptions to;
  to.offload_dir = dir.path();
  offload::Tiers tiers(*be, to);
  GenerationResult r;
  {
    engine::BlockExecutor sched(*be, tiers, cfg, src, s.policy, nullptr, {s.always_stage});
    r = serving::generate(sched, req, hooks);
  }
  for (offload::Tier t : {offload::Tier::Gpu, offload::Tier::Cpu, offload::Tier::Disk})
    EXPECT_EQ(tiers.budget(t).used(), 0) << tier_name(t);
  return r;
}

// Shared against separate prefills, continuous (slots: the block) or one fixed block. Returns
// whether two choices of a sampled line drew other tokens (a short line at a peaked
// distribution may well draw the same: the tests ask it of some run, not of every one).
bool expect_shared_equals_separate(const ModelConfig& cfg, const engine::WeightSource& src, const Placement& s,
                                   std::span<const std::int64_t> choices, std::uint64_t seed, bool continuous,
                                   std::int64_t prefill_budget = 512) {
  SCOPED_TRACE(s.name + (continuous ? ", continuous" : ", fixed") + ", seed " + std::to_string(seed) +
               ", prefill budget " + std::to_string(prefill_budget));
  GenerationRequest shared = choices_request(cfg, choices, seed, true);
  GenerationRequest separate = choices_request(cfg, choices, seed, false);
  const std::int64_t slots = continuous ? s.policy.block_size() : static_cast<std::int64_t>(shared.sequences.size());
  for (GenerationRequest* r : {&shared, &separate}) {
    r->slots = continuous ? slots : 0;
    r->prefill_budget = prefill_budget;
  }
  // The logits that picked each token of the separate run: what bounds the log-probabilities.
  std::vector<std::vector<std::vector<float>>> logits(separate.sequences.size());
  engine::GenerationHooks keep;
  if (continuous)
    keep.on_sequence_logits = [&](std::size_t q, std::int64_t, std::span<const float> l) { logits[q].emplace_back(l.begin(), l.end()); };
  else
    keep.on_logits = [&](std::int64_t, std::span<const float> l) {
      const auto vocab = static_cast<std::size_t>(cfg.vocab_size);
      for (std::size_t q = 0; q < logits.size(); ++q) logits[q].emplace_back(l.begin() + q * vocab, l.begin() + (q + 1) * vocab);
    };
  const GenerationResult a = run_scheduler(cfg, src, s, shared), b = run_scheduler(cfg, src, s, separate, keep);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.finish_reasons, b.finish_reasons);
  // The forked KV is the prefilled slot's, computed in a step of other rows than the sibling's
  // own prefill would be: where the CPU GEMM's summation order follows the rows of a step, the
  // logits may differ within fp32 rounding of a forward pass, and a log-softmax by twice that.
  EXPECT_EQ(a.logprobs.size(), b.logprobs.size());
  for (std::size_t q = 0; q < a.logprobs.size() && a.tokens == b.tokens && a.logprobs.size() == b.logprobs.size(); ++q) {
    EXPECT_EQ(a.logprobs[q].size(), b.logprobs[q].size());
    if (a.logprobs[q].size() != b.logprobs[q].size()) continue;
    for (std::size_t i = 0; i < a.logprobs[q].size(); ++i) {
      const auto tokens = static_cast<std::int64_t>(shared.sequences[q].prompt.size() + i + 1);
      EXPECT_NEAR(a.logprobs[q][i], b.logprobs[q][i], 2 * testing::forward_tolerance(cfg, tokens, logits[q][i]))
          << "request " << q << ", token " << i;
    }
  }
  EXPECT_EQ(a.prompt_tokens, b.prompt_tokens);
  EXPECT_EQ(b.prompt_tokens_computed, b.prompt_tokens);
  EXPECT_EQ(a.prompt_tokens_computed, prefilled_once(shared, choices, slots));
  EXPECT_EQ(a.generated_tokens, b.generated_tokens);
  if (continuous) {
    EXPECT_EQ(a.sequence_steps, a.generated_tokens) << "a fork's slot counts from its first token";
  }
  // The choices of the sampled lines drew their own tokens.
  bool differ = false;
  for (std::size_t q = 1; q < a.tokens.size(); ++q)
    differ = differ || (shared.sequences[q].shares_prompt && engine::sampling_of(shared, q).temperature > 0 &&
                        a.tokens[q] != a.tokens[q - 1]);
  return differ;
}

// Placements of the KV cache: in memory, staged from cpu or disk, split over the three tiers
// with the cpu part attended in place; forks cross GPU batches and tiers.
std::vector<Placement> placements() {
  std::vector<Placement> out;
  auto add = [&](std::string name, std::int64_t gbs, std::int64_t k, offload::TierFractions weights,
                 offload::TierFractions cache, bool stage, bool cpu_compute, bool overlap) {
    Placement s;
    s.policy.gpu_batch_size = gbs;
    s.policy.num_gpu_batches = k;
    s.policy.weights = weights;
    s.policy.cache = cache;
    s.policy.activations = {0.5, 0.5, 0};
    s.policy.cpu_cache_compute = cpu_compute;
    s.policy.overlap = overlap;
    s.always_stage = stage;
    s.name = std::move(name);
    out.push_back(s);
  };
  add("in memory", 6, 1, {1, 0, 0}, {1, 0, 0}, false, false, true);
  add("cache on cpu", 2, 3, {0.5, 0.5, 0}, {0, 1, 0}, false, false, true);
  add("cache on disk", 3, 2, {0.3, 0.4, 0.3}, {0, 0, 1}, true, false, true);
  add("cache over three tiers", 2, 3, {0.3, 0.4, 0.3}, {0.34, 0.33, 0.33}, true, true, false);
  return out;
}

const std::int64_t kContinuousChoices[] = {3, 2, 1, 4, 7, 1};  // 7 > the 6 slots: two prefills
const std::int64_t kFixedChoices[] = {2, 3, 1};                 // one block of 6

TEST(PrefillFork, SharedEqualsSeparateOverTheTiersStories260k) {
  auto m = engine::open_model({});
  std::uint64_t seed = 900;
  bool choices_differ = false;  // the forks drew with their own streams somewhere
  for (const Placement& s : placements()) {
    choices_differ |= expect_shared_equals_separate(m.config, *m.weights, s, kContinuousChoices, seed, true);
    choices_differ |= expect_shared_equals_separate(m.config, *m.weights, s, kContinuousChoices, seed + 1, true, 4);
    choices_differ |= expect_shared_equals_separate(m.config, *m.weights, s, kFixedChoices, seed + 2, false);
    seed += 3;
  }
  EXPECT_TRUE(choices_differ);
}

TEST(PrefillFork, SharedEqualsSeparateOverTheTiersLlama) {
  const ModelConfig cfg = testing::tiny_llama_config();
  engine::DummyWeights src(cfg, 31);
  std::uint64_t seed = 920;
  bool choices_differ = false;
  for (const Placement& s : placements()) {
    choices_differ |= expect_shared_equals_separate(cfg, src, s, kContinuousChoices, seed, true, 8);
    choices_differ |= expect_shared_equals_separate(cfg, src, s, kFixedChoices, seed + 1, false);
    seed += 2;
  }
  EXPECT_TRUE(choices_differ);
}

// Every --kv policy (its state per kv head copied with the KV) and both compressions.
TEST(PrefillFork, SharedEqualsSeparateEveryKvPolicyCompressed) {
  auto m = engine::open_model({});
  const char* kv[] = {"h2o:0.3", "local:0.3", "tova:0.3", "scissorhands:0.3", "pyramid:0.3", "snapkv:0.3",
                      "streaming:0.3", "flex:0.3", "flex:0.3,sink=1,merge=0"};
  std::uint64_t seed = 940;
  bool choices_differ = false;
  for (const char* spec : kv)
    for (const bool compress : {false, true}) {
      Placement s = placements()[3];
      s.policy.kv = spec;
      s.policy.compress_weight = s.policy.compress_cache = compress;
      s.name = std::string(spec) + (compress ? " compressed" : "");
      choices_differ |= expect_shared_equals_separate(m.config, *m.weights, s, kContinuousChoices, seed++, true);
      choices_differ |= expect_shared_equals_separate(m.config, *m.weights, s, kFixedChoices, seed++, false);
    }
  EXPECT_TRUE(choices_differ);
}

// Each choice against its own prefill alone in memory (Generator), token by token.
TEST(PrefillFork, EachChoiceMatchesItsSoloRun) {
  auto m = engine::open_model({});
  GenerationRequest req = choices_request(m.config, kContinuousChoices, 960, true);
  auto be = kernels::make_cpu_backend();
  for (const Placement& s : placements()) {
    SCOPED_TRACE(s.name);
    const auto c = testing::expect_refill_matches_solo(*be, m.config, *m.weights, s.policy, req, {s.always_stage});
    EXPECT_EQ(c.exact, c.requests);
  }
}

TEST(PrefillFork, SharedPromptsAreChecked) {
  auto m = engine::open_model({});
  auto be = kernels::make_cpu_backend();
  offload::Tiers tiers(*be, {});
  Placement s = placements()[0];
  engine::BlockExecutor sched(*be, tiers, m.config, *m.weights, s.policy);
  const std::int64_t choices[] = {2, 2};
  GenerationRequest req = choices_request(m.config, choices, 980, true);
  GenerationRequest bad = req;
  bad.sequences[2].shares_prompt = true;  // line 1's first choice: another prompt
  EXPECT_THROW(serving::generate(sched, bad), std::invalid_argument);
  bad = req;
  *bad.sequences[1].max_new_tokens += 1;  // another limit
  EXPECT_THROW(serving::generate(sched, bad), std::invalid_argument);
  bad = req;
  bad.sequences[0].shares_prompt = true;
  EXPECT_THROW(serving::generate(sched, bad), std::invalid_argument);
  engine::GenerationHooks logits;
  logits.on_logits = [](std::int64_t, std::span<const float>) {};
  EXPECT_THROW(serving::generate(sched, req, logits), std::invalid_argument);
  EXPECT_EQ(engine::shared_prompt_run(req, 0), 2);
  EXPECT_EQ(engine::shared_prompt_run(req, 1), 1);
  EXPECT_EQ(engine::shared_prompt_run(req, 2), 2);
}

}  // namespace
}  // namespace flexh2o
