// FlexGen's zig-zag block schedule over the tiers: a block of gpu_batch_size x num_gpu_batches
// sequences runs token step i x scheduling unit j x GPU batch k. Who runs each step is decided
// above (the serving layer's BlockRun); this carries out each step's plan (step_plan.h) and
// returns what it sampled. With overlap on, the next unit's
// weights are fetched while the K batches of this unit compute, and batch k+1's
// activations/KV are fetched (batch k-1's written back) while batch k computes, each on its
// own copy lane; tickets order them (no global barrier). With overlap off the same copies
// run in line before and after each compute (the ablation baseline).
//
// Compression (compress_weight / compress_cache): weight matrices and KV slots are stored as
// 4- or 8-bit groups in every tier, copied compressed, and dequantized by the compute kernels.
//
// Placement: weights, each batch's KV cache and its hidden states are TieredTensors split
// by the policy's fractions. Weights not wholly on the gpu tier are staged into two device
// slots (the unit computing and the one being fetched). KV is split by sequence: gpu-homed
// sequences are attended in place, cpu/disk-homed ones are staged through a ring of three
// device slots (fetching, computing, writing back); with cpu_cache_compute the cpu-homed
// sequences are attended where they live, in host memory. (On the CPU backend that is the
// compute backend itself; a device backend will hand those parts to a CPU backend.)
//
// Pipeline stages (engine/distributed): a scheduler can hold a contiguous slice of the layers
// (LayerRange) with only their weights and KV caches; its first unit then takes each GPU
// batch's hidden states from StageLinks::receive and its last one hands them to
// StageLinks::send. A stage keeps several blocks in flight and advances each a step at a time
// (begin, then run_step per step); serving::generate (engine/serving/generate.h) is the same
// loop for one block.
//
// Mixture-of-experts: every expert is its own group of tiered tensors. Under routed expert
// loading (Policy::routed_expert_loading) a MoE unit's load brings its router, norm and
// shared expert; the unit before it routes each GPU batch right after computing it (a merged
// unit routes between its attention and its MLP) and the experts that batch needs and the
// block has not yet fetched start to stream in while the next batches compute. Otherwise all
// experts come with the unit, as for a dense MLP. A staging slot holds Policy::expert_slot_count
// of a unit's staged experts (by default those a decode step is expected to route to); the
// prefetch stops when they are full, and a GPU batch whose routed experts do not fit runs its
// MoE layer in ascending chunks of experts, each fetched over the last, adding up to the same
// sums as one run.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/runtime/generator.h"
#include "engine/model/layers.h"
#include "engine/runtime/cache_ring.h"
#include "engine/runtime/prefill_fork.h"
#include "engine/runtime/step_plan.h"
#include "engine/runtime/units.h"
#include "engine/runtime/weight_staging.h"
#include "offload/copy_engine.h"
#include "offload/trace.h"
#include "policy/pipeline.h"
#include "policy/policy.h"

namespace flexh2o::engine {

// Layers [begin, end) of build_layers(cfg) (input embedding, attention and MLP per decoder
// layer, output head); end < 0: through the last.
struct LayerRange {
  std::int64_t begin = 0, end = -1;
};

// The layers of a pipeline stage's decoder layers, with the input embedding on the first stage
// and the head on the last.
LayerRange stage_layers(const ModelConfig& cfg, const policy::StageSlice& slice);

// The hidden states ([rows, hidden] fp32 in host memory) of GPU batch k of the current step at
// a stage's boundaries.
struct StageLinks {
  // Fills them before the stage's first unit computes batch k (a stage after the first).
  std::function<void(std::int64_t k, std::span<float> hidden)> receive;
  // Takes them after the stage's last unit computed batch k (a stage before the last); the
  // span is valid during the call.
  std::function<void(std::int64_t k, std::span<const float> hidden)> send;
};

class BlockExecutor {
 public:
  // Loads the weights of `layers` into their tiers. Throws BudgetExceeded when they do not fit.
  BlockExecutor(kernels::Backend& be, offload::Tiers& tiers, const ModelConfig& cfg, const WeightSource& source,
                 const policy::Policy& policy, offload::Trace* trace = nullptr, offload::CopyOptions copy = {},
                 LayerRange layers = {});
  ~BlockExecutor();

  // One block stepped from outside: at most gpu_batch_size x num_gpu_batches prompts, cut into
  // GPU batches in order, or with req.slots > 0 (continuous batching) any number of prompts
  // flowing through that many slots. `req` must outlive the block, and blocks the executor.
  struct Block;
  struct BlockDeleter {
    void operator()(Block* b) const;
  };
  using BlockPtr = std::unique_ptr<Block, BlockDeleter>;
  // Whether the block's newcomers may take prompt prefixes the rows hold (the request asks and
  // the model and KV policy allow it: prefix_sharing_off_reason).
  bool shares_prefixes(const GenerationRequest& req) const;
  // Whether prefixes may be held once for the request (continuous batching, the request asks,
  // the backend reads shared prefixes apart): the scheduler then offers a PrefixPool.
  bool can_hold_prefixes(const GenerationRequest& req) const;
  // Places `slots` slots' KV caches and hidden states (throws BudgetExceeded), and the prefix
  // pool `pool` (rows == 0: none) beside them where it fits (holds_prefixes says whether).
  BlockPtr begin(const GenerationRequest& req, std::size_t slots, const PrefixPool& pool = {});
  bool holds_prefixes(const Block& b) const;
  // One step of `in.plan`: its row copies, then this executor's layers over every GPU batch
  // (FlexGen's loop), then, with the output head here, the sampling of each slot's token.
  StepOutput run_step(Block& b, const StepInput& in, const StageLinks& links = {});

  kernels::Backend& backend() const { return be_; }
  const ModelConfig& config() const { return cfg_; }
  const policy::Policy& policy() const { return policy_; }
  // Whether the input embedding / the output head are among this scheduler's layers.
  bool holds_input() const;
  bool holds_head() const { return holds_head_; }
  const ExpertLoadStats& expert_loads() const { return staging_->expert_loads(); }
  const KvReads& kv_reads() const { return ring_->reads(); }  // over every run so far
  const KvCopies& kv_copies() const { return kv_copies_; }    // over every run so far
  const KvHeld& kv_held() const { return kv_held_; }          // over every run so far
  // The most slots a sequence's KV row held in a block with a KV policy (its budget + 1), over
  // every run so far; 0 where every block kept the full cache.
  std::int64_t evicting_row_slots() const { return evicting_row_slots_; }

 private:
  struct BlockState;
  // FlexGen's loop body for unit u and GPU batch k (compute number `counter` of the block).
  void load_inputs(BlockState& st, std::int64_t counter, std::int64_t u, std::int64_t k, const StageLinks& links);
  void prefetch_next(BlockState& st, std::int64_t counter, std::int64_t u, std::int64_t k, std::int64_t instance);
  void compute(BlockState& st, std::int64_t u, std::int64_t k, RingSlot& slot, std::int64_t instance,
               const StepInput& in);
  void route_next_unit(std::int64_t u, const GpuBatch& b, Activations& act, std::int64_t instance);
  void sample(BlockState& st, const GpuBatch& b, Activations& act, const StepInput& in);
  void receive(BlockState& st, std::int64_t k, const StageLinks& links);
  void send(BlockState& st, std::int64_t k, const StageLinks& links);
  // Whether the request's rows keep budget-sized KV (its KV policy, else the policy's --kv).
  bool evicts(const GenerationRequest& req) const;
  // begin(): the block's GPU batches with their KV caches and hidden states in their tiers, the
  // pool of st.pool, the activations and the ring slots (throws BudgetExceeded).
  void place(BlockState& st, const GenerationRequest& req);
  void place_batches(BlockState& st, const GenerationRequest& req);
  // The bytes of one token's K (or V) over the kv heads of one layer, in the cache dtype.
  std::int64_t kv_token_bytes() const;
  // place() with `pool` on the first tier of gpu, cpu, disk (from the one the policy's
  // prefix_pool names) where it fits beside the rows it shrinks (whatever tiers those live on);
  // false, nothing placed, where it fits on none.
  bool place_with_pool(BlockState& st, const GenerationRequest& req, const PrefixPool& pool);
  // The pool of st.pool on `tier`, read in place there or staged (st.pool_home).
  void place_pool(BlockState& st, offload::Tier tier);
  KvHeld held_bytes(const BlockState& st, const GenerationRequest& req) const;
  // Continuous batching: the KV slots per (sequence, kv head) and the most rows of a GPU
  // batch's step, for any request of the queue.
  std::int64_t continuous_capacity(const GenerationRequest& req) const;
  std::int64_t continuous_rows(const GenerationRequest& req, std::int64_t slots) const;
  // Before a step (step_plan_run.cc): the plan's row copies made and each GPU batch's step
  // laid out from it (each slot's tokens in `tokens`); the rows `copies` name copied in order,
  // their bytes added to `moved`.
  void apply_plan(BlockState& st, const StepInput& in);
  StepBatch lay_out(const BlockState& st, const GpuBatch& b, const StepInput& in) const;
  void copy_rows(BlockState& st, std::span<const RowCopy> copies, bool evicting, const char* what,
                 KvCopyBytes& moved);
  // Samples one sequence (slot `slot`, row i of the batch's logits) with its own token index,
  // and those forked from its prefill from the same logits.
  void sample_slot(BlockState& st, const float* logits, std::int64_t slot, const StepInput& in);
  void sample_sequence(BlockState& st, const float* logits, std::int64_t slot, const StepInput& in);

  kernels::Backend& be_;
  offload::Tiers& tiers_;
  ModelConfig cfg_;  // weight matrices in q4 under compress_weight
  policy::Policy policy_;
  kernels::DType cache_dtype_;  // q4 under compress_cache
  offload::Trace* trace_;
  std::vector<std::unique_ptr<Layer>> layers_;
  UnitList units_;
  bool holds_head_ = true;
  std::int64_t unit_instances_ = 0;  // units run so far: instance = step x units + unit
  std::vector<float> boundary_;      // hidden states received or sent at a stage boundary
  // Host buffers of the copies made in line: stage boundaries, forks of a shared prefill.
  std::unique_ptr<offload::Staging> host_staging_;
  std::unique_ptr<policy::KvPolicy> kv_policy_;  // from policy_.kv; null for the full cache
  std::unique_ptr<WeightStaging> staging_;
  std::unique_ptr<CacheRing> ring_;
  KvCopies kv_copies_;
  KvHeld kv_held_;
  std::int64_t evicting_row_slots_ = 0;
  // Declared last: destroyed first, so queued copies finish before the memory they touch goes.
  std::unique_ptr<offload::CopyEngine> copies_;
};

}  // namespace flexh2o::engine
