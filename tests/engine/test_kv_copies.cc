// The KV bytes row copies moved (BlockExecutor::kv_copies, docs/prefix-sharing.md), exactly: a
// newcomer taking a shared prefix copies K and V of its first tokens from the donor's row in
// every decoder layer, a forked prefill its prompt's; each byte read from the donor row's tier
// and written to the receiving row's, as stored (compressed or not). Nothing is copied with
// sharing off, nor when a newcomer's own row holds its prefix.
#include <gtest/gtest.h>

#include <random>

#include "engine/runtime/block_executor.h"
#include "kernels/backend.h"
#include "tests/support/test_models.h"
#include "tests/support/tiered_run.h"

namespace flexh2o {
namespace {

using engine::GenerationRequest;
using engine::GenerationResult;
using engine::KvCopies;
using offload::Tier;
using Tokens = std::vector<std::int32_t>;
using ByTier = std::array<std::int64_t, 3>;

using testing::random_tokens;

// Prompt 0 is a `prefix`-token prompt; the others that prefix and items of the given lengths;
// greedy, `new_tokens` each.
GenerationRequest prefixed(const engine::ModelConfig& cfg, std::int64_t prefix, std::vector<std::size_t> items,
                           std::int64_t new_tokens) {
  std::mt19937_64 rng(48);
  GenerationRequest req;
  const Tokens shared = random_tokens(rng, static_cast<std::size_t>(prefix), cfg.vocab_size);
  req.sequences.push_back({.prompt = shared});
  for (const std::size_t n : items) {
    Tokens prompt = shared;
    const Tokens item = random_tokens(rng, n, cfg.vocab_size);
    prompt.insert(prompt.end(), item.begin(), item.end());
    req.sequences.push_back({.prompt = std::move(prompt)});
  }
  for (auto& seq : req.sequences) seq.sampling = kernels::SamplingParams{.temperature = 0.0f, .ignore_eos = true};
  req.max_new_tokens = new_tokens;
  req.min_shared_prefix = 4;
  return req;
}

testing::KvTraffic run(const engine::ModelConfig& cfg, const policy::Policy& pol, const GenerationRequest& req) {
  const std::unique_ptr<kernels::Backend> be = kernels::make_cpu_backend();
  return testing::kv_traffic(*be, cfg, pol, req);
}

// One GPU batch of `gbs` continuous slots, the KV cache split over the tiers by `cache`.
policy::Policy placement(std::int64_t gbs, offload::TierFractions cache, bool compress) {
  policy::Policy p;
  p.gpu_batch_size = gbs;
  p.num_gpu_batches = 1;
  p.weights = {1, 0, 0};
  p.cache = cache;
  p.activations = {1, 0, 0};
  p.compress_cache = compress;
  return p;
}

ByTier times(ByTier rows, std::int64_t bytes) {
  for (auto& r : rows) r *= bytes;
  return rows;
}

// A 20-token prompt, then three that extend it: step 1 copies row 0's 20 slots into rows 1-3.
// All on gpu, or row 0 on gpu, row 1 on cpu, rows 2-3 on disk (a quarter, a quarter, a half).
TEST(KvCopies, SharedPrefixByTier) {
  const engine::ModelConfig cfg = testing::tiny_llama_config();
  struct Case {
    offload::TierFractions cache;
    ByTier written_rows;
  };
  for (const Case& c : {Case{{1, 0, 0}, {3, 0, 0}}, Case{{0.25, 0.25, 0.5}, {0, 1, 2}}})
    for (const bool compress : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "cache on gpu " << c.cache.gpu << (compress ? ", compressed" : ""));
      const policy::Policy pol = placement(4, c.cache, compress);
      GenerationRequest req = prefixed(cfg, 20, {3, 6, 4}, 5);
      req.slots = pol.block_size();
      req.hold_prefixes = false;  // on the gpu tier the prefix would be held once, not copied
      const testing::KvTraffic r = run(cfg, pol, req);
      ASSERT_EQ(r.result.prefix_shared_tokens, 3 * 20);
      ASSERT_EQ(r.result.prefix_hits, 3);
      const std::int64_t prefix_bytes = 20 * testing::kv_bytes_per_slot(cfg, pol);
      EXPECT_EQ(r.copies.prefixes.read, times({3, 0, 0}, prefix_bytes));
      EXPECT_EQ(r.copies.prefixes.written, times(c.written_rows, prefix_bytes));
      EXPECT_EQ(r.copies.prefixes.total(), 3 * prefix_bytes);
      EXPECT_EQ(r.copies.forks.total(), 0);
    }
}

// With sharing off nothing is copied; a newcomer admitted into the one slot after the prompt
// whose prefix its row holds takes it from its own row: shared tokens, no copy.
TEST(KvCopies, NoneWithoutSharingOrFromItsOwnRow) {
  const engine::ModelConfig cfg = testing::tiny_llama_config();
  const policy::Policy four = placement(4, {0.25, 0.25, 0.5}, false);
  GenerationRequest off = prefixed(cfg, 20, {3, 6, 4}, 5);
  off.slots = four.block_size();
  off.share_prefixes = false;
  const testing::KvTraffic unshared = run(cfg, four, off);
  ASSERT_EQ(unshared.result.prefix_shared_tokens, 0);
  EXPECT_EQ(unshared.copies.prefixes.total(), 0);
  EXPECT_EQ(unshared.copies.prefixes.written, ByTier{});

  const policy::Policy one = placement(1, {1, 0, 0}, false);
  GenerationRequest own = prefixed(cfg, 20, {3}, 3);
  own.slots = one.block_size();
  const testing::KvTraffic r = run(cfg, one, own);
  ASSERT_EQ(r.result.prefix_shared_tokens, 20);
  EXPECT_EQ(r.copies.prefixes.total(), 0);
  EXPECT_EQ(r.copies.forks.total(), 0);
}

// Three samples of one 12-token prompt share its prefill in slot 0 (gpu); after it the prompt's
// slots are forked into slots 1 (cpu) and 2 (disk): counted as forks, not as prefixes. With
// the three held as a prefix family (its 11 shareable tokens in a pool row), a fork copies only
// the slot after them.
TEST(KvCopies, ForkedPrefillsApart) {
  const engine::ModelConfig cfg = testing::tiny_llama_config();
  const policy::Policy pol = placement(4, {0.25, 0.25, 0.5}, false);
  GenerationRequest req = prefixed(cfg, 12, {}, 4);
  req.sequences.push_back(req.sequences[0]);
  req.sequences.push_back(req.sequences[0]);
  req.sequences[1].shares_prompt = req.sequences[2].shares_prompt = true;
  req.slots = pol.block_size();
  const std::int64_t slot_bytes = testing::kv_bytes_per_slot(cfg, pol);
  for (const bool hold : {false, true}) {
    SCOPED_TRACE(hold ? "held" : "copied");
    req.hold_prefixes = hold;
    const testing::KvTraffic r = run(cfg, pol, req);
    for (const auto& tokens : r.result.tokens) ASSERT_EQ(tokens.size(), 4u);
    const std::int64_t forked_bytes = (hold ? 1 : 12) * slot_bytes;
    EXPECT_EQ(r.copies.forks.read, times({2, 0, 0}, forked_bytes));
    EXPECT_EQ(r.copies.forks.written, times({0, 1, 1}, forked_bytes));
    EXPECT_EQ(r.copies.prefixes.total(), 0);
  }
}

}  // namespace
}  // namespace flexh2o
