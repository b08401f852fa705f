#include "engine/runtime/cache_ring.h"

#include "engine/runtime/kv_staging.h"

#include <algorithm>

namespace flexh2o::engine {

using offload::CopyPiece;
using offload::CopyTicket;
using offload::Place;
using offload::TieredTensor;

namespace {
void wait_all(const std::vector<CopyTicket>& ts) {
  for (const auto& t : ts) t.wait();
}
std::string batch_label(const SchedulingUnit& u, std::int64_t k) { return u.name + " b" + std::to_string(k); }
}  // namespace

std::int64_t KvReads::total() const {
  std::int64_t sum = 0;
  for (std::size_t t = 0; t < in_place.size(); ++t) sum += in_place[t] + staged[t];
  return sum;
}

void KvReads::add(const KvReads& o) {
  for (std::size_t t = 0; t < in_place.size(); ++t) {
    in_place[t] += o.in_place[t];
    staged[t] += o.staged[t];
  }
  shared_prefix_saved += o.shared_prefix_saved;
}

CacheRing::CacheRing(offload::Tiers& tiers, offload::CopyEngine& copies, std::int64_t hidden,
                     std::int64_t n_kv_heads, std::int64_t head_dim, kernels::DType cache_dtype, bool overlap,
                     bool prefix_once)
    : tiers_(tiers),
      copies_(copies),
      hidden_(hidden),
      n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      cache_dtype_(cache_dtype),
      overlap_(overlap),
      prefix_once_(prefix_once) {
  lane_cache_in_ = copies_.add_lane("copy: cache in");
  lane_cache_out_ = copies_.add_lane("copy: cache out");
  lane_hidden_in_ = copies_.add_lane("copy: hidden in");
  lane_hidden_out_ = copies_.add_lane("copy: hidden out");
}

// A load that must wait for copies on other lanes (the slot's previous write-backs, the
// batch's own last store) before it reads.
CopyTicket CacheRing::submit_after(int lane, std::vector<CopyTicket> deps, std::vector<CopyPiece> pieces,
                                   offload::CopyLabel label, std::int64_t bytes) {
  return copies_.submit(
      lane,
      [this, deps = std::move(deps), pieces = std::move(pieces)](offload::Staging& s) {
        wait_all(deps);
        offload::copy_pieces_now(tiers_, pieces, s, copies_.options());
      },
      std::move(label), bytes);
}

void CacheRing::load(const SchedulingUnit& u, std::int64_t k, GpuBatch& b, RingSlot& slot, std::int64_t capacity,
                     bool hidden_resident, const PoolHome& pool) {
  // The slot's previous write-backs read its buffers: they must finish before it is refilled.
  std::vector<CopyTicket> before = std::move(slot.stores);
  slot.stores.clear();
  slot.loads.clear();
  if (b.step.rows() == 0) {  // continuous batching: the batch's slots are all idle this step
    wait_all(before);
    return;
  }
  if (!hidden_resident && !u.first) {
    auto pieces = b.hidden->pieces(0, b.step.rows(), Place::gpu(slot.hidden.data()), false);
    std::vector<CopyTicket> deps = before;
    deps.push_back(b.hidden_stored);
    slot.loads.push_back(submit_after(lane_hidden_in_, std::move(deps), std::move(pieces),
                                      {"load_hidden", batch_label(u, k)}, b.step.rows() * hidden_ * 4));
  }
  if (u.cache_layer >= 0 && b.step.any_cached()) load_cache(u, k, b, slot, capacity, before, pool);
  if (slot.loads.empty()) wait_all(before);  // nothing queued behind them: settle here
}

// Counts what the attention of u's layer reads of batch b's rows, and starts the copies of its
// staged rows into `slot` after `before`.
void CacheRing::load_cache(const SchedulingUnit& u, std::int64_t k, GpuBatch& b, RingSlot& slot,
                           std::int64_t capacity, const std::vector<CopyTicket>& before, const PoolHome& pool) {
  const auto layer = static_cast<std::size_t>(u.cache_layer);
  const std::vector<std::int64_t> elsewhere = prefix_read_elsewhere(b, layer);
  count_reads(b, layer, capacity, elsewhere, pool);
  if (pool.staged) load_pool(u, k, b, slot, before, pool);
  if (b.resident_end == b.n) return;
  // Only the valid slots of each (sequence, kv head) that reads its cache: those cached
  // before this step's rows, less a shared prefix its attention reads from another row or a
  // pool (its row holds the slots after a held prefix); none of a prefilling or idle one.
  // Under eviction the policy's slots fill the (budget-sized) rows: all of them.
  const std::int64_t slot_bytes = kernels::kv_slot_bytes(cache_dtype_, head_dim_);
  const std::int64_t head_bytes = capacity * slot_bytes;
  std::vector<KvByteRange> ranges;
  std::int64_t bytes = 0;
  for (std::int64_t s = b.resident_end; s < b.n; ++s) {
    const std::int64_t cached = b.step.cached(s);
    if (cached == 0)
      ranges.push_back({0, 0});
    else if (!b.eviction.empty())
      ranges.push_back({0, head_bytes});
    else
      ranges.push_back(
          {elsewhere[static_cast<std::size_t>(s)] * slot_bytes, own_slots(b.step, s, cached) * slot_bytes});
    bytes += 2 * n_kv_heads_ * (ranges.back().to - ranges.back().from);
  }
  auto pieces = kv_stage_pieces(*b.k[layer], *b.v[layer], n_kv_heads_, b.resident_end, ranges, slot.k.data(),
                                slot.v.data(), false);
  std::vector<CopyTicket> deps = before;
  deps.push_back(b.cache_stored[layer]);
  slot.loads.push_back(
      submit_after(lane_cache_in_, std::move(deps), std::move(pieces), {"load_cache", batch_label(u, k)}, bytes));
}

// Each pool row read by a sequence that decodes or extends: the slots of its held prefix cached
// before the step (a row being filled this step is read only where it is written).
void CacheRing::load_pool(const SchedulingUnit& u, std::int64_t k, const GpuBatch& b, RingSlot& slot,
                          const std::vector<CopyTicket>& before, const PoolHome& pool) {
  const auto layer = static_cast<std::size_t>(u.cache_layer);
  const std::int64_t slot_bytes = kernels::kv_slot_bytes(cache_dtype_, head_dim_);
  std::vector<KvByteRange> ranges(static_cast<std::size_t>(pool.k[layer]->rows()));
  std::int64_t bytes = 0;
  for (std::int64_t s = 0; s < b.n; ++s) {
    const std::int64_t row = b.step.pool_row[static_cast<std::size_t>(s)];
    if (row < 0 || b.step.cached(s) == 0 || ranges[static_cast<std::size_t>(row)].to > 0) continue;
    ranges[static_cast<std::size_t>(row)].to =
        std::min(b.step.cached(s), b.step.base[static_cast<std::size_t>(s)]) * slot_bytes;
    bytes += 2 * n_kv_heads_ * ranges[static_cast<std::size_t>(row)].to;
  }
  if (bytes == 0) return;
  auto pieces = kv_stage_pieces(*pool.k[layer], *pool.v[layer], n_kv_heads_, 0, ranges, slot.pool_k.data(),
                                slot.pool_v.data(), false);
  std::vector<CopyTicket> deps = before;
  deps.push_back(pool.stored[layer]);
  slot.loads.push_back(
      submit_after(lane_cache_in_, std::move(deps), std::move(pieces), {"load_pool", batch_label(u, k)}, bytes));
}

std::int64_t CacheRing::own_slots(const StepBatch& step, std::int64_t s, std::int64_t slots) {
  return slots - step.base[static_cast<std::size_t>(s)];
}

// Sequence s attends in one call with s - 1 (layers.cc): the same kind, on the same tier in place, or both staged.
bool CacheRing::same_run(const GpuBatch& b, std::size_t layer, std::int64_t s) {
  const auto k = static_cast<std::size_t>(s);
  const bool in_place = s < b.resident_end;
  const offload::RowSplit& split = b.k[layer]->split();
  return b.step.kinds[k] == b.step.kinds[k - 1] && in_place == (s - 1 < b.resident_end) &&
         (!in_place || split.tier_of(s) == split.tier_of(s - 1));
}

// Where a layer reads shared prefixes once, the members of a group after its first in a run of
// sequences of one kind within a part (a tier attended in place, or the staged rest) read the
// prefix from the first one's row, in every attention call of the run (a run of extending rows
// may take several).
std::vector<std::int64_t> CacheRing::prefix_read_elsewhere(const GpuBatch& b, std::size_t layer) const {
  std::vector<std::int64_t> elsewhere(static_cast<std::size_t>(b.n), 0);
  if (!prefix_once_ || !b.eviction.empty()) return elsewhere;
  std::vector<std::int64_t> read;  // the groups whose prefix the current run reads
  for (std::int64_t s = 0; s < b.n; ++s) {
    if (s == 0 || !same_run(b, layer, s)) read.clear();
    const auto i = static_cast<std::size_t>(s);
    const std::int64_t group = b.step.prefix_group[i];
    // A held prefix is read from its pool row (count_reads), its members' rows hold none of it.
    if (group < 0 || b.step.cached(s) == 0 || b.step.pool_row[i] >= 0) continue;
    if (std::ranges::find(read, group) != read.end())
      elsewhere[i] = b.step.prefix_len[i];
    else
      read.push_back(group);
  }
  return elsewhere;
}

// A held prefix's pool row is read where the pool lives: in place once by each run of the batch
// that reads it, or staged once for the batch (load_pool).
void CacheRing::count_reads(const GpuBatch& b, std::size_t layer, std::int64_t capacity,
                            std::span<const std::int64_t> elsewhere, const PoolHome& pool) {
  const std::int64_t slot_bytes = kernels::kv_slot_bytes(cache_dtype_, head_dim_);
  const offload::RowSplit& split = b.k[layer]->split();
  std::vector<std::int64_t> pool_rows_read;  // by the current run (staged: by the batch)
  for (std::int64_t s = 0; s < b.n; ++s) {
    if (s == 0 || (!pool.staged && !same_run(b, layer, s))) pool_rows_read.clear();
    const std::int64_t cached = b.step.cached(s);
    if (cached == 0) continue;
    const auto i = static_cast<std::size_t>(s);
    const std::int64_t skipped = elsewhere[i], pool_row = b.step.pool_row[i];
    std::int64_t saved = skipped;
    if (pool_row >= 0 && std::ranges::find(pool_rows_read, pool_row) == pool_rows_read.end()) {
      pool_rows_read.push_back(pool_row);
      auto& pool_reads = pool.staged ? reads_.staged : reads_.in_place;
      pool_reads[static_cast<std::size_t>(pool.tier)] += 2 * n_kv_heads_ * b.step.base[i] * slot_bytes;
    } else {
      saved += b.step.base[i];
    }
    reads_.shared_prefix_saved += 2 * n_kv_heads_ * saved * slot_bytes;
    const std::int64_t slots = (b.eviction.empty() ? own_slots(b.step, s, cached) : capacity) - skipped;
    auto& by_tier = s < b.resident_end ? reads_.in_place : reads_.staged;
    by_tier[static_cast<std::size_t>(split.tier_of(s))] += 2 * n_kv_heads_ * slots * slot_bytes;
  }
}

void CacheRing::store(const SchedulingUnit& u, std::int64_t k, GpuBatch& b, RingSlot& slot, std::int64_t capacity,
                      bool hidden_resident, PoolHome& pool) {
  if (b.step.rows() == 0) return;
  if (!hidden_resident && !u.last) {
    auto pieces = b.hidden->pieces(0, b.step.rows(), Place::gpu(slot.hidden.data()), true);
    b.hidden_stored = copies_.copy(lane_hidden_out_, std::move(pieces), {"store_hidden", batch_label(u, k)});
    slot.stores.push_back(b.hidden_stored);
  }
  if (u.cache_layer >= 0 && b.resident_end < b.n) {
    const auto layer = static_cast<std::size_t>(u.cache_layer);
    const std::int64_t slot_bytes = kernels::kv_slot_bytes(cache_dtype_, head_dim_);
    const std::int64_t head_bytes = capacity * slot_bytes;
    // A step wrote the slots after those cached before it, [cached, len): all of a prefill's,
    // the last of a decode's; under eviction the policy's slots anywhere in the row; an idle
    // slot nothing.
    const bool all = !b.eviction.empty();
    // A row after a held prefix holds the slots from its base on (a prefill's before it went to the pool).
    std::vector<KvByteRange> ranges;
    for (std::int64_t s = b.resident_end; s < b.n; ++s) {
      const SeqStep kind = b.step.kinds[static_cast<std::size_t>(s)];
      const std::int64_t from = std::max<std::int64_t>(own_slots(b.step, s, b.step.cached(s)), 0);
      const std::int64_t to = own_slots(b.step, s, b.step.lens[s]);
      if (kind == SeqStep::Idle)
        ranges.push_back({0, 0});
      else
        ranges.push_back({all ? 0 : from * slot_bytes, all ? head_bytes : to * slot_bytes});
    }
    auto pieces = kv_stage_pieces(*b.k[layer], *b.v[layer], n_kv_heads_, b.resident_end, ranges, slot.k.data(),
                                  slot.v.data(), true);
    b.cache_stored[layer] = copies_.copy(lane_cache_out_, std::move(pieces), {"store_cache", batch_label(u, k)});
    slot.stores.push_back(b.cache_stored[layer]);
  }
  if (u.cache_layer >= 0 && pool.staged) store_pool(u, k, b, slot, pool);
  if (!overlap_) wait_all(slot.stores);
}

// A prefill filling its pool row wrote the slots of its rows before its base: they go home.
// (The lane runs in order: the pool's last write-back ticket covers the earlier ones.)
void CacheRing::store_pool(const SchedulingUnit& u, std::int64_t k, const GpuBatch& b, RingSlot& slot,
                           PoolHome& pool) {
  const auto layer = static_cast<std::size_t>(u.cache_layer);
  const std::int64_t slot_bytes = kernels::kv_slot_bytes(cache_dtype_, head_dim_);
  std::vector<KvByteRange> ranges(static_cast<std::size_t>(pool.k[layer]->rows()));
  bool any = false;
  for (std::int64_t s = 0; s < b.n; ++s) {
    const auto i = static_cast<std::size_t>(s);
    const std::int64_t row = b.step.pool_row[i], from = b.step.cached(s);
    if (row < 0 || b.step.kinds[i] == SeqStep::Idle || from >= b.step.base[i]) continue;
    ranges[static_cast<std::size_t>(row)] = {from * slot_bytes, std::min(b.step.lens[i], b.step.base[i]) * slot_bytes};
    any = true;
  }
  if (!any) return;
  auto pieces = kv_stage_pieces(*pool.k[layer], *pool.v[layer], n_kv_heads_, 0, ranges, slot.pool_k.data(),
                                slot.pool_v.data(), true);
  pool.stored[layer] = copies_.copy(lane_cache_out_, std::move(pieces), {"store_pool", batch_label(u, k)});
  slot.stores.push_back(pool.stored[layer]);
}

}  // namespace flexh2o::engine
