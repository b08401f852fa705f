// Where a block's memory goes (BlockExecutor::begin): its GPU batches' hidden states and KV
// cache over the tiers, the activations and staging ring, and the pool that holds shared
// prefixes once, each reserved against the tiers' budgets before the first step.
#include <algorithm>
#include <array>
#include <memory>
#include <string>

#include "engine/model/kv_eviction.h"
#include "engine/model/rope_scaling.h"
#include "engine/runtime/block_executor.h"
#include "engine/runtime/block_state.h"

namespace flexh2o::engine {

using offload::Tier;
using offload::TieredTensor;

void BlockExecutor::place(BlockState& st, const GenerationRequest& req) {
  place_batches(st, req);
  std::int64_t max_rows = 0;
  for (const auto& b : st.batches) max_rows = std::max(max_rows, b.hidden->rows());
  const std::int64_t kv_row_bytes = st.capacity * kv_token_bytes();
  const std::int64_t gbs = policy_.gpu_batch_size;
  // A prefill filling a pool row attends over it: the op scratch of the longer of the two rows.
  st.act_reserved = tiers_.budget(Tier::Gpu).reserve_scoped(
      Activations::bytes(be_, cfg_, max_rows, gbs, std::max(st.capacity, st.pool.capacity), st.evicting),
      "activation scratch");
  st.act = std::make_unique<Activations>(be_, cfg_, max_rows, gbs);
  st.ring.resize(3);
  for (std::size_t i = 0; i < st.ring.size(); ++i) {
    const std::string n = " (ring slot " + std::to_string(i) + ")";
    if (!st.hidden_resident) st.ring[i].hidden = GpuBuffer(tiers_, max_rows * cfg_.hidden * 4, "hidden staging" + n);
    if (st.staged_max > 0) {
      st.ring[i].k = GpuBuffer(tiers_, st.staged_max * kv_row_bytes, "K staging" + n);
      st.ring[i].v = GpuBuffer(tiers_, st.staged_max * kv_row_bytes, "V staging" + n);
    }
    if (st.pool_home.staged) {
      const std::int64_t pool_bytes = st.pool.rows * st.pool.capacity * kv_token_bytes();
      st.ring[i].pool_k = GpuBuffer(tiers_, pool_bytes, "K held prefixes staging" + n);
      st.ring[i].pool_v = GpuBuffer(tiers_, pool_bytes, "V held prefixes staging" + n);
    }
  }
}

// Nothing is in flight yet: a try's buffers go, their budgets freed and their peaks as before,
// for the next tier (or the copies). A tier the policy names comes first, then the slower ones.
bool BlockExecutor::place_with_pool(BlockState& st, const GenerationRequest& req, const PrefixPool& pool) {
  std::array<std::int64_t, 3> peaks{};
  for (const Tier t : {Tier::Gpu, Tier::Cpu, Tier::Disk}) peaks[static_cast<std::size_t>(t)] = tiers_.budget(t).peak();
  bool tried_named = policy_.prefix_pool == "auto";
  for (const Tier tier : {Tier::Gpu, Tier::Cpu, Tier::Disk}) {
    tried_named = tried_named || policy_.prefix_pool == offload::tier_name(tier);
    if (!tried_named) continue;
    st.pool = pool;
    try {
      place_pool(st, tier);
      place(st, req);
      return true;
    } catch (const offload::BudgetExceeded&) {
      st.ring.clear();
      st.act.reset();
      st.act_reserved.reset();
      st.pool_home = {};
      st.batches.clear();
      st.pool = {};
      st.capacity = st.staged_max = 0;
      st.hidden_resident = true;
      for (const Tier t : {Tier::Gpu, Tier::Cpu, Tier::Disk})
        tiers_.budget(t).restore_peak(peaks[static_cast<std::size_t>(t)]);
    }
  }
  return false;
}

std::int64_t BlockExecutor::continuous_capacity(const GenerationRequest& req) const {
  std::int64_t most = 0;
  for (std::size_t b = 0; b < req.sequences.size(); ++b) most = std::max(most, sequence_tokens(req, b));
  return most;
}

std::int64_t BlockExecutor::continuous_rows(const GenerationRequest& req, std::int64_t slots) const {
  std::int64_t longest = 0;
  for (const Sequence& s : req.sequences)
    longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(s.prompt.size()));
  // The other slots decode while newcomers prefill up to the budget (or one longer prompt).
  std::int64_t rows = slots - 1 + std::max(req.prefill_budget, longest);
  // Phi-3 re-prefills a sequence whole when it outgrows the original context.
  if (cfg_.rope.reprefill_on_long) rows = std::max(rows, slots * continuous_capacity(req));
  return std::max(rows, slots);
}

void BlockExecutor::place_batches(BlockState& st, const GenerationRequest& req) {
  const bool continuous = st.continuous;
  const std::int64_t B = static_cast<std::int64_t>(st.next.size());
  const std::int64_t gbs = policy_.gpu_batch_size;
  // With a KV policy the cache holds each (sequence, kv head)'s budget + 1 slots, not all tokens.
  const policy::KvPolicy* kv = req.kv ? req.kv : kv_policy_.get();
  std::vector<std::vector<std::unique_ptr<KvEvictionLayer>>> evictions;
  // Continuous batching: a slot holds whichever request comes, up to the longest.
  const std::int64_t longest = continuous ? continuous_capacity(req) : longest_prompt(req) + req.max_new_tokens;
  st.capacity = kv ? 0 : st.pool.rows > 0 ? st.pool.row_capacity : longest;
  if (kv) check_kv_policy_fits(cfg_, longest);
  std::vector<std::int64_t> all_totals;
  for (std::size_t b = 0; continuous && kv && b < req.sequences.size(); ++b)
    all_totals.push_back(sequence_tokens(req, b));
  for (std::int64_t s0 = 0; continuous && kv && s0 < B; s0 += gbs) {
    const std::int64_t n = std::min(gbs, B - s0);
    evictions.push_back(make_kv_eviction_slots(be_, *kv, cfg_, n, all_totals, continuous_rows(req, n)));
    for (const auto& e : evictions.back()) st.capacity = std::max(st.capacity, e->capacity());
  }
  for (std::int64_t s0 = 0; !continuous && kv && s0 < B; s0 += gbs) {
    std::vector<std::int64_t> total;
    std::int64_t rows = 0;
    for (std::int64_t s = s0; s < std::min(B, s0 + gbs); ++s) {
      total.push_back(sequence_tokens(req, static_cast<std::size_t>(s)));
      rows += static_cast<std::int64_t>(req.sequences[static_cast<std::size_t>(s)].prompt.size());
    }
    evictions.push_back(make_kv_eviction(be_, *kv, cfg_, total, rows));
    for (const auto& e : evictions.back()) st.capacity = std::max(st.capacity, e->capacity());
  }
  if (kv) evicting_row_slots_ = std::max(evicting_row_slots_, st.capacity);
  // A KV row: one sequence's kv_heads x capacity slots.
  const std::int64_t kv_row = cfg_.n_kv_heads * st.capacity * cfg_.head_dim;
  const std::int64_t kv_row_bytes = st.capacity * kv_token_bytes();
  for (std::int64_t s0 = 0; s0 < B; s0 += gbs) {
    GpuBatch b;
    if (kv) b.eviction = std::move(evictions[static_cast<std::size_t>(s0 / gbs)]);
    b.first_sequence = s0;
    b.n = std::min(gbs, B - s0);
    const auto seqs = std::span(req.sequences).subspan(static_cast<std::size_t>(s0), static_cast<std::size_t>(b.n));
    const std::int64_t rows = continuous ? continuous_rows(req, b.n)
                                         : std::max(rows_for_batch(cfg_, prompts_of(seqs), req.max_new_tokens), b.n);
    const std::string tag = " of batch " + std::to_string(st.batches.size());
    b.hidden = std::make_unique<TieredTensor>(tiers_, "hidden states" + tag, kernels::DType::F32, rows, cfg_.hidden,
                                              policy_.activations);
    // Only the caches of this scheduler's decoder layers.
    b.k.resize(static_cast<std::size_t>(cfg_.n_layers));
    b.v.resize(static_cast<std::size_t>(cfg_.n_layers));
    for (const std::int64_t l : units_.cache_layers) {
      const std::string name = "KV cache of layer " + std::to_string(l) + tag;
      b.k[static_cast<std::size_t>(l)] =
          std::make_unique<TieredTensor>(tiers_, "K " + name, cache_dtype_, b.n, kv_row, policy_.cache, kv_row_bytes);
      b.v[static_cast<std::size_t>(l)] =
          std::make_unique<TieredTensor>(tiers_, "V " + name, cache_dtype_, b.n, kv_row, policy_.cache, kv_row_bytes);
    }
    if (units_.cache_layers.empty()) {
      b.resident_end = b.n;
    } else {
      const auto& split = b.k[static_cast<std::size_t>(units_.cache_layers.front())]->split();
      b.resident_end = policy_.cpu_cache_compute ? split.end[1] : split.end[0];
    }
    b.cache_stored.resize(static_cast<std::size_t>(cfg_.n_layers));
    st.hidden_resident = st.hidden_resident && b.hidden->entirely_on(Tier::Gpu);
    st.staged_max = std::max(st.staged_max, b.n - b.resident_end);
    st.batches.push_back(std::move(b));
  }
}

bool BlockExecutor::can_hold_prefixes(const GenerationRequest& req) const {
  return req.slots > 0 && req.hold_prefixes && be_.reads_shared_prefixes_once();
}

std::int64_t BlockExecutor::kv_token_bytes() const {
  return cfg_.n_kv_heads * kernels::kv_slot_bytes(cache_dtype_, cfg_.head_dim);
}

void BlockExecutor::place_pool(BlockState& st, Tier tier) {
  PoolHome& home = st.pool_home;
  home.capacity = st.pool.capacity;
  home.tier = tier;
  // Read in place where the rows on that tier would be: the gpu, or the cpu with cpu_cache_compute.
  home.staged = tier == Tier::Disk || (tier == Tier::Cpu && !policy_.cpu_cache_compute);
  const offload::TierFractions all_on{.gpu = tier == Tier::Gpu ? 1.0 : 0.0,
                                      .cpu = tier == Tier::Cpu ? 1.0 : 0.0,
                                      .disk = tier == Tier::Disk ? 1.0 : 0.0};
  const std::int64_t row = cfg_.n_kv_heads * st.pool.capacity * cfg_.head_dim;
  const std::int64_t row_bytes = st.pool.capacity * kv_token_bytes();
  home.k.resize(static_cast<std::size_t>(cfg_.n_layers));
  home.v.resize(static_cast<std::size_t>(cfg_.n_layers));
  home.stored.resize(static_cast<std::size_t>(cfg_.n_layers));
  for (const std::int64_t l : units_.cache_layers) {
    const std::string name = "held prefixes of layer " + std::to_string(l);
    const auto i = static_cast<std::size_t>(l);
    home.k[i] = std::make_unique<TieredTensor>(tiers_, "K " + name, cache_dtype_, st.pool.rows, row, all_on, row_bytes);
    home.v[i] = std::make_unique<TieredTensor>(tiers_, "V " + name, cache_dtype_, st.pool.rows, row, all_on, row_bytes);
  }
}

// The pool and the rows by the tiers they live on, against those rows sized for whole sequences.
KvHeld BlockExecutor::held_bytes(const BlockState& st, const GenerationRequest& req) const {
  const std::int64_t kv = 2 * static_cast<std::int64_t>(units_.cache_layers.size()) * kv_token_bytes();
  const std::int64_t whole = continuous_capacity(req);
  KvHeld held{.prefixes = st.pool.families, .rows = st.pool.rows};
  held.pools[static_cast<std::size_t>(st.pool_home.tier)] = 1;
  held.bytes[static_cast<std::size_t>(st.pool_home.tier)] = kv * st.pool.rows * st.pool.capacity;
  for (const GpuBatch& b : st.batches) {
    const offload::RowSplit& split = b.k[static_cast<std::size_t>(units_.cache_layers.front())]->split();
    for (const Tier t : {Tier::Gpu, Tier::Cpu, Tier::Disk}) {
      held.bytes[static_cast<std::size_t>(t)] += kv * split.rows(t) * st.capacity;
      held.bytes_without[static_cast<std::size_t>(t)] += kv * split.rows(t) * whole;
    }
  }
  return held;
}

}  // namespace flexh2o::engine
