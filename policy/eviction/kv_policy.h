// KV eviction policies (docs/kv-eviction.md): which cached tokens of one (layer, sequence,
// kv head) stay in its fixed slot array. Pure logic: the attention kernels report the
// attention mass (prefill column sums, decode per-slot probabilities, both summed over the kv
// head's query heads) and the engine moves K/V rows; the policy only decides.
//
// Life of one (layer, sequence, kv head):
//   B = policy.budget(layer, n_total);                  // n_total: prompt + generated tokens
//   KvHeadState st = policy.make_state(kv_slot_capacity(B));   // B + 1 slots
//   w = policy.prefill_query_weights(layer, n_prompt);  // kernel: col[j] = sum_i w[i] p(i, j)
//   policy.on_prefill(layer, n_prompt, col, B, st);     // slots [0, kept) hold the kept prompt
//                                                       // positions ascending: gather those rows
//   each decode step:
//     s = st.free_slot();  write K/V of token `pos` to slot s;  attention over the occupied slots
//     policy.on_decode_step(st, s, pos, probs_of_this_head, B, evict);   // evict: slots freed
// (flex also takes the norm of each token's value vector: on_prefill's value_norms and
// on_decode_step's value_norm, when uses_value_norms(). When merges_evictions(), each decode
// step's evicted slot, whose K/V are still in the cache, is merged into a kept one:
//     sim[s] = cos(key of the evicted slot, key of slot s)        // kernel: kv_similarity
//     if (policy.merge_evicted(st, evicted, sim, B, m)) blend value row m.from into m.to with
//       m.weight                                                  // kernel: kv_merge
// and attention adds st.logit_bias(s) to every slot's score.)
// Slots are order-free. With one eviction per step the occupied slots plus the next token's
// slot (free_slot() is the lowest free slot) are always [0, size()+1), so a kernel that attends
// slots [0, len) stays correct; a step that frees several slots (scissorhands with drop > 1, or
// a budget that shrank) leaves holes: call compact() and copy the rows it reports.
//
// Scores are fp32. Decode steps cost O(capacity) time and allocate nothing once warm; each
// state holds 8 bytes per slot (position, score) plus, for flex, a weight from the token's
// value-vector norm (4 bytes) and a logit bias (4 bytes, when merging), and for scissorhands
// ceil(history/64) 64-bit words of "unimportant" bits.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "policy/eviction/kv_spec.h"

namespace flexh2o::policy {

// Slots to allocate per (layer, sequence, kv head) for a budget: the kept tokens plus one for
// the incoming token, which attention sees before the policy evicts.
constexpr std::int64_t kv_slot_capacity(std::int64_t budget) { return budget + 1; }

// A K/V row the engine must copy from slot `from` to slot `to` (see KvHeadState::compact).
struct KvSlotMove {
  std::int64_t from = 0;
  std::int64_t to = 0;
};

// A value row the engine must blend into another: row[to] = (1 - weight) * row[to] + weight *
// row[from] (KvPolicy::merge_evicted; `from` is the slot just evicted).
struct KvSlotMerge {
  std::int64_t from = 0;
  std::int64_t to = 0;
  float weight = 0.0f;
};

// The cache bookkeeping of one (layer, sequence, kv head): per slot the original position of
// the token it holds (-1: free) and the policy's fp32 score. Made by KvPolicy::make_state and
// changed only by that policy (and compact()).
class KvHeadState {
 public:
  KvHeadState() = default;  // capacity 0; assign one from KvPolicy::make_state before use

  std::int64_t capacity() const { return static_cast<std::int64_t>(pos_.size()); }
  std::int64_t size() const { return size_; }  // occupied slots
  bool occupied(std::int64_t slot) const { return pos_[static_cast<std::size_t>(slot)] >= 0; }
  // The lowest free slot (where the next token goes), or -1 when every slot is taken.
  std::int64_t free_slot() const;
  std::int64_t position(std::int64_t slot) const { return pos_[static_cast<std::size_t>(slot)]; }
  // h2o/snapkv/pyramid: accumulated attention; tova: the last step's attention;
  // scissorhands: how often the token was below the uniform share within the history window;
  // full/local/streaming: 0. A slot freed by a decode step keeps its token's last score until
  // it is reused (what merge_evicted weighs the evicted token by).
  float score(std::int64_t slot) const { return score_[static_cast<std::size_t>(slot)]; }
  // flex: the weight the policy derived from the token's value-vector norm (KvPolicy::value_weight;
  // 0 for policies that do not use norms).
  float value_weight(std::int64_t slot) const {
    return value_.empty() ? 0.0f : value_[static_cast<std::size_t>(slot)];
  }
  // flex with merging: what attention adds to the slot's score, the log of how much attention
  // mass the slot stands for relative to its own token (0 unmerged); 0 for other policies.
  float logit_bias(std::int64_t slot) const { return bias_.empty() ? 0.0f : bias_[static_cast<std::size_t>(slot)]; }
  std::int64_t last_position() const { return last_pos_; }  // newest token seen, -1 if none
  std::int64_t steps() const { return steps_; }              // decode steps observed
  // Bookkeeping bytes per slot: position and score (8), plus the value weight (flex, 4), the
  // logit bias (flex merging, 4) and the history bits (scissorhands, 8 per 64 steps).
  // Independent of the budget and the sequence.
  std::int64_t bytes_per_slot() const {
    return static_cast<std::int64_t>(sizeof(std::int32_t) + sizeof(float)) + (value_.empty() ? 0 : 4) +
           (bias_.empty() ? 0 : 4) + 8 * words_;
  }
  // Original positions of the occupied slots, ascending (allocates; for tests and reports).
  std::vector<std::int64_t> kept_positions() const;

  // Frees every slot (a new sequence). Keeps the capacity.
  void clear();
  // Moves tokens from the highest occupied slots into the holes below so that the occupied
  // slots become exactly [0, size()); appends one move per copied row (nothing when already
  // contiguous). Positions, scores and history move with their tokens.
  void compact(std::vector<KvSlotMove>& moves);

 private:
  friend class KvPolicy;
  void occupy(std::int64_t slot, std::int64_t position, float score, float value_weight = 0.0f);
  void release(std::int64_t slot);

  std::vector<std::int32_t> pos_;     // original position per slot, -1 = free
  std::vector<float> score_;          // per slot
  std::vector<std::uint64_t> bits_;   // scissorhands: words_ per slot, ring of `history_` bits
  std::vector<float> value_;          // flex: per slot value_weight(|v|) of the token
  std::vector<float> bias_;           // flex merging: per slot logit bias
  std::int64_t words_ = 0;
  std::int64_t history_ = 0;
  std::int64_t size_ = 0;
  mutable std::int64_t low_free_ = 0;  // every slot below is occupied
  std::int64_t last_pos_ = -1;
  std::int64_t steps_ = 0;
};

class KvPolicy {
 public:
  virtual ~KvPolicy() = default;
  KvPolicy(const KvPolicy&) = delete;
  KvPolicy& operator=(const KvPolicy&) = delete;

  const KvSpec& spec() const { return spec_; }
  const std::string& name() const { return spec_.name; }
  // decode=0: the prefill keeps room for the new tokens and decoding evicts none while they fit.
  bool evicts_while_decoding() const { return !spec_.params.count("decode") || spec_.params.at("decode") != 0; }
  // What a prefill keeps of a sequence whose budget is `budget` and that will generate up to
  // `new_tokens`: the budget, or under decode=0 the budget less the new tokens (at least
  // min(budget, 8), the fewest a fraction's budget keeps).
  std::int64_t prefill_budget(std::int64_t budget, std::int64_t new_tokens) const;
  // layerwise=1: every kv head of a layer is given the scores summed over them, so they keep
  // the same tokens in the same slots (in step from the prefill on).
  bool scores_per_layer() const { return spec_.params.count("layerwise") && spec_.params.at("layerwise") != 0; }
  std::int64_t n_layers() const { return n_layers_; }

  // Tokens kept per kv head of `layer` for a sequence of n_tokens (BOS included).
  // full: n; pyramid: shrinks with depth (see policies.cc); others: budget_tokens(spec, n).
  virtual std::int64_t budget(std::int64_t layer, std::int64_t n_tokens) const;
  // A state with `capacity` free slots (normally kv_slot_capacity(budget)).
  KvHeadState make_state(std::int64_t capacity) const;

  // What the kernels must report. full/local/streaming need neither (their arguments may be
  // empty spans); tova/snapkv/pyramid/scissorhands need weighted prefill column sums.
  virtual bool uses_prefill_scores() const { return true; }
  virtual bool uses_decode_probs() const { return true; }
  // flex: the L2 norm of each token's value vector (per kv head) at prefill and decode.
  virtual bool uses_value_norms() const { return false; }
  // flex (merge=1): a decode step's evicted token is merged into a kept one (merge_evicted)
  // instead of dropped, and attention adds each slot's logit_bias. Decode steps of such a
  // policy evict at most one slot per (sequence, kv head).
  virtual bool merges_evictions() const { return false; }
  // What a state keeps per slot of a token whose value vector has norm `norm` (computed once,
  // when the token enters, so that decode steps need no pow per slot).
  virtual float value_weight(float norm) const { return norm; }
  // Weight w[i] of prompt query row i in the prefill column sums, size n:
  // h2o: all 1; tova: only the last row; snapkv: the last `window` rows; scissorhands: the last
  // `history` rows; pyramid: the last 20% rows ("observers") weighted linearly 1.0 .. 1.2;
  // full/local/streaming: all 1 (unused).
  virtual std::vector<float> prefill_query_weights(std::int64_t layer, std::int64_t n) const;

  // Prefill of n prompt tokens (positions 0..n-1): clears `state`, keeps at most `budget` of
  // them in slots 0..kept-1 (positions ascending) with their initial scores.
  // col_sums[j] = sum_i w[i] * p(i, j) over prompt queries i >= j (summed over the kv head's
  // query heads), w from prefill_query_weights. Throws std::invalid_argument on bad sizes.
  // value_norms[j]: the norm of prompt token j's value vector, when uses_value_norms().
  void on_prefill(std::int64_t layer, std::int64_t n, std::span<const float> col_sums, std::int64_t budget,
                  KvHeadState& state, std::span<const float> value_norms = {}) const;
  void on_prefill(std::int64_t layer, std::int64_t n, std::span<const float> col_sums, KvHeadState& state) const {
    on_prefill(layer, n, col_sums, budget(layer, n), state);
  }

  // One decode step: the token at original position new_pos (> every position seen) was written
  // to the free slot new_slot and attention ran over the occupied slots including it; probs[s]
  // is the attention slot s received this step (size >= capacity; free slots ignored). Updates
  // the scores, then evicts so that at most `budget` slots stay occupied; `evict` is overwritten
  // with the freed slots (usually one once the cache is full, none before). Throws
  // std::logic_error when new_slot is not free (allocate kv_slot_capacity(budget) slots).
  // value_norm: the norm of the new token's value vector, when uses_value_norms().
  void on_decode_step(KvHeadState& state, std::int64_t new_slot, std::int64_t new_pos, std::span<const float> probs,
                      std::int64_t budget, std::vector<std::int64_t>& evict, float value_norm = 0.0f) const;
  // Only the eviction half: frees slots until at most `budget` remain; `evict` is overwritten.
  void select_evictions(KvHeadState& state, std::int64_t budget, std::vector<std::int64_t>& evict) const;
  // When merges_evictions(): right after on_decode_step freed slot `evicted`, with
  // similarity[s] the cosine between its key and slot s's (size >= capacity; free slots
  // ignored), picks the kept slot it merges into and the blend weight, and raises that slot's
  // logit bias. Returns false when no kept slot can take it (then it is dropped).
  // Throws std::logic_error for a policy that does not merge or a slot that is not free.
  virtual bool merge_evicted(KvHeadState& state, std::int64_t evicted, std::span<const float> similarity,
                             std::int64_t budget, KvSlotMerge& merge) const;

 protected:
  KvPolicy(KvSpec spec, std::int64_t n_layers);
  void check_layer(std::int64_t layer) const;

  // Prompt positions to keep (any order, distinct, at most budget) when n > budget. value_norms
  // is empty unless uses_value_norms().
  virtual void prefill_keep(std::int64_t layer, std::int64_t n, std::span<const float> col_sums,
                            std::span<const float> value_norms, std::int64_t budget,
                            std::vector<std::int64_t>& keep) const = 0;
  // Whether the kept prompt tokens start with a score from their column sum (else 0), and which.
  virtual bool prefill_sums_are_scores() const { return uses_prefill_scores(); }
  virtual float prefill_score(float col_sum) const { return col_sum; }
  // Bits of history per slot the state needs (scissorhands).
  virtual std::int64_t history_bits() const { return 0; }
  // Updates the scores with this step's probabilities (the new token is already occupied).
  virtual void observe(KvHeadState& state, std::span<const float> probs) const;
  // Called while size() > budget: frees (via release) and appends at least one slot.
  virtual void evict_some(KvHeadState& state, std::int64_t budget, std::vector<std::int64_t>& evict) const = 0;

  // State access for the policies.
  static std::span<std::int32_t> positions(KvHeadState& s) { return s.pos_; }
  static std::span<float> scores(KvHeadState& s) { return s.score_; }
  static std::span<float> value_weights(KvHeadState& s) { return s.value_; }
  static std::span<float> logit_biases(KvHeadState& s) { return s.bias_; }
  static std::span<std::uint64_t> history(KvHeadState& s) { return s.bits_; }
  static std::int64_t history_words(const KvHeadState& s) { return s.words_; }
  static void release(KvHeadState& s, std::int64_t slot, std::vector<std::int64_t>& evict) {
    s.release(slot);
    evict.push_back(slot);
  }

 private:
  KvSpec spec_;
  std::int64_t n_layers_ = 1;
};

// Throws std::invalid_argument for n_layers < 1.
std::unique_ptr<KvPolicy> make_kv_policy(const KvSpec& spec, std::int64_t n_layers);

}  // namespace flexh2o::policy
