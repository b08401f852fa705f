// Shared prompt prefixes (docs/prefix-sharing.md): under continuous batching a newcomer takes
// the KV of the longest prefix of its prompt that a slot's cache row holds and computes the
// rest (SeqStep::Extend). Each request's tokens are those of its solo in-memory run with
// sharing on and with it off (tests/support/refill_check.h: near-ties of fp32 rounding aside,
// as the extend rows attend through the decode kernel), in memory and with the KV cache over
// gpu/cpu/disk, compressed or not; under a KV eviction policy nothing is shared. The counters
// say what was shared: exactly, for admissions worked out by hand. The decode attention reads
// the prefixes rows share once for all (cascade attention): the runs with sharing count the
// queries that read a prefix from another row. A prefix family's KV may instead be held once
// in a pool on the gpu tier, each row holding only what follows it (HeldPrefixes*).
#include <gtest/gtest.h>

#include <atomic>
#include <random>

#include "engine/loaders/dummy_weights.h"
#include "engine/loaders/model_source.h"
#include "engine/runtime/block_executor.h"
#include "engine/serving/generate.h"
#include "engine/runtime/prefix_match.h"
#include "tests/support/forwarding_backend.h"
#include "tests/support/refill_check.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

using engine::GenerationRequest;
using engine::GenerationResult;
using Tokens = std::vector<std::int32_t>;

using testing::random_tokens;

Tokens join(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Prompts over two shared instructions (40 and 25 tokens) with items of 1 to 12 tokens, some
// identical, one a prefix of an earlier and one of a later prompt, and some sharing nothing;
// 1 to 9 new tokens each, greedy (two lines sampled with their own streams).
GenerationRequest mixed_request(std::int64_t vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const Tokens a = random_tokens(rng, 40, vocab), b = random_tokens(rng, 25, vocab);
  GenerationRequest req;
  auto add = [&](Tokens prompt) {
    req.sequences.push_back({.prompt = std::move(prompt), .max_new_tokens = 1 + static_cast<std::int64_t>(rng() % 9)});
  };
  add(Tokens(a.begin(), a.begin() + 30));  // a prefix of the next ones
  for (int i = 0; i < 14; ++i) {
    const Tokens item = random_tokens(rng, 1 + rng() % 12, vocab);
    add(join(i % 3 == 2 ? b : a, item));
    if (i % 4 == 1) add(req.sequences.back().prompt);          // the same prompt again
    if (i % 5 == 3) add(random_tokens(rng, 5 + rng() % 20, vocab));  // nothing shared
  }
  add(Tokens(req.sequences[3].prompt.begin(), req.sequences[3].prompt.end() - 1));  // a prefix of an earlier prompt
  req.max_new_tokens = 9;
  for (std::size_t p = 0; p < req.sequences.size(); ++p)
    req.sequences[p].sampling = {.temperature = p % 7 == 3 ? 0.8f : 0.0f, .top_p = 0.9f, .seed = seed};
  req.min_shared_prefix = 4;
  return req;
}

struct Placement {
  policy::Policy policy;
  bool always_stage = false;
  std::string name;
  // Each attention call holds one row of a GPU batch (two rows on two tiers): no prefix group
  // has two members in a call.
  bool one_row_a_call = false;
};

// The KV cache in memory, staged from cpu or disk, over the three tiers with the cpu part
// attended in place: shared rows cross GPU batches and tiers.
std::vector<Placement> placements() {
  std::vector<Placement> out;
  auto add = [&](std::string name, std::int64_t gbs, std::int64_t k, offload::TierFractions weights,
                 offload::TierFractions cache, bool stage, bool cpu_compute) {
    Placement s;
    s.policy.gpu_batch_size = gbs;
    s.policy.num_gpu_batches = k;
    s.policy.weights = weights;
    s.policy.cache = cache;
    s.policy.activations = {0.5, 0.5, 0};
    s.policy.cpu_cache_compute = cpu_compute;
    s.always_stage = stage;
    s.name = std::move(name);
    out.push_back(s);
  };
  add("in memory", 4, 1, {1, 0, 0}, {1, 0, 0}, false, false);
  add("cache on cpu", 2, 3, {0.5, 0.5, 0}, {0, 1, 0}, false, false);
  add("cache on disk", 3, 2, {0.3, 0.4, 0.3}, {0, 0, 1}, true, false);
  add("cache over three tiers", 2, 3, {0.3, 0.4, 0.3}, {0.34, 0.33, 0.33}, true, true);
  out.back().one_row_a_call = true;
  return out;
}

// The CPU backend, counting the decode queries that read a shared prefix in another row, and
// those whose row starts after a prefix held in a pool.
class SharedPrefixReads final : public testing::ForwardingBackend {
 public:
  std::atomic<std::int64_t> queries = 0, held = 0;

 protected:
  void do_attention_decode(const kernels::AttentionDecodeArgs& a) override {
    for (const std::int64_t base : a.row_base) held += base > 0 && a.prefix_cache.k != nullptr;
    if (kernels::shared_prefix_applies(a))
      for (std::size_t i = 0; i < a.prefix_of.size(); ++i) {
        const std::int64_t p = a.prefix_of[i];
        const std::int64_t row = a.cache_rows.empty() ? static_cast<std::int64_t>(i) : a.cache_rows[i];
        if (p < 0) continue;
        const kernels::SharedPrefix& prefix = a.shared_prefixes[static_cast<std::size_t>(p)];
        if (prefix.len > 0 && prefix.row != row) ++queries;
      }
    inner().attention_decode(a);
  }
};

// `shared_reads`: where given, the decode queries that read a shared prefix in another row;
// `held_reads`: those whose own row starts after a held prefix.
GenerationResult run_scheduler(const engine::ModelConfig& cfg, const engine::WeightSource& src, const Placement& s,
                               const GenerationRequest& req, std::int64_t* shared_reads = nullptr,
                               std::int64_t* held_reads = nullptr, engine::KvHeld* kv_held = nullptr) {
  SharedPrefixReads be;
  testing::TempDir dir;
  offload::TierOptions to;
  to.offload_dir = dir.path();
  offload::Tiers tiers(be, to);
  GenerationResult r;
  {
    engine::BlockExecutor sched(be, tiers, cfg, src, s.policy, nullptr, {s.always_stage});
    r = serving::generate(sched, req);
    if (kv_held) *kv_held = sched.kv_held();
  }
  if (shared_reads) *shared_reads = be.queries;
  if (held_reads) *held_reads = be.held;
  for (offload::Tier t : {offload::Tier::Gpu, offload::Tier::Cpu, offload::Tier::Disk})
    EXPECT_EQ(tiers.budget(t).used(), 0) << tier_name(t);
  return r;
}

// With sharing on and off: every request's tokens are its solo run's, and the counters add up
// (something shared when `shares`, nothing otherwise); returns the run with sharing on.
GenerationResult expect_sharing_changes_no_token(const engine::ModelConfig& cfg, const engine::WeightSource& src,
                                                 const Placement& s, GenerationRequest req, bool shares) {
  SCOPED_TRACE(s.name);
  auto be = kernels::make_cpu_backend();
  req.slots = s.policy.block_size();
  req.prefill_budget = 24;
  req.hold_prefixes = false;  // copies (HeldPrefixes* hold them once)
  GenerationResult on_off[2];
  for (const bool share : {true, false}) {
    SCOPED_TRACE(share ? "sharing on" : "sharing off");
    req.share_prefixes = share;
    const auto c = testing::expect_refill_matches_solo(*be, cfg, src, s.policy, req, {s.always_stage});
    EXPECT_EQ(c.requests, req.sequences.size());
    std::int64_t shared_reads = 0;
    const GenerationResult r = on_off[share ? 0 : 1] = run_scheduler(cfg, src, s, req, &shared_reads);
    EXPECT_EQ(r.prompt_tokens - r.prompt_tokens_computed, r.prefix_shared_tokens);
    if (share && shares) {
      EXPECT_GT(r.prefix_hits, 0);
      EXPECT_LT(r.prompt_tokens_computed, r.prompt_tokens);
      if (s.one_row_a_call)
        EXPECT_EQ(shared_reads, 0);
      else
        EXPECT_GT(shared_reads, 0);
    } else {
      EXPECT_EQ(r.prefix_hits, 0);
      EXPECT_EQ(r.prompt_tokens_computed, r.prompt_tokens);
      EXPECT_EQ(shared_reads, 0);
    }
  }
  // Both runs equal the solo runs; where neither met a near-tie, they equal each other.
  EXPECT_EQ(on_off[0].prompt_tokens, on_off[1].prompt_tokens);
  EXPECT_EQ(on_off[0].tokens.size(), on_off[1].tokens.size());
  return on_off[0];
}

TEST(PrefixSharing, TokensAsWithoutSharingOverTheTiersStories260k) {
  auto m = engine::open_model({});
  std::uint64_t seed = 4500;
  for (const Placement& s : placements()) {
    const GenerationRequest req = mixed_request(m.config.vocab_size, seed++);
    const GenerationResult on = expect_sharing_changes_no_token(m.config, *m.weights, s, req, true);
    EXPECT_GT(on.prefix_shared_tokens, on.prompt_tokens / 3) << s.name;
  }
}

TEST(PrefixSharing, TokensAsWithoutSharingLlamaGqa) {
  const engine::ModelConfig cfg = testing::tiny_llama_config();
  engine::DummyWeights src(cfg, 45);
  std::uint64_t seed = 4600;
  for (const Placement& s : placements())
    expect_sharing_changes_no_token(cfg, src, s, mixed_request(cfg.vocab_size, seed++), true);
}

// Each request as alone with sharing on and off, and the greedy tokens with sharing those of
// the run without.
void expect_greedy_tokens_as_without_sharing(const engine::ModelSource& m, const Placement& s, std::uint64_t seed) {
  GenerationRequest req = mixed_request(m.config.vocab_size, seed);
  expect_sharing_changes_no_token(m.config, *m.weights, s, req, true);
  for (engine::Sequence& seq : req.sequences) seq.sampling->temperature = 0.0f;
  req.slots = s.policy.block_size();
  const GenerationResult on = run_scheduler(m.config, *m.weights, s, req);
  req.share_prefixes = false;
  EXPECT_EQ(on.tokens, run_scheduler(m.config, *m.weights, s, req).tokens) << s.name;
}

// A compressed cache: every prompt row attends over the K/V as stored (re-rounded to q8/q4),
// so a row after a shared prefix sees what its own prefill would.
TEST(PrefixSharing, CompressedCacheShares) {
  auto m = engine::open_model({});
  for (const int bits : {8, 4}) {
    Placement s = placements()[3];
    s.policy.compress_cache = true;
    s.policy.compress_bits = bits;
    s.name += " q" + std::to_string(bits);
    expect_greedy_tokens_as_without_sharing(m, s, 4700 + static_cast<std::uint64_t>(bits));
  }
}

// A 16-bit cache under fp32 compute: a prompt's own rows attend over their K/V rounded to the
// cache's dtype, the values a shared prefix is read back with.
TEST(PrefixSharing, SixteenBitCacheShares) {
  auto m = engine::open_model({});
  for (const kernels::DType dtype : {kernels::DType::F16, kernels::DType::BF16})
    for (const std::size_t placement : {0u, 3u}) {
      Placement s = placements()[placement];
      s.policy.cache_storage = dtype;
      s.name += std::string(" cache ") + std::string(kernels::dtype_name(dtype));
      expect_greedy_tokens_as_without_sharing(m, s, 4800 + placement + 10 * static_cast<std::uint64_t>(dtype));
    }
}

// A KV policy keeps each sequence's own slots: nothing is shared, tokens as without.
TEST(PrefixSharing, OffUnderKvEviction) {
  auto m = engine::open_model({});
  Placement s = placements()[1];
  s.policy.kv = "h2o:0.5";
  s.name += ", h2o";
  expect_sharing_changes_no_token(m.config, *m.weights, s, mixed_request(m.config.vocab_size, 4800), false);
  EXPECT_NE(engine::prefix_sharing_off_reason(m.config, true), "");
  EXPECT_EQ(engine::prefix_sharing_off_reason(m.config, false), "");
}

// Admissions worked out by hand, 4 slots in one GPU batch, instructions A of 40 tokens:
// step 0: P0 = A + 8 prefills (48); P1 = A + 8 others waits, as P0 prefills its longest prefix;
// step 1: P1 takes A from slot 0 (8 rows); P2 = P1 waits for P1's 47 (longer than A by 7);
// step 2: P2 takes 47 of P1 (1 row); P3 = 20 tokens of A + 5 takes 20 from a row (5 rows).
TEST(PrefixSharing, CountersOfHandWorkedAdmissions) {
  auto m = engine::open_model({});
  std::mt19937_64 rng(4900);
  const auto vocab = m.config.vocab_size;
  const Tokens a = random_tokens(rng, 40, vocab);
  GenerationRequest req;
  req.sequences = engine::sequences_of({join(a, random_tokens(rng, 8, vocab)), join(a, random_tokens(rng, 8, vocab))});
  req.sequences.push_back(req.sequences[1]);
  req.sequences.push_back({.prompt = join(Tokens(a.begin(), a.begin() + 20), random_tokens(rng, 5, vocab))});
  req.max_new_tokens = 4;
  req.slots = 4;
  req.min_shared_prefix = 4;
  req.hold_prefixes = false;  // copies (HeldPrefixes* hold them once)
  Placement s = placements()[0];
  const GenerationResult r = run_scheduler(m.config, *m.weights, s, req);
  EXPECT_EQ(r.prompt_tokens, 3 * 48 + 25);
  EXPECT_EQ(r.prompt_tokens_computed, 48 + 8 + 1 + 5);
  EXPECT_EQ(r.prefix_hits, 3);
  EXPECT_EQ(r.prefix_shared_tokens, 40 + 47 + 20);
  EXPECT_EQ(r.prefill_steps, 3);
  // Below the fewest worth sharing, each prefills its own.
  req.min_shared_prefix = 48;
  const GenerationResult none = run_scheduler(m.config, *m.weights, s, req);
  EXPECT_EQ(none.prefix_hits, 0);
  EXPECT_EQ(none.prompt_tokens_computed, none.prompt_tokens);
  EXPECT_EQ(none.tokens, r.tokens);
}

// One slot: the next request starts with what the slot's last one held (its prompt and the
// tokens it generated), as llama.cpp's cache_prompt; a prompt held whole still computes its
// last token for its logits.
TEST(PrefixSharing, ASlotReusesItsOwnRow) {
  auto m = engine::open_model({});
  std::mt19937_64 rng(4950);
  const Tokens a = random_tokens(rng, 30, m.config.vocab_size);
  GenerationRequest req;
  req.sequences = engine::sequences_of({a, a, join(a, random_tokens(rng, 3, m.config.vocab_size))});
  req.max_new_tokens = 5;
  req.slots = 1;
  req.min_shared_prefix = 4;
  for (const bool share : {true, false}) {
    req.share_prefixes = share;
    auto be = kernels::make_cpu_backend();
    const auto c = testing::expect_refill_matches_solo(*be, m.config, *m.weights, placements()[0].policy, req);
    EXPECT_EQ(c.requests, 3u);
  }
  req.share_prefixes = true;
  const GenerationResult r = run_scheduler(m.config, *m.weights, placements()[0], req);
  EXPECT_EQ(r.prefix_hits, 2);
  EXPECT_EQ(r.prefix_shared_tokens, 29 + 30);
  EXPECT_EQ(r.prompt_tokens_computed, 30 + 1 + 3);
}

// Prompts behind two instructions (40 and 30 tokens) with items of 1 to 12 tokens, and two that
// share nothing (at most 14 tokens); 1 to 9 new tokens each, greedy. Over 8 slots, holding the
// instructions once takes less memory than a row of 61 slots for each.
GenerationRequest held_request(std::int64_t vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const Tokens a = random_tokens(rng, 40, vocab), b = random_tokens(rng, 30, vocab);
  GenerationRequest req;
  for (int i = 0; i < 18; ++i) {
    const Tokens item = random_tokens(rng, 1 + rng() % 12, vocab);
    req.sequences.push_back({.prompt = i % 9 == 4 ? random_tokens(rng, 2 + rng() % 13, vocab) : join(i % 3 ? a : b, item),
                             .max_new_tokens = 1 + static_cast<std::int64_t>(rng() % 9)});
  }
  req.max_new_tokens = 9;
  req.min_shared_prefix = 4;
  return req;
}

// Prefixes held once in a pool (GenerationRequest::hold_prefixes): every request's
// tokens are its solo run's, rows after a held prefix were read (none when the prefix is
// copied instead), and the greedy tokens are those of the run without sharing. Returns what
// the run held once.
engine::KvHeld expect_held_prefixes_change_no_token(const engine::ModelConfig& cfg, const engine::WeightSource& src,
                                                    Placement s, GenerationRequest req) {
  SCOPED_TRACE(s.name);
  req.slots = s.policy.block_size();
  req.prefill_budget = 24;
  auto be = kernels::make_cpu_backend();
  for (const bool hold : {true, false}) {
    SCOPED_TRACE(hold ? "held once" : "copied");
    req.hold_prefixes = hold;
    EXPECT_EQ(testing::expect_refill_matches_solo(*be, cfg, src, s.policy, req).requests, req.sequences.size());
    std::int64_t held_reads = 0;
    const GenerationResult r = run_scheduler(cfg, src, s, req, nullptr, &held_reads);
    EXPECT_EQ(r.prompt_tokens - r.prompt_tokens_computed, r.prefix_shared_tokens);
    EXPECT_GT(r.prefix_hits, 10);
    if (hold)
      EXPECT_GT(held_reads, 0);
    else
      EXPECT_EQ(held_reads, 0);
  }
  req.hold_prefixes = true;
  engine::KvHeld kv_held;
  const GenerationResult held = run_scheduler(cfg, src, s, req, nullptr, nullptr, &kv_held);
  req.share_prefixes = false;
  EXPECT_EQ(held.tokens, run_scheduler(cfg, src, s, req).tokens);
  return kv_held;
}

engine::KvHeld expect_held_prefixes_change_no_token(const engine::ModelConfig& cfg, const engine::WeightSource& src,
                                                    const Placement& s, std::uint64_t seed) {
  return expect_held_prefixes_change_no_token(cfg, src, s, held_request(cfg.vocab_size, seed));
}

Placement in_memory_two_batches() {
  Placement s = placements()[0];
  s.policy.num_gpu_batches = 2;
  s.name += ", two GPU batches";
  return s;
}

// Per-document questions: 10 documents (prefixes of 20 to 40 tokens) of 3 questions each
// (items of 1 to 12 tokens, 1 to 9 new tokens), a document's questions one after another, then
// a last question on documents 0 and 4 (whose rows other documents took by then).
GenerationRequest per_document_request(std::int64_t vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  GenerationRequest req;
  std::vector<Tokens> documents;
  auto ask = [&](const Tokens& document) {
    req.sequences.push_back({.prompt = join(document, random_tokens(rng, 1 + rng() % 12, vocab)),
                             .max_new_tokens = 1 + static_cast<std::int64_t>(rng() % 9)});
  };
  for (int d = 0; d < 10; ++d) {
    documents.push_back(random_tokens(rng, 20 + rng() % 21, vocab));
    for (int q = 0; q < 3; ++q) ask(documents.back());
  }
  ask(documents[0]);
  ask(documents[4]);
  req.max_new_tokens = 9;
  req.min_shared_prefix = 4;
  return req;
}

// More families than the block's running requests hold at once: the pool has fewer rows than
// families, a family takes a free row when its first request in a while comes (filling it again
// where the row went to another family), and nothing changes a token.
TEST(PrefixSharing, HeldPrefixesTakeTurnsInFewerRows) {
  auto m = engine::open_model({});
  Placement disk = placements()[2];
  disk.policy.compress_cache = true;
  disk.name += " q8";
  std::uint64_t seed = 5300;
  for (const Placement& s : {in_memory_two_batches(), disk}) {
    const engine::KvHeld held =
        expect_held_prefixes_change_no_token(m.config, *m.weights, s, per_document_request(m.config.vocab_size, seed++));
    EXPECT_EQ(held.prefixes, 10) << s.name;
    EXPECT_LT(held.rows, held.prefixes) << s.name;
    EXPECT_GT(held.fills, held.prefixes) << s.name;  // documents 0 and 4 filled again
  }
  const engine::ModelConfig cfg = testing::tiny_llama_config();
  engine::DummyWeights src(cfg, 53);
  const engine::KvHeld held =
      expect_held_prefixes_change_no_token(cfg, src, placements()[1], per_document_request(cfg.vocab_size, seed));
  EXPECT_LT(held.rows, held.prefixes);
}

// Each document's second question asked twice, the two sharing one prefill (an OpenAI request
// with n = 2): the fork copies the first's own row after the held prefix and reads the pool (in
// memory, and staged from disk).
TEST(PrefixSharing, HeldPrefixesWithSharedPrefills) {
  auto m = engine::open_model({});
  const GenerationRequest questions = per_document_request(m.config.vocab_size, 5400);
  GenerationRequest req = questions;
  req.sequences.clear();
  for (std::size_t i = 0; i < questions.sequences.size(); ++i) {
    req.sequences.push_back(questions.sequences[i]);
    if (i % 3 != 1 || i >= 30) continue;
    req.sequences.push_back(questions.sequences[i]);
    req.sequences.back().shares_prompt = true;
  }
  Placement pool_on_disk = in_memory_two_batches();
  pool_on_disk.policy.prefix_pool = "disk";
  pool_on_disk.name += ", pool on disk";
  for (const Placement& s : {in_memory_two_batches(), pool_on_disk}) {
    SCOPED_TRACE(s.name);
    req.slots = s.policy.block_size();
    req.prefill_budget = 24;
    req.share_prefixes = true;
    auto be = kernels::make_cpu_backend();
    EXPECT_EQ(testing::expect_refill_matches_solo(*be, m.config, *m.weights, s.policy, req).requests,
              req.sequences.size());
    engine::KvHeld kv_held;
    const GenerationResult held = run_scheduler(m.config, *m.weights, s, req, nullptr, nullptr, &kv_held);
    EXPECT_EQ(kv_held.prefixes, 10);
    EXPECT_GT(kv_held.rows, 0);
    EXPECT_EQ(kv_held.pools[s.policy.prefix_pool == "disk" ? 2 : 0], 1);
    req.share_prefixes = false;
    EXPECT_EQ(held.tokens, run_scheduler(m.config, *m.weights, s, req).tokens);
  }
}

TEST(PrefixSharing, HeldPrefixesStories260k) {
  auto m = engine::open_model({});
  expect_held_prefixes_change_no_token(m.config, *m.weights, in_memory_two_batches(), 5000);
  for (const int bits : {8, 4}) {
    Placement s = in_memory_two_batches();
    s.policy.compress_cache = true;
    s.policy.compress_bits = bits;
    s.name += " q" + std::to_string(bits);
    expect_held_prefixes_change_no_token(m.config, *m.weights, s, 5010 + static_cast<std::uint64_t>(bits));
  }
  for (const kernels::DType dtype : {kernels::DType::F16, kernels::DType::BF16}) {
    Placement s = in_memory_two_batches();
    s.policy.cache_storage = dtype;
    s.name += std::string(" cache ") + std::string(kernels::dtype_name(dtype));
    expect_held_prefixes_change_no_token(m.config, *m.weights, s, 5020 + static_cast<std::uint64_t>(dtype));
  }
}

TEST(PrefixSharing, HeldPrefixesLlamaGqa) {
  const engine::ModelConfig cfg = testing::tiny_llama_config();
  engine::DummyWeights src(cfg, 50);
  expect_held_prefixes_change_no_token(cfg, src, in_memory_two_batches(), 5100);
}

// Layers under a sliding window shorter than the prefixes (alternating, as Gemma 2's): a
// member sees its prefix from its window's first slot, or none of it once the window has moved
// past; copied prefixes are read once for a group all the same, held ones from the pool, in
// memory and staged from disk.
TEST(PrefixSharing, SlidingWindows) {
  engine::ModelConfig cfg = testing::tiny_llama_config();
  cfg.layer_window = {8, 0, 8};
  engine::DummyWeights src(cfg, 54);
  std::uint64_t seed = 5150;
  for (const std::size_t placement : {0u, 2u})
    expect_sharing_changes_no_token(cfg, src, placements()[placement], mixed_request(cfg.vocab_size, seed++), true);
  expect_held_prefixes_change_no_token(cfg, src, in_memory_two_batches(), seed++);
  expect_held_prefixes_change_no_token(cfg, src, placements()[2], per_document_request(cfg.vocab_size, seed));
}

// The pool on the gpu tier, the rows after it staged from cpu or disk (compressed there) or
// attended in place on the cpu tier.
TEST(PrefixSharing, HeldPrefixesOverTheTiers) {
  auto m = engine::open_model({});
  std::uint64_t seed = 5200;
  const std::vector<Placement> all = placements();
  for (Placement s : std::span(all).subspan(1)) {
    if (s.name == "cache on disk") {
      s.policy.compress_cache = true;
      s.name += " q8";
    }
    expect_held_prefixes_change_no_token(m.config, *m.weights, s, seed++);
  }
  const engine::ModelConfig cfg = testing::tiny_llama_config();
  engine::DummyWeights src(cfg, 52);
  expect_held_prefixes_change_no_token(cfg, src, placements()[2], seed);
}

// A run of `s` whose gpu tier holds at most gpu_bytes (and disk tier disk_bytes): its tokens,
// the gpu tier's peak, what it held once.
struct GpuTierRun {
  GenerationResult result;
  std::int64_t gpu_peak = 0;
  engine::KvHeld held;
};
GpuTierRun run_with_gpu_bytes(const engine::ModelConfig& cfg, const engine::WeightSource& src, const Placement& s,
                              const GenerationRequest& req, std::int64_t gpu_bytes,
                              std::int64_t disk_bytes = offload::Budget::kUnlimited) {
  auto be = kernels::make_cpu_backend();
  testing::TempDir dir;
  offload::Tiers tiers(*be, {.gpu_bytes = gpu_bytes, .disk_bytes = disk_bytes, .offload_dir = dir.path()});
  engine::BlockExecutor sched(*be, tiers, cfg, src, s.policy, nullptr, {s.always_stage});
  GpuTierRun r{.result = serving::generate(sched, req)};
  r.gpu_peak = tiers.budget(offload::Tier::Gpu).peak();
  r.held = sched.kv_held();
  return r;
}

// The pool off the gpu tier (--prefix-pool): on cpu staged through the ring slots, or read in
// place there with cpu_cache_compute (the three tiers' placement); on disk staged. The rows live
// where the policy puts them; a per-document job's families take turns in the rows from disk.
TEST(PrefixSharing, HeldPrefixesInAPoolOnEachTier) {
  auto m = engine::open_model({});
  std::uint64_t seed = 5500;
  const std::vector<Placement> all = placements();
  for (const offload::Tier tier : {offload::Tier::Cpu, offload::Tier::Disk}) {
    for (Placement s : {all[0], all[2], all[3]}) {
      s.policy.prefix_pool = offload::tier_name(tier);
      s.name += ", pool on " + s.policy.prefix_pool;
      const engine::KvHeld held = expect_held_prefixes_change_no_token(m.config, *m.weights, s, seed++);
      EXPECT_EQ(held.pools[static_cast<std::size_t>(tier)], 1) << s.name;
    }
  }
  Placement disk = placements()[2];
  disk.policy.compress_cache = true;
  disk.policy.prefix_pool = "disk";
  disk.name += " q8, pool on disk";
  const engine::KvHeld turns =
      expect_held_prefixes_change_no_token(m.config, *m.weights, disk, per_document_request(m.config.vocab_size, seed));
  EXPECT_LT(turns.rows, turns.prefixes);
  EXPECT_GT(turns.fills, turns.prefixes);
  const engine::ModelConfig cfg = testing::tiny_llama_config();
  engine::DummyWeights src(cfg, 55);
  Placement cpu = placements()[1];
  cpu.policy.prefix_pool = "cpu";
  expect_held_prefixes_change_no_token(cfg, src, cpu, seed + 1);
}

// With the KV rows on cpu the pool takes more of the gpu tier than the shorter rows' staging
// slots give back. Where the gpu tier holds less than the pool needs, the pool goes to the cpu
// tier (staged: its ring buffers, a layer's pool, take less of the gpu than every layer's), also
// where the policy names the gpu (then the slower tiers); a pool asked for on disk where the disk
// holds none is not held: the rows copy the prefixes, with the copies' peak (the pool's try left
// none). The same tokens each way.
TEST(PrefixSharing, APoolThatDoesNotFitOnTheGpuTierMovesOrIsCopied) {
  auto m = engine::open_model({});
  Placement s = placements()[1];
  GenerationRequest req = held_request(m.config.vocab_size, 5300);
  req.slots = s.policy.block_size();
  req.prefill_budget = 24;
  const std::int64_t unlimited = offload::Budget::kUnlimited;
  req.hold_prefixes = false;
  const GpuTierRun copied = run_with_gpu_bytes(m.config, *m.weights, s, req, unlimited);
  req.hold_prefixes = true;
  const GpuTierRun held = run_with_gpu_bytes(m.config, *m.weights, s, req, unlimited);
  ASSERT_EQ(held.held.prefixes, 2);
  ASSERT_EQ(held.held.pools[0], 1);
  ASSERT_GT(held.gpu_peak, copied.gpu_peak);
  const std::int64_t between = (copied.gpu_peak + held.gpu_peak) / 2;
  const GpuTierRun moved = run_with_gpu_bytes(m.config, *m.weights, s, req, between);
  EXPECT_EQ(moved.held.prefixes, 2);
  EXPECT_EQ(moved.held.pools[1], 1);
  EXPECT_LT(moved.gpu_peak, held.gpu_peak);
  EXPECT_EQ(moved.result.tokens, copied.result.tokens);
  s.policy.prefix_pool = "gpu";
  EXPECT_EQ(run_with_gpu_bytes(m.config, *m.weights, s, req, between).held.pools[1], 1);
  s.policy.prefix_pool = "disk";
  const GpuTierRun tight = run_with_gpu_bytes(m.config, *m.weights, s, req, between, 1);
  EXPECT_EQ(tight.held.prefixes, 0);
  EXPECT_EQ(tight.gpu_peak, copied.gpu_peak);
  EXPECT_GT(tight.result.prefix_hits, 10);
  EXPECT_EQ(tight.result.tokens, copied.result.tokens);
}

// Families, worked out by hand (min 4 tokens; A: 20 tokens, B: 15): A + x, A + y, A + z and D
// (A's first 10 tokens + 2) sort in a run linked by 20, 20, 10: cut at the 10, A's three save
// 2 x 20 > 3 x 10, and D is left alone; B + u, B + v share 15; C shares nothing. With D1..D3
// sharing only A's 10 tokens, and A's two members, the whole run saves 4 x 10 > 20 (A's pair
// alone). A prompt that is all of another's prefix shares at most its length less one.
TEST(PrefixSharing, PrefixFamiliesByHand) {
  const Tokens a = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29};
  const Tokens b = {50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64};
  const Tokens a10(a.begin(), a.begin() + 10);
  auto families = [](const std::vector<Tokens>& prompts) {
    const std::vector<std::span<const std::int32_t>> spans(prompts.begin(), prompts.end());
    return engine::prefix_families(spans, 4);
  };
  const engine::PrefixFamilies f = families({join(a, {1}), join(b, {1}), join(a, {2}), join(a10, {99, 98}), {200, 201, 202},
                                             join(a, {3}), join(b, {2})});
  ASSERT_EQ(f.prefix, (std::vector<std::int64_t>{20, 15}));
  EXPECT_EQ(f.family_of, (std::vector<std::int64_t>{0, 1, 0, -1, -1, 0, 1}));
  const engine::PrefixFamilies whole =
      families({join(a, {1}), join(a10, {97}), join(a, {2}), join(a10, {98}), join(a10, {99})});
  ASSERT_EQ(whole.prefix, (std::vector<std::int64_t>{10}));
  EXPECT_EQ(whole.family_of, (std::vector<std::int64_t>{0, 0, 0, 0, 0}));
  const engine::PrefixFamilies capped = families({a, join(a, {1}), join(a, {2})});
  ASSERT_EQ(capped.prefix, (std::vector<std::int64_t>{19}));
  EXPECT_EQ(families({{1, 2, 3, 4, 5}, {1, 2, 3, 9}}).prefix.size(), 0u);
}

TEST(PrefixSharing, LongestPrefixLeavesOneTokenAndPrefersTheSlotItself) {
  const Tokens prompt = {5, 6, 7, 8, 9};
  const Tokens whole = {5, 6, 7, 8, 9, 10}, three = {5, 6, 7}, other = {6, 6, 7, 8};
  const std::vector<std::span<const std::int32_t>> held = {three, whole, whole, other};
  EXPECT_EQ(engine::common_prefix(prompt, whole), 5);
  const engine::PrefixMatch m = engine::longest_prefix(prompt, held, 0, 2);
  EXPECT_EQ(m.slot, 1);
  EXPECT_EQ(m.tokens, 4);
  EXPECT_EQ(engine::longest_prefix(prompt, held, 2, 2).slot, 2);
  EXPECT_EQ(engine::longest_prefix(prompt, held, 0, 5).slot, -1);
  EXPECT_EQ(engine::longest_prefix(Tokens{5}, held, 0, 1).slot, -1);
}

}  // namespace
}  // namespace flexh2o
