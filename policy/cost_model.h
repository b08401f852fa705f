// FlexGen's cost model and placement search (docs/planner.md), extended with what
// flexh2o runs: exact row-split fractions, the KV eviction budget (KV term sized by the budget
// plus the policy's score arrays), cpu_cache_compute, embeddings, overlap off, GEMMs bounded
// by reading their weights from device memory, and the engine's own working set (two weight
// staging slots, KV/hidden staging rings, one GPU batch's activations, all in the profile's
// activation dtype). For one (gbs, K) the placement is a small LP solved with GLPK; the search
// walks gbs and K and ranks every policy it evaluates.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kernels/dtype.h"
#include "offload/tier.h"
#include "policy/eviction/kv_spec.h"
#include "policy/hardware_profile.h"
#include "policy/model_shape.h"
#include "policy/gen_len.h"
#include "policy/policy.h"
#include "policy/workload.h"

namespace flexh2o::policy {

// Sizes the engine allocates, in bytes (unit tests check them by hand).
struct ModelSizes {
  std::int64_t layer_weights = 0;      // one decoder layer (attention + MLP; MoE: all experts, layer mean)
  std::int64_t layer_expert_weights = 0;  // the routed experts' part of layer_weights
  std::int64_t embedding_weights = 0;  // the tensors outside the decoder layers: input embedding (+ positions), final norm, untied head
  std::int64_t total_weights = 0;
  std::int64_t head_weights = 0;       // the output head's matrix (the input embedding when tied; 0 on a pipeline stage without it)
  // Scheduling units as a staging slot holds them: attention, dense MLP, a MoE MLP without its
  // routed experts, one routed expert, input embedding, head (0: none in the model).
  std::int64_t attention_unit = 0, dense_mlp_unit = 0, moe_unit_base = 0, expert_unit = 0, embedding_unit = 0,
               head_unit = 0;
  std::int64_t layer_params = 0;       // elements of one decoder layer's matrices a token multiplies
  std::int64_t kv_per_token_layer = 0; // K and V, one token, one layer, in the cache dtype
  // A weight staging slot: the biggest scheduling unit with `expert_slots` routed experts in a
  // MoE unit, attention and MLP as one unit with sep_layer off; the input embedding and head
  // units only when they are staged (not Policy::resident_embeddings).
  std::int64_t staging_slot(std::int64_t expert_slots, bool sep_layer, bool embeddings_staged = true) const;
};
ModelSizes model_sizes(const ModelShape& m);
// The shape as stored under the policy's compress_weight / compress_cache / cache_dtype (an
// unset cache_dtype is the model's float dtype). Apply it once, to the model's own shape.
ModelShape with_compression(ModelShape m, const Policy& p);
// Tokens a sequence's KV occupies per head: prompt + gen, or the eviction budget's slots.
std::int64_t kv_tokens(const ModelShape& m, const Workload& w, const KvSpec& kv);

struct Estimate {
  Policy policy;
  // Fixed blocks: one block's prefill and decode. Continuous: no prefill of its own (newcomers
  // prefill within the steps); decode_seconds is the job's steps (or the mean request's, when
  // the requests are not known) at the mean step.
  double prefill_seconds = 0, decode_seconds = 0;
  double decode_step_seconds = 0;                  // one decode step of one block (continuous: the mean step)
  // Tokens/s. Continuous: decode and total are the useful rate, generated tokens over time.
  double prefill_throughput = 0, decode_throughput = 0, total_throughput = 0;
  bool continuous = false;
  SlotStep slot_step;  // continuous batching: the block's mean slot-step it was estimated at
  std::array<std::int64_t, 3> peak_bytes{};  // gpu, cpu, disk
  // What makes up each tier's peak: named items with their bytes, largest first.
  std::array<std::vector<std::pair<std::string, std::int64_t>>, 3> memory;
  std::string bottleneck;  // the decode term that sets the step time
  std::int64_t prefill_budget = 0;  // continuous batching: the prefill budget estimated with
  // Continuous: a decode row's attention per token of context it attends over (all layers), at
  // the mean step's context: what a longer context adds to a step.
  double context_token_seconds = 0;
  double compute_seconds = 0;  // one block's compute terms alone (prefill + decode), hidden or not
  double generated_tokens = 0;  // the tokens those compute seconds give (a block's, or the job's steps')
  // What plans of different blocks compare: compute per generated token.
  double compute_per_token() const { return generated_tokens > 0 ? compute_seconds / generated_tokens : compute_seconds; }
};

struct PlanOptions {
  KvSpec kv = parse_kv_spec("full");
  bool allow_cpu_cache_compute = true;
  std::int64_t max_block = 1 << 14;
  // Plan for compressed weights / KV, or a KV dtype other than the model's (the chosen policy
  // carries the same).
  bool compress_weight = false, compress_cache = false;
  int compress_bits = 4;
  std::optional<kernels::DType> cache_storage = {};
  // Blocks whose KV caches, hidden states and scratch are held at once: a pipeline stage's
  // micro-batches (their weights are shared).
  std::int64_t blocks_in_flight = 1;
};

// The cost of one fixed policy (the fractions and compression as given); nullopt when it does not fit.
std::optional<Estimate> estimate(const ModelShape& m, const HardwareProfile& hw, const Workload& w,
                                 const Policy& p, const PlanOptions& o = {});

// Why a fixed policy does not fit: the first tier over its share (or, where the gpu tier is host
// memory, the two together over the cpu tier's), what it would hold there (largest first) and
// what it may use (the profile's memory_safety fraction of the tier).
struct Shortfall {
  offload::Tier tier = offload::Tier::Gpu;
  std::int64_t need = 0, available = 0, capacity = 0;
  double safety = 1;
  bool gpu_is_host_memory = false;  // the gpu and cpu tiers together are over the host memory's share
  std::vector<std::pair<std::string, std::int64_t>> items;
  // "gpu tier needs 1.20 GiB (weights 800 MiB, KV cache 300 MiB, ...) but has 460 MiB (90% of 512 MiB)"
  std::string describe() const;
};
// nullopt when the policy fits.
std::optional<Shortfall> shortfall(const ModelShape& m, const HardwareProfile& hw, const Workload& w, const Policy& p,
                                   const PlanOptions& o = {});
// estimate(), or std::invalid_argument "<what> does not fit <profile>: <shortfall>; <what to change>".
Estimate estimate_or_throw(const ModelShape& m, const HardwareProfile& hw, const Workload& w, const Policy& p,
                           const PlanOptions& o, const std::string& what);

// How close to the fastest a policy with less compute (per generated token: blocks of
// different sizes compare by it) may predict and still be the plan: the
// spread of the GEMM rates a run measures at its start on a 2-core VM (a 64-row layer at 261-285
// GFLOP/s over four runs in a 1.5 GiB cgroup); with 1% one run's plan flipped from one GPU
// batch of 64 rows (32.5 tok/s measured) to two of 32 (25.8).
constexpr double kPlanNearTie = 0.05;

// The planner's choice among `items` (not empty, any order): of those within kPlanNearTie of
// the fastest, the one that computes least (they are typically bound by the same transfer, their
// compute hidden behind it, and the least compute stays ahead when the rates are off), the
// faster at equal compute. Single placements (plan) and pipelines (plan_pipeline) alike.
template <class T, class Throughput, class Compute>
const T& near_tie_pick(std::span<const T> items, Throughput throughput, Compute compute) {
  double fastest = 0;
  for (const T& x : items) fastest = std::max(fastest, throughput(x));
  // Equal compute within rounding (per token it often is: rates that do not depend on the rows
  // price every block's token alike), the faster.
  constexpr double kSame = 1e-9;
  const T* pick = nullptr;
  for (const T& x : items) {
    if (throughput(x) < (1 - kPlanNearTie) * fastest) continue;
    const double c = compute(x), least = pick ? compute(*pick) : 0;
    if (!pick || c < least * (1 - kSame) || (c <= least * (1 + kSame) && throughput(x) > throughput(*pick))) pick = &x;
  }
  return *pick;
}

// The best policy found: none the search evaluated predicts more than kPlanNearTie more total
// throughput, and of those within it of the fastest it has the least compute (near_tie_pick). Throws
// std::invalid_argument naming the smallest change that fits when nothing does (more memory
// on a tier, --disk-mem, or a KV budget).
Estimate plan(const ModelShape& m, const HardwareProfile& hw, const Workload& w, const PlanOptions& o = {});
// The `count` fastest distinct policies the search evaluated, fastest first (plan() is the
// first); the same errors as plan().
std::vector<Estimate> plan_ranked(const ModelShape& m, const HardwareProfile& hw, const Workload& w,
                                  const PlanOptions& o, std::size_t count);

// The best placement (fractions, cpu_cache_compute, what is staged) for GPU batches of `gbs`
// sequences, K per block; nullopt when none fits. `m` is stored as the options' compression says.
std::optional<Estimate> best_placement(const ModelShape& m, const HardwareProfile& hw, const Workload& w,
                                       const PlanOptions& o, std::int64_t gbs, std::int64_t k);
// Gives `fits` the (gbs, K) blocks plan() tries (blocks up to max_block), in its order: for each
// GPU batch size it searches, the largest K at which `fits(gbs, K)` holds by doubling and
// bisection, then the K of FlexGen's published policies and the powers of two below it
// (throughput need not grow with K: the KV may spill to a slower tier).
void search_blocks(std::int64_t max_block, const std::function<bool(std::int64_t gbs, std::int64_t k)>& fits);
// The shape as the options' compression stores it.
ModelShape with_compression(const ModelShape& m, const PlanOptions& o);

}  // namespace flexh2o::policy
