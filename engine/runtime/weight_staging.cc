#include "engine/runtime/weight_staging.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace flexh2o::engine {

using offload::CopyPiece;
using offload::CopyTicket;
using offload::Place;
using offload::Tier;
using offload::TieredTensor;

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

struct WeightStaging::Slot {
  GpuBuffer buf;
  std::int64_t instance = -1;  // the unit instance it holds or is fetching
  std::int64_t unit = -1;
  std::vector<LayerWeights> weights;  // per layer of the unit
  CopyTicket ready;       // all weights but the experts'
  std::int64_t used = 0;  // bytes of buf taken
  std::int64_t step = 0;  // the token step it loads for (expert statistics)
  // Experts: fetched as routed (false: all with the unit). Which expert each sub-slot holds
  // (-1: none) and the copy bringing it, and each expert's sub-slot (-1: none).
  bool routed = false;
  std::byte* experts_base = nullptr;
  std::vector<std::int32_t> held, where;
  std::vector<CopyTicket> arrives;
};

WeightStaging::WeightStaging(offload::Tiers& tiers, TieredWeights weights, const std::vector<SchedulingUnit>& units,
                             std::int64_t expert_slots, offload::CopyEngine& copies, bool overlap)
    : tiers_(tiers), weights_(std::move(weights)), units_(units), copies_(copies), overlap_(overlap) {
  lane_ = copies_.add_lane("copy: weights in");
  // Each tensor once: in place in the unit's typed weights when wholly on the gpu tier, else
  // among those a fetch stages. Returns the device bytes it takes in a slot.
  auto place = [&](UnitWeights& uw, const UnitTensor& u, std::vector<StagedTensor>& staged) -> std::int64_t {
    const TieredTensor& t = *weights_.at(u.spec.name);
    if (!t.entirely_on(Tier::Gpu)) {
      staged.push_back({&u, &t});
      return policy::slot_bytes(t.bytes());
    }
    set_weight(uw.in_place[u.layer], u.spec, {t.place(0).ptr, t.dtype(), t.rows(), t.cols()});
    return 0;
  };
  std::vector<std::int64_t> base_bytes;
  for (const auto& u : units_) {
    UnitWeights& uw = unit_weights_.emplace_back();
    for (const Layer* l : u.layers) uw.in_place.push_back(l->empty_weights());
    std::int64_t& bytes = base_bytes.emplace_back();
    for (const auto& t : u.weights) bytes += place(uw, t, uw.staged);
    for (const auto& e : u.experts) {
      auto& staged = uw.staged_experts.emplace_back();
      std::int64_t eb = 0;
      for (const auto& t : e) eb += place(uw, t, staged);
      uw.staged_expert_count += eb > 0;
      expert_bytes_ = std::max(expert_bytes_, eb);
    }
    uw.sub_slots = std::min(expert_slots, uw.staged_expert_count);
  }
  std::int64_t slot_bytes = 0;
  for (std::size_t i = 0; i < units_.size(); ++i)
    slot_bytes = std::max(slot_bytes, base_bytes[i] + unit_weights_[i].sub_slots * expert_bytes_);
  if (slot_bytes > 0)
    for (int i = 0; i < 2; ++i)
      slots_.emplace_back().buf = GpuBuffer(tiers_, slot_bytes, "weight staging slot " + std::to_string(i));
}

WeightStaging::~WeightStaging() = default;

WeightStaging::Slot& WeightStaging::slot_of(std::int64_t instance) {
  return slots_[static_cast<std::size_t>(instance % 2)];
}

void WeightStaging::forget() {
  for (auto& s : slots_) s.instance = -1;
}

// Puts staged tensor `s` at `dst` in the slot's weights, with the copies that fetch it.
// Returns the device bytes it takes there and adds the bytes read from the cpu and disk tiers
// to `moved`.
std::int64_t WeightStaging::stage(Slot& slot, const StagedTensor& s, std::byte* dst, std::vector<CopyPiece>& pieces,
                                  std::int64_t& moved) {
  const TieredTensor& t = *s.source;
  set_weight(slot.weights[s.tensor->layer], s.tensor->spec, {dst, t.dtype(), t.rows(), t.cols()});
  auto p = t.pieces(0, t.rows(), Place::gpu(dst), false);
  pieces.insert(pieces.end(), p.begin(), p.end());
  moved += t.bytes() - t.bytes_on(Tier::Gpu);
  return policy::slot_bytes(t.bytes());
}

void WeightStaging::fetch(std::int64_t unit, std::int64_t instance, std::int64_t step, bool routed) {
  if (slots_.empty()) return;
  Slot& slot = slot_of(instance);
  if (slot.instance == instance) return;
  const SchedulingUnit& u = units_[static_cast<std::size_t>(unit)];
  const UnitWeights& uw = unit_weights_[static_cast<std::size_t>(unit)];
  slot.instance = -1;  // set once the fetch is queued, so a failure here never looks loaded
  slot.unit = unit;
  slot.weights = uw.in_place;
  slot.used = 0;
  slot.routed = routed && uw.staged_expert_count > 0;
  slot.step = step;
  std::vector<CopyPiece> pieces;
  std::int64_t moved = 0;
  for (const StagedTensor& t : uw.staged) slot.used += stage(slot, t, slot.buf.data() + slot.used, pieces, moved);
  slot.experts_base = slot.buf.data() + slot.used;
  slot.held.assign(static_cast<std::size_t>(uw.sub_slots), -1);
  slot.arrives.assign(slot.held.size(), {});
  slot.where.assign(u.experts.size(), -1);
  slot.ready = copies_.copy(lane_, std::move(pieces), {"load_weight", u.name});
  slot.instance = instance;
  if (!u.experts.empty() && !slot.routed) {
    std::vector<std::int32_t> all(u.experts.size());
    std::iota(all.begin(), all.end(), 0);
    fetch_experts(slot, all, false);
  }
}

const std::vector<LayerWeights>& WeightStaging::weights(std::int64_t unit, std::int64_t instance) {
  if (slots_.empty()) return unit_weights_[static_cast<std::size_t>(unit)].in_place;
  Slot& slot = slot_of(instance);
  if (slot.instance != instance) throw std::logic_error("a unit's weights were used before they were fetched");
  slot.ready.wait();
  return slot.weights;
}

bool WeightStaging::routes(std::int64_t instance) const {
  if (slots_.empty()) return false;
  const Slot& slot = slots_[static_cast<std::size_t>(instance % 2)];
  if (slot.instance != instance) throw std::logic_error("the MoE unit's router weights were not fetched ahead");
  return slot.routed;
}

void WeightStaging::prefetch_experts(std::int64_t instance, std::span<const std::int32_t> experts) {
  fetch_experts(slot_of(instance), experts, false);
}

// Fetches the staged experts of `experts` the slot does not hold, as one copy: into free
// sub-slots (the rest wait until computed), or with `evict` also into those of experts not
// among `experts` (which then must fit the sub-slots).
void WeightStaging::fetch_experts(Slot& slot, std::span<const std::int32_t> experts, bool evict) {
  const SchedulingUnit& u = units_[static_cast<std::size_t>(slot.unit)];
  const UnitWeights& uw = unit_weights_[static_cast<std::size_t>(slot.unit)];
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
    if (uw.staged_experts[ei].empty() || slot.where[ei] >= 0) continue;
    if (next_free == free_slots.end()) {
      if (evict) throw std::logic_error("a chunk of experts larger than the staging slot's expert slots");
      break;
    }
    const std::size_t i = *next_free++;
    if (const std::int32_t old = slot.held[i]; old >= 0) {
      slot.arrives[i].wait();  // a copy still bringing the evicted expert would land after ours
      for (const StagedTensor& t : uw.staged_experts[static_cast<std::size_t>(old)])
        set_weight(slot.weights[t.tensor->layer], t.tensor->spec, {});
      slot.where[static_cast<std::size_t>(old)] = -1;
    }
    std::byte* dst = slot.experts_base + static_cast<std::int64_t>(i) * expert_bytes_;
    for (const StagedTensor& t : uw.staged_experts[ei]) dst += stage(slot, t, dst, pieces, bytes);
    slot.held[i] = e;
    slot.where[ei] = static_cast<std::int32_t>(i);
    filled.push_back(i);
    if (!which.empty()) which += ',';
    which += std::to_string(e);
  }
  if (pieces.empty()) return;
  const CopyTicket t = copies_.copy(lane_, std::move(pieces), {"load_experts", u.name + " experts " + which});
  for (const std::size_t i : filled) slot.arrives[i] = t;
  expert_loads_.add(slot.step, static_cast<std::int64_t>(filled.size()), bytes);
  if (!overlap_) t.wait();
}

// All at once when the staged experts `routing` needs fit the slot, else in ascending chunks
// that do, each fetched (over experts the chunk does not need) before it runs, so that the
// sums are forward()'s.
void WeightStaging::run_experts(kernels::Backend& be, std::int64_t instance, const ExpertRouting& routing,
                                Activations& act) {
  Slot& slot = slot_of(instance);
  const SchedulingUnit& u = units_[static_cast<std::size_t>(slot.unit)];
  const UnitWeights& uw = unit_weights_[static_cast<std::size_t>(slot.unit)];
  const auto moe_at = static_cast<std::size_t>(std::ranges::find(u.layers, u.moe) - u.layers.begin());
  const std::vector<std::int32_t>& routed = routing.routed;
  const auto cap = static_cast<std::int64_t>(slot.held.size());
  const std::int64_t n_experts = static_cast<std::int64_t>(u.experts.size());
  std::int64_t begin = 0;
  std::vector<std::int32_t> chunk;
  for (std::size_t i = 0;;) {
    chunk.clear();
    std::size_t j = i;
    for (; j < routed.size(); ++j) {
      if (uw.staged_experts[static_cast<std::size_t>(routed[j])].empty()) continue;
      if (static_cast<std::int64_t>(chunk.size()) == cap) break;
      chunk.push_back(routed[j]);
    }
    fetch_experts(slot, chunk, true);
    for (const std::int32_t e : chunk)
      slot.arrives[static_cast<std::size_t>(slot.where[static_cast<std::size_t>(e)])].wait();
    const std::int64_t end = j < routed.size() ? routed[j] : n_experts + 1;
    u.moe->forward_experts(be, slot.weights[moe_at], routing, act, begin, end);
    if (j == routed.size()) return;
    begin = end;
    i = j;
  }
}

}  // namespace flexh2o::engine
