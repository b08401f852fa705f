#include "engine/runtime/block_scheduler.h"

#include "engine/model/kv_eviction.h"
#include "engine/model/rope_scaling.h"
#include "engine/runtime/block_state.h"
#include "engine/runtime/graph_step.h"
#include "engine/runtime/prefix_match.h"
#include "kernels/option_error.h"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <utility>

namespace flexh2o::engine {

using offload::CopyTicket;
using offload::Tier;
using offload::TieredTensor;

LayerRange stage_layers(const ModelConfig& cfg, const policy::StageSlice& s) {
  if (s.layers < 1 || s.first_layer < 0 || s.first_layer + s.layers > cfg.n_layers ||
      s.input != (s.first_layer == 0) || s.head != (s.first_layer + s.layers == cfg.n_layers))
    throw std::invalid_argument("decoder layers [" + std::to_string(s.first_layer) + ", " +
                                std::to_string(s.first_layer + s.layers) + ") are not a slice of " + cfg.name + "'s " +
                                std::to_string(cfg.n_layers));
  // build_layers: input embedding, then attention and MLP per decoder layer, then the head.
  return {s.input ? 0 : 1 + 2 * s.first_layer, s.head ? 2 + 2 * cfg.n_layers : 1 + 2 * (s.first_layer + s.layers)};
}

BlockScheduler::BlockScheduler(kernels::Backend& be, offload::Tiers& tiers, const ModelConfig& cfg,
                               const WeightSource& source, const policy::Policy& policy, offload::Trace* trace,
                               offload::CopyOptions copy, LayerRange range)
    : be_(be),
      tiers_(tiers),
      cfg_(with_weight_dtype(cfg, policy.weight_dtype(cfg.dtype))),
      policy_(policy),
      cache_dtype_(policy.cache_dtype(cfg.dtype)),
      trace_(trace),
      layers_(build_layers(cfg_)) {
  policy_.validate();
  if (policy_.cpu_cache_compute && be_.kind() != kernels::DeviceKind::Cpu)
    throw kernels::OptionError{kernels::Option::CpuCacheCompute,
                               " is not supported on the " + be_.name() + " backend yet (it needs a CPU backend beside it)"};
  const auto n = static_cast<std::int64_t>(layers_.size());
  const std::int64_t end = range.end < 0 ? n : range.end;
  if (range.begin < 0 || range.begin >= end || end > n)
    throw std::invalid_argument("layers [" + std::to_string(range.begin) + ", " + std::to_string(end) +
                                ") are not a slice of the model's " + std::to_string(n) + " layers");
  units_ = make_units(layers_, range.begin, end, policy_.sep_layer);
  holds_head_ = end == n;
  if (policy_.kv != "full") kv_policy_ = policy::make_kv_policy(policy::parse_kv_spec(policy_.kv), cfg_.n_layers);
  auto weights = load_tiered_weights(cfg_, source, tiers_, policy_.weights, policy_.resident_embeddings,
                                     units_.weight_names);
  copies_ = std::make_unique<offload::CopyEngine>(tiers_, copy, trace_);
  staging_ = std::make_unique<WeightStaging>(tiers_, std::move(weights), units_.units,
                                             policy_.expert_slot_count(cfg_.moe.experts, cfg_.moe.top_k), *copies_,
                                             policy_.overlap);
  ring_ = std::make_unique<CacheRing>(tiers_, *copies_, cfg_.hidden, cfg_.n_kv_heads, cfg_.head_dim, cache_dtype_,
                                      policy_.overlap, be_.reads_shared_prefixes_once());
  host_staging_ = std::make_unique<offload::Staging>(&tiers_.backend());
}

BlockScheduler::~BlockScheduler() = default;

struct BlockScheduler::Block {
  Block(kernels::Backend& be, const ModelConfig& cfg, const GenerationRequest& req) : log(be, cfg, req) {}
  GenerationLog log;
  BlockState st;
  std::int64_t computes = 0;  // so far: compute c uses ring slot c % 3
};

void BlockScheduler::BlockDeleter::operator()(Block* b) const { delete b; }

bool BlockScheduler::holds_input() const { return units_.units.front().first; }

BlockScheduler::BlockPtr BlockScheduler::begin(const GenerationRequest& req, const PlannerFactory& make_planner) {
  BlockPtr blk(new Block(be_, cfg_, req));
  const bool continuous = req.slots > 0;
  const std::int64_t prompts = static_cast<std::int64_t>(req.sequences.size());
  const std::int64_t B = continuous ? std::min(req.slots, prompts) : prompts;
  const std::string block = "gpu_batch_size x num_gpu_batches = " + std::to_string(policy_.block_size());
  if (!continuous && B > policy_.block_size())
    throw std::invalid_argument("a block holds at most " + block + " prompts, got " + std::to_string(B));
  if (continuous && req.slots > policy_.block_size())
    throw std::invalid_argument("continuous batching runs at most " + block + " slots, asked for " +
                                std::to_string(req.slots));
  if (continuous && req.on_logits)
    throw std::invalid_argument("on_logits needs a fixed block; under continuous batching use on_sequence_logits");
  if (continuous && req.prefill_budget < 1) throw std::invalid_argument("the prefill token budget must be at least 1");
  if (req.on_logits && std::ranges::any_of(req.sequences, &Sequence::shares_prompt))
    throw std::invalid_argument("on_logits needs each prompt prefilled on its own (no shares_prompt)");
  if (B == 0) return blk;
  staging_->forget();
  BlockState& st = blk->st;
  st.req = &req;
  st.log = &blk->log;
  st.continuous = continuous;
  st.next.resize(static_cast<std::size_t>(B));
  if (req.on_logits) st.host_logits.resize(static_cast<std::size_t>(B * cfg_.vocab_size));
  if (req.on_sequence_logits) st.host_logits.resize(static_cast<std::size_t>(cfg_.vocab_size));
  st.evicting = req.kv != nullptr || kv_policy_ != nullptr;
  const bool sharing = req.share_prefixes && prefix_sharing_off_reason(cfg_, st.evicting).empty();
  st.planner = make_planner(req, policy_.gpu_batch_size, sharing);
  // Its plans index the block's slots (st.next, the GPU batches' rows).
  if (st.planner->slots() != static_cast<std::size_t>(B))
    throw std::logic_error("the step planner plans " + std::to_string(st.planner->slots()) + " slots for a block of " +
                           std::to_string(B));
  // A pool of prefixes held once where it fits beside the rows it shrinks, else rows that copy them.
  const PrefixPool pool = sharing && can_hold_prefixes(req) ? st.planner->prefix_pool() : PrefixPool{};
  if (pool.rows > 0 && place_with_pool(st, req, pool)) {
    st.planner->hold_prefixes();
    kv_held_.add(held_bytes(st, req));
  } else {
    place(st, req);
  }
  next_steps(st);
  return blk;
}

void BlockScheduler::place(BlockState& st, const GenerationRequest& req) {
  place_batches(st, *st.log, req);
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
bool BlockScheduler::place_with_pool(BlockState& st, const GenerationRequest& req, const PrefixPool& pool) {
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

std::int64_t BlockScheduler::continuous_capacity(const GenerationRequest& req) const {
  std::int64_t most = 0;
  for (std::size_t b = 0; b < req.sequences.size(); ++b) most = std::max(most, sequence_tokens(req, b));
  return most;
}

std::int64_t BlockScheduler::continuous_rows(const GenerationRequest& req, std::int64_t slots) const {
  std::int64_t longest = 0;
  for (const Sequence& s : req.sequences)
    longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(s.prompt.size()));
  // The other slots decode while newcomers prefill up to the budget (or one longer prompt).
  std::int64_t rows = slots - 1 + std::max(req.prefill_budget, longest);
  // Phi-3 re-prefills a sequence whole when it outgrows the original context.
  if (cfg_.rope.reprefill_on_long) rows = std::max(rows, slots * continuous_capacity(req));
  return std::max(rows, slots);
}

void BlockScheduler::place_batches(BlockState& st, const GenerationLog& log, const GenerationRequest& req) {
  const bool continuous = st.continuous;
  const std::int64_t B = static_cast<std::int64_t>(st.next.size());
  const std::int64_t gbs = policy_.gpu_batch_size;
  // With a KV policy the cache holds each (sequence, kv head)'s budget + 1 slots, not all tokens.
  const policy::KvPolicy* kv = req.kv ? req.kv : kv_policy_.get();
  std::vector<std::vector<std::unique_ptr<KvEvictionLayer>>> evictions;
  // Continuous batching: a slot holds whichever request comes, up to the longest.
  const std::int64_t longest = continuous ? continuous_capacity(req) : log.max_prompt() + req.max_new_tokens;
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

bool BlockScheduler::can_hold_prefixes(const GenerationRequest& req) const {
  return req.slots > 0 && req.hold_prefixes && be_.reads_shared_prefixes_once();
}

std::int64_t BlockScheduler::kv_token_bytes() const {
  return cfg_.n_kv_heads * kernels::kv_slot_bytes(cache_dtype_, cfg_.head_dim);
}

void BlockScheduler::place_pool(BlockState& st, Tier tier) {
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
KvHeld BlockScheduler::held_bytes(const BlockState& st, const GenerationRequest& req) const {
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

bool BlockScheduler::active(const Block& b) const { return b.log.active(); }
std::int64_t BlockScheduler::rows_computed(const Block& b) const { return b.log.rows_computed(); }

// FlexGen's loop (docs/offloading.md, "The block schedule"): for every unit j and GPU batch k,
// load weight j+1, load cache and hidden k+1, compute (j, k), store cache and hidden k.
void BlockScheduler::run_step(Block& blk, const StageLinks& links) {
  if (!blk.log.active()) throw std::logic_error("run_step on a finished block");
  if ((!holds_input() && !links.receive) || (!holds_head_ && !links.send))
    throw std::logic_error("a scheduler holding part of the model needs the links to its neighbours");
  BlockState& st = blk.st;
  const auto& units = units_.units;
  const std::int64_t K = static_cast<std::int64_t>(st.batches.size());
  const std::int64_t U = static_cast<std::int64_t>(units.size());
  std::int64_t routed_rows = 0;
  for (const auto& b : st.batches) routed_rows += b.step.rows();
  st.routed_experts =
      cfg_.moe.experts > 0 && policy_.routed_expert_loading(cfg_.moe.experts, cfg_.moe.top_k, routed_rows);
  const std::int64_t first_instance = unit_instances_;
  unit_instances_ += U;
  // A decode step wholly on the device may run as a CUDA graph (graph_step.h), ended before sample().
  const bool on_device = st.req->cuda_graphs && K == 1 && holds_input() && holds_head_ && cfg_.moe.experts == 0 &&
                         !st.evicting && !staging_->staged() && st.hidden_resident &&
                         st.batch(0).resident_end == st.batch(0).n && !st.pool_home.staged;
  GraphStepScope graph(be_, on_device ? decode_graph_key(st.batch(0).step) : std::nullopt);
  for (std::int64_t u = 0; u < U; ++u) {
    const std::int64_t instance = first_instance + u;
    staging_->fetch(u, instance, st.step, st.routed_experts);  // unless fetched ahead
    for (std::int64_t k = 0; k < K; ++k) {
      const std::int64_t counter = blk.computes++;
      load_inputs(st, counter, u, k, links);                // unless fetched ahead
      prefetch_next(st, counter, u, k, instance);           // weight j+1, cache and hidden k+1
      compute(st, u, k, st.slot(counter), instance);
      ring_->store(units[static_cast<std::size_t>(u)], k, st.batch(k), st.slot(counter), st.capacity,
                   st.hidden_resident, st.pool_home);
      if (u == U - 1 && !holds_head_) send(st, k, links);
    }
  }
  graph.end();
}

// Batch k's hidden states and KV cache for unit u into the compute's ring slot, unless the
// previous compute fetched them ahead; a stage after the first receives them first.
void BlockScheduler::load_inputs(BlockState& st, std::int64_t counter, std::int64_t u, std::int64_t k,
                                 const StageLinks& links) {
  RingSlot& slot = st.slot(counter);
  if (slot.assigned == counter) return;
  if (u == 0 && !holds_input()) receive(st, k, links);
  ring_->load(units_.units[static_cast<std::size_t>(u)], k, st.batch(k), slot, st.capacity, st.hidden_resident,
              st.pool_home);
  slot.assigned = counter;
}

// While compute (u, k) runs: the next unit's weights (the next step's first unit after the
// last; fetched in vain only after the very last step) and the next compute's inputs, when
// they do not depend on this compute nor on a neighbour stage (received in line). Without
// overlap only a MoE unit's router comes ahead: this unit routes for it.
void BlockScheduler::prefetch_next(BlockState& st, std::int64_t counter, std::int64_t u, std::int64_t k,
                                   std::int64_t instance) {
  const auto& units = units_.units;
  const std::int64_t K = static_cast<std::int64_t>(st.batches.size());
  const std::int64_t U = static_cast<std::int64_t>(units.size());
  if (!policy_.overlap) {
    const bool route_ahead = st.routed_experts && u + 1 < U && units[static_cast<std::size_t>(u + 1)].routed_before;
    if (route_ahead && k == 0) staging_->fetch(u + 1, instance + 1, st.step, st.routed_experts);
    return;
  }
  if (k == 0) staging_->fetch((u + 1) % U, instance + 1, st.step, st.routed_experts);
  const bool receiving = !holds_input();
  const bool next_in_unit = k + 1 < K && !(u == 0 && receiving), next_unit = k + 1 == K && u + 1 < U && K > 1;
  if (next_in_unit || next_unit) {
    RingSlot& ns = st.slot(counter + 1);
    ring_->load(units[static_cast<std::size_t>(next_in_unit ? u : u + 1)], next_in_unit ? k + 1 : 0,
                st.batch(next_in_unit ? k + 1 : 0), ns, st.capacity, st.hidden_resident, st.pool_home);
    ns.assigned = counter + 1;
  }
}

void BlockScheduler::compute(BlockState& st, std::int64_t unit, std::int64_t k, RingSlot& slot,
                             std::int64_t instance) {
  const SchedulingUnit& u = units_.units[static_cast<std::size_t>(unit)];
  GpuBatch& b = st.batch(k);
  const std::vector<LayerWeights>& w = staging_->weights(unit, instance);
  for (const auto& t : slot.loads) t.wait();
  if (b.step.rows() == 0) return;  // continuous batching: every slot of the batch is idle
  Activations& act = *st.act;
  act.hidden = st.hidden_resident ? static_cast<float*>(b.hidden->place(0).ptr)
                                  : reinterpret_cast<float*>(slot.hidden.data());
  KvView view{st.capacity, cache_dtype_, {}, nullptr};
  if (u.cache_layer >= 0) {
    const auto layer = static_cast<std::size_t>(u.cache_layer);
    if (!b.eviction.empty()) view.eviction = b.eviction[layer].get();
    const TieredTensor& kt = *b.k[layer];
    const TieredTensor& vt = *b.v[layer];
    for (Tier t : {Tier::Gpu, Tier::Cpu}) {
      const std::int64_t s0 = kt.split().begin[static_cast<int>(t)];
      const std::int64_t s1 = std::min(kt.split().end[static_cast<int>(t)], b.resident_end);
      if (s0 < s1) view.parts.push_back({s0, s1, kt.place(s0).ptr, vt.place(s0).ptr});
    }
    if (b.resident_end < b.n) view.parts.push_back({b.resident_end, b.n, slot.k.data(), slot.v.data()});
    const PoolHome& pool = st.pool_home;
    if (pool.held() && pool.staged) view.pool = {slot.pool_k.data(), slot.pool_v.data(), pool.capacity};
    if (pool.held() && !pool.staged)
      view.pool = {pool.k[layer]->place(0).ptr, pool.v[layer]->place(0).ptr, pool.capacity};
  }
  offload::ScopedSpan span(trace_, "compute", "compute_layer", u.name + " b" + std::to_string(k));
  for (std::size_t i = 0; i < u.layers.size(); ++i) {
    const Layer* l = u.layers[i];
    if (staging_->staged() && l == u.moe) {
      // The experts this batch routes to (prefetched as the unit before routed it, or with
      // the unit), fetched here where they were not or did not fit.
      staging_->run_experts(be_, instance, l->route_experts(be_, w[i], b.step, act), act);
      continue;
    }
    l->forward(be_, w[i], b.step, act, u.cache_layer >= 0 ? &view : nullptr);
  }
  if (staging_->staged() && st.routed_experts && !u.last) route_next_unit(unit, b, act, instance);
  if (u.last && holds_head_) sample(st, b, act);
}

// Routes the batch for the next unit's MoE layer now that its input is here, so the experts
// it needs stream in while the next batches compute.
void BlockScheduler::route_next_unit(std::int64_t unit, const GpuBatch& b, Activations& act,
                                     std::int64_t instance) {
  const SchedulingUnit& next = units_.units[static_cast<std::size_t>(unit + 1)];
  if (!next.routed_before || !staging_->routes(instance + 1)) return;
  // routed_before: the MoE layer is the unit's first.
  const LayerWeights& router = staging_->weights(unit + 1, instance + 1).front();
  staging_->prefetch_experts(instance + 1, next.moe->route_experts(be_, router, b.step, act).routed);
}

// The batch's next tokens from the head's logits (and a host copy of them when asked).
void BlockScheduler::sample(BlockState& st, const GpuBatch& b, Activations& act) {
  be_.graph_step_end();  // the logits are complete on the device
  const bool forking = std::ranges::any_of(st.plan.slots, [](const SlotStep& s) { return s.fork_of >= 0; });
  if (st.continuous || forking) {
    for (std::int64_t i = 0; i < b.n; ++i)
      if (b.step.kinds[static_cast<std::size_t>(i)] != SeqStep::Idle) sample_slot(st, act, b.first_sequence + i, i);
    return;
  }
  const GenerationRequest& req = *st.req;
  const auto first = static_cast<std::size_t>(b.first_sequence), n = static_cast<std::size_t>(b.n);
  be_.sample(st.log->sample_args(act.logits.as<float>(), first, std::span(st.next).subspan(first, n)));
  if (req.on_logits)
    be_.copy_to_host(st.host_logits.data() + b.first_sequence * cfg_.vocab_size, act.logits.data(),
                     static_cast<std::size_t>(b.n * cfg_.vocab_size) * sizeof(float));
}

void BlockScheduler::sample_slot(BlockState& st, Activations& act, std::int64_t slot, std::int64_t i) {
  const float* logits = act.logits.as<float>() + i * cfg_.vocab_size;
  sample_sequence(st, logits, slot);
  for (std::size_t f = 0; f < st.plan.slots.size(); ++f)
    if (st.plan.slots[f].fork_of == slot) sample_sequence(st, logits, static_cast<std::int64_t>(f));
}

void BlockScheduler::sample_sequence(BlockState& st, const float* logits, std::int64_t slot) {
  const GenerationRequest& req = *st.req;
  const auto seq = static_cast<std::size_t>(st.plan.slots[static_cast<std::size_t>(slot)].seq);
  // The sampler's step for this sequence is its own new-token index (GenerationLog's).
  be_.sample(st.log->sample_args(logits, seq, std::span(st.next).subspan(static_cast<std::size_t>(slot), 1)));
  if (st.continuous && req.on_sequence_logits) {
    be_.copy_to_host(st.host_logits.data(), logits, st.host_logits.size() * sizeof(float));
    req.on_sequence_logits(seq, st.log->generated(seq), st.host_logits);
  }
}

void BlockScheduler::receive(BlockState& st, std::int64_t k, const StageLinks& links) {
  GpuBatch& b = st.batch(k);
  boundary_.resize(static_cast<std::size_t>(b.step.rows() * cfg_.hidden));
  links.receive(k, boundary_);
  b.hidden->write_rows(0, b.step.rows(), boundary_.data(), *host_staging_);
}

void BlockScheduler::send(BlockState& st, std::int64_t k, const StageLinks& links) {
  const GpuBatch& b = st.batch(k);
  boundary_.resize(static_cast<std::size_t>(b.step.rows() * cfg_.hidden));
  be_.copy_to_host(boundary_.data(), st.act->hidden, boundary_.size() * sizeof(float));
  links.send(k, boundary_);
}

std::span<std::int32_t> BlockScheduler::next_tokens(Block& b) { return b.st.next; }

void BlockScheduler::end_step(Block& blk) {
  BlockState& st = blk.st;
  if (st.continuous) {
    record_slots(st, blk.log);
  } else {
    if (holds_head_ && st.req->on_logits) st.req->on_logits(st.step, st.host_logits);
    blk.log.record(st.step, st.next);  // finished sequences are computed on
    st.planner->record_all(st.next);
  }
  ++st.step;
  if (st.continuous || blk.log.active()) next_steps(st);
}

GenerationResult BlockScheduler::finish(Block& b) { return b.log.finish(); }

}  // namespace flexh2o::engine
