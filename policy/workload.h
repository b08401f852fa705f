// What a job asks of a block, and how continuous batching admits its requests into slots as
// the engine's StepScheduler does: the planner's model of admission (docs/planner.md), kept
// apart from the cost terms it feeds (cost_model.h).
#pragma once
#include <cstdint>
#include <vector>

#include "policy/gen_len.h"
#include "policy/hardware_profile.h"

namespace flexh2o::policy {

// Continuous batching's prefill budget where the gpu tier is host memory (the CPU backend):
// prompt tokens a GPU batch's step prefills for newcomers.
constexpr std::int64_t kHostPrefillBudget = 512;

// One request of a job: its prompt tokens and its max_tokens, and the first `shared` of its
// prompt tokens it may take from a prefix another request computed (docs/prefix-sharing.md):
// its prefill then computes only the rest, which alone counts against the prefill budget. In a
// prefix family (`family` >= 0) it takes them only where a cache row (or the family's pool
// row) holds them when it is admitted (JobAdmission, workload.cc); without one, always.
struct RequestLength {
  std::int64_t prompt = 0, gen = 0, shared = 0;
  std::int64_t family = -1;  // its prefix family where the job's prompts share prefixes, -1: none
  bool shares_prompt = false;  // one of n choices: it takes the previous request's prefill (a fork)
};

// Prefixes held once (docs/prefix-sharing.md, "Holding a prefix once"): a job's prefix
// families, held in pool rows of `prefix` KV tokens (the longest family prefix), a family in a
// row while its requests run, beside rows of the most tokens a request holds after its
// family's prefix (`rest`).
struct HeldPrefixes {
  std::int64_t families = 0, prefix = 0, rest = 0;
  double mean_prefix = 0;  // over the job's requests: the prefix each holds in the pool (0: none)
  // Whether `rows` pool rows and `slots` rows of `rest` take less than `slots` rows of `whole`
  // tokens: the engine holds prefixes only then (and the planner counts them only then).
  bool saves_memory(std::int64_t rows, std::int64_t slots, std::int64_t whole) const {
    return rows > 0 && rows * prefix + slots * rest < slots * whole;
  }
};

// What a job asks of a block. The maxima size what must fit: the engine gives every slot the
// KV of the longest sequence, so a request is admitted into any free slot and nothing is
// dropped or cut. Under fixed blocks every sequence runs at the maxima too (a block steps until
// its longest ends). Under continuous batching a slot whose request ends takes the next, so
// the time follows the job's lengths: `requests` when the job's are known, else the means.
struct Workload {
  std::int64_t prompt_len = 512;  // the longest prompt
  std::int64_t gen_len = kDefaultGenLen;      // the largest max_tokens
  bool continuous = false;
  // Continuous batching: the job's requests in admission order (empty: steady state at the means).
  std::vector<RequestLength> requests;
  double mean_prompt_len = 0, mean_gen_len = 0;  // 0: the maxima; with `requests`, theirs
  // Steady state (no `requests`): the tokens of each prompt taken from a shared prefix, not
  // computed (with `requests`, each one's RequestLength::shared).
  double mean_shared = 0;
  // Prompt tokens a GPU batch prefills per step (run --prefill-budget); 0: the profile's
  // default for each GPU batch size (default_prefill_budget).
  std::int64_t prefill_budget = kHostPrefillBudget;
  // KV tokens a slot must hold: the longest prompt + max_tokens of one request (its KV at the
  // end), or the longest prompt + the largest max_tokens when the requests are not known.
  std::int64_t sequence_capacity() const;
  // Continuous batching: the job's prefixes a block may hold once (families 0: none).
  HeldPrefixes held;
  // The pool rows a block of `slots` over GPU batches of `gpu_batch` holds them in, as the
  // engine: as many as the most families its running requests hold at once (the requests
  // admitted as slot_step admits them, each with its RequestLength::family; at the means,
  // min(families, slots)), where those rows save memory over rows of the longest sequence;
  // else 0 (the rows copy prefixes).
  std::int64_t pool_rows(std::int64_t slots, std::int64_t gpu_batch) const;
};

// A continuous job's slot-steps (one slot during one step), averaged over the job: steps x slots.
struct SlotStep {
  double busy = 1;           // share holding a request (the rest: idle slots of the job's tail)
  double prefill_rows = 0;   // a newcomer's prompt rows (its first token comes of them)
  double decode_rows = 1;    // one row per decode
  double kv_attended = 0;    // KV tokens the decode rows attend over (p + t at a request's step t)
  // Of them, the tokens of shared prefixes a decode row leaves to another row of its GPU batch
  // in the same prefix family, which reads them once for the group (cascade attention).
  double kv_prefix_read_by_others = 0;
  // A newcomer's prefill attention: its prompt tokens squared, or c (2p - c) for the c rows it
  // computes after p - c taken from a shared prefix.
  double prompt_sq = 0;
  double steps = 0;          // steps of the whole job (0: requests not known; steady state)
  double rows() const { return prefill_rows + decode_rows; }
};
// From the requests: admitted step by step by the engine's rule (policy::admit_step: each GPU
// batch of `gpu_batch` slots takes newcomers into its free slots within the prefill budget),
// each holding its slot for its max_tokens steps (its prefill step gives its first token); from
// the means: every slot busy (steady state). `pool_rows` > 0: the job's prefix families take
// turns in that many pool rows (Workload::pool_rows), and a family that comes back after its
// row went to another computes its prefix again. A GPU batch's decode rows of one family
// (RequestLength::family; at the means, the held families spread evenly over a GPU batch's
// slots) read their prefix once for all (SlotStep::kv_prefix_read_by_others).
SlotStep slot_step(const Workload& w, std::int64_t slots, std::int64_t gpu_batch, std::int64_t pool_rows = 0);
// One step of a continuous job: the prompt rows its newcomers compute and its decode rows.
struct StepRows {
  std::int64_t prefill = 0, decode = 0;
  bool operator==(const StepRows&) const = default;
};
// The steps of a continuous job of known requests (w.requests), admitted as slot_step admits
// them: what the engine's steps compute, step by step (tests/policy/test_admission_agrees.cc).
std::vector<StepRows> job_steps(const Workload& w, std::int64_t slots, std::int64_t gpu_batch, std::int64_t pool_rows = 0);
// The job's requests as a continuous workload (maxima and means from them).
Workload continuous_workload(std::vector<RequestLength> requests, std::int64_t prefill_budget);
// Continuous batching's prefill budget when none is given, for GPU batches of `gpu_batch`
// slots. On a device with its own memory: a GPU batch of the job's mean prompts (at least
// kHostPrefillBudget), so that its slots fill in the step they free, as a fixed block's
// prefill fills them: a uniform job takes no more steps than fixed blocks. A GPU's step time
// grows little with its rows until thousands, so every step a smaller budget adds costs about
// a decode step's weights and launches (measured on an H200, OPT-1.3B, 64 prompts of 512:
// 95 steps and 664 tok/s at 512 a step, 1,201 tok/s as fixed blocks). Where the gpu tier is
// host memory (the CPU backend) kHostPrefillBudget: a CPU's rows cost the same in any step,
// and the activations of a larger step take host memory from the weights (docs/planner.md).
std::int64_t default_prefill_budget(const HardwareProfile& hw, const Workload& w, std::int64_t gpu_batch);
// `w` with its prefill budget resolved for GPU batches of `gpu_batch` (a budget given is kept).
Workload with_prefill_budget(Workload w, const HardwareProfile& hw, std::int64_t gpu_batch);

}  // namespace flexh2o::policy
