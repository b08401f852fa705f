#include "policy/eviction/kv_policy.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>

namespace flexh2o::policy {
namespace {

// "kv policy '<text>': <parts...>" built by appending (GCC 12's -Wrestrict misfires on
// "literal" + std::string&&).
template <class... A>
std::string msg(const std::string& text, const A&... parts) {
  std::string out = "kv policy '";
  out += text;
  out += "': ";
  (out.append(std::string_view(parts)), ...);
  return out;
}

std::string str(std::int64_t v) { return std::to_string(v); }

}  // namespace

// ---- KvHeadState ----

std::int64_t KvHeadState::free_slot() const {
  const std::int64_t cap = capacity();
  while (low_free_ < cap && pos_[static_cast<std::size_t>(low_free_)] >= 0) ++low_free_;
  return low_free_ < cap ? low_free_ : -1;
}

std::vector<std::int64_t> KvHeadState::kept_positions() const {
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(size_));
  for (const std::int32_t p : pos_)
    if (p >= 0) out.push_back(p);
  std::sort(out.begin(), out.end());
  return out;
}

void KvHeadState::clear() {
  std::fill(pos_.begin(), pos_.end(), -1);
  std::fill(score_.begin(), score_.end(), 0.0f);
  std::fill(value_.begin(), value_.end(), 0.0f);
  std::fill(bias_.begin(), bias_.end(), 0.0f);
  std::fill(bits_.begin(), bits_.end(), 0);
  size_ = 0;
  low_free_ = 0;
  last_pos_ = -1;
  steps_ = 0;
}

void KvHeadState::occupy(std::int64_t slot, std::int64_t position, float score, float value_weight) {
  const auto s = static_cast<std::size_t>(slot);
  pos_[s] = static_cast<std::int32_t>(position);
  score_[s] = score;
  if (!value_.empty()) value_[s] = value_weight;
  if (!bias_.empty()) bias_[s] = 0.0f;
  if (words_ > 0) std::fill_n(bits_.begin() + slot * words_, words_, 0);
  ++size_;
  if (slot == low_free_) ++low_free_;
  last_pos_ = std::max(last_pos_, position);
}

void KvHeadState::release(std::int64_t slot) {
  const auto s = static_cast<std::size_t>(slot);
  pos_[s] = -1;  // the score stays until the slot is reused (KvPolicy::merge_evicted reads it)
  --size_;
  low_free_ = std::min(low_free_, slot);
}

void KvHeadState::compact(std::vector<KvSlotMove>& moves) {
  std::int64_t lo = 0, hi = capacity() - 1;
  while (true) {
    while (lo < hi && pos_[static_cast<std::size_t>(lo)] >= 0) ++lo;
    while (hi > lo && pos_[static_cast<std::size_t>(hi)] < 0) --hi;
    if (lo >= hi) break;
    const auto f = static_cast<std::size_t>(hi), t = static_cast<std::size_t>(lo);
    pos_[t] = pos_[f];
    score_[t] = score_[f];
    if (!value_.empty()) value_[t] = value_[f];
    if (!bias_.empty()) bias_[t] = bias_[f];
    if (words_ > 0)
      std::copy_n(bits_.begin() + hi * words_, words_, bits_.begin() + lo * words_);
    pos_[f] = -1;
    score_[f] = 0.0f;
    moves.push_back({hi, lo});
  }
  low_free_ = size_;
}

// ---- KvPolicy ----

KvPolicy::KvPolicy(KvSpec spec, std::int64_t n_layers) : spec_(std::move(spec)), n_layers_(n_layers) {
  if (n_layers < 1)
    throw std::invalid_argument(msg(spec_.text, "the model needs at least one layer"));
}

void KvPolicy::check_layer(std::int64_t layer) const {
  if (layer < 0 || layer >= n_layers_)
    throw std::out_of_range(msg(spec_.text, "layer ", str(layer), " outside [0, ", str(n_layers_), ")"));
}

std::int64_t KvPolicy::budget(std::int64_t layer, std::int64_t n_tokens) const {
  check_layer(layer);
  return budget_tokens(spec_, n_tokens);
}

KvHeadState KvPolicy::make_state(std::int64_t capacity) const {
  if (capacity < 1 || capacity > std::numeric_limits<std::int32_t>::max())
    throw std::invalid_argument(msg(spec_.text, "slot capacity ", str(capacity), " must be in [1, 2^31)"));
  KvHeadState s;
  const auto cap = static_cast<std::size_t>(capacity);
  s.pos_.assign(cap, -1);
  s.score_.assign(cap, 0.0f);
  if (uses_value_norms()) s.value_.assign(cap, 0.0f);
  if (merges_evictions()) s.bias_.assign(cap, 0.0f);
  s.history_ = history_bits();
  s.words_ = (s.history_ + 63) / 64;
  s.bits_.assign(cap * static_cast<std::size_t>(s.words_), 0);
  return s;
}

std::vector<float> KvPolicy::prefill_query_weights(std::int64_t layer, std::int64_t n) const {
  check_layer(layer);
  if (n < 0) throw std::invalid_argument(msg(spec_.text, "prompt length ", str(n), " < 0"));
  return std::vector<float>(static_cast<std::size_t>(n), 1.0f);
}

std::int64_t KvPolicy::prefill_budget(std::int64_t budget, std::int64_t new_tokens) const {
  if (evicts_while_decoding()) return budget;
  constexpr std::int64_t kLeast = 8;
  return std::max(std::min(budget, kLeast), budget - new_tokens);
}

void KvPolicy::on_prefill(std::int64_t layer, std::int64_t n, std::span<const float> col_sums, std::int64_t budget,
                          KvHeadState& state, std::span<const float> value_norms) const {
  check_layer(layer);
  const std::string& t = spec_.text;
  if (n < 0) throw std::invalid_argument(msg(t, "prompt length ", str(n), " < 0"));
  if (budget < 1 && n > 0) throw std::invalid_argument(msg(t, "budget ", str(budget), " must be at least 1"));
  if (n > std::numeric_limits<std::int32_t>::max())
    throw std::invalid_argument(msg(t, "prompt of ", str(n), " tokens is too long"));
  if (uses_prefill_scores() && static_cast<std::int64_t>(col_sums.size()) < n)
    throw std::invalid_argument(msg(t, str(static_cast<std::int64_t>(col_sums.size())),
                                    " prefill column sums for a prompt of ", str(n), " tokens"));
  const std::int64_t kept = std::min(n, budget);
  if (kept > state.capacity())
    throw std::invalid_argument(msg(t, "the state has ", str(state.capacity()), " slots but the prefill keeps ",
                                    str(kept), "; make it with make_state(kv_slot_capacity(budget))"));
  if (uses_value_norms() && static_cast<std::int64_t>(value_norms.size()) < n)
    throw std::invalid_argument(msg(t, str(static_cast<std::int64_t>(value_norms.size())),
                                    " value norms for a prompt of ", str(n), " tokens"));
  if (state.history_ != history_bits() || state.value_.empty() == uses_value_norms())
    throw std::logic_error(msg(t, "the state was not made by this policy's make_state"));

  state.clear();
  std::vector<std::int64_t> keep;
  if (n <= budget) {
    keep.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) keep[static_cast<std::size_t>(i)] = i;
  } else {
    prefill_keep(layer, n, col_sums, uses_value_norms() ? value_norms.first(static_cast<std::size_t>(n)) : value_norms,
                 budget, keep);
    std::sort(keep.begin(), keep.end());
    if (static_cast<std::int64_t>(keep.size()) > budget ||
        std::adjacent_find(keep.begin(), keep.end()) != keep.end() || (!keep.empty() && (keep.front() < 0 || keep.back() >= n)))
      throw std::logic_error(msg(t, "prefill selection is invalid"));
  }
  const bool sums_as_scores = uses_prefill_scores() && prefill_sums_are_scores();
  for (std::size_t i = 0; i < keep.size(); ++i) {
    const std::int64_t p = keep[i];
    state.occupy(static_cast<std::int64_t>(i), p, sums_as_scores ? prefill_score(col_sums[static_cast<std::size_t>(p)]) : 0.0f,
                 uses_value_norms() ? value_weight(value_norms[static_cast<std::size_t>(p)]) : 0.0f);
  }
  state.last_pos_ = n - 1;
}

void KvPolicy::observe(KvHeadState&, std::span<const float>) const {}

bool KvPolicy::merge_evicted(KvHeadState&, std::int64_t, std::span<const float>, std::int64_t, KvSlotMerge&) const {
  throw std::logic_error(msg(spec_.text, "this policy does not merge evicted tokens"));
}

void KvPolicy::on_decode_step(KvHeadState& state, std::int64_t new_slot, std::int64_t new_pos,
                              std::span<const float> probs, std::int64_t budget,
                              std::vector<std::int64_t>& evict, float value_norm) const {
  evict.clear();
  const std::string& t = spec_.text;
  if (budget < 1) throw std::invalid_argument(msg(t, "budget ", str(budget), " must be at least 1"));
  if (new_slot < 0 || new_slot >= state.capacity() || state.occupied(new_slot))
    throw std::logic_error(msg(t, "slot ", str(new_slot), " is not a free slot of this head (capacity ",
                               str(state.capacity()), ", ", str(state.size()),
                               " occupied); write the new token to free_slot() and allocate "
                               "kv_slot_capacity(budget) = budget + 1 slots"));
  if (new_pos <= state.last_pos_ || new_pos > std::numeric_limits<std::int32_t>::max())
    throw std::logic_error(
        msg(t, "token position ", str(new_pos), " must follow the newest position ", str(state.last_pos_)));
  if (uses_decode_probs() && static_cast<std::int64_t>(probs.size()) < state.capacity())
    throw std::invalid_argument(msg(t, str(static_cast<std::int64_t>(probs.size())), " attention probabilities for ",
                                    str(state.capacity()), " slots"));
  if (state.history_ != history_bits() || state.value_.empty() == uses_value_norms())
    throw std::logic_error(msg(t, "the state was not made by this policy's make_state"));
  state.occupy(new_slot, new_pos, 0.0f, uses_value_norms() ? value_weight(value_norm) : 0.0f);
  observe(state, probs);
  ++state.steps_;
  while (state.size() > budget) {
    const std::size_t before = evict.size();
    evict_some(state, budget, evict);
    if (evict.size() == before) throw std::logic_error(msg(t, "no token could be evicted"));
  }
}

void KvPolicy::select_evictions(KvHeadState& state, std::int64_t budget, std::vector<std::int64_t>& evict) const {
  evict.clear();
  if (budget < 1)
    throw std::invalid_argument(msg(spec_.text, "budget ", str(budget), " must be at least 1"));
  while (state.size() > budget) {
    const std::size_t before = evict.size();
    evict_some(state, budget, evict);
    if (evict.size() == before) throw std::logic_error(msg(spec_.text, "no token could be evicted"));
  }
}

}  // namespace flexh2o::policy
