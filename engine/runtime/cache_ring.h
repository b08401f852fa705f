// FlexGen's load_cache / load_hidden / store_cache / store_hidden: the hidden states and KV
// cache of one GPU batch copied between their tiers and one of three device ring slots (one
// fetching, one computing, one writing back), each on its own copy lane. KV is split by
// sequence: sequences [0, resident_end) of a batch are attended where they live (gpu tier, or
// host memory with cpu_cache_compute); the rest are staged through the slot. Only the valid
// slots move: those cached before the step in (less a shared prefix that the attention reads
// from another row, or from the pool of prefixes held once on the device, read in place), the
// step's new slots out (under eviction, each head's whole budget-sized row both ways). The pool
// of prefixes held once lives on one tier: read in place there (gpu; cpu with
// cpu_cache_compute), or staged like the rows: the pool rows a batch reads in, a filled row out.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/model/kv_eviction.h"
#include "engine/runtime/gpu_buffer.h"
#include "engine/runtime/units.h"
#include "engine/model/step.h"
#include "offload/copy_engine.h"
#include "offload/tiered_tensor.h"

namespace flexh2o::engine {

// One GPU batch of a block: its sequences, their tokens and step, and the homes of its hidden
// states and KV cache (TieredTensors split by the policy).
struct GpuBatch {
  std::int64_t first_sequence = 0, n = 0;  // sequences [first_sequence, first_sequence + n) of the block
  StepBatch step;
  std::unique_ptr<offload::TieredTensor> hidden;  // [max rows, hidden]
  std::vector<std::unique_ptr<offload::TieredTensor>> k, v;  // per decoder layer: n rows of kv_heads x capacity slots
  std::int64_t resident_end = 0;  // sequences [0, resident_end) are attended where they live
  std::vector<std::unique_ptr<KvEvictionLayer>> eviction;  // per decoder layer, with a KV policy
  offload::CopyTicket hidden_stored;
  std::vector<offload::CopyTicket> cache_stored;  // per decoder layer
};

// The KV cache bytes the attention of the steps read, by the tier each sequence's rows live on:
// attended where they live (sequences [0, resident_end) of a batch) or staged through a ring
// slot first (load_cache). A sequence that decodes or extends reads, in each decoder layer, K
// and V of the slots its cache held before the step (under eviction its whole budget-sized
// rows); a prefill reads none (it attends over the K/V it computes). Where a layer's attention
// reads shared prefixes once (StepBatch::prefix_group), the members of a group attended in
// place by one call read the prefix once: the first member all its slots, the others their
// slots after it; staged rows the same (load_cache leaves the others' prefixes out).
struct KvReads {
  std::array<std::int64_t, 3> in_place{}, staged{};  // by offload::Tier
  // Not in the totals: the bytes a group's members after its first did not read (their prefix).
  std::int64_t shared_prefix_saved = 0;
  std::int64_t total() const;
  void add(const KvReads& o);
};

// The pool of prefixes held once (docs/prefix-sharing.md, "Where it lives"): per decoder layer,
// K and V rows of `capacity` slots (a row per pool row, laid out like a KV row) wholly on one
// tier, attended in place or staged through the ring slots' pool buffers.
struct PoolHome {
  std::int64_t capacity = 0;
  offload::Tier tier = offload::Tier::Gpu;
  bool staged = false;
  std::vector<std::unique_ptr<offload::TieredTensor>> k, v;  // per decoder layer
  std::vector<offload::CopyTicket> stored;  // per decoder layer: the last write-back of a filled row
  bool held() const { return !k.empty(); }
};

// Device buffers of one compute in flight: its hidden states, its staged KV sequences and,
// where the pool is staged, the pool rows the compute reads or fills (at their pool offsets).
struct RingSlot {
  GpuBuffer hidden, k, v, pool_k, pool_v;
  std::vector<offload::CopyTicket> loads;   // fetches into this slot for the compute it is assigned to
  std::vector<offload::CopyTicket> stores;  // write-backs reading this slot
  std::int64_t assigned = -1;               // the compute (counter) its loads are for
};

class CacheRing {
 public:
  // Adds its four lanes to `copies` (which outlives this). prefix_once: whether attention reads
  // a shared prefix once for all the members of a call (the backend's reads_shared_prefixes_once).
  CacheRing(offload::Tiers& tiers, offload::CopyEngine& copies, std::int64_t hidden, std::int64_t n_kv_heads,
            std::int64_t head_dim, kernels::DType cache_dtype, bool overlap, bool prefix_once);
  // Starts the copies of batch `b`'s inputs to unit `u` into `slot`: its hidden states unless
  // they stay resident (`hidden_resident`) or come from the embedding, and its staged KV
  // sequences' valid slots (`capacity` slots per head) when u attends and a sequence of the
  // step reads what earlier steps cached (it decodes or extends), with the staged pool's rows
  // those sequences read.
  void load(const SchedulingUnit& u, std::int64_t k, GpuBatch& b, RingSlot& slot, std::int64_t capacity,
            bool hidden_resident, const PoolHome& pool);
  // Starts the write-backs of what unit `u` computed for batch `b` in `slot` (and of the
  // staged pool rows its prefills filled).
  void store(const SchedulingUnit& u, std::int64_t k, GpuBatch& b, RingSlot& slot, std::int64_t capacity,
             bool hidden_resident, PoolHome& pool);
  // What the loads so far read (each (unit, batch) of a step is loaded once).
  const KvReads& reads() const { return reads_; }

 private:
  void load_cache(const SchedulingUnit& u, std::int64_t k, GpuBatch& b, RingSlot& slot, std::int64_t capacity,
                  const std::vector<offload::CopyTicket>& before, const PoolHome& pool);
  // The staged pool's rows that b's sequences read in `layer` (their held prefix), into `slot`.
  void load_pool(const SchedulingUnit& u, std::int64_t k, const GpuBatch& b, RingSlot& slot,
                 const std::vector<offload::CopyTicket>& before, const PoolHome& pool);
  void store_pool(const SchedulingUnit& u, std::int64_t k, const GpuBatch& b, RingSlot& slot, PoolHome& pool);
  // Per sequence of b: the slots of a shared prefix its attention in `layer` reads from
  // another row of its run (not from its own, which need not hold them), else 0.
  std::vector<std::int64_t> prefix_read_elsewhere(const GpuBatch& b, std::size_t layer) const;
  // Of a sequence's first `slots` slots, those its own row holds (after a held prefix).
  static std::int64_t own_slots(const StepBatch& step, std::int64_t s, std::int64_t slots);
  static bool same_run(const GpuBatch& b, std::size_t layer, std::int64_t s);
  // Adds what the attention of `layer` reads of b's rows (`elsewhere`: prefix_read_elsewhere).
  void count_reads(const GpuBatch& b, std::size_t layer, std::int64_t capacity,
                   std::span<const std::int64_t> elsewhere, const PoolHome& pool);
  offload::CopyTicket submit_after(int lane, std::vector<offload::CopyTicket> deps,
                                   std::vector<offload::CopyPiece> pieces, offload::CopyLabel label,
                                   std::int64_t bytes);

  offload::Tiers& tiers_;
  offload::CopyEngine& copies_;
  std::int64_t hidden_, n_kv_heads_, head_dim_;
  kernels::DType cache_dtype_;
  bool overlap_;
  bool prefix_once_;
  int lane_cache_in_ = 0, lane_cache_out_ = 0, lane_hidden_in_ = 0, lane_hidden_out_ = 0;
  KvReads reads_;
};

}  // namespace flexh2o::engine
