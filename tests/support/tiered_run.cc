#include "tests/support/tiered_run.h"

#include "engine/loaders/dummy_weights.h"
#include "engine/runtime/block_executor.h"
#include "engine/serving/generate.h"
#include "offload/tiers.h"
#include "tests/support/test_models.h"

namespace flexh2o::testing {

policy::Policy spread_policy(std::int64_t gbs, std::int64_t k, std::array<double, 3> weights) {
  policy::Policy pol;
  pol.gpu_batch_size = gbs;
  pol.num_gpu_batches = k;
  pol.weights = {weights[0], weights[1], weights[2]};
  pol.cache = {0.25, 0.5, 0.25};
  pol.activations = {0.5, 0.5, 0};
  return pol;
}

std::vector<std::vector<std::int32_t>> generate_tiered(kernels::Backend& be, const engine::ModelConfig& cfg,
                                                       const engine::WeightSource& source, const policy::Policy& pol,
                                                       const engine::GenerationRequest& req, offload::CopyOptions copy) {
  TempDir dir;
  offload::TierOptions to;
  to.offload_dir = dir.path();
  offload::Tiers tiers(be, to);
  engine::BlockExecutor sched(be, tiers, cfg, source, pol, nullptr, copy);
  return serving::generate(sched, req).tokens;
}

KvTraffic kv_traffic(kernels::Backend& be, const engine::ModelConfig& cfg, const policy::Policy& pol,
                     const engine::GenerationRequest& req) {
  TempDir dir;
  offload::TierOptions to;
  to.offload_dir = dir.path();
  offload::Tiers tiers(be, to);
  engine::DummyWeights src(cfg, 46);
  engine::BlockExecutor sched(be, tiers, cfg, src, pol, nullptr);
  KvTraffic r;
  r.result = serving::generate(sched, req);
  r.reads = sched.kv_reads();
  r.copies = sched.kv_copies();
  r.held = sched.kv_held();
  return r;
}

std::int64_t kv_bytes_per_slot(const engine::ModelConfig& cfg, const policy::Policy& pol) {
  return cfg.n_layers * 2 * cfg.n_kv_heads * kernels::kv_slot_bytes(pol.cache_dtype(cfg.dtype), cfg.head_dim);
}

}  // namespace flexh2o::testing
