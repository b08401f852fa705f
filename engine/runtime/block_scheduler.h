// FlexGen's zig-zag block schedule over the tiers: a block of gpu_batch_size x num_gpu_batches
// sequences runs token step i x scheduling unit j x GPU batch k. Who runs each step is decided
// by the block's StepPlanner (step_plan.h), which the caller's PlannerFactory makes (the
// serving layer's StepScheduler); this executes its plans. With overlap on, the next unit's
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
// (begin, run_step, end_step, finish); serving::generate (engine/serving/generate.h) is the
// same loop for one block.
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

class BlockScheduler {
 public:
  // Loads the weights of `layers` into their tiers. Throws BudgetExceeded when they do not fit.
  BlockScheduler(kernels::Backend& be, offload::Tiers& tiers, const ModelConfig& cfg, const WeightSource& source,
                 const policy::Policy& policy, offload::Trace* trace = nullptr, offload::CopyOptions copy = {},
                 LayerRange layers = {});
  ~BlockScheduler();

  // One block stepped from outside: at most gpu_batch_size x num_gpu_batches prompts, cut into
  // GPU batches in order, or with req.slots > 0 (continuous batching) any number of prompts
  // flowing through that many slots. `req` must outlive the block, and blocks the scheduler.
  struct Block;
  struct BlockDeleter {
    void operator()(Block* b) const;
  };
  using BlockPtr = std::unique_ptr<Block, BlockDeleter>;
  // Places the block's KV caches and hidden states (throws BudgetExceeded), checks its prompts
  // and takes the first plan of the planner make_planner makes for it.
  BlockPtr begin(const GenerationRequest& req, const PlannerFactory& make_planner);
  bool active(const Block& b) const;
  // The sequence rows the block's steps computed so far (each sampled a token).
  std::int64_t rows_computed(const Block& b) const;
  // This scheduler's layers over every GPU batch of the block's current step; with the output
  // head here the step's tokens are then sampled into next_tokens().
  void run_step(Block& b, const StageLinks& links = {});
  // The tokens of the current step: sampled by run_step, or set here by the caller (a stage
  // without the head gets them from the one with it) before end_step.
  std::span<std::int32_t> next_tokens(Block& b);
  // Records the step's tokens (stops, forcing, on_step) and moves the block to its next step.
  void end_step(Block& b);
  GenerationResult finish(Block& b);

  const ModelConfig& config() const { return cfg_; }
  const policy::Policy& policy() const { return policy_; }
  // Whether the input embedding / the output head are among this scheduler's layers.
  bool holds_input() const;
  bool holds_head() const { return holds_head_; }
  const ExpertLoadStats& expert_loads() const { return staging_->expert_loads(); }
  const KvReads& kv_reads() const { return ring_->reads(); }  // over every run so far
  const KvCopies& kv_copies() const { return kv_copies_; }    // over every run so far
  const KvHeld& kv_held() const { return kv_held_; }          // over every run so far

 private:
  struct BlockState;
  // FlexGen's loop body for unit u and GPU batch k (compute number `counter` of the block).
  void load_inputs(BlockState& st, std::int64_t counter, std::int64_t u, std::int64_t k, const StageLinks& links);
  void prefetch_next(BlockState& st, std::int64_t counter, std::int64_t u, std::int64_t k, std::int64_t instance);
  void compute(BlockState& st, std::int64_t u, std::int64_t k, RingSlot& slot, std::int64_t instance);
  void route_next_unit(std::int64_t u, const GpuBatch& b, Activations& act, std::int64_t instance);
  void sample(BlockState& st, const GpuBatch& b, Activations& act);
  void receive(BlockState& st, std::int64_t k, const StageLinks& links);
  void send(BlockState& st, std::int64_t k, const StageLinks& links);
  // begin(): the block's GPU batches with their KV caches and hidden states in their tiers, the
  // pool of st.pool, the activations and the ring slots (throws BudgetExceeded).
  void place(BlockState& st, const GenerationRequest& req);
  void place_batches(BlockState& st, const GenerationLog& log, const GenerationRequest& req);
  // Whether the block's prefixes may be held once (StepPlanner::prefix_pool): continuous
  // batching, the backend reading shared prefixes apart.
  bool can_hold_prefixes(const GenerationRequest& req) const;
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
  // Between steps (step_plan_run.cc): records the step's tokens slot by slot (continuous
  // batching); takes the StepPlanner's next plan, makes its row copies and lays out each
  // GPU batch's step from it; the rows `copies` name copied in order, their bytes added to `moved`.
  void record_slots(BlockState& st, GenerationLog& log);
  void next_steps(BlockState& st);
  StepBatch lay_out(const BlockState& st, const GpuBatch& b) const;
  void copy_rows(BlockState& st, std::span<const RowCopy> copies, bool evicting, const char* what,
                 KvCopyBytes& moved);
  // Samples one sequence (slot `slot`, row i of the batch's logits) with its own token index,
  // and those forked from its prefill from the same logits.
  void sample_slot(BlockState& st, const float* logits, std::int64_t slot);
  void sample_sequence(BlockState& st, const float* logits, std::int64_t slot);

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
  // Declared last: destroyed first, so queued copies finish before the memory they touch goes.
  std::unique_ptr<offload::CopyEngine> copies_;
};

}  // namespace flexh2o::engine
