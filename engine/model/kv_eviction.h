// KV eviction around one attention layer (policy/eviction decides, this moves the data):
// at prefill the kernel's (query-weighted) column sums go to the policy, which keeps at most
// the budget of each (sequence, kv head); each decode step writes the new token into a free
// slot per head, attends over the occupied slots with per-slot probabilities, and lets the
// policy evict. A policy that merges evictions (flex) then gets the evicted key's similarity
// to every slot's key (kv_similarity), names the slot whose value it is blended into
// (kv_merge), and attention adds the slots' logit biases. The cache holds
// kv_slot_capacity(budget) slots per (sequence, kv head).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/model/layers.h"
#include "policy/eviction/kv_policy.h"

namespace flexh2o::engine {

class KvEvictionLayer {
 public:
  // `slots` sequences; sizing_len: prompt + new tokens of every sequence that may take a slot
  // (the budget is a fraction of it), which sizes the capacity; max_prompt_rows: the most
  // rows a step prefills. Each slot starts with reset().
  KvEvictionLayer(kernels::Backend& be, const policy::KvPolicy& policy, const ModelConfig& cfg, std::int64_t layer,
                  std::int64_t slots, std::span<const std::int64_t> sizing_len, std::int64_t max_prompt_rows);
  // Slots per (sequence, kv head) this layer needs.
  std::int64_t capacity() const { return capacity_; }
  // Slot `seq` starts a sequence of `total_len` tokens (prompt + new tokens): its budget, and
  // an empty state per kv head (continuous batching: a newcomer in a freed slot).
  void reset(std::int64_t seq, std::int64_t total_len);
  // Slot `seq` takes slot `from_seq` of `from` (a layer of the same policy and capacity, maybe
  // another GPU batch's) as it is: its budget and every kv head's state (a shared prefill).
  void copy_sequence(const KvEvictionLayer& from, std::int64_t from_seq, std::int64_t seq);

  // Attention::forward calls these instead of its kernels, for the run of sequences starting
  // at `seq0` that `s` holds (rebased to 0), whose cache is `part` of `cache`.
  void prefill(kernels::Backend& be, const StepBatch& s, std::int64_t seq0, const kernels::AttentionShape& shape,
               const float* q, const float* k, const float* v, float* out, const KvPart& part, const KvView& cache);
  void decode(kernels::Backend& be, const StepBatch& s, std::int64_t seq0, const kernels::AttentionShape& shape,
              const float* q, const float* k, const float* v, float* out, const KvPart& part, const KvView& cache);

 private:
  std::int64_t budget_of(std::int64_t total_len) const;
  // layerwise: each kv head's scores replaced by their sum over the heads. Prefill: sequence
  // runs `seq_offsets` of column sums laid out [t0 * H + g * n + j]; decode: [(b * H + g) * capacity + slot].
  void sum_prefill_scores(std::span<const std::int64_t> seq_offsets);
  void sum_decode_scores(std::int64_t B, std::int64_t capacity);
  // value_norms_[g * rows + r]: the L2 norm of row r's value vector of kv head g.
  void compute_value_norms(kernels::Backend& be, const float* v, std::int64_t rows);

  const policy::KvPolicy& policy_;
  std::int64_t layer_, n_kv_heads_, head_dim_, capacity_ = 0;
  std::vector<std::int64_t> budget_, total_;  // per sequence: its budget, prompt + new tokens
  std::vector<policy::KvHeadState> states_;   // [B * n_kv_heads]
  // Merging: each slot's logit bias for attention; the evicted keys' similarities.
  void upload_logit_biases(kernels::Backend& be, std::int64_t seq0, std::int64_t B, std::int64_t capacity);
  void merge_evictions(kernels::Backend& be, std::int64_t seq0, std::int64_t capacity, const KvPart& part,
                       const KvView& cache);

  kernels::DeviceBuffer col_sums_, probs_;    // kernel outputs the policy reads
  kernels::DeviceBuffer bias_, similarity_;   // merging: attention's slot bias, kv_similarity's output
  std::vector<float> host_scores_, host_values_, value_norms_, host_bias_, host_similarity_;
  std::vector<kernels::KvSimilarityQuery> queries_;
  std::vector<kernels::KvMerge> merges_;
  std::vector<std::int64_t> head_slot_, lens_, evicted_;
  std::vector<policy::KvSlotMove> slot_moves_;
  std::vector<kernels::KvMove> moves_;
};

// One KvEvictionLayer per decoder layer, slot b holding a sequence of total_len[b] tokens.
std::vector<std::unique_ptr<KvEvictionLayer>> make_kv_eviction(kernels::Backend& be, const policy::KvPolicy& policy,
                                                               const ModelConfig& cfg,
                                                               std::span<const std::int64_t> total_len,
                                                               std::int64_t max_prompt_rows);
// Continuous batching: one per decoder layer with `slots` slots, sized for any sequence of
// `sizing_len`; each slot is reset() when a sequence takes it.
std::vector<std::unique_ptr<KvEvictionLayer>> make_kv_eviction_slots(kernels::Backend& be,
                                                                     const policy::KvPolicy& policy,
                                                                     const ModelConfig& cfg, std::int64_t slots,
                                                                     std::span<const std::int64_t> sizing_len,
                                                                     std::int64_t max_prompt_rows);

}  // namespace flexh2o::engine
