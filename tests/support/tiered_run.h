// The engine's tiered run as the parity tests use it: a BlockExecutor over fresh tiers whose
// offload directory is removed afterwards, with a policy that spreads weights, KV cache and
// activations over the gpu, cpu and disk tiers.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "engine/runtime/block_executor.h"
#include "engine/runtime/generator.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"
#include "kernels/backend.h"
#include "offload/copy_engine.h"
#include "policy/policy.h"

namespace flexh2o::testing {

// gbs x k GPU batches; `weights` in percent-like shares of gpu/cpu/disk; KV 25/50/25 and
// activations 50/50 gpu/cpu.
policy::Policy spread_policy(std::int64_t gbs, std::int64_t k, std::array<double, 3> weights);

std::vector<std::vector<std::int32_t>> generate_tiered(kernels::Backend& be, const engine::ModelConfig& cfg,
                                                       const engine::WeightSource& source, const policy::Policy& pol,
                                                       const engine::GenerationRequest& req,
                                                       offload::CopyOptions copy = {});

// One block of `req` on dummy weights (seed 46) over fresh tiers: its result and the KV bytes
// it read and copied.
struct KvTraffic {
  engine::GenerationResult result;
  engine::KvReads reads;
  engine::KvCopies copies;
  engine::KvHeld held;
};
KvTraffic kv_traffic(kernels::Backend& be, const engine::ModelConfig& cfg, const policy::Policy& pol,
                     const engine::GenerationRequest& req);

// The bytes of one cache slot's K and V in all layers.
std::int64_t kv_bytes_per_slot(const engine::ModelConfig& cfg, const policy::Policy& pol);

}  // namespace flexh2o::testing
