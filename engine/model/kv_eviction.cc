#include "engine/model/kv_eviction.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace flexh2o::engine {

KvEvictionLayer::KvEvictionLayer(kernels::Backend& be, const policy::KvPolicy& policy, const ModelConfig& cfg,
                                 std::int64_t layer, std::int64_t slots, std::span<const std::int64_t> sizing_len,
                                 std::int64_t max_prompt_rows)
    : policy_(policy), layer_(layer), n_kv_heads_(cfg.n_kv_heads), head_dim_(cfg.head_dim) {
  for (const std::int64_t total : sizing_len) capacity_ = std::max(capacity_, policy::kv_slot_capacity(budget_of(total)));
  budget_.assign(static_cast<std::size_t>(slots), 0);
  total_.assign(static_cast<std::size_t>(slots), 0);
  states_.resize(static_cast<std::size_t>(slots * n_kv_heads_));
  const auto f = sizeof(float);
  if (policy.uses_prefill_scores()) col_sums_ = {be, static_cast<std::size_t>(max_prompt_rows * n_kv_heads_) * f};
}

std::int64_t KvEvictionLayer::budget_of(std::int64_t total_len) const {
  // A budget at or above the sequence never evicts; its slots need not exceed the tokens.
  return std::min(policy_.budget(layer_, total_len), total_len);
}

void KvEvictionLayer::reset(std::int64_t seq, std::int64_t total_len) {
  const std::int64_t budget = budget_of(total_len), slots = policy::kv_slot_capacity(budget);
  if (slots > capacity_)
    throw std::logic_error("KV eviction: a sequence of " + std::to_string(total_len) + " tokens needs " +
                           std::to_string(slots) + " slots, the cache was sized for " + std::to_string(capacity_));
  budget_[static_cast<std::size_t>(seq)] = budget;
  total_[static_cast<std::size_t>(seq)] = total_len;
  for (std::int64_t g = 0; g < n_kv_heads_; ++g)
    states_[static_cast<std::size_t>(seq * n_kv_heads_ + g)] = policy_.make_state(slots);
}

void KvEvictionLayer::copy_sequence(const KvEvictionLayer& from, std::int64_t from_seq, std::int64_t seq) {
  const std::int64_t budget = from.budget_[static_cast<std::size_t>(from_seq)];
  if (&from.policy_ != &policy_ || from.layer_ != layer_ || policy::kv_slot_capacity(budget) > capacity_)
    throw std::logic_error("KV eviction: a sequence is copied only between slots of one policy and layer that fit it");
  budget_[static_cast<std::size_t>(seq)] = budget;
  total_[static_cast<std::size_t>(seq)] = from.total_[static_cast<std::size_t>(from_seq)];
  std::copy_n(from.states_.begin() + from_seq * n_kv_heads_, n_kv_heads_, states_.begin() + seq * n_kv_heads_);
}

void KvEvictionLayer::sum_prefill_scores(std::span<const std::int64_t> seq_offsets) {
  const std::int64_t H = n_kv_heads_;
  for (std::size_t b = 0; b + 1 < seq_offsets.size(); ++b) {
    const std::int64_t t0 = seq_offsets[b], n = seq_offsets[b + 1] - t0;
    float* col = host_scores_.data() + t0 * H;  // head g's sums at col[g * n + j]
    for (std::int64_t j = 0; j < n; ++j) {
      float sum = 0;
      for (std::int64_t g = 0; g < H; ++g) sum += col[g * n + j];
      for (std::int64_t g = 0; g < H; ++g) col[g * n + j] = sum;
    }
  }
}

void KvEvictionLayer::sum_decode_scores(std::int64_t B, std::int64_t capacity) {
  const std::int64_t H = n_kv_heads_;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t slot = 0; slot < capacity; ++slot) {
      float sum = 0;
      for (std::int64_t g = 0; g < H; ++g) sum += host_scores_[static_cast<std::size_t>((b * H + g) * capacity + slot)];
      for (std::int64_t g = 0; g < H; ++g) host_scores_[static_cast<std::size_t>((b * H + g) * capacity + slot)] = sum;
    }
}

void KvEvictionLayer::compute_value_norms(kernels::Backend& be, const float* v, std::int64_t rows) {
  const std::int64_t H = n_kv_heads_, D = head_dim_;
  host_values_.resize(static_cast<std::size_t>(rows * H * D));
  be.copy_to_host(host_values_.data(), v, host_values_.size() * sizeof(float));
  value_norms_.resize(static_cast<std::size_t>(rows * H));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t g = 0; g < H; ++g) {
      const float* x = host_values_.data() + (r * H + g) * D;
      float ss = 0;
      for (std::int64_t d = 0; d < D; ++d) ss += x[d] * x[d];
      value_norms_[static_cast<std::size_t>(g * rows + r)] = std::sqrt(ss);
    }
}

void KvEvictionLayer::prefill(kernels::Backend& be, const StepBatch& s, std::int64_t seq0,
                              const kernels::AttentionShape& shape, const float* q, const float* k, const float* v,
                              float* out, const KvPart& part, const KvView& cache) {
  const std::int64_t B = s.batch(), H = n_kv_heads_, T = s.rows(), capacity = cache.capacity;
  const bool scores = policy_.uses_prefill_scores();
  std::vector<float> weights;
  if (scores)
    for (std::int64_t b = 0; b < B; ++b) {
      const auto w = policy_.prefill_query_weights(layer_, s.seq_offsets[b + 1] - s.seq_offsets[b]);
      weights.insert(weights.end(), w.begin(), w.end());
    }
  be.attention_prefill({.shape = shape, .q = q, .k = k, .v = v, .out = out, .seq_offsets = s.seq_offsets,
                        .col_sums = scores ? col_sums_.as<float>() : nullptr, .query_weights = weights});
  if (scores) {
    host_scores_.resize(static_cast<std::size_t>(T * H));
    be.copy_to_host(host_scores_.data(), col_sums_.data(), host_scores_.size() * sizeof(float));
    if (policy_.scores_per_layer()) sum_prefill_scores(s.seq_offsets);
  }
  const bool norms = policy_.uses_value_norms();
  if (norms) compute_value_norms(be, v, T);
  // The policy keeps positions per head; only those rows are written, to the slots it chose.
  head_slot_.assign(static_cast<std::size_t>(T * H), -1);
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t t0 = s.seq_offsets[b], n = s.seq_offsets[b + 1] - t0;
    for (std::int64_t g = 0; g < H; ++g) {
      policy::KvHeadState& st = states_[static_cast<std::size_t>((seq0 + b) * H + g)];
      const std::span<const float> col = scores ? std::span<const float>(host_scores_).subspan(static_cast<std::size_t>(t0 * H + g * n), static_cast<std::size_t>(n))
                                                : std::span<const float>{};
      const std::span<const float> vn = norms ? std::span<const float>(value_norms_).subspan(static_cast<std::size_t>(g * T + t0), static_cast<std::size_t>(n))
                                              : std::span<const float>{};
      const auto at = static_cast<std::size_t>(seq0 + b);
      policy_.on_prefill(layer_, n, col, policy_.prefill_budget(budget_[at], total_[at] - n), st, vn);
      for (std::int64_t slot = 0; slot < st.capacity(); ++slot)
        if (st.occupied(slot)) head_slot_[static_cast<std::size_t>((t0 + st.position(slot)) * H + g)] = slot;
    }
  }
  be.kv_write({.src = k, .cache = part.k, .n_kv_heads = H, .head_dim = head_dim_, .capacity = capacity,
               .seq = s.row_seq, .head_slot = head_slot_, .cache_dtype = cache.dtype});
  be.kv_write({.src = v, .cache = part.v, .n_kv_heads = H, .head_dim = head_dim_, .capacity = capacity,
               .seq = s.row_seq, .head_slot = head_slot_, .cache_dtype = cache.dtype});
}

void KvEvictionLayer::decode(kernels::Backend& be, const StepBatch& s, std::int64_t seq0,
                             const kernels::AttentionShape& shape, const float* q, const float* k, const float* v,
                             float* out, const KvPart& part, const KvView& cache) {
  const std::int64_t B = s.batch(), H = n_kv_heads_, capacity = cache.capacity;
  head_slot_.assign(static_cast<std::size_t>(B * H), -1);
  lens_.assign(static_cast<std::size_t>(B), 0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t g = 0; g < H; ++g) {
      const policy::KvHeadState& st = states_[static_cast<std::size_t>((seq0 + b) * H + g)];
      const std::int64_t slot = st.free_slot();
      // The occupied slots and the new one are [0, size + 1) (compaction keeps it so), the
      // same count for every head, so one length per sequence covers them.
      if (slot < 0 || slot > st.size() || (g > 0 && lens_[b] != st.size() + 1))
        throw std::logic_error("KV eviction: the slots of a sequence's heads are out of step");
      head_slot_[static_cast<std::size_t>(b * H + g)] = slot;
      lens_[static_cast<std::size_t>(b)] = st.size() + 1;
    }
  be.kv_write({.src = k, .cache = part.k, .n_kv_heads = H, .head_dim = head_dim_, .capacity = capacity,
               .seq = s.row_seq, .head_slot = head_slot_, .cache_dtype = cache.dtype});
  be.kv_write({.src = v, .cache = part.v, .n_kv_heads = H, .head_dim = head_dim_, .capacity = capacity,
               .seq = s.row_seq, .head_slot = head_slot_, .cache_dtype = cache.dtype});
  const bool probs = policy_.uses_decode_probs(), merging = policy_.merges_evictions();
  // The cache may be wider than this layer needs (pyramid: layers differ); probs follow its stride.
  const auto probs_bytes = static_cast<std::size_t>(B * H * capacity) * sizeof(float);
  if (probs && probs_.bytes() < probs_bytes) probs_ = {be, probs_bytes};
  if (merging) upload_logit_biases(be, seq0, B, capacity);
  be.attention_decode({.shape = shape, .q = q, .k_cache = part.k, .v_cache = part.v, .capacity = capacity,
                       .lens = lens_, .out = out, .probs = probs ? probs_.as<float>() : nullptr,
                       .cache_dtype = cache.dtype, .slot_bias = merging ? bias_.as<float>() : nullptr});
  if (probs) {
    host_scores_.resize(static_cast<std::size_t>(B * H * capacity));
    be.copy_to_host(host_scores_.data(), probs_.data(), host_scores_.size() * sizeof(float));
    if (policy_.scores_per_layer()) sum_decode_scores(B, capacity);
  }
  const bool norms = policy_.uses_value_norms();
  if (norms) compute_value_norms(be, v, B);
  moves_.clear();
  queries_.clear();
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t g = 0; g < H; ++g) {
      policy::KvHeadState& st = states_[static_cast<std::size_t>((seq0 + b) * H + g)];
      const std::span<const float> p = probs ? std::span<const float>(host_scores_).subspan(static_cast<std::size_t>((b * H + g) * capacity), static_cast<std::size_t>(capacity))
                                             : std::span<const float>{};
      policy_.on_decode_step(st, head_slot_[static_cast<std::size_t>(b * H + g)], s.positions[b], p,
                             budget_[static_cast<std::size_t>(seq0 + b)], evicted_,
                             norms ? value_norms_[static_cast<std::size_t>(g * B + b)] : 0.0f);
      if (merging) {
        if (evicted_.size() > 1)
          throw std::logic_error("KV eviction: a merging policy evicted more than one slot of a head in a step");
        if (!evicted_.empty()) queries_.push_back({b, g, evicted_[0], lens_[static_cast<std::size_t>(b)]});
      }
      // One eviction leaves the freed slot for the next token; more leave holes to close.
      if (evicted_.size() > 1) {
        slot_moves_.clear();
        st.compact(slot_moves_);
        for (const auto& m : slot_moves_) moves_.push_back({b, g, m.from, m.to});
      }
    }
  if (!moves_.empty()) {
    be.kv_move({.cache = part.k, .n_kv_heads = H, .head_dim = head_dim_, .capacity = capacity, .moves = moves_,
                .cache_dtype = cache.dtype});
    be.kv_move({.cache = part.v, .n_kv_heads = H, .head_dim = head_dim_, .capacity = capacity, .moves = moves_,
                .cache_dtype = cache.dtype});
  }
  if (!queries_.empty()) merge_evictions(be, seq0, capacity, part, cache);
}

void KvEvictionLayer::upload_logit_biases(kernels::Backend& be, std::int64_t seq0, std::int64_t B,
                                          std::int64_t capacity) {
  const std::int64_t H = n_kv_heads_;
  // 0 for the free slots, among them the one the new token was just written to.
  host_bias_.assign(static_cast<std::size_t>(B * H * capacity), 0.0f);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t g = 0; g < H; ++g) {
      const policy::KvHeadState& st = states_[static_cast<std::size_t>((seq0 + b) * H + g)];
      for (std::int64_t slot = 0; slot < st.capacity(); ++slot)
        if (st.occupied(slot)) host_bias_[static_cast<std::size_t>((b * H + g) * capacity + slot)] = st.logit_bias(slot);
    }
  const std::size_t bytes = host_bias_.size() * sizeof(float);
  if (bias_.bytes() < bytes) bias_ = {be, bytes};
  be.copy_to_device(bias_.data(), host_bias_.data(), bytes);
}

void KvEvictionLayer::merge_evictions(kernels::Backend& be, std::int64_t seq0, std::int64_t capacity,
                                      const KvPart& part, const KvView& cache) {
  const std::int64_t H = n_kv_heads_;
  const auto n = static_cast<std::int64_t>(queries_.size());
  const auto bytes = static_cast<std::size_t>(n * capacity) * sizeof(float);
  if (similarity_.bytes() < bytes) similarity_ = {be, bytes};
  be.kv_similarity({.cache = part.k, .n_kv_heads = H, .head_dim = head_dim_, .capacity = capacity, .queries = queries_,
                    .out = similarity_.as<float>(), .cache_dtype = cache.dtype});
  host_similarity_.resize(static_cast<std::size_t>(n * capacity));
  be.copy_to_host(host_similarity_.data(), similarity_.data(), bytes);
  merges_.clear();
  for (std::int64_t i = 0; i < n; ++i) {
    const kernels::KvSimilarityQuery& q = queries_[static_cast<std::size_t>(i)];
    policy::KvHeadState& st = states_[static_cast<std::size_t>((seq0 + q.seq) * H + q.head)];
    // Slots >= len were not compared: no kept token lies there.
    const std::span<const float> sim(host_similarity_.data() + i * capacity, static_cast<std::size_t>(capacity));
    policy::KvSlotMerge m;
    if (policy_.merge_evicted(st, q.slot, sim, budget_[static_cast<std::size_t>(seq0 + q.seq)], m))
      merges_.push_back({q.seq, q.head, m.from, m.to, m.weight});
  }
  // Values only: the kept key stands in for both tokens (the policy raised its logit bias).
  if (!merges_.empty())
    be.kv_merge({.cache = part.v, .n_kv_heads = H, .head_dim = head_dim_, .capacity = capacity, .merges = merges_,
                 .cache_dtype = cache.dtype});
}

std::vector<std::unique_ptr<KvEvictionLayer>> make_kv_eviction_slots(kernels::Backend& be,
                                                                     const policy::KvPolicy& policy,
                                                                     const ModelConfig& cfg, std::int64_t slots,
                                                                     std::span<const std::int64_t> sizing_len,
                                                                     std::int64_t max_prompt_rows) {
  std::vector<std::unique_ptr<KvEvictionLayer>> out;
  for (std::int64_t l = 0; l < cfg.n_layers; ++l)
    out.push_back(std::make_unique<KvEvictionLayer>(be, policy, cfg, l, slots, sizing_len, max_prompt_rows));
  return out;
}

std::vector<std::unique_ptr<KvEvictionLayer>> make_kv_eviction(kernels::Backend& be, const policy::KvPolicy& policy,
                                                               const ModelConfig& cfg,
                                                               std::span<const std::int64_t> total_len,
                                                               std::int64_t max_prompt_rows) {
  const auto slots = static_cast<std::int64_t>(total_len.size());
  auto out = make_kv_eviction_slots(be, policy, cfg, slots, total_len, max_prompt_rows);
  for (auto& layer : out)
    for (std::int64_t b = 0; b < slots; ++b) layer->reset(b, total_len[static_cast<std::size_t>(b)]);
  return out;
}

}  // namespace flexh2o::engine
