// The block scheduler against the plain in-memory run: for random policies (tier fractions
// including disk, GPU batch size, number of GPU batches, overlap, sep_layer,
// cpu_cache_compute, staged copies, KV eviction, 4/8-bit compression of weights and KV) the
// generated tokens must be identical to the plain run with the same eviction and compression.
// Mixture-of-experts models also with only the routed experts loaded, or all of them, and with
// staging slots for fewer experts than a batch routes to (the MoE layer then runs in chunks).
// Also: the staged KV copies (one strided piece per sequence and K/V) and the device scratch
// of the backend's ops counted in the gpu budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <iterator>
#include <random>

#include "engine/runtime/block_executor.h"
#include "engine/serving/generate.h"
#include "engine/runtime/kv_staging.h"
#include "engine/loaders/dummy_weights.h"
#include "engine/model/model_shape.h"
#include "engine/loaders/model_source.h"
#include "kernels/cpu/gemm_cpu.h"
#include "policy/cost_model.h"
#include "policy/eviction/kv_spec.h"
#include "kernels/option_error.h"
#include "tests/support/forwarding_backend.h"
#include "tests/support/refill_check.h"
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
                      "streaming:0.3", "flex:0.3", "scissorhands:0.3,recent=1,sink=1"};
  p.kv = rng() % 2 ? "full" : kv[rng() % std::size(kv)];
  c.always_stage = rng() % 2;
  c.force_threads = rng() % 4 == 0;
  p.compress_weight = rng() % 3 == 0;
  p.compress_cache = rng() % 3 == 0;
  p.compress_bits = rng() % 4 == 0 ? 8 : 4;
  p.resident_embeddings = rng() % 3 == 0;
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
         std::to_string(p.compress_bits) + " experts " + p.expert_loading + " expert_slots " +
         std::to_string(p.expert_slots) + " resident_embeddings " + std::to_string(p.resident_embeddings);
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

// Each prompt's own new tokens limit in [1, 8] (a prompts line's max_tokens).
std::vector<std::int64_t> random_limits(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x5eed);
  std::vector<std::int64_t> out(n);
  for (auto& l : out) l = 1 + static_cast<std::int64_t>(rng() % 8);
  return out;
}

void expect_same_tokens(const Case& c, const ModelConfig& cfg, const engine::WeightSource& src, std::uint64_t seed,
                        float temperature, bool own_limits = false) {
  SCOPED_TRACE("seed " + std::to_string(seed) + ": " + describe(c) + (own_limits ? ", own limits" : ""));
  GenerationRequest req;
  req.sequences = engine::sequences_of(random_prompts(cfg, c.policy.block_size(), seed));
  req.max_new_tokens = 8;
  if (own_limits) {
    const auto limits = random_limits(req.sequences.size(), seed);
    for (std::size_t b = 0; b < limits.size(); ++b) req.sequences[b].max_new_tokens = limits[b];
  }
  req.sampling = {.temperature = temperature, .top_p = 0.9f, .seed = seed};

  auto be = kernels::make_cpu_backend();
  const ModelConfig stored = engine::with_weight_dtype(cfg, c.policy.weight_dtype(cfg.dtype));
  const auto host = engine::load_weights(stored, src);
  engine::Generator plain(*be, stored, host, c.policy.cache_dtype(cfg.dtype));
  const auto kv = c.policy.kv == "full" ? nullptr
                                        : policy::make_kv_policy(policy::parse_kv_spec(c.policy.kv), cfg.n_layers);
  req.kv = kv.get();
  const auto want = plain.generate(req).tokens;
  for (std::size_t b = 0; b < want.size(); ++b)
    EXPECT_LE(static_cast<std::int64_t>(want[b].size()), engine::new_tokens_limit(req, b)) << "prompt " << b;
  req.kv = nullptr;  // the scheduler takes it from its policy

  testing::TempDir dir;
  offload::TierOptions to;
  to.offload_dir = dir.path();
  to.force_disk_threads = c.force_threads;
  to.pin_host = c.policy.pin_weight;
  offload::Tiers tiers(*be, to);
  {
    engine::BlockExecutor sched(*be, tiers, cfg, src, c.policy, nullptr, {c.always_stage});
    EXPECT_EQ(serving::generate(sched, req).tokens, want);
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

// flex reads each token's value norm from the step's V rows and merges each evicted value into
// a kept slot of whichever tier holds it: with the cache split over the gpu, cpu and disk tiers
// and staged, the cpu part attended where it lies or not, with and without a 4-bit cache and
// merging, its choices (and so the tokens) must be the plain run's.
TEST(Scheduler, FlexEvictionOffloadedMatchesInMemoryRun) {
  auto m = engine::open_model({});
  for (const bool compress : {false, true})
    for (const bool cpu_cache_compute : {false, true})
      for (const char* kv : {"flex:0.3,sink=1", "flex:0.3,sink=1,merge=0"}) {
        Case c;
        c.policy.gpu_batch_size = 2;
        c.policy.num_gpu_batches = 2;
        c.policy.weights = {0.5, 0.5, 0};
        c.policy.cache = {0.25, 0.25, 0.5};
        c.policy.kv = kv;
        c.policy.compress_cache = compress;
        c.policy.cpu_cache_compute = cpu_cache_compute;
        c.always_stage = true;
        expect_same_tokens(c, m.config, *m.weights, 400 + static_cast<std::uint64_t>(compress), 0.0f);
      }
}

// Requests with their own limits: every offloaded, evicting or compressed schedule stops each
// sequence where the plain run does.
TEST(Scheduler, PerRequestLimitsMatchInMemoryRun) {
  auto m = engine::open_model({});
  for (std::uint64_t seed = 500; seed < 508; ++seed) expect_same_tokens(random_case(seed), m.config, *m.weights, seed, 0.0f, true);
}

// Without eviction a sequence's tokens do not depend on its limit: under its own limit it gets
// the first tokens of the run that gives every sequence the largest limit (or stops at a stop id).
TEST(Scheduler, PerRequestLimitsCutEachSequenceAtItsOwnLimit) {
  auto m = engine::open_model({});
  auto be = kernels::make_cpu_backend();
  const auto host = engine::load_weights(m.config, *m.weights);
  engine::Generator plain(*be, m.config, host);
  GenerationRequest req;
  req.sequences = engine::sequences_of(random_prompts(m.config, 6, 77));
  req.max_new_tokens = 24;
  const auto full = plain.generate(req).tokens;
  const std::int64_t limits[] = {1, 24, 5, 12, 2, 9};
  for (std::size_t b = 0; b < full.size(); ++b) req.sequences[b].max_new_tokens = limits[b];
  const auto cut = plain.generate(req).tokens;
  for (std::size_t b = 0; b < full.size(); ++b) {
    const auto n = std::min<std::size_t>(full[b].size(), static_cast<std::size_t>(limits[b]));
    EXPECT_EQ(cut[b], std::vector<std::int32_t>(full[b].begin(), full[b].begin() + static_cast<std::ptrdiff_t>(n)))
        << "prompt " << b;
  }
  req.sequences[1].max_new_tokens = 25;  // above the request's max_new_tokens
  EXPECT_THROW(plain.generate(req), std::invalid_argument);
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

// Routed-only expert loading forced on and off, and auto, under random policies; staging
// slots sized from the block (0), or for 1 to 3 of the 6 experts, fewer than most GPU batches
// route to (every prefill does): those run their MoE layers in chunks.
TEST(Scheduler, RandomPoliciesMatchInMemoryRunMoe) {
  const ModelConfig cfg = testing::tiny_moe_config();
  engine::DummyWeights src(cfg, 14);
  const char* loading[] = {"routed", "all", "auto"};
  for (std::uint64_t seed = 400; seed < 436; ++seed) {
    Case c = random_case(seed);
    c.policy.expert_loading = loading[seed % 3];
    if (c.policy.expert_loading != "all") c.policy.expert_slots = static_cast<std::int64_t>((seed / 3) % 4);
    expect_same_tokens(c, cfg, src, seed, seed % 2 ? 0.8f : 0.0f);
  }
}

// Staging slots for fewer experts than the block routes to: the weight staging slots take the
// bytes the planner's memory model gives them (a unit's other weights and expert_slots
// experts); the tokens are those of slots for every expert; each GPU batch fetches its own
// routed experts chunk by chunk, so a decode step fetches at least the experts of the union of
// the batches and, with one slot, re-fetches some of them.
TEST(Scheduler, SmallExpertSlotsRunInChunks) {
  const ModelConfig cfg = testing::tiny_moe_config();
  engine::DummyWeights src(cfg, 16);
  const std::int64_t E = cfg.moe.experts;
  GenerationRequest req;
  req.sequences = engine::sequences_of(random_prompts(cfg, 8, 9));
  req.max_new_tokens = 6;
  auto be = kernels::make_cpu_backend();
  std::vector<std::vector<std::vector<std::int32_t>>> tokens;
  std::vector<engine::ExpertLoadStats> loads;
  for (const bool sep_layer : {true, false})
    for (const std::int64_t slots : {E, std::int64_t{2}, std::int64_t{1}}) {
      SCOPED_TRACE("sep_layer " + std::to_string(sep_layer) + ", slots " + std::to_string(slots));
      policy::Policy p;
      p.gpu_batch_size = 2;
      p.num_gpu_batches = 4;
      p.weights = {0, 1, 0};
      p.sep_layer = sep_layer;
      p.expert_loading = "routed";
      p.expert_slots = slots;
      offload::Tiers tiers(*be, {});
      engine::BlockExecutor sched(*be, tiers, cfg, src, p);
      const auto z = policy::model_sizes(policy::with_compression(engine::model_shape(cfg), p));
      EXPECT_EQ(tiers.budget(offload::Tier::Gpu).used(), 2 * z.staging_slot(slots, sep_layer));
      tokens.push_back(serving::generate(sched, req).tokens);
      loads.push_back(sched.expert_loads());
    }
  for (const auto& t : tokens) EXPECT_EQ(t, tokens[0]);
  const std::int64_t moe_layers = 2, rows = 2 * 4;
  for (std::size_t run : {0u, 3u}) {
    const auto &all = loads[run], &one = loads[run + 2];
    ASSERT_EQ(all.experts_by_step.size(), one.experts_by_step.size());
    bool refetched = false;
    for (std::size_t step = 1; step < all.experts_by_step.size(); ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      EXPECT_GE(one.experts_by_step[step], all.experts_by_step[step]);
      EXPECT_LE(one.experts_by_step[step], moe_layers * rows * cfg.moe.top_k);
      refetched = refetched || one.experts_by_step[step] > all.experts_by_step[step];
    }
    EXPECT_TRUE(refetched);
  }
}

// With the experts on cpu and disk, routed loading fetches at most top_k experts per MoE layer
// for a single sequence's decode step, every expert of them once, with their bytes; loading
// all fetches every expert each step; gpu-resident experts are never fetched. Same tokens.
TEST(Scheduler, RoutedExpertLoadingFetchesOnlyTheRoutedExperts) {
  ModelConfig cfg = testing::tiny_moe_config();
  cfg.moe.shared_ffn = 0;
  engine::DummyWeights src(cfg, 15);
  const std::int64_t moe_layers = 2, E = cfg.moe.experts;
  const std::int64_t expert_bytes = 3 * cfg.moe.expert_ffn * cfg.hidden * 4;
  GenerationRequest req;
  req.sequences = engine::sequences_of(random_prompts(cfg, 1, 7));
  req.max_new_tokens = 6;
  auto be = kernels::make_cpu_backend();
  std::vector<std::vector<std::int32_t>> tokens;
  for (const char* loading : {"routed", "all"}) {
    SCOPED_TRACE(loading);
    policy::Policy p;
    p.weights = {0, 0.5, 0.5};
    p.expert_loading = loading;
    testing::TempDir dir;
    offload::TierOptions to;
    to.offload_dir = dir.path();
    offload::Tiers tiers(*be, to);
    engine::BlockExecutor sched(*be, tiers, cfg, src, p);
    tokens.push_back(serving::generate(sched, req).tokens[0]);
    const auto& s = sched.expert_loads();
    ASSERT_EQ(static_cast<std::int64_t>(s.experts_by_step.size()), req.max_new_tokens);
    for (std::size_t step = 0; step < s.experts_by_step.size(); ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const std::int64_t n = s.experts_by_step[step];
      EXPECT_EQ(s.bytes_by_step[step], n * expert_bytes);
      if (std::string(loading) == "all")
        EXPECT_EQ(n, moe_layers * E);
      else if (step > 0)
        EXPECT_EQ(n, moe_layers * cfg.moe.top_k);  // one row: its top_k distinct experts
      else
        EXPECT_LE(n, moe_layers * E);
    }
  }
  EXPECT_EQ(tokens[0], tokens[1]);
  policy::Policy resident;
  resident.expert_loading = "routed";
  offload::Tiers tiers(*be, {});
  engine::BlockExecutor sched(*be, tiers, cfg, src, resident);
  EXPECT_EQ(serving::generate(sched, req).tokens[0], tokens[0]);
  EXPECT_EQ(sched.expert_loads().experts(), 0);
}

TEST(Scheduler, RandomPoliciesMatchInMemoryRunStories260k) {
  auto m = engine::open_model({});
  for (std::uint64_t seed = 200; seed < 210; ++seed) expect_same_tokens(m.config, *m.weights, seed, 0.0f);
}

// ---- Staged KV copies ------------------------------------------------------------------------

// One layer's K and V of 5 sequences (3 kv heads x 7 slots of 16 bytes), homed on cpu and disk,
// staged into device slots and written back: each sequence's valid slots of all heads move as
// one 2-D piece per K/V (not one piece per head), the bytes counted are the valid ones, and
// exactly those bytes arrive, in both directions; whole heads (eviction) move as whole rows.
TEST(KvStaging, OneStridedPiecePerSequenceAndKv) {
  auto be = kernels::make_cpu_backend();
  testing::TempDir dir;
  offload::TierOptions to;
  to.offload_dir = dir.path();
  offload::Tiers tiers(*be, to);
  const std::int64_t heads = 3, slots = 7, slot = 16, head = slots * slot, row = heads * head, seqs = 5;
  offload::TieredTensor k(tiers, "K", kernels::DType::F32, seqs, heads * slots * 4, {0, 0.6, 0.4}, row);
  offload::TieredTensor v(tiers, "V", kernels::DType::F32, seqs, heads * slots * 4, {0, 0.6, 0.4}, row);
  std::mt19937_64 rng(5);
  auto random_bytes = [&](std::int64_t n) {
    std::vector<unsigned char> b(static_cast<std::size_t>(n));
    for (auto& x : b) x = static_cast<unsigned char>(rng());
    return b;
  };
  offload::Staging staging;
  const auto k_home = random_bytes(seqs * row), v_home = random_bytes(seqs * row);
  k.write_rows(0, seqs, k_home.data(), staging);
  v.write_rows(0, seqs, v_home.data(), staging);
  const std::vector<std::int64_t> lens = {1, 7, 4, 2, 6};  // valid slots per sequence
  std::vector<engine::KvByteRange> load;
  for (std::int64_t n : lens) load.push_back({0, n * slot});
  // Sequences 1..4 staged (0 resident, say): device slots hold rows 1..4.
  const std::span<const engine::KvByteRange> staged(load.data() + 1, 4);
  kernels::DeviceBuffer kd(*be, static_cast<std::size_t>(4 * row)), vd(*be, static_cast<std::size_t>(4 * row));
  std::memset(kd.data(), 0xee, kd.bytes());
  std::memset(vd.data(), 0xee, vd.bytes());
  auto pieces = engine::kv_stage_pieces(k, v, heads, 1, staged, kd.as<std::byte>(), vd.as<std::byte>(), false);
  ASSERT_EQ(pieces.size(), 8u);  // per sequence: K and V, each one piece of 3 rows
  std::int64_t bytes = 0;
  for (const auto& p : pieces) {
    if (p.bytes == row) {  // sequence 1 uses all 7 slots: its heads touch, one contiguous copy
      EXPECT_TRUE(p.contiguous());
    } else {
      EXPECT_EQ(p.rows, heads);
      EXPECT_EQ(p.src_pitch, head);
      EXPECT_EQ(p.dst_pitch, head);
    }
    bytes += p.total();
  }
  EXPECT_EQ(bytes, 2 * heads * (7 + 4 + 2 + 6) * slot);
  offload::copy_pieces_now(tiers, pieces, staging);
  for (std::int64_t i = 0; i < 4; ++i)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t b = 0; b < head; ++b) {
        const std::size_t dev = static_cast<std::size_t>(i * row + h * head + b);
        const std::size_t home = static_cast<std::size_t>((i + 1) * row + h * head + b);
        const bool valid = b < lens[static_cast<std::size_t>(i + 1)] * slot;
        ASSERT_EQ(kd.as<unsigned char>()[dev], valid ? k_home[home] : 0xee) << i << " " << h << " " << b;
        ASSERT_EQ(vd.as<unsigned char>()[dev], valid ? v_home[home] : 0xee) << i << " " << h << " " << b;
      }

  // Write back the last slot of each staged sequence: only those bytes of the homes change.
  std::vector<engine::KvByteRange> last;
  for (std::int64_t i = 1; i < seqs; ++i) last.push_back({(lens[static_cast<std::size_t>(i)] - 1) * slot, lens[static_cast<std::size_t>(i)] * slot});
  std::memset(kd.data(), 0x11, kd.bytes());
  std::memset(vd.data(), 0x22, vd.bytes());
  pieces = engine::kv_stage_pieces(k, v, heads, 1, last, kd.as<std::byte>(), vd.as<std::byte>(), true);
  EXPECT_EQ(pieces.size(), 8u);
  offload::copy_pieces_now(tiers, pieces, staging);
  std::vector<unsigned char> k_back(k_home.size()), v_back(v_home.size());
  k.read_rows(0, seqs, k_back.data(), staging);
  v.read_rows(0, seqs, v_back.data(), staging);
  for (std::int64_t s = 0; s < seqs; ++s)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t b = 0; b < head; ++b) {
        const std::size_t at = static_cast<std::size_t>(s * row + h * head + b);
        const bool written = s > 0 && b / slot == lens[static_cast<std::size_t>(s)] - 1;
        ASSERT_EQ(k_back[at], written ? 0x11 : k_home[at]) << s << " " << h << " " << b;
        ASSERT_EQ(v_back[at], written ? 0x22 : v_home[at]) << s << " " << h << " " << b;
      }

  // Whole heads: whole rows, one piece per tier the sequences touch, per K/V.
  const std::vector<engine::KvByteRange> whole(seqs, engine::KvByteRange{0, head});
  kernels::DeviceBuffer kw(*be, static_cast<std::size_t>(seqs * row)), vw(*be, static_cast<std::size_t>(seqs * row));
  pieces = engine::kv_stage_pieces(k, v, heads, 0, whole, kw.as<std::byte>(), vw.as<std::byte>(), false);
  EXPECT_EQ(pieces.size(), 4u);  // cpu and disk parts of K and of V
  for (const auto& p : pieces) EXPECT_TRUE(p.contiguous());
  offload::copy_pieces_now(tiers, pieces, staging);
  EXPECT_EQ(std::memcmp(kw.data(), k_back.data(), k_back.size()), 0);
  EXPECT_EQ(std::memcmp(vw.data(), v_back.data(), v_back.size()), 0);
}

// ---- Op scratch in the gpu budget ----------------------------------------------------------

// The CPU backend, reporting device scratch for its ops (as the CUDA backend does for its
// conversion panels and attention partials) and recording the largest any call made needs.
class ScratchReportingBackend final : public testing::ForwardingBackend {
 public:
  std::int64_t gemm_scratch_bytes(std::int64_t m, std::int64_t k, std::int64_t n, kernels::DType,
                                  kernels::DType) const override {
    return 2 * m * k + n;
  }
  std::int64_t attention_scratch_bytes(const kernels::AttentionShape& s, std::int64_t rows, std::int64_t batch,
                                       std::int64_t capacity, bool scores) const override {
    return std::max(3 * rows * s.n_heads, 5 * batch * capacity * s.n_heads) + (scores ? 4096 : 0);
  }
  void do_gemm(const kernels::GemmArgs& a) override {
    seen = std::max(seen, gemm_scratch_bytes(a.m, a.w.cols, a.w.rows, a.w.dtype, a.compute));
    ForwardingBackend::do_gemm(a);
  }
  void do_attention_prefill(const kernels::AttentionPrefillArgs& a) override {
    seen = std::max(seen, attention_scratch_bytes(a.shape, a.seq_offsets.back(), 0, 0, a.col_sums != nullptr));
    ForwardingBackend::do_attention_prefill(a);
  }
  void do_attention_decode(const kernels::AttentionDecodeArgs& a) override {
    seen = std::max(seen, attention_scratch_bytes(a.shape, 0, static_cast<std::int64_t>(a.lens.size()), a.capacity,
                                                  a.probs != nullptr));
    ForwardingBackend::do_attention_decode(a);
  }
  std::int64_t seen = 0;
};

// The gpu tier's peak grows by at least the largest scratch any op of the run asked for, and
// a budget one byte short of it is refused.
TEST(Scheduler, ReservesTheBackendsOpScratch) {
  const ModelConfig cfg = testing::tiny_llama_config();
  engine::DummyWeights src(cfg, 21);
  for (const char* kv : {"full", "h2o:0.3"}) {
    SCOPED_TRACE(kv);
    policy::Policy p;
    p.gpu_batch_size = 3;
    p.num_gpu_batches = 2;
    p.weights = {0.5, 0.5, 0};
    p.cache = {0.5, 0.5, 0};
    p.kv = kv;
    GenerationRequest req;
    req.sequences = engine::sequences_of(random_prompts(cfg, p.block_size(), 7));
    req.max_new_tokens = 4;
    auto peak_with = [&](kernels::Backend& be, std::int64_t gpu_bytes) {
      offload::TierOptions to;
      to.gpu_bytes = gpu_bytes;
      offload::Tiers tiers(be, to);
      {
        engine::BlockExecutor sched(be, tiers, cfg, src, p);
        serving::generate(sched, req);
      }
      return tiers.budget(offload::Tier::Gpu).peak();
    };
    auto plain = kernels::make_cpu_backend();
    ScratchReportingBackend scratch;
    const std::int64_t base = peak_with(*plain, offload::Budget::kUnlimited);
    const std::int64_t with = peak_with(scratch, offload::Budget::kUnlimited);
    EXPECT_GT(scratch.seen, 0);
    EXPECT_GE(with - base, scratch.seen);
    EXPECT_THROW(peak_with(scratch, with - 1), offload::BudgetExceeded);
  }
}

// ---- Continuous batching -----------------------------------------------------------------------

// Three blocks' worth of prompts (and one more) with limits of 1 to 12 tokens through the
// block's slots under random policies (tiers, staging, eviction, compression), with a prefill
// budget from one token (a newcomer per GPU batch and step) to all of them: each request's
// tokens are those of its solo in-memory run.
testing::RefillComparison expect_refill_matches_solo(const Case& c, const ModelConfig& cfg,
                                                     const engine::WeightSource& src, std::uint64_t seed,
                                                     float temperature) {
  SCOPED_TRACE("seed " + std::to_string(seed) + ": " + describe(c));
  GenerationRequest req;
  req.sequences = engine::sequences_of(random_prompts(cfg, 3 * c.policy.block_size() + 1, seed));
  std::mt19937_64 rng(seed);
  req.max_new_tokens = 0;
  for (auto& seq : req.sequences) {
    seq.max_new_tokens = 1 + static_cast<std::int64_t>(rng() % 12);
    req.max_new_tokens = std::max(req.max_new_tokens, *seq.max_new_tokens);
  }
  const std::int64_t budgets[] = {1, 6, 512};
  req.prefill_budget = budgets[seed % 3];
  req.sampling = {.temperature = temperature, .top_p = 0.9f, .seed = seed};
  if (temperature > 0)  // each request its own sampling, penalties (over its own history) included
    for (std::size_t b = 0; b < req.sequences.size(); ++b)
      req.sequences[b].sampling = {.temperature = b % 3 == 0 ? 0.0f : temperature,
                                   .top_p = 0.9f,
                                   .top_k = static_cast<std::int32_t>(b % 4) * 5,
                                   .seed = seed + b,
                                   .repetition_penalty = b % 2 ? 1.3f : 1.0f};
  auto be = kernels::make_cpu_backend();
  const auto r = testing::expect_refill_matches_solo(*be, cfg, src, c.policy, req, {c.always_stage});
  if (r.exact < r.requests) std::cout << "note: " << r.requests - r.exact << " of " << r.requests << " requests differ from their solo run (" << r.near_ties << " at near-ties)\n";
  return r;
}

TEST(Scheduler, RefillMatchesSoloRunsStories260k) {
  auto m = engine::open_model({});
  for (std::uint64_t seed = 600; seed < 612; ++seed) expect_refill_matches_solo(random_case(seed), m.config, *m.weights, seed, seed % 2 ? 0.8f : 0.0f);
}

TEST(Scheduler, RefillMatchesSoloRunsOpt) {
  const ModelConfig cfg = testing::tiny_opt_config();
  engine::DummyWeights src(cfg, 11);
  for (std::uint64_t seed = 620; seed < 632; ++seed) expect_refill_matches_solo(random_case(seed), cfg, src, seed, 0.0f);
}

TEST(Scheduler, RefillMatchesSoloRunsLlama) {
  const ModelConfig cfg = testing::tiny_llama_config();
  engine::DummyWeights src(cfg, 12);
  for (std::uint64_t seed = 640; seed < 652; ++seed) expect_refill_matches_solo(random_case(seed), cfg, src, seed, 0.8f);
}

TEST(Scheduler, RefillMatchesSoloRunsMoe) {
  const ModelConfig cfg = testing::tiny_moe_config();
  engine::DummyWeights src(cfg, 14);
  const char* loading[] = {"routed", "all", "auto"};
  for (std::uint64_t seed = 660; seed < 672; ++seed) {
    Case c = random_case(seed);
    c.policy.expert_loading = loading[seed % 3];
    expect_refill_matches_solo(c, cfg, src, seed, seed % 2 ? 0.8f : 0.0f);
  }
}

// Under bf16 compute on a CPU with AVX-512 BF16 every projection of float weights takes the bf16
// tiled kernel, whose rows never depend on each other: refill gives every request its solo
// run's logits bit for bit, so no near-tie is ever needed. (fp32 is not there: its GEMM picks a
// path by row count, and q4/q8 weights under bf16 take oneDNN.)
TEST(Scheduler, RefillUnderBf16ComputeIsExact) {
  const kernels::GemmArgs bf16{nullptr, 1, {nullptr, kernels::DType::F32, 1, 1}, nullptr, nullptr, 0.0f, kernels::DType::BF16};
  if (!kernels::cpu_gemm_path_supported(kernels::CpuGemmPath::TiledBf16, bf16)) GTEST_SKIP() << "no AVX-512 BF16 here";
  ModelConfig cfg = testing::tiny_llama_config();
  cfg.compute_dtype = kernels::DType::BF16;
  cfg.hidden = 512;  // wide enough that oneDNN's bf16 GEMM sums in another order at other row counts
  cfg.ffn = 1024;
  cfg.n_heads = 8;
  cfg.n_kv_heads = 2;
  cfg.head_dim = 64;
  engine::DummyWeights src(cfg, 12);
  for (std::uint64_t seed = 900; seed < 906; ++seed) {
    Case c = random_case(seed);
    c.policy.compress_weight = false;
    const auto r = expect_refill_matches_solo(c, cfg, src, seed, seed % 2 ? 0.8f : 0.0f);
    EXPECT_EQ(r.bitwise, r.requests) << "seed " << seed;
  }
}

// Every --kv policy and both compressions over the three tiers, staged, under refill.
TEST(Scheduler, RefillMatchesSoloRunsEveryKvPolicyCompressed) {
  auto m = engine::open_model({});
  const char* kv[] = {"h2o:0.3", "local:0.3", "tova:0.3", "scissorhands:0.3", "pyramid:0.3", "snapkv:0.3",
                      "streaming:0.3", "flex:0.3", "flex:0.3,sink=1,merge=0"};
  std::uint64_t seed = 700;
  for (const char* spec : kv)
    for (const bool compress : {false, true}) {
      Case c;
      c.policy.gpu_batch_size = 2;
      c.policy.num_gpu_batches = 2;
      c.policy.weights = {0.3, 0.4, 0.3};
      c.policy.cache = {0.25, 0.25, 0.5};
      c.policy.kv = spec;
      c.policy.compress_weight = c.policy.compress_cache = compress;
      c.always_stage = true;
      expect_refill_matches_solo(c, m.config, *m.weights, seed++, 0.0f);
    }
}

// A queue shared with other runners (data-parallel ranks): the slots take only the prompts
// the feed gives, some a step late ("none yet" while other slots run), and those are their
// solo runs' tokens; the others end without tokens and count in no total.
TEST(Scheduler, RefillTakesOnlyThePromptsTheFeedGives) {
  auto m = engine::open_model({});
  Case c;
  c.policy.gpu_batch_size = 2;
  c.policy.num_gpu_batches = 2;
  c.policy.cache = {0.5, 0.5, 0};
  GenerationRequest req;
  req.sequences = engine::sequences_of(random_prompts(m.config, 13, 820));
  for (std::size_t b = 0; b < req.sequences.size(); ++b)
    req.sequences[b].max_new_tokens = 1 + static_cast<std::int64_t>(b % 7);
  req.max_new_tokens = 7;
  // This runner's prompts, every other answer "none yet" while other slots run.
  struct MineFeed final : serving::SequenceFeed {
    std::vector<std::size_t> mine = {0, 2, 3, 7, 8, 12};
    std::size_t none_left = 0, answers = 0, last_from = 0, idle_asks = 0;
    std::optional<std::size_t> next_sequence(std::size_t from, bool idle) override {
      EXPECT_GE(from, last_from) << "the queue's cursor went back";
      last_from = from;
      idle_asks += idle ? 1 : 0;
      if (!idle && ++answers % 2) return std::nullopt;
      const auto it = std::ranges::lower_bound(mine, from);
      return it == mine.end() ? none_left : *it;
    }
  } feed;
  feed.none_left = req.sequences.size();
  auto be = kernels::make_cpu_backend();
  const auto r = testing::expect_refill_matches_solo(*be, m.config, *m.weights, c.policy, req, {}, &feed);
  EXPECT_EQ(r.requests, feed.mine.size());
  EXPECT_GE(feed.idle_asks, 1u) << "the first answer comes while no slot runs";
}

// More slots than prompts; and continuous batching's own checks.
TEST(Scheduler, RefillWithFewPromptsAndBadSlots) {
  auto m = engine::open_model({});
  Case c;
  c.policy.gpu_batch_size = 4;
  c.policy.num_gpu_batches = 2;
  expect_refill_matches_solo(c, m.config, *m.weights, 800, 0.0f);
  auto be = kernels::make_cpu_backend();
  offload::Tiers tiers(*be, {});
  engine::BlockExecutor sched(*be, tiers, m.config, *m.weights, c.policy);
  GenerationRequest req;
  req.sequences = engine::sequences_of(random_prompts(m.config, 3, 801));
  req.max_new_tokens = 4;
  req.slots = 9;  // more than the block's 8
  EXPECT_THROW(serving::generate(sched, req), std::invalid_argument);
  req.slots = 2;
  req.prefill_budget = 0;
  EXPECT_THROW(serving::generate(sched, req), std::invalid_argument);
  req.prefill_budget = 4;
  engine::GenerationHooks logits;
  logits.on_logits = [](std::int64_t, std::span<const float>) {};
  EXPECT_THROW(serving::generate(sched, req, logits), std::invalid_argument);
}

// A backend that says it is a device: cpu_cache_compute is refused there, naming the option so
// that the CLI can render its flag.
TEST(Scheduler, CpuCacheComputeOnADeviceNamesTheOption) {
  struct DeviceKindBackend : testing::ForwardingBackend {
    kernels::DeviceKind kind() const override { return kernels::DeviceKind::Cuda; }
  } be;
  const ModelConfig cfg = testing::tiny_llama_config();
  engine::DummyWeights src(cfg, 22);
  policy::Policy p;
  p.cache = {0, 1, 0};
  p.cpu_cache_compute = true;
  offload::Tiers tiers(be, {});
  try {
    engine::BlockExecutor sched(be, tiers, cfg, src, p);
    ADD_FAILURE() << "cpu_cache_compute accepted on a device backend";
  } catch (const kernels::OptionError& e) {
    const std::string as_flag = e.text([](kernels::Option o) {
      return o == kernels::Option::CpuCacheCompute ? std::string("--cpu-cache-compute") : std::string("?");
    });
    EXPECT_EQ(as_flag.rfind("--cpu-cache-compute is not supported on the ", 0), 0u) << as_flag;
    EXPECT_EQ(as_flag.find('?'), std::string::npos) << as_flag;
  }
}

}  // namespace
}  // namespace flexh2o
