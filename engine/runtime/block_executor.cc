#include "engine/runtime/block_executor.h"

#include "engine/model/kv_eviction.h"
#include "engine/runtime/block_state.h"
#include "engine/runtime/graph_step.h"
#include "engine/runtime/prefix_match.h"
#include "kernels/option_error.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace flexh2o::engine {

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

BlockExecutor::BlockExecutor(kernels::Backend& be, offload::Tiers& tiers, const ModelConfig& cfg,
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

BlockExecutor::~BlockExecutor() = default;

struct BlockExecutor::Block {
  BlockState st;
  std::int64_t computes = 0;  // so far: compute c uses ring slot c % 3
};

void BlockExecutor::BlockDeleter::operator()(Block* b) const { delete b; }

bool BlockExecutor::holds_input() const { return units_.units.front().first; }

bool BlockExecutor::evicts(const GenerationRequest& req) const { return req.kv != nullptr || kv_policy_ != nullptr; }

bool BlockExecutor::shares_prefixes(const GenerationRequest& req) const {
  return req.share_prefixes && prefix_sharing_off_reason(cfg_, evicts(req)).empty();
}

BlockExecutor::BlockPtr BlockExecutor::begin(const GenerationRequest& req, std::size_t slots, const PrefixPool& pool) {
  BlockPtr blk(new Block);
  const bool continuous = req.slots > 0;
  const std::int64_t prompts = static_cast<std::int64_t>(req.sequences.size());
  const std::int64_t B = continuous ? std::min(req.slots, prompts) : prompts;
  const std::string block = "gpu_batch_size x num_gpu_batches = " + std::to_string(policy_.block_size());
  if (!continuous && B > policy_.block_size())
    throw std::invalid_argument("a block holds at most " + block + " prompts, got " + std::to_string(B));
  if (continuous && req.slots > policy_.block_size())
    throw std::invalid_argument("continuous batching runs at most " + block + " slots, asked for " +
                                std::to_string(req.slots));
  if (continuous && req.prefill_budget < 1) throw std::invalid_argument("the prefill token budget must be at least 1");
  // The plans index the block's slots (st.next, the GPU batches' rows).
  if (slots != static_cast<std::size_t>(B))
    throw std::logic_error("the scheduler plans " + std::to_string(slots) + " slots for a block of " +
                           std::to_string(B));
  if (B == 0) return blk;
  staging_->forget();
  BlockState& st = blk->st;
  st.req = &req;
  st.continuous = continuous;
  st.next.resize(static_cast<std::size_t>(B));
  st.evicting = evicts(req);
  // A pool of prefixes held once where it fits beside the rows it shrinks, else rows that copy them.
  if (pool.rows > 0 && !(shares_prefixes(req) && can_hold_prefixes(req)))
    throw std::logic_error("a prefix pool offered for a block that cannot hold prefixes once");
  if (pool.rows > 0 && place_with_pool(st, req, pool)) {
    kv_held_.add(held_bytes(st, req));
  } else {
    place(st, req);
  }
  return blk;
}

bool BlockExecutor::holds_prefixes(const Block& b) const { return b.st.pool.rows > 0; }

// FlexGen's loop (docs/offloading.md, "The block schedule"): for every unit j and GPU batch k,
// load weight j+1, load cache and hidden k+1, compute (j, k), store cache and hidden k.
StepOutput BlockExecutor::run_step(Block& blk, const StepInput& in, const StageLinks& links) {
  BlockState& st = blk.st;
  if (st.batches.empty()) throw std::logic_error("run_step on a block without slots");
  if (!in.plan || !in.log || in.plan->slots.size() != st.next.size() || in.tokens.size() != st.next.size())
    throw std::logic_error("a step's plan, tokens and log must cover the block's slots");
  if ((!holds_input() && !links.receive) || (!holds_head_ && !links.send))
    throw std::logic_error("an executor holding part of the model needs the links to its neighbours");
  apply_plan(st, in);
  if (in.keep_logits && holds_head_) st.host_logits.resize(st.next.size() * static_cast<std::size_t>(cfg_.vocab_size));
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
      compute(st, u, k, st.slot(counter), instance, in);
      ring_->store(units[static_cast<std::size_t>(u)], k, st.batch(k), st.slot(counter), st.capacity,
                   st.hidden_resident, st.pool_home);
      if (u == U - 1 && !holds_head_) send(st, k, links);
    }
  }
  graph.end();
  ++st.step;
  std::int64_t prompt_rows = 0;  // every row but the decodes' one each
  for (const GpuBatch& b : st.batches)
    prompt_rows += b.step.rows() - std::ranges::count(b.step.kinds, SeqStep::Decode);
  const bool logits = in.keep_logits && holds_head_;
  return {st.next, logits ? std::span<const float>(st.host_logits) : std::span<const float>(), prompt_rows};
}

// Batch k's hidden states and KV cache for unit u into the compute's ring slot, unless the
// previous compute fetched them ahead; a stage after the first receives them first.
void BlockExecutor::load_inputs(BlockState& st, std::int64_t counter, std::int64_t u, std::int64_t k,
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
void BlockExecutor::prefetch_next(BlockState& st, std::int64_t counter, std::int64_t u, std::int64_t k,
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

void BlockExecutor::compute(BlockState& st, std::int64_t unit, std::int64_t k, RingSlot& slot,
                            std::int64_t instance, const StepInput& in) {
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
  if (u.last && holds_head_) sample(st, b, act, in);
}

// Routes the batch for the next unit's MoE layer now that its input is here, so the experts
// it needs stream in while the next batches compute.
void BlockExecutor::route_next_unit(std::int64_t unit, const GpuBatch& b, Activations& act,
                                     std::int64_t instance) {
  const SchedulingUnit& next = units_.units[static_cast<std::size_t>(unit + 1)];
  if (!next.routed_before || !staging_->routes(instance + 1)) return;
  // routed_before: the MoE layer is the unit's first.
  const LayerWeights& router = staging_->weights(unit + 1, instance + 1).front();
  staging_->prefetch_experts(instance + 1, next.moe->route_experts(be_, router, b.step, act).routed);
}

// The batch's next tokens from the head's logits (and a host copy of them when asked). The
// logits cross to the host once for the batch, however many calls sample them; they hold a row
// per sequence that predicts a token (Activations::logits), none for an idle slot.
void BlockExecutor::sample(BlockState& st, const GpuBatch& b, Activations& act, const StepInput& in) {
  be_.graph_step_end();  // the logits are complete on the device
  const std::int64_t V = cfg_.vocab_size, rows = b.step.predicting();
  const float* logits = be_.logits_on_host(act.logits.as<float>(), rows, V);
  auto idle = [&](std::int64_t i) { return b.step.kinds[static_cast<std::size_t>(i)] == SeqStep::Idle; };
  if (in.keep_logits)
    for (std::int64_t i = 0, row = 0; i < b.n; ++i)
      if (!idle(i)) std::copy_n(logits + row++ * V, V, st.host_logits.begin() + (b.first_sequence + i) * V);
  const auto& slots = in.plan->slots;
  const bool forking = std::ranges::any_of(slots, [](const SlotStep& s) { return s.fork_of >= 0; });
  if (st.continuous || forking || rows < b.n) {
    for (std::int64_t i = 0, row = 0; i < b.n; ++i)
      if (!idle(i)) sample_slot(st, logits + row++ * V, b.first_sequence + i, in);
    return;
  }
  const auto first = static_cast<std::size_t>(b.first_sequence), n = static_cast<std::size_t>(b.n);
  kernels::SampleArgs args = in.log->sample_args(logits, first, std::span(st.next).subspan(first, n));
  args.logits_on_host = true;
  be_.sample(args);
  for (std::size_t seq = first; seq < first + n; ++seq)
    if (in.log->failed(seq)) st.next[seq] = kFailedToken;
}

void BlockExecutor::sample_slot(BlockState& st, const float* logits, std::int64_t slot, const StepInput& in) {
  sample_sequence(st, logits, slot, in);
  for (std::size_t f = 0; f < in.plan->slots.size(); ++f)
    if (in.plan->slots[f].fork_of == slot) sample_sequence(st, logits, static_cast<std::int64_t>(f), in);
}

// `logits`: the slot's row, on the host.
void BlockExecutor::sample_sequence(BlockState& st, const float* logits, std::int64_t slot, const StepInput& in) {
  const auto seq = static_cast<std::size_t>(in.plan->slots[static_cast<std::size_t>(slot)].seq);
  // The sampler's step for this sequence is its own new-token index (GenerationLog's).
  kernels::SampleArgs args =
      in.log->sample_args(logits, seq, std::span(st.next).subspan(static_cast<std::size_t>(slot), 1));
  args.logits_on_host = true;
  be_.sample(args);
  // Its constraint failed while filling its mask: the token drawn is not its.
  if (in.log->failed(seq)) st.next[static_cast<std::size_t>(slot)] = kFailedToken;
}

void BlockExecutor::receive(BlockState& st, std::int64_t k, const StageLinks& links) {
  GpuBatch& b = st.batch(k);
  boundary_.resize(static_cast<std::size_t>(b.step.rows() * cfg_.hidden));
  links.receive(k, boundary_);
  b.hidden->write_rows(0, b.step.rows(), boundary_.data(), *host_staging_);
}

void BlockExecutor::send(BlockState& st, std::int64_t k, const StageLinks& links) {
  const GpuBatch& b = st.batch(k);
  boundary_.resize(static_cast<std::size_t>(b.step.rows() * cfg_.hidden));
  be_.copy_to_host(boundary_.data(), st.act->hidden, boundary_.size() * sizeof(float));
  links.send(k, boundary_);
}

}  // namespace flexh2o::engine
