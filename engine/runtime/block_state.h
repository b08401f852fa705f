// The state of one block between the steps of a BlockScheduler: its GPU batches, ring slots,
// activations and, under continuous batching, which request each slot runs (block_scheduler.cc
// steps it; step_admission.cc decides who runs each step). Private to engine/runtime.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/runtime/block_scheduler.h"

namespace flexh2o::engine {

struct BlockScheduler::BlockState {
  std::vector<GpuBatch> batches;
  std::vector<RingSlot> ring;  // compute c uses ring[c % 3]
  std::unique_ptr<Activations> act;
  offload::Reservation act_reserved;  // its charge to the gpu-tier budget
  std::int64_t capacity = 0;          // KV slots per (sequence, kv head)
  std::int64_t staged_max = 0;        // most staged sequences of any batch
  std::int64_t step = 0;
  bool routed_experts = false;  // this step's MoE units fetch only the experts routed to
  bool hidden_resident = true;
  bool evicting = false;  // a KV policy keeps budget-sized rows
  const GenerationRequest* req = nullptr;
  GenerationLog* log = nullptr;  // the block's: what the sampler needs per sequence
  // Continuous batching: each slot's sequence (-1: idle) and the first prompt not yet admitted.
  bool continuous = false;
  std::vector<std::int64_t> slot_seq;
  std::size_t waiting = 0;
  // Shared prefills: per slot, the slot whose prefill of this step it takes (-1: none), and
  // whether any does.
  std::vector<std::int64_t> fork_of;
  bool forking = false;
  // Shared prompt prefixes (continuous batching; docs/prefix-sharing.md): whether they apply,
  // and per slot, how many leading tokens of its batch's tokens its cache row holds (also after
  // its request ended: a later one may start with them) and how many of them its newcomer of
  // this step took from a shared prefix (0: it prefills its whole prompt).
  bool sharing = false;
  std::vector<std::int64_t> held;
  std::vector<std::int64_t> prefix;
  std::vector<std::int32_t> next;          // per block sequence
  std::vector<float> host_logits;
  RingSlot& slot(std::int64_t counter) { return ring[static_cast<std::size_t>(counter % 3)]; }
  GpuBatch& batch(std::int64_t k) { return batches[static_cast<std::size_t>(k)]; }
  // Outstanding copies touch the buffers above: wait for all of them before those go,
  // also when a compute threw.
  ~BlockState() {
    auto settle = [](const offload::CopyTicket& t) {
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

}  // namespace flexh2o::engine
