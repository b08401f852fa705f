#include "engine/block_scheduler.h"

#include "engine/kv_eviction.h"
#include "engine/kv_staging.h"
#include "engine/rope_scaling.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <stdexcept>

namespace flexh2o::engine {

using offload::CopyPiece;
using offload::CopyTicket;
using offload::Place;
using offload::Tier;
using offload::TieredTensor;

namespace {

constexpr std::int64_t kAlign = 256;  // device sub-allocations stay aligned for vector loads
std::int64_t aligned(std::int64_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

void wait_all(const std::vector<CopyTicket>& ts) {
  for (const auto& t : ts) t.wait();
}

// A device buffer charged to the gpu-tier budget.
struct GpuBuffer {
  GpuBuffer() = default;
  GpuBuffer(offload::Tiers& tiers, std::int64_t bytes, const std::string& what)
      : reserved(tiers.budget(Tier::Gpu).reserve_scoped(bytes, what)),
        buf(tiers.backend(), static_cast<std::size_t>(bytes)) {}
  offload::Reservation reserved;
  kernels::DeviceBuffer buf;
  std::byte* data() const { return static_cast<std::byte*>(buf.data()); }
};

}  // namespace

LayerRange stage_layers(const ModelConfig& cfg, const policy::StageSlice& s) {
  if (s.layers < 1 || s.first_layer < 0 || s.first_layer + s.layers > cfg.n_layers ||
      s.input != (s.first_layer == 0) || s.head != (s.first_layer + s.layers == cfg.n_layers))
    throw std::invalid_argument("decoder layers [" + std::to_string(s.first_layer) + ", " +
                                std::to_string(s.first_layer + s.layers) + ") are not a slice of " + cfg.name + "'s " +
                                std::to_string(cfg.n_layers));
  // build_layers: input embedding, then attention and MLP per decoder layer, then the head.
  return {s.input ? 0 : 1 + 2 * s.first_layer, s.head ? 2 + 2 * cfg.n_layers : 1 + 2 * (s.first_layer + s.layers)};
}

struct BlockScheduler::Unit {
  std::string name;
  std::vector<const Layer*> layers;
  std::vector<std::string> weights;  // all but the experts'
  std::int64_t cache_layer = -1;
  bool first = false, last = false;
  // Mixture-of-experts: the layer that routes, its experts' weights by expert, which of them
  // are staged (not wholly on the gpu tier; routing is worth a load only if some are), and how
  // many of those a staging slot holds at once.
  const Layer* moe = nullptr;
  std::vector<std::vector<std::string>> experts;
  std::vector<bool> expert_staged;
  std::int64_t staged_experts = 0, expert_slots = 0;
  // The MoE layer comes first and a unit before it routes for it.
  bool routed_before = false;
};

struct BlockScheduler::WeightSlot {
  GpuBuffer buf;
  std::int64_t seq = -1;  // which unit instance (step * units + unit) it holds or is fetching
  DeviceWeights view;
  CopyTicket ready;  // all weights but the experts'
  std::int64_t used = 0;  // bytes of buf taken
  std::int64_t step = 0;  // the token step it loads for (expert statistics)
  // Experts: fetched as routed (false: all with the unit). The staged ones live in the unit's
  // expert_slots sub-slots of expert_bytes_ each after its other weights: which expert each
  // sub-slot holds (-1: none) and the copy bringing it, and each expert's sub-slot (-1: none).
  bool routed = false;
  std::byte* experts_base = nullptr;
  std::vector<std::int32_t> held, where;
  std::vector<CopyTicket> arrives;
};

void ExpertLoadStats::add(std::int64_t step, std::int64_t experts, std::int64_t bytes) {
  const auto i = static_cast<std::size_t>(step);
  if (experts_by_step.size() <= i) {
    experts_by_step.resize(i + 1);
    bytes_by_step.resize(i + 1);
  }
  experts_by_step[i] += experts;
  bytes_by_step[i] += bytes;
}

std::int64_t ExpertLoadStats::experts() const {
  return std::accumulate(experts_by_step.begin(), experts_by_step.end(), std::int64_t{0});
}

std::int64_t ExpertLoadStats::bytes() const {
  return std::accumulate(bytes_by_step.begin(), bytes_by_step.end(), std::int64_t{0});
}

// Device buffers of one compute in flight: its hidden states and its staged KV sequences.
struct BlockScheduler::RingSlot {
  GpuBuffer hidden, k, v;
  std::vector<CopyTicket> loads;   // fetches into this slot for the compute it is assigned to
  std::vector<CopyTicket> stores;  // write-backs reading this slot
  std::int64_t assigned = -1;      // compute counter of its loads
};

struct BlockScheduler::Batch {
  std::int64_t seq0 = 0, n = 0;  // sequences [seq0, seq0 + n) of the block
  std::vector<std::vector<std::int32_t>> tokens;  // each sequence's tokens so far (prompt first)
  StepBatch step;
  std::unique_ptr<TieredTensor> hidden;       // [max rows, hidden]
  std::vector<std::unique_ptr<TieredTensor>> k, v;  // per decoder layer: n rows of kv_heads x capacity slots
  std::int64_t resident_end = 0;  // sequences [0, resident_end) are attended where they live
  std::vector<std::unique_ptr<KvEvictionLayer>> eviction;  // per decoder layer, with a KV policy
  CopyTicket hidden_stored;
  std::vector<CopyTicket> cache_stored;
};

struct BlockScheduler::BlockState {
  std::vector<Batch> batches;
  std::vector<RingSlot> ring;
  std::unique_ptr<Activations> act;
  offload::Reservation act_reserved;  // its charge to the gpu-tier budget
  std::int64_t capacity = 0;
  std::int64_t staged_max = 0;  // most staged sequences of any batch
  std::int64_t step = 0;
  bool routed_experts = false;  // this step's MoE units fetch only the experts routed to
  bool hidden_resident = true;
  const GenerationRequest* req = nullptr;
  std::span<const std::uint64_t> streams;  // the GenerationLog's
  std::vector<std::int32_t> next;  // per block sequence
  std::vector<float> host_logits;
  // Outstanding copies touch the buffers above: wait for all of them before those go,
  // also when a compute threw.
  ~BlockState() {
    auto settle = [](const CopyTicket& t) {
      try {
        t.wait();
      } catch (...) {  // the error was reported where it was first waited on
      }
    };
    for (auto& b : batches) {
      settle(b.hidden_stored);
      for (const auto& t : b.cache_stored) settle(t);
    }
    for (auto& s : ring) {
      for (const auto& t : s.loads) settle(t);
      for (const auto& t : s.stores) settle(t);
    }
  }
};

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
    throw std::invalid_argument("cpu_cache_compute is not supported on the " + be_.name() +
                                " backend yet (it needs a CPU backend beside it); run without --cpu-cache-compute");
  const auto n = static_cast<std::int64_t>(layers_.size());
  const std::int64_t end = range.end < 0 ? n : range.end;
  if (range.begin < 0 || range.begin >= end || end > n)
    throw std::invalid_argument("layers [" + std::to_string(range.begin) + ", " + std::to_string(end) +
                                ") are not a slice of the model's " + std::to_string(n) + " layers");
  // Scheduling units: with sep_layer off, a decoder block's attention and MLP load together.
  std::vector<std::string> names;
  for (std::int64_t i = range.begin; i < end; ++i) {
    const Layer* l = layers_[static_cast<std::size_t>(i)].get();
    const bool merge = !policy_.sep_layer && !units_.empty() && units_.back().cache_layer >= 0 &&
                       units_.back().layers.size() == 1 && l->cache_index() < 0 && l->name().rfind("mlp.", 0) == 0;
    if (!merge) {
      units_.emplace_back();
      units_.back().name = l->name();
      units_.back().cache_layer = l->cache_index();
    }
    Unit& u = units_.back();
    if (merge) u.name = "layer." + std::to_string(u.cache_layer);
    if (l->cache_index() >= 0) cache_layers_.push_back(l->cache_index());
    u.layers.push_back(l);
    const auto experts = l->expert_weight_names();
    std::set<std::string> expert_names;
    for (const auto& e : experts) expert_names.insert(e.begin(), e.end());
    if (!experts.empty()) {
      u.moe = l;
      u.experts = experts;
    }
    for (auto& w : l->weight_names())
      if (!expert_names.count(w) && std::find(u.weights.begin(), u.weights.end(), w) == u.weights.end())
        u.weights.push_back(w);
    for (auto& w : l->weight_names())
      if (std::find(names.begin(), names.end(), w) == names.end()) names.push_back(w);
  }
  for (std::size_t i = 1; i < units_.size(); ++i)
    units_[i].routed_before = units_[i].moe && units_[i].moe == units_[i].layers.front();
  units_.front().first = range.begin == 0;  // its input is the embedding, not hidden states
  units_.back().last = true;                // its output leaves the scheduler
  holds_head_ = end == n;

  if (policy_.kv != "full") kv_policy_ = policy::make_kv_policy(policy::parse_kv_spec(policy_.kv), cfg_.n_layers);
  weights_ = load_tiered_weights(cfg_, source, tiers_, policy_.weights, names);
  // A staging slot holds a unit's staged weights but its experts, and expert_slots sub-slots
  // for staged experts, each as large as the largest one.
  auto staged_bytes = [&](const std::string& name) -> std::int64_t {
    const TieredTensor& t = *weights_.at(name);
    if (!t.entirely_on(Tier::Gpu)) return aligned(t.bytes());
    resident_[name] = {t.place(0).ptr, t.dtype(), t.rows(), t.cols()};
    return 0;
  };
  const std::int64_t expert_slots = policy_.expert_slot_count(cfg_.moe.experts, cfg_.moe.top_k);
  std::vector<std::int64_t> base_bytes;
  for (auto& u : units_) {
    std::int64_t b = 0;
    for (const auto& name : u.weights) b += staged_bytes(name);
    base_bytes.push_back(b);
    for (const auto& e : u.experts) {
      std::int64_t eb = 0;
      for (const auto& name : e) eb += staged_bytes(name);
      u.expert_staged.push_back(eb > 0);
      u.staged_experts += eb > 0;
      expert_bytes_ = std::max(expert_bytes_, eb);
    }
    u.expert_slots = std::min(expert_slots, u.staged_experts);
  }
  std::int64_t slot_bytes = 0;
  for (std::size_t i = 0; i < units_.size(); ++i)
    slot_bytes = std::max(slot_bytes, base_bytes[i] + units_[i].expert_slots * expert_bytes_);
  if (slot_bytes > 0)
    for (int i = 0; i < 2; ++i)
      weight_slots_.emplace_back().buf = GpuBuffer(tiers_, slot_bytes, "weight staging slot " + std::to_string(i));

  copies_ = std::make_unique<offload::CopyEngine>(tiers_, copy, trace_);
  lane_weights_ = copies_->add_lane("copy: weights in");
  lane_cache_in_ = copies_->add_lane("copy: cache in");
  lane_cache_out_ = copies_->add_lane("copy: cache out");
  lane_hidden_in_ = copies_->add_lane("copy: hidden in");
  lane_hidden_out_ = copies_->add_lane("copy: hidden out");
  boundary_staging_ = std::make_unique<offload::Staging>(&tiers_.backend());
}

BlockScheduler::~BlockScheduler() = default;

// Puts weight `name` in the slot's view: in place when gpu-resident, else at `dst` with the
// copies that fetch it. Returns the device bytes it takes at dst (0 in place) and adds the
// bytes read from the cpu and disk tiers to `moved`.
std::int64_t BlockScheduler::stage_weight(WeightSlot& slot, const std::string& name, std::byte* dst,
                                          std::vector<CopyPiece>& pieces, std::int64_t& moved) {
  if (auto it = resident_.find(name); it != resident_.end()) {
    slot.view[name] = it->second;
    return 0;
  }
  const TieredTensor& t = *weights_.at(name);
  slot.view[name] = {dst, t.dtype(), t.rows(), t.cols()};
  auto p = t.pieces(0, t.rows(), Place::gpu(dst), false);
  pieces.insert(pieces.end(), p.begin(), p.end());
  moved += t.bytes() - t.bytes_on(Tier::Gpu);
  return aligned(t.bytes());
}

void BlockScheduler::issue_weights(std::int64_t unit, std::int64_t seq, const BlockState& st) {
  if (weight_slots_.empty()) return;
  WeightSlot& slot = weight_slots_[static_cast<std::size_t>(seq % 2)];
  if (slot.seq == seq) return;
  const Unit& u = units_[static_cast<std::size_t>(unit)];
  slot.seq = -1;  // set once the fetch is queued, so a failure here never looks loaded
  slot.view.clear();
  slot.used = 0;
  slot.routed = st.routed_experts && u.staged_experts > 0;
  slot.step = st.step;
  std::vector<CopyPiece> pieces;
  std::int64_t moved = 0;
  for (const auto& name : u.weights) slot.used += stage_weight(slot, name, slot.buf.data() + slot.used, pieces, moved);
  slot.experts_base = slot.buf.data() + slot.used;
  slot.held.assign(static_cast<std::size_t>(u.expert_slots), -1);
  slot.arrives.assign(slot.held.size(), {});
  slot.where.assign(u.experts.size(), -1);
  for (std::size_t e = 0; e < u.experts.size(); ++e)
    if (!u.expert_staged[e])
      for (const auto& name : u.experts[e]) slot.view[name] = resident_.at(name);
  slot.ready = copies_->copy(lane_weights_, std::move(pieces), {"load_weight", u.name});
  slot.seq = seq;
  if (!u.experts.empty() && !slot.routed) {
    std::vector<std::int32_t> all(u.experts.size());
    std::iota(all.begin(), all.end(), 0);
    issue_experts(slot, unit, all, false);
  }
}

// Fetches the staged experts of `experts` the slot does not hold, as one copy: into free
// sub-slots (the rest wait until computed), or with `evict` also into those of experts not
// among `experts` (which then must fit the sub-slots).
void BlockScheduler::issue_experts(WeightSlot& slot, std::int64_t unit, std::span<const std::int32_t> experts,
                                   bool evict) {
  const Unit& u = units_[static_cast<std::size_t>(unit)];
  std::vector<std::size_t> free_slots, victims;
  for (std::size_t i = 0; i < slot.held.size(); ++i) {
    if (slot.held[i] < 0)
      free_slots.push_back(i);
    else if (evict && std::ranges::find(experts, slot.held[i]) == experts.end())
      victims.push_back(i);
  }
  free_slots.insert(free_slots.end(), victims.begin(), victims.end());
  std::vector<CopyPiece> pieces;
  std::vector<std::size_t> filled;
  std::int64_t bytes = 0;
  std::string which;
  auto next_free = free_slots.begin();
  for (const std::int32_t e : experts) {
    const auto ei = static_cast<std::size_t>(e);
    if (!u.expert_staged[ei] || slot.where[ei] >= 0) continue;
    if (next_free == free_slots.end()) {
      if (evict) throw std::logic_error("a chunk of experts larger than the staging slot's expert slots");
      break;
    }
    const std::size_t i = *next_free++;
    if (const std::int32_t old = slot.held[i]; old >= 0) {
      slot.arrives[i].wait();  // a copy still bringing the evicted expert would land after ours
      for (const auto& name : u.experts[static_cast<std::size_t>(old)]) slot.view.erase(name);
      slot.where[static_cast<std::size_t>(old)] = -1;
    }
    std::byte* dst = slot.experts_base + static_cast<std::int64_t>(i) * expert_bytes_;
    for (const auto& name : u.experts[ei]) dst += stage_weight(slot, name, dst, pieces, bytes);
    slot.held[i] = e;
    slot.where[ei] = static_cast<std::int32_t>(i);
    filled.push_back(i);
    if (!which.empty()) which += ',';
    which += std::to_string(e);
  }
  if (pieces.empty()) return;
  const CopyTicket t = copies_->copy(lane_weights_, std::move(pieces), {"load_experts", u.name + " experts " + which});
  for (const std::size_t i : filled) slot.arrives[i] = t;
  expert_loads_.add(slot.step, static_cast<std::int64_t>(filled.size()), bytes);
  if (!policy_.overlap) t.wait();
}

// Runs the MoE layer of `unit` for one GPU batch routed as `routing`: all at once when the
// staged experts it routes to fit the slot, else in ascending chunks that do, each fetched
// (over experts the chunk does not need) before it runs, so that the sums are forward()'s.
void BlockScheduler::run_experts(WeightSlot& slot, std::int64_t unit, const ExpertRouting& routing,
                                 Activations& act) {
  const Unit& u = units_[static_cast<std::size_t>(unit)];
  const std::vector<std::int32_t>& routed = routing.routed;
  const auto cap = static_cast<std::int64_t>(slot.held.size());
  std::int64_t begin = 0;
  std::vector<std::int32_t> chunk;
  for (std::size_t i = 0;;) {
    chunk.clear();
    std::size_t j = i;
    for (; j < routed.size(); ++j) {
      const auto e = static_cast<std::size_t>(routed[j]);
      if (!u.expert_staged[e]) continue;
      if (static_cast<std::int64_t>(chunk.size()) == cap) break;
      chunk.push_back(routed[j]);
    }
    issue_experts(slot, unit, chunk, true);
    for (const std::int32_t e : chunk) slot.arrives[static_cast<std::size_t>(slot.where[static_cast<std::size_t>(e)])].wait();
    const std::int64_t end = j < routed.size() ? routed[j] : cfg_.moe.experts + 1;
    u.moe->forward_experts(be_, slot.view, routing, act, begin, end);
    if (j == routed.size()) return;
    begin = end;
    i = j;
  }
}

void BlockScheduler::issue_loads(BlockState& st, std::int64_t unit, std::int64_t k, RingSlot& slot) {
  const Unit& u = units_[static_cast<std::size_t>(unit)];
  Batch& b = st.batches[static_cast<std::size_t>(k)];
  const std::int64_t row_floats = cfg_.hidden;
  // The slot's previous write-backs read its buffers: they must finish before it is refilled.
  std::vector<CopyTicket> before = std::move(slot.stores);
  slot.stores.clear();
  slot.loads.clear();
  if (!st.hidden_resident && !u.first) {
    auto pieces = b.hidden->pieces(0, b.step.rows(), Place::gpu(slot.hidden.data()), false);
    std::vector<CopyTicket> deps = before;
    deps.push_back(b.hidden_stored);
    slot.loads.push_back(copies_->submit(
        lane_hidden_in_,
        [this, deps, pieces = std::move(pieces)](offload::Staging& s) {
          wait_all(deps);
          offload::copy_pieces_now(tiers_, pieces, s, copies_->options());
        },
        {"load_hidden", u.name + " b" + std::to_string(k)}, b.step.rows() * row_floats * 4));
  }
  const std::int64_t staged = b.n - b.resident_end;
  if (u.cache_layer >= 0 && staged > 0 && !b.step.prefill) {
    // Only the valid slots of each (sequence, kv head): lens before this step's token. Under
    // eviction the policy's slots fill the (budget-sized) rows: all of them.
    const TieredTensor& kt = *b.k[static_cast<std::size_t>(u.cache_layer)];
    const TieredTensor& vt = *b.v[static_cast<std::size_t>(u.cache_layer)];
    const std::int64_t slot_bytes = kernels::kv_slot_bytes(cache_dtype_, cfg_.head_dim);
    const std::int64_t head_bytes = st.capacity * slot_bytes;
    std::vector<KvByteRange> ranges;
    std::int64_t bytes = 0;
    for (std::int64_t s = b.resident_end; s < b.n; ++s) {
      ranges.push_back({0, b.eviction.empty() ? (b.step.lens[s] - 1) * slot_bytes : head_bytes});
      bytes += 2 * cfg_.n_kv_heads * ranges.back().to;
    }
    auto pieces = kv_stage_pieces(kt, vt, cfg_.n_kv_heads, b.resident_end, ranges, slot.k.data(), slot.v.data(), false);
    std::vector<CopyTicket> deps = before;
    deps.push_back(b.cache_stored[static_cast<std::size_t>(u.cache_layer)]);
    slot.loads.push_back(copies_->submit(
        lane_cache_in_,
        [this, deps, pieces = std::move(pieces)](offload::Staging& s) {
          wait_all(deps);
          offload::copy_pieces_now(tiers_, pieces, s, copies_->options());
        },
        {"load_cache", u.name + " b" + std::to_string(k)}, bytes));
  }
  if (slot.loads.empty()) wait_all(before);  // nothing queued behind them: settle here
}

void BlockScheduler::compute(BlockState& st, std::int64_t unit, std::int64_t k, RingSlot& slot,
                             std::int64_t weight_seq) {
  const Unit& u = units_[static_cast<std::size_t>(unit)];
  Batch& b = st.batches[static_cast<std::size_t>(k)];
  const DeviceWeights* w = &resident_;
  WeightSlot* ws = nullptr;
  if (!weight_slots_.empty()) {
    ws = &weight_slots_[static_cast<std::size_t>(weight_seq % 2)];
    ws->ready.wait();
    w = &ws->view;
  }
  wait_all(slot.loads);
  Activations& act = *st.act;
  act.hidden = st.hidden_resident ? static_cast<float*>(b.hidden->place(0).ptr)
                                  : reinterpret_cast<float*>(slot.hidden.data());
  KvView view{st.capacity, cache_dtype_, {}, nullptr};
  if (u.cache_layer >= 0) {
    if (!b.eviction.empty()) view.eviction = b.eviction[static_cast<std::size_t>(u.cache_layer)].get();
    const TieredTensor& kt = *b.k[static_cast<std::size_t>(u.cache_layer)];
    const TieredTensor& vt = *b.v[static_cast<std::size_t>(u.cache_layer)];
    for (Tier t : {Tier::Gpu, Tier::Cpu}) {
      const std::int64_t s0 = kt.split().begin[static_cast<int>(t)];
      const std::int64_t s1 = std::min(kt.split().end[static_cast<int>(t)], b.resident_end);
      if (s0 < s1) view.parts.push_back({s0, s1, kt.place(s0).ptr, vt.place(s0).ptr});
    }
    if (b.resident_end < b.n) view.parts.push_back({b.resident_end, b.n, slot.k.data(), slot.v.data()});
  }
  {
    offload::ScopedSpan span(trace_, "compute", "compute_layer", u.name + " b" + std::to_string(k));
    for (const Layer* l : u.layers) {
      if (ws && l == u.moe) {
        // The experts this batch routes to (prefetched as the unit before routed it, or with
        // the unit), fetched here where they were not or did not fit.
        run_experts(*ws, unit, l->route_experts(be_, *w, b.step, act), act);
        continue;
      }
      l->forward(be_, *w, b.step, act, u.cache_layer >= 0 ? &view : nullptr);
    }
    // Route this batch for the next unit's MoE layer now that its input is here, so the
    // experts it needs stream in while the next batches compute.
    if (ws && st.routed_experts && !u.last && units_[static_cast<std::size_t>(unit + 1)].routed_before) {
      WeightSlot& next = weight_slots_[static_cast<std::size_t>((weight_seq + 1) % 2)];
      if (next.seq != weight_seq + 1) throw std::logic_error("the MoE unit's router weights were not fetched ahead");
      if (next.routed) {
        next.ready.wait();
        issue_experts(next, unit + 1,
                      units_[static_cast<std::size_t>(unit + 1)].moe->route_experts(be_, next.view, b.step, act).routed,
                      false);
      }
    }
    if (u.last && holds_head_) {
      const GenerationRequest& req = *st.req;
      std::span<std::int32_t> next(st.next.data() + b.seq0, static_cast<std::size_t>(b.n));
      std::span<const std::uint64_t> streams(st.streams.data() + b.seq0, static_cast<std::size_t>(b.n));
      be_.sample({act.logits.as<float>(), b.n, cfg_.vocab_size, req.sampling, streams,
                  static_cast<std::uint64_t>(st.step), next});
      if (req.on_logits)
        be_.copy_to_host(st.host_logits.data() + b.seq0 * cfg_.vocab_size, act.logits.data(),
                         static_cast<std::size_t>(b.n * cfg_.vocab_size) * sizeof(float));
    }
  }
}

void BlockScheduler::issue_stores(BlockState& st, std::int64_t unit, std::int64_t k, RingSlot& slot) {
  const Unit& u = units_[static_cast<std::size_t>(unit)];
  Batch& b = st.batches[static_cast<std::size_t>(k)];
  if (!st.hidden_resident && !u.last) {
    auto pieces = b.hidden->pieces(0, b.step.rows(), Place::gpu(slot.hidden.data()), true);
    b.hidden_stored = copies_->copy(lane_hidden_out_, std::move(pieces), {"store_hidden", u.name + " b" + std::to_string(k)});
    slot.stores.push_back(b.hidden_stored);
  }
  if (u.cache_layer >= 0 && b.resident_end < b.n) {
    const TieredTensor& kt = *b.k[static_cast<std::size_t>(u.cache_layer)];
    const TieredTensor& vt = *b.v[static_cast<std::size_t>(u.cache_layer)];
    const std::int64_t slot_bytes = kernels::kv_slot_bytes(cache_dtype_, cfg_.head_dim);
    const std::int64_t head_bytes = st.capacity * slot_bytes;
    // Prefill wrote slots [0, len); a decode step wrote slot len - 1; under eviction the
    // policy's slots anywhere in the row.
    const bool all = !b.eviction.empty();
    std::vector<KvByteRange> ranges;
    for (std::int64_t s = b.resident_end; s < b.n; ++s)
      ranges.push_back({b.step.prefill || all ? 0 : (b.step.lens[s] - 1) * slot_bytes,
                        all ? head_bytes : b.step.lens[s] * slot_bytes});
    auto pieces = kv_stage_pieces(kt, vt, cfg_.n_kv_heads, b.resident_end, ranges, slot.k.data(), slot.v.data(), true);
    auto& stored = b.cache_stored[static_cast<std::size_t>(u.cache_layer)];
    stored = copies_->copy(lane_cache_out_, std::move(pieces), {"store_cache", u.name + " b" + std::to_string(k)});
    slot.stores.push_back(stored);
  }
  if (!policy_.overlap) wait_all(slot.stores);
}

struct BlockScheduler::Block {
  Block(kernels::Backend& be, const ModelConfig& cfg, const GenerationRequest& req) : log(be, cfg, req) {}
  GenerationLog log;
  BlockState st;
  std::int64_t computes = 0;  // so far: compute c uses ring slot c % 3
};

void BlockScheduler::BlockDeleter::operator()(Block* b) const { delete b; }

bool BlockScheduler::holds_input() const { return units_.front().first; }

BlockScheduler::BlockPtr BlockScheduler::begin(const GenerationRequest& req) {
  BlockPtr blk(new Block(be_, cfg_, req));
  const std::int64_t B = static_cast<std::int64_t>(req.prompts.size());
  if (B > policy_.block_size())
    throw std::invalid_argument("a block holds at most gpu_batch_size x num_gpu_batches = " +
                                std::to_string(policy_.block_size()) + " prompts, got " + std::to_string(B));
  if (B == 0) return blk;

  // Unit instances fetched before (or failed to) are not reused by a new block.
  for (auto& ws : weight_slots_) ws.seq = -1;
  GenerationLog& log = blk->log;
  BlockState& st = blk->st;
  st.req = &req;
  st.streams = log.streams();
  st.next.resize(static_cast<std::size_t>(B));
  if (req.on_logits) st.host_logits.resize(static_cast<std::size_t>(B * cfg_.vocab_size));
  const std::int64_t gbs = policy_.gpu_batch_size;
  // With a KV policy the cache holds each (sequence, kv head)'s budget + 1 slots, not all tokens.
  const policy::KvPolicy* kv = req.kv ? req.kv : kv_policy_.get();
  std::vector<std::vector<std::unique_ptr<KvEvictionLayer>>> evictions;
  st.capacity = kv ? 0 : log.max_prompt() + req.max_new_tokens;
  if (kv) check_kv_policy_fits(cfg_, log.max_prompt() + req.max_new_tokens);
  for (std::int64_t s0 = 0; kv && s0 < B; s0 += gbs) {
    std::vector<std::int64_t> total;
    std::int64_t rows = 0;
    for (std::int64_t s = s0; s < std::min(B, s0 + gbs); ++s) {
      total.push_back(sequence_tokens(req, static_cast<std::size_t>(s)));
      rows += static_cast<std::int64_t>(req.prompts[s].size());
    }
    evictions.push_back(make_kv_eviction(be_, *kv, cfg_, total, rows));
    for (const auto& e : evictions.back()) st.capacity = std::max(st.capacity, e->capacity());
  }
  // A KV row: one sequence's kv_heads x capacity slots.
  const std::int64_t kv_row = cfg_.n_kv_heads * st.capacity * cfg_.head_dim;
  const std::int64_t kv_row_bytes = cfg_.n_kv_heads * st.capacity * kernels::kv_slot_bytes(cache_dtype_, cfg_.head_dim);
  std::int64_t max_rows = 0;
  for (std::int64_t s0 = 0; s0 < B; s0 += gbs) {
    Batch b;
    if (kv) b.eviction = std::move(evictions[static_cast<std::size_t>(s0 / gbs)]);
    b.seq0 = s0;
    b.n = std::min(gbs, B - s0);
    b.tokens.assign(req.prompts.begin() + s0, req.prompts.begin() + s0 + b.n);
    b.step = StepBatch::make_prefill(b.tokens);
    const std::int64_t rows = std::max(rows_for_batch(cfg_, b.tokens, req.max_new_tokens), b.n);
    max_rows = std::max(max_rows, rows);
    const std::string tag = " of batch " + std::to_string(st.batches.size());
    b.hidden = std::make_unique<TieredTensor>(tiers_, "hidden states" + tag, kernels::DType::F32, rows, cfg_.hidden,
                                              policy_.activations);
    // Only the caches of this scheduler's decoder layers.
    b.k.resize(static_cast<std::size_t>(cfg_.n_layers));
    b.v.resize(static_cast<std::size_t>(cfg_.n_layers));
    for (const std::int64_t l : cache_layers_) {
      const std::string name = "KV cache of layer " + std::to_string(l) + tag;
      b.k[static_cast<std::size_t>(l)] =
          std::make_unique<TieredTensor>(tiers_, "K " + name, cache_dtype_, b.n, kv_row, policy_.cache, kv_row_bytes);
      b.v[static_cast<std::size_t>(l)] =
          std::make_unique<TieredTensor>(tiers_, "V " + name, cache_dtype_, b.n, kv_row, policy_.cache, kv_row_bytes);
    }
    if (cache_layers_.empty()) {
      b.resident_end = b.n;
    } else {
      const auto& split = b.k[static_cast<std::size_t>(cache_layers_.front())]->split();
      b.resident_end = policy_.cpu_cache_compute ? split.end[1] : split.end[0];
    }
    b.cache_stored.resize(static_cast<std::size_t>(cfg_.n_layers));
    st.hidden_resident = st.hidden_resident && b.hidden->entirely_on(Tier::Gpu);
    st.staged_max = std::max(st.staged_max, b.n - b.resident_end);
    st.batches.push_back(std::move(b));
  }
  st.act_reserved = tiers_.budget(Tier::Gpu).reserve_scoped(
      Activations::bytes(be_, cfg_, max_rows, gbs, st.capacity, kv != nullptr), "activation scratch");
  st.act = std::make_unique<Activations>(be_, cfg_, max_rows, gbs);
  st.ring.resize(3);
  for (std::size_t i = 0; i < st.ring.size(); ++i) {
    const std::string n = " (ring slot " + std::to_string(i) + ")";
    if (!st.hidden_resident) st.ring[i].hidden = GpuBuffer(tiers_, max_rows * cfg_.hidden * 4, "hidden staging" + n);
    if (st.staged_max > 0) {
      st.ring[i].k = GpuBuffer(tiers_, st.staged_max * kv_row_bytes, "K staging" + n);
      st.ring[i].v = GpuBuffer(tiers_, st.staged_max * kv_row_bytes, "V staging" + n);
    }
  }
  return blk;
}

bool BlockScheduler::active(const Block& b) const { return b.log.active(); }

void BlockScheduler::run_step(Block& blk, const StageLinks& links) {
  if (!blk.log.active()) throw std::logic_error("run_step on a finished block");
  BlockState& st = blk.st;
  const bool receiving = !holds_input(), sending = !holds_head_;
  if ((receiving && !links.receive) || (sending && !links.send))
    throw std::logic_error("a scheduler holding part of the model needs the links to its neighbours");
  const std::int64_t K = static_cast<std::int64_t>(st.batches.size());
  const std::int64_t U = static_cast<std::int64_t>(units_.size());
  auto receive = [&](std::int64_t k) {
    Batch& b = st.batches[static_cast<std::size_t>(k)];
    boundary_.resize(static_cast<std::size_t>(b.step.rows() * cfg_.hidden));
    links.receive(k, boundary_);
    b.hidden->write_rows(0, b.step.rows(), boundary_.data(), *boundary_staging_);
  };
  auto send = [&](std::int64_t k) {
    const Batch& b = st.batches[static_cast<std::size_t>(k)];
    boundary_.resize(static_cast<std::size_t>(b.step.rows() * cfg_.hidden));
    be_.copy_to_host(boundary_.data(), st.act->hidden, boundary_.size() * sizeof(float));
    links.send(k, boundary_);
  };
  const std::int64_t first_seq = unit_instances_;
  unit_instances_ += U;
  std::int64_t routed_rows = 0;
  for (const auto& b : st.batches) routed_rows += b.step.rows();
  st.routed_experts =
      cfg_.moe.experts > 0 && policy_.routed_expert_loading(cfg_.moe.experts, cfg_.moe.top_k, routed_rows);
  for (std::int64_t u = 0; u < U; ++u) {
    const std::int64_t wseq = first_seq + u;
    issue_weights(u, wseq, st);
    // A MoE unit's router comes ahead even without overlap: this unit routes for it.
    const bool route_ahead = st.routed_experts && u + 1 < U && units_[static_cast<std::size_t>(u + 1)].routed_before;
    for (std::int64_t k = 0; k < K; ++k) {
      const std::int64_t counter = blk.computes++;
      RingSlot& slot = st.ring[static_cast<std::size_t>(counter % 3)];
      if (slot.assigned != counter) {
        if (u == 0 && receiving) receive(k);
        issue_loads(st, u, k, slot);
        slot.assigned = counter;
      }
      if (route_ahead && !policy_.overlap && k == 0) issue_weights(u + 1, wseq + 1, st);
      if (policy_.overlap) {
        // Next unit's weights while this unit's K batches compute (the next step's first
        // unit at the end; fetched in vain only after the very last step).
        if (k == 0) issue_weights((u + 1) % U, wseq + 1, st);
        // Next batch's activations and KV, when they do not depend on this compute (nor on a
        // neighbour stage: its input is received in line, not before this compute).
        const bool next_in_unit = k + 1 < K && !(u == 0 && receiving), next_unit = k + 1 == K && u + 1 < U && K > 1;
        if (next_in_unit || next_unit) {
          RingSlot& ns = st.ring[static_cast<std::size_t>((counter + 1) % 3)];
          issue_loads(st, next_in_unit ? u : u + 1, next_in_unit ? k + 1 : 0, ns);
          ns.assigned = counter + 1;
        }
      }
      compute(st, u, k, slot, wseq);
      issue_stores(st, u, k, slot);
      if (u == U - 1 && sending) send(k);
    }
  }
}

std::span<std::int32_t> BlockScheduler::next_tokens(Block& b) { return b.st.next; }

void BlockScheduler::end_step(Block& blk) {
  BlockState& st = blk.st;
  if (holds_head_ && st.req->on_logits) st.req->on_logits(st.step, st.host_logits);
  blk.log.record(st.step, st.next);
  ++st.step;
  if (!blk.log.active()) return;
  for (auto& b : st.batches) {
    const auto next = std::span(st.next).subspan(static_cast<std::size_t>(b.seq0), static_cast<std::size_t>(b.n));
    for (std::size_t i = 0; i < next.size(); ++i) b.tokens[i].push_back(next[i]);
    // Phi-3 prefills a batch whole again when a sequence outgrows the original context.
    b.step = rope_reprefills(cfg_, b.step.lens) ? StepBatch::make_prefill(b.tokens)
                                                 : StepBatch::make_decode(next, b.step.lens);
  }
}

GenerationResult BlockScheduler::finish(Block& b) { return b.log.finish(); }

GenerationResult BlockScheduler::generate(const GenerationRequest& req) {
  if (!holds_input() || !holds_head_) throw std::logic_error("generate() needs the whole model; step a stage's blocks");
  BlockPtr blk = begin(req);
  while (active(*blk)) {
    run_step(*blk);
    end_step(*blk);
  }
  return finish(*blk);
}

}  // namespace flexh2o::engine
