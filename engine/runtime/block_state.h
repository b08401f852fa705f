// The state of one block between the steps of a BlockExecutor: its GPU batches, ring slots,
// activations (block_executor.cc runs a step; step_plan_run.cc carries out a plan's copies and
// lays out its GPU batches). Private to engine/runtime.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/runtime/block_executor.h"
#include "engine/runtime/gpu_buffer.h"
#include "engine/runtime/step_plan.h"

namespace flexh2o::engine {

struct BlockExecutor::BlockState {
  std::vector<GpuBatch> batches;
  std::vector<RingSlot> ring;  // compute c uses ring[c % 3]
  std::unique_ptr<Activations> act;
  offload::Reservation act_reserved;  // its charge to the gpu-tier budget
  std::int64_t capacity = 0;          // KV slots per (sequence, kv head)
  // Prefixes held once (BlockExecutor::begin's pool): their pool rows and, per decoder layer of
  // this scheduler, the pool's K and V rows of pool.capacity slots where they live; pool.rows == 0: none.
  PrefixPool pool;
  PoolHome pool_home;
  std::int64_t staged_max = 0;        // most staged sequences of any batch
  std::int64_t step = 0;
  bool routed_experts = false;  // this step's MoE units fetch only the experts routed to
  bool hidden_resident = true;
  bool evicting = false;  // a KV policy keeps budget-sized rows
  const GenerationRequest* req = nullptr;
  bool continuous = false;
  std::vector<std::int32_t> next;   // per slot: the token it sampled in the last step
  std::vector<float> host_logits;   // per slot, its logits row of the last step (StepInput::keep_logits)
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
    for (const auto& t : pool_home.stored) settle(t);
    for (auto& s : ring) {
      for (const auto& t : s.loads) settle(t);
      for (const auto& t : s.stores) settle(t);
    }
  }
};

}  // namespace flexh2o::engine
