// The KV bytes the attention read (CacheRing::reads, docs/prefix-sharing.md), exactly: a
// sequence that decodes or extends reads K and V of the slots its cache held before the step,
// in every decoder layer; a prefill reads none; the members of a shared prefix's group in one
// attention call read it once where the backend does (the CPU's cascade attention). Split by
// the tier its rows live on, attended in place or staged through the ring.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "engine/runtime/block_executor.h"
#include "kernels/backend.h"
#include "tests/support/forwarding_backend.h"
#include "tests/support/test_models.h"
#include "tests/support/tiered_run.h"

namespace flexh2o {
namespace {

using engine::GenerationRequest;
using engine::GenerationResult;
using engine::KvReads;
using engine::Sequence;
using offload::Tier;
using Tokens = std::vector<std::int32_t>;

using testing::random_tokens;

// Prompts of the given lengths, greedy, every one generating `new_tokens` (no stop id).
GenerationRequest request(const engine::ModelConfig& cfg, std::vector<std::size_t> lengths, std::int64_t new_tokens) {
  std::mt19937_64 rng(45);
  GenerationRequest req;
  for (const std::size_t n : lengths)
    req.sequences.push_back({.prompt = random_tokens(rng, n, cfg.vocab_size),
                             .sampling = kernels::SamplingParams{.temperature = 0.0f, .ignore_eos = true}});
  req.max_new_tokens = new_tokens;
  return req;
}

// A backend whose decode attention reads every query's row whole, shared prefixes or not (as
// one without cascade attention does).
class PerSequenceReads final : public testing::ForwardingBackend {
 public:
  bool reads_shared_prefixes_once() const override { return false; }

 protected:
  void do_attention_decode(const kernels::AttentionDecodeArgs& a) override {
    kernels::AttentionDecodeArgs whole = a;
    whole.shared_prefixes = {};
    whole.prefix_of = {};
    inner().attention_decode(whole);
  }
};

testing::KvTraffic run(const engine::ModelConfig& cfg, const policy::Policy& pol, const GenerationRequest& req,
                       bool per_sequence = false) {
  std::unique_ptr<kernels::Backend> be = kernels::make_cpu_backend();
  if (per_sequence) be = std::make_unique<PerSequenceReads>();
  return testing::kv_traffic(*be, cfg, pol, req);
}

// The slots a sequence of `prompt` tokens generating `generated` reads over its decode steps:
// step i (1 .. generated - 1) reads prompt + i - 1.
std::int64_t decode_slots(std::int64_t prompt, std::int64_t generated) {
  return (generated - 1) * prompt + (generated - 1) * (generated - 2) / 2;
}

policy::Policy placement(std::int64_t gbs, std::int64_t k, offload::TierFractions cache, bool cpu_compute) {
  policy::Policy p;
  p.gpu_batch_size = gbs;
  p.num_gpu_batches = k;
  p.weights = {1, 0, 0};
  p.cache = cache;
  p.activations = {1, 0, 0};
  p.cpu_cache_compute = cpu_compute;
  return p;
}

// A fixed block: two GPU batches of two, each batch's first row on gpu (attended in place),
// its second on cpu (staged).
TEST(KvReads, FixedBlockByTierStagedFromCpu) {
  const engine::ModelConfig cfg = testing::tiny_llama_config();
  const policy::Policy pol = placement(2, 2, {0.5, 0.5, 0}, false);
  const std::vector<std::size_t> lengths = {5, 9, 3, 12};
  const std::int64_t g = 6;
  const testing::KvTraffic r = run(cfg, pol, request(cfg, lengths, g));
  const std::int64_t unit = testing::kv_bytes_per_slot(cfg, pol);
  KvReads want;
  want.in_place[static_cast<std::size_t>(Tier::Gpu)] = unit * (decode_slots(5, g) + decode_slots(3, g));
  want.staged[static_cast<std::size_t>(Tier::Cpu)] = unit * (decode_slots(9, g) + decode_slots(12, g));
  EXPECT_EQ(r.reads.in_place, want.in_place);
  EXPECT_EQ(r.reads.staged, want.staged);
  EXPECT_EQ(r.reads.total(), want.total());
}

// Rows over the three tiers, the cpu one attended in place (cpu_cache_compute), the disk one
// staged.
TEST(KvReads, FixedBlockOverThreeTiers) {
  const engine::ModelConfig cfg = testing::tiny_llama_config();
  const policy::Policy pol = placement(3, 1, {0.34, 0.33, 0.33}, true);
  const std::int64_t g = 4;
  const testing::KvTraffic r = run(cfg, pol, request(cfg, {7, 4, 10}, g));
  const std::int64_t unit = testing::kv_bytes_per_slot(cfg, pol);
  KvReads want;
  want.in_place[static_cast<std::size_t>(Tier::Gpu)] = unit * decode_slots(7, g);
  want.in_place[static_cast<std::size_t>(Tier::Cpu)] = unit * decode_slots(4, g);
  want.staged[static_cast<std::size_t>(Tier::Disk)] = unit * decode_slots(10, g);
  EXPECT_EQ(r.reads.in_place, want.in_place);
  EXPECT_EQ(r.reads.staged, want.staged);
}

// Continuous batching with shared prefixes, on a backend that reads each row whole: a request
// that takes a prefix reads it in its extend step, then decodes as any other.
TEST(KvReads, ContinuousBatchingReadingEveryRowWhole) {
  const engine::ModelConfig cfg = testing::tiny_llama_config();
  const policy::Policy pol = placement(2, 1, {1, 0, 0}, false);
  GenerationRequest req = request(cfg, {20, 3, 6, 4, 9}, 5);
  std::mt19937_64 rng(47);
  const Tokens prefix = random_tokens(rng, 20, cfg.vocab_size);
  for (std::size_t p = 1; p < req.sequences.size(); ++p)
    req.sequences[p].prompt.insert(req.sequences[p].prompt.begin(), prefix.begin(), prefix.end());
  req.sequences[0].prompt = prefix;
  req.slots = pol.block_size();
  req.min_shared_prefix = 4;
  const testing::KvTraffic r = run(cfg, pol, req, true);
  ASSERT_GT(r.result.prefix_shared_tokens, 0);
  std::int64_t slots = r.result.prefix_shared_tokens;
  for (std::size_t b = 0; b < req.sequences.size(); ++b)
    slots += decode_slots(static_cast<std::int64_t>(req.sequences[b].prompt.size()),
                          static_cast<std::int64_t>(r.result.tokens[b].size()));
  KvReads want;
  want.in_place[static_cast<std::size_t>(Tier::Gpu)] = testing::kv_bytes_per_slot(cfg, pol) * slots;
  EXPECT_EQ(r.reads.in_place, want.in_place);
  EXPECT_EQ(r.reads.staged, KvReads{}.staged);
}

// One GPU batch of four: prompt 0 is a 20-token prefix, prompts 1-3 that prefix and items of 3, 6
// and 4 tokens; 5 new tokens each. Step 0 prefills prompt 0 (the others wait for it); step 1
// slot 0 decodes while slots 1-3 extend, each after the 20 slots copied from row 0; steps 2-4
// all four decode; step 5 slots 1-3 (slot 0 has its 5 tokens). Reading each row whole, that is
// the 60 shared tokens read by the extends plus every decode's cached slots. Reading the 20
// slots once per run of one kind: the extend call of step 1 reads them once for 3 (saves
// 2 x 20), the decode calls of steps 2-4 once for 4 (3 x 20 each), that of step 5 once for 3
// (2 x 20); slot 0 decodes alone in step 1's decode call. Staged rows load what is read.
GenerationRequest one_prefix_job(const engine::ModelConfig& cfg, const policy::Policy& pol) {
  GenerationRequest req = request(cfg, {20, 3, 6, 4}, 5);
  const Tokens prefix = req.sequences[0].prompt;
  for (std::size_t p = 1; p < req.sequences.size(); ++p) {
    Tokens& prompt = req.sequences[p].prompt;
    prompt.insert(prompt.begin(), prefix.begin(), prefix.end());
  }
  req.slots = pol.block_size();
  req.min_shared_prefix = 4;
  req.hold_prefixes = false;  // copied into each row (on the gpu tier it would be held once)
  return req;
}

void expect_group_reads_prefix_once(const policy::Policy& pol, Tier tier, bool staged) {
  const engine::ModelConfig cfg = testing::tiny_llama_config();
  const GenerationRequest req = one_prefix_job(cfg, pol);
  std::int64_t whole = 3 * 20;
  for (const Sequence& seq : req.sequences) whole += decode_slots(static_cast<std::int64_t>(seq.prompt.size()), 5);
  const std::int64_t once = whole - 20 * (2 + 3 * 3 + 2);
  for (const bool per_sequence : {true, false}) {
    SCOPED_TRACE(per_sequence ? "reading each row whole" : "reading shared prefixes once");
    const testing::KvTraffic r = run(cfg, pol, req, per_sequence);
    ASSERT_EQ(r.result.prefix_shared_tokens, 3 * 20);
    for (const auto& tokens : r.result.tokens) ASSERT_EQ(tokens.size(), 5u);
    const std::int64_t unit = testing::kv_bytes_per_slot(cfg, pol);
    KvReads want;
    (staged ? want.staged : want.in_place)[static_cast<std::size_t>(tier)] = unit * (per_sequence ? whole : once);
    EXPECT_EQ(r.reads.in_place, want.in_place);
    EXPECT_EQ(r.reads.staged, want.staged);
    EXPECT_EQ(r.reads.shared_prefix_saved, unit * (per_sequence ? 0 : whole - once));
  }
}

TEST(KvReads, ContinuousBatchingReadsAGroupsPrefixOnce) {
  expect_group_reads_prefix_once(placement(4, 1, {1, 0, 0}, false), Tier::Gpu, false);
}

// Staged rows: load_cache leaves out the prefix of every member of a run but its first, from
// whose row the attention reads it for all of them.
TEST(KvReads, StagedRowsLoadAGroupsPrefixOnce) {
  expect_group_reads_prefix_once(placement(4, 1, {0, 1, 0}, false), Tier::Cpu, true);
  expect_group_reads_prefix_once(placement(4, 1, {0, 0, 1}, false), Tier::Disk, true);
}

// The 20-token prefix held once: a family's prefix leaves its shortest prompt's last token, so
// the pool row holds 19 slots and each row the rest (at most 31 - 19 = 12 slots, 31 without).
// Steps as above: each run that reads the pool row (the decode and the extend call of step 1,
// the decode call of each of steps 2-5) reads its 19 slots once in place on the gpu tier (staged
// from cpu or disk, once a step: 5 times); the 19 runs of members reading it (4 in step 1, 4 x
// 3, 3) read their own rows' slots after it where they live, staged or in place.
TEST(KvReads, HeldPrefixReadOnceARunFromThePool) {
  const engine::ModelConfig cfg = testing::tiny_llama_config();
  for (const Tier tier : {Tier::Gpu, Tier::Cpu, Tier::Disk}) {
    for (const Tier pool_tier : {Tier::Gpu, Tier::Cpu, Tier::Disk}) {
      SCOPED_TRACE(fmt::format("rows on {}, pool on {}", offload::tier_name(tier), offload::tier_name(pool_tier)));
      const auto on = [&](Tier t) { return tier == t ? 1.0 : 0.0; };
      policy::Policy pol = placement(4, 1, {on(Tier::Gpu), on(Tier::Cpu), on(Tier::Disk)}, false);
      pol.prefix_pool = offload::tier_name(pool_tier);
      GenerationRequest req = one_prefix_job(cfg, pol);
      req.hold_prefixes = true;
      std::int64_t whole = 3 * 19;
      for (const Sequence& seq : req.sequences) whole += decode_slots(static_cast<std::int64_t>(seq.prompt.size()), 5);
      const testing::KvTraffic r = run(cfg, pol, req);
      ASSERT_EQ(r.held.prefixes, 1);
      ASSERT_EQ(r.result.prefix_shared_tokens, 3 * 19);
      const std::int64_t unit = testing::kv_bytes_per_slot(cfg, pol);
      const auto p = static_cast<std::size_t>(pool_tier), t = static_cast<std::size_t>(tier);
      // Off the gpu the pool is staged (no cpu_cache_compute): once a step, step 1's two runs' read as one.
      const bool staged = pool_tier != Tier::Gpu;
      const std::int64_t pool_reads = staged ? 5 : 6;
      KvReads want;
      (staged ? want.staged : want.in_place)[p] = unit * pool_reads * 19;
      (tier == Tier::Gpu ? want.in_place : want.staged)[t] += unit * (whole - 19 * 19);
      EXPECT_EQ(r.reads.in_place, want.in_place);
      EXPECT_EQ(r.reads.staged, want.staged);
      EXPECT_EQ(r.reads.shared_prefix_saved, unit * (19 - pool_reads) * 19);
      std::array<std::int64_t, 3> held{}, without{};
      held[p] = unit * 19;
      held[t] += unit * 4 * 12;
      without[t] = unit * 4 * 31;
      EXPECT_EQ(r.held.bytes, held);
      EXPECT_EQ(r.held.bytes_without, without);
      EXPECT_EQ(r.held.pools[p], 1);
    }
  }
}

}  // namespace
}  // namespace flexh2o
