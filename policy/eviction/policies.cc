// The eviction policies of docs/kv-eviction.md ("Definitions"). Conventions shared by all of them:
//  - "oldest" / "newest" compare original positions; ties in a score are broken against the
//    oldest token, at prefill and decode alike (the prefill keeps the newer of two equal
//    tokens, exactly as repeated "evict the lowest, ties oldest" would).
//  - Protected windows count tokens in the cache: "the R newest" are the R largest positions
//    held, "the S sinks" the S smallest (the first tokens of the sequence, which sink-keeping
//    policies never evict).
//  - Decode steps are O(capacity): a few passes over the slots. The protected windows are
//    normally positions [0, S) and (last - R, last], checked by counting; only when they are
//    not (positions not starting at 0, a budget that changed) an nth_element runs over a
//    thread-local scratch copy of the positions. Nothing is allocated once that is warm.
//    Measured (g++ -O3, one core): B = 2048: local 3 us/step, h2o/snapkv/pyramid ~12,
//    tova 8, scissorhands 18; B = 256: h2o 1.6, scissorhands 2.4.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <string>
#include <string_view>

#include "policy/eviction/kv_policy.h"

namespace flexh2o::policy {
namespace {

constexpr std::int64_t kNoLimit = std::numeric_limits<std::int64_t>::max();

// Appends (GCC 12's -Wrestrict misfires on "literal" + std::string&&).
template <class... A>
std::string cat(const A&... parts) {
  std::string out;
  (out.append(std::string_view(parts)), ...);
  return out;
}

std::int64_t param_int(const KvSpec& s, const char* key) { return static_cast<std::int64_t>(s.param(key)); }

// Thread-local scratch so decode steps do not allocate.
std::vector<std::int32_t>& scratch_positions() {
  thread_local std::vector<std::int32_t> v;
  return v;
}
std::vector<std::int64_t>& scratch_slots() {
  thread_local std::vector<std::int64_t> v;
  return v;
}

// The protected ends of the cache: positions <= sink_last are the S oldest held, positions
// >= recent_first the R newest. Candidates lie strictly between.
struct Window {
  std::int64_t sink_last = -1;
  std::int64_t recent_first = kNoLimit;
  bool candidate(std::int64_t p) const { return p > sink_last && p < recent_first; }
};

Window protect(std::span<const std::int32_t> pos, std::int64_t n_held, std::int64_t last_pos, std::int64_t sinks,
               std::int64_t recent) {
  Window w;
  if (sinks <= 0 && recent <= 0) return w;
  // Fast path, one pass: normally the sinks are positions [0, S) and the recent tokens
  // (last_pos - R, last_pos], all still held.
  const std::int64_t first_recent = last_pos - recent + 1;
  std::int64_t n_sink = 0, n_recent = 0;
  for (const std::int32_t p : pos) {
    if (p < 0) continue;
    n_sink += p < sinks ? 1 : 0;
    n_recent += p >= first_recent ? 1 : 0;
  }
  const bool sinks_ok = sinks <= 0 || n_sink == sinks;
  const bool recent_ok = recent <= 0 || n_recent == recent;
  if (sinks_ok && recent_ok) {
    if (sinks > 0) w.sink_last = sinks - 1;
    if (recent > 0) w.recent_first = first_recent;
    return w;
  }
  // General case (positions not starting at 0, a protected token already gone): order
  // statistics over a copy of the held positions.
  auto& v = scratch_positions();
  v.clear();
  for (const std::int32_t p : pos)
    if (p >= 0) v.push_back(p);
  if (sinks > 0) {
    std::nth_element(v.begin(), v.begin() + (sinks - 1), v.end());
    w.sink_last = v[static_cast<std::size_t>(sinks - 1)];
  }
  if (recent > 0) {
    std::nth_element(v.begin(), v.begin() + (n_held - recent), v.end());
    w.recent_first = v[static_cast<std::size_t>(n_held - recent)];
  }
  return w;
}

// The occupied candidate slot with the lowest (score, position), or -1.
std::int64_t lowest_scored(std::span<const std::int32_t> pos, std::span<const float> score, const Window& w) {
  std::int64_t best = -1;
  float best_score = 0;
  std::int32_t best_pos = 0;
  for (std::size_t s = 0; s < pos.size(); ++s) {
    const std::int32_t p = pos[s];
    if (p < 0 || !w.candidate(p)) continue;
    if (best < 0 || score[s] < best_score || (score[s] == best_score && p < best_pos)) {
      best = static_cast<std::int64_t>(s);
      best_score = score[s];
      best_pos = p;
    }
  }
  return best;
}

// The occupied candidate slot with the smallest position, or -1.
std::int64_t oldest(std::span<const std::int32_t> pos, const Window& w) {
  std::int64_t best = -1;
  std::int32_t best_pos = 0;
  for (std::size_t s = 0; s < pos.size(); ++s) {
    const std::int32_t p = pos[s];
    if (p < 0 || !w.candidate(p)) continue;
    if (best < 0 || p < best_pos) {
      best = static_cast<std::int64_t>(s);
      best_pos = p;
    }
  }
  return best;
}

// Appends to `keep` the k positions of `cand` with the largest key; ties keep the newer one.
template <class Key>
void keep_top(std::vector<std::int64_t> cand, std::int64_t k, const Key& key, std::vector<std::int64_t>& keep) {
  k = std::clamp<std::int64_t>(k, 0, static_cast<std::int64_t>(cand.size()));
  if (k == 0) return;
  auto better = [&](std::int64_t a, std::int64_t b) {
    const auto ka = key(a), kb = key(b);
    return ka > kb || (ka == kb && a > b);
  };
  std::nth_element(cand.begin(), cand.begin() + (k - 1), cand.end(), better);
  keep.insert(keep.end(), cand.begin(), cand.begin() + k);
}

std::vector<std::int64_t> range(std::int64_t lo, std::int64_t hi) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = lo; i < hi; ++i) v.push_back(i);
  return v;
}

void keep_range(std::int64_t lo, std::int64_t hi, std::vector<std::int64_t>& keep) {
  for (std::int64_t i = lo; i < hi; ++i) keep.push_back(i);
}

// ---- full: no eviction ----
class FullPolicy final : public KvPolicy {
 public:
  FullPolicy(const KvSpec& s, std::int64_t l) : KvPolicy(s, l) {}
  std::int64_t budget(std::int64_t layer, std::int64_t n) const override {
    check_layer(layer);
    if (n < 0) throw std::invalid_argument(cat("kv policy 'full': sequence length ", std::to_string(n), " < 0"));
    return n;
  }
  bool uses_prefill_scores() const override { return false; }
  bool uses_decode_probs() const override { return false; }

 protected:
  void prefill_keep(std::int64_t, std::int64_t n, std::span<const float>, std::span<const float>, std::int64_t budget,
                    std::vector<std::int64_t>&) const override {
    throw std::logic_error(cat("kv policy 'full' keeps every token: budget ", std::to_string(budget),
                               " is below the prompt's ", std::to_string(n), " tokens; use budget(layer, n)"));
  }
  void evict_some(KvHeadState& st, std::int64_t budget, std::vector<std::int64_t>&) const override {
    throw std::logic_error(cat("kv policy 'full' keeps every token: ", std::to_string(st.size()),
                               " tokens exceed the budget ", std::to_string(budget),
                               "; size the budget for the whole sequence"));
  }
};

// ---- local: the B most recent tokens ----
class LocalPolicy final : public KvPolicy {
 public:
  LocalPolicy(const KvSpec& s, std::int64_t l) : KvPolicy(s, l) {}
  bool uses_prefill_scores() const override { return false; }
  bool uses_decode_probs() const override { return false; }

 protected:
  void prefill_keep(std::int64_t, std::int64_t n, std::span<const float>, std::span<const float>, std::int64_t b,
                    std::vector<std::int64_t>& keep) const override {
    keep_range(n - b, n, keep);
  }
  void evict_some(KvHeadState& st, std::int64_t, std::vector<std::int64_t>& evict) const override {
    const std::int64_t v = oldest(positions(st), Window{});
    if (v >= 0) release(st, v, evict);
  }
};

// ---- streaming (StreamingLLM): `sink` first tokens + the most recent ----
// With a budget of at most `sink` tokens the sinks shrink to budget - 1 so that the current
// token always stays.
class StreamingPolicy final : public KvPolicy {
 public:
  StreamingPolicy(const KvSpec& s, std::int64_t l) : KvPolicy(s, l), sink_(param_int(s, "sink")) {}
  bool uses_prefill_scores() const override { return false; }
  bool uses_decode_probs() const override { return false; }

 protected:
  std::int64_t sinks(std::int64_t b) const { return std::min(sink_, b - 1); }
  void prefill_keep(std::int64_t, std::int64_t n, std::span<const float>, std::span<const float>, std::int64_t b,
                    std::vector<std::int64_t>& keep) const override {
    const std::int64_t s = sinks(b);
    keep_range(0, s, keep);
    keep_range(n - (b - s), n, keep);
  }
  void evict_some(KvHeadState& st, std::int64_t b, std::vector<std::int64_t>& evict) const override {
    const std::int64_t v = oldest(positions(st), protect(positions(st), st.size(), st.last_position(), sinks(b), 0));
    if (v >= 0) release(st, v, evict);
  }

 private:
  std::int64_t sink_;
};

// ---- accumulated attention (h2o; also the decode rule of snapkv and pyramid) ----
// Decode: every step adds its probabilities to each held token's score; when over budget,
// protect the `recent(B)` newest (the current token included) and `sinks` oldest tokens and
// evict the lowest score among the rest (ties: oldest).
class AccumulatedPolicy : public KvPolicy {
 protected:
  AccumulatedPolicy(const KvSpec& s, std::int64_t l) : KvPolicy(s, l) {}
  // Newest tokens protected at decode (and kept as the recent window at prefill).
  virtual std::int64_t recent(std::int64_t b) const { return std::max<std::int64_t>(1, b / 2); }
  // Oldest tokens protected at decode.
  virtual std::int64_t sink_param() const { return 0; }
  std::int64_t sinks(std::int64_t b) const { return std::clamp<std::int64_t>(sink_param(), 0, b - recent(b)); }

  void observe(KvHeadState& st, std::span<const float> probs) const override {
    const auto pos = positions(st);
    const auto sc = scores(st);
    for (std::size_t s = 0; s < pos.size(); ++s)
      if (pos[s] >= 0) sc[s] += probs[s];
  }
  void evict_some(KvHeadState& st, std::int64_t b, std::vector<std::int64_t>& evict) const override {
    const Window w = protect(positions(st), st.size(), st.last_position(), sinks(b), recent(b));
    const std::int64_t v = lowest_scored(positions(st), scores(st), w);
    if (v >= 0) release(st, v, evict);
  }
};

// h2o: recent = floor(B/2) including the current token, heavy = B - recent (H2O's evaluation
// split; docs/kv-eviction.md), or the explicit heavy=/recent= split. Prefill keeps the recent window
// plus the top-heavy column sums of the older tokens; the column sums seed the scores.
class H2oPolicy final : public AccumulatedPolicy {
 public:
  H2oPolicy(const KvSpec& s, std::int64_t l) : AccumulatedPolicy(s, l) {
    if (s.params.count("heavy")) {
      heavy_ = s.params.at("heavy");
      recent_ = s.params.at("recent");
    }
  }

 protected:
  std::int64_t recent(std::int64_t b) const override {
    if (recent_ < 0) return std::max<std::int64_t>(1, b / 2);
    if (recent_ >= 1) return std::min(b, static_cast<std::int64_t>(recent_));
    if (heavy_ == 0 || heavy_ >= 1) return std::max<std::int64_t>(1, b - std::min(b, static_cast<std::int64_t>(heavy_)));
    // Both fractions: split the budget in their proportion.
    return std::clamp<std::int64_t>(std::llround(static_cast<double>(b) * recent_ / (heavy_ + recent_)), 1, b);
  }
  void prefill_keep(std::int64_t, std::int64_t n, std::span<const float> sums, std::span<const float>, std::int64_t b,
                    std::vector<std::int64_t>& keep) const override {
    const std::int64_t r = recent(b);
    keep_range(n - r, n, keep);
    keep_top(range(0, n - r), b - r, [&](std::int64_t j) { return sums[static_cast<std::size_t>(j)]; }, keep);
  }

 private:
  double heavy_ = -1, recent_ = -1;  // -1: default split
};

// ---- tova: keep the top-B by the current query's attention ----
// Prefill uses the last prompt query's attention (weights: last row only). Decode: the score
// is this step's probability; evict the lowest (ties: oldest). The current token may itself
// be evicted, as in TOVA.
class TovaPolicy final : public KvPolicy {
 public:
  TovaPolicy(const KvSpec& s, std::int64_t l)
      : KvPolicy(s, l), pool_(param_int(s, "pool")), ahead_(param_int(s, "ahead")) {}
  std::vector<float> prefill_query_weights(std::int64_t layer, std::int64_t n) const override {
    std::vector<float> w = KvPolicy::prefill_query_weights(layer, n);
    std::fill(w.begin(), w.end(), 0.0f);
    if (n > 0) w.back() = 1.0f;
    return w;
  }

 protected:
  // pool > 1: each prompt token ranks by the largest score within pool / 2 tokens of it, so a
  // kept token keeps its neighbours (a number's digits, a name's pieces) where the budget allows;
  // ties go to the token's own score. ahead > 0 moves that window: a high score keeps `ahead`
  // more tokens after it and as many fewer before (what an answer copies follows what it
  // attends to).
  void prefill_keep(std::int64_t, std::int64_t n, std::span<const float> sums, std::span<const float>, std::int64_t b,
                    std::vector<std::int64_t>& keep) const override {
    if (pool_ <= 1) {
      keep_top(range(0, n), b, [&](std::int64_t j) { return sums[static_cast<std::size_t>(j)]; }, keep);
      return;
    }
    const std::vector<double> pooled = max_pooled(sums.first(static_cast<std::size_t>(n)), pool_ / 2, ahead_);
    keep_top(range(0, n), b, [&](std::int64_t j) { return pooled[static_cast<std::size_t>(j)]; }, keep);
  }
  void observe(KvHeadState& st, std::span<const float> probs) const override {
    const auto pos = positions(st);
    const auto sc = scores(st);
    for (std::size_t s = 0; s < pos.size(); ++s)
      if (pos[s] >= 0) sc[s] = probs[s];
  }
  void evict_some(KvHeadState& st, std::int64_t, std::vector<std::int64_t>& evict) const override {
    const std::int64_t v = lowest_scored(positions(st), scores(st), Window{});
    if (v >= 0) release(st, v, evict);
  }

 private:
  // The largest of s in [j - half - ahead, j + half - ahead] for each index j, plus a millionth
  // of its own score (the tie-break).
  static std::vector<double> max_pooled(std::span<const float> s, std::int64_t half, std::int64_t ahead) {
    const auto n = static_cast<std::int64_t>(s.size());
    std::vector<double> out(s.size());
    for (std::int64_t j = 0; j < n; ++j) {
      double most = 0.0;
      for (std::int64_t i = std::max<std::int64_t>(0, j - half - ahead); i <= std::min(n - 1, j + half - ahead); ++i)
        most = std::max(most, static_cast<double>(s[static_cast<std::size_t>(i)]));
      out[static_cast<std::size_t>(j)] = most + 1e-6 * s[static_cast<std::size_t>(j)];
    }
    return out;
  }
  std::int64_t pool_, ahead_;
};

// ---- scissorhands: persistence of importance ----
// Each decode step records, per held token, one bit: its attention was below the uniform share
// of this step (sum of the step's probabilities / tokens held; the sum is the number of query
// heads in the group). Bits live in a ring of `history` steps per slot; the score is the number
// of set bits, i.e. how often the token was unimportant in the last `history` steps it was
// held. When the cache is over budget: protect the `recent` newest tokens and drop the `drop`
// tokens (a count, or a fraction of the budget) most often unimportant, ties oldest first;
// with drop > 1 the cache then stays below budget until it fills again (compact() closes the
// holes). Prefill has no per-step history: keep the `recent` newest prompt tokens plus the top
// column sums of the last `history` queries (weights), and start every count at zero.
// `sink` (default 0: the paper's rule) is not in the paper: it keeps the `sink` oldest tokens
// and measures the others against the uniform share of the attention they get without the
// sinks, (sum - the sinks' probabilities) / (held - sinks). In a trained model whose heads park
// most attention on the first token nearly every other token is below the plain uniform share;
// README.md ("KV eviction: flex and the eval protocol") has what each part changes on SmolLM2.
class ScissorhandsPolicy final : public KvPolicy {
 public:
  ScissorhandsPolicy(const KvSpec& s, std::int64_t l)
      : KvPolicy(s, l),
        history_(param_int(s, "history")),
        recent_(param_int(s, "recent")),
        sink_(param_int(s, "sink")),
        drop_(s.param("drop")) {}
  std::vector<float> prefill_query_weights(std::int64_t layer, std::int64_t n) const override {
    std::vector<float> w = KvPolicy::prefill_query_weights(layer, n);
    for (std::int64_t i = 0; i < n - history_; ++i) w[static_cast<std::size_t>(i)] = 0.0f;
    return w;
  }

 protected:
  std::int64_t history_bits() const override { return history_; }
  bool prefill_sums_are_scores() const override { return false; }
  std::int64_t recent(std::int64_t b) const { return std::min(recent_, b); }
  std::int64_t sinks(std::int64_t b) const { return std::clamp<std::int64_t>(sink_, 0, b - recent(b)); }
  std::int64_t drop(std::int64_t b) const {
    if (drop_ < 1) return std::max<std::int64_t>(1, std::llround(drop_ * static_cast<double>(b)));
    return static_cast<std::int64_t>(drop_);
  }
  void prefill_keep(std::int64_t, std::int64_t n, std::span<const float> sums, std::span<const float>, std::int64_t b,
                    std::vector<std::int64_t>& keep) const override {
    const std::int64_t r = recent(b), s = sinks(b);
    keep_range(0, s, keep);
    keep_range(n - r, n, keep);
    keep_top(range(s, n - r), b - r - s, [&](std::int64_t j) { return sums[static_cast<std::size_t>(j)]; }, keep);
  }
  void observe(KvHeadState& st, std::span<const float> probs) const override {
    const auto pos = positions(st);
    const auto sc = scores(st);
    const auto bits = history(st);
    const std::int64_t words = history_words(st);
    // The sinks: the min(sink, held) oldest held tokens; the share leaves them out.
    const std::int64_t n_sinks = std::min(sink_, st.size());
    const std::int64_t sink_last =
        n_sinks > 0 ? protect(pos, st.size(), st.last_position(), n_sinks, 0).sink_last : -1;
    double total = 0, sink_mass = 0;
    for (std::size_t s = 0; s < pos.size(); ++s)
      if (pos[s] >= 0) {
        total += probs[s];
        if (pos[s] <= sink_last) sink_mass += probs[s];
      }
    const double share = n_sinks < st.size() ? (total - sink_mass) / static_cast<double>(st.size() - n_sinks)
                                             : total / static_cast<double>(st.size());
    const std::int64_t idx = st.steps() % history_;
    const std::size_t word = static_cast<std::size_t>(idx / 64);
    const std::uint64_t mask = std::uint64_t{1} << (idx % 64);
    for (std::size_t s = 0; s < pos.size(); ++s) {
      if (pos[s] < 0) continue;
      std::uint64_t& w = bits[s * static_cast<std::size_t>(words) + word];
      const bool was = (w & mask) != 0;
      const bool now = static_cast<double>(probs[s]) < share;
      if (was != now) {
        w ^= mask;
        sc[s] += now ? 1.0f : -1.0f;
      }
    }
  }
  void evict_some(KvHeadState& st, std::int64_t b, std::vector<std::int64_t>& evict) const override {
    const auto pos = positions(st);
    const auto sc = scores(st);
    const Window w = protect(pos, st.size(), st.last_position(), sinks(b), recent(b));
    if (std::max(drop(b), st.size() - b) == 1) {  // the usual case: one linear scan
      std::int64_t best = -1;
      for (std::size_t s = 0; s < pos.size(); ++s) {
        if (pos[s] < 0 || !w.candidate(pos[s])) continue;
        const auto bs = static_cast<std::size_t>(best);
        if (best < 0 || sc[s] > sc[bs] || (sc[s] == sc[bs] && pos[s] < pos[bs])) best = static_cast<std::int64_t>(s);
      }
      if (best >= 0) release(st, best, evict);
      return;
    }
    auto& cand = scratch_slots();
    cand.clear();
    for (std::size_t s = 0; s < pos.size(); ++s)
      if (pos[s] >= 0 && w.candidate(pos[s])) cand.push_back(static_cast<std::int64_t>(s));
    const std::int64_t m = std::min(std::max(drop(b), st.size() - b), static_cast<std::int64_t>(cand.size()));
    if (m <= 0) return;
    auto worse = [&](std::int64_t a, std::int64_t c) {  // more often unimportant first, then older
      const auto ua = static_cast<std::size_t>(a), uc = static_cast<std::size_t>(c);
      return sc[ua] > sc[uc] || (sc[ua] == sc[uc] && pos[ua] < pos[uc]);
    };
    std::nth_element(cand.begin(), cand.begin() + (m - 1), cand.end(), worse);
    for (std::int64_t i = 0; i < m; ++i) release(st, cand[static_cast<std::size_t>(i)], evict);
  }

 private:
  std::int64_t history_, recent_, sink_;
  double drop_;
};

// ---- snapkv: prefill-only selection from an observation window ----
// Prefill: the last `window` prompt queries (weights 1, others 0) score the keys; the scores
// of the tokens before the kept window are average-pooled (kernel k, zero padding counted, as
// SnapKV's avg_pool1d) and the top B - window of them are kept with the window itself. When the
// budget is smaller than the window only the newest B tokens are kept.
// Decode: SnapKV does not evict after the prompt, but a fixed budget has to, so decode uses
// h2o's accumulated-attention rule (recent floor(B/2), evict the lowest accumulated score),
// seeded with the window's raw (unpooled) column sums. snapkv therefore differs from h2o only
// in which prompt tokens survive the prefill.
class SnapKvPolicy final : public AccumulatedPolicy {
 public:
  SnapKvPolicy(const KvSpec& s, std::int64_t l)
      : AccumulatedPolicy(s, l), window_(param_int(s, "window")), kernel_(param_int(s, "kernel")) {}
  std::vector<float> prefill_query_weights(std::int64_t layer, std::int64_t n) const override {
    std::vector<float> w = KvPolicy::prefill_query_weights(layer, n);
    for (std::int64_t i = 0; i < n - window_; ++i) w[static_cast<std::size_t>(i)] = 0.0f;
    return w;
  }

 protected:
  void prefill_keep(std::int64_t, std::int64_t n, std::span<const float> sums, std::span<const float>, std::int64_t b,
                    std::vector<std::int64_t>& keep) const override {
    const std::int64_t win = std::min({window_, n, b});
    const std::int64_t prefix = n - win;
    keep_range(prefix, n, keep);
    const std::int64_t half = kernel_ / 2;
    std::vector<double> pooled(static_cast<std::size_t>(prefix));
    for (std::int64_t j = 0; j < prefix; ++j) {
      double acc = 0;
      for (std::int64_t i = std::max<std::int64_t>(0, j - half); i <= std::min(prefix - 1, j + half); ++i)
        acc += sums[static_cast<std::size_t>(i)];
      pooled[static_cast<std::size_t>(j)] = acc / static_cast<double>(kernel_);
    }
    keep_top(range(0, prefix), b - win, [&](std::int64_t j) { return pooled[static_cast<std::size_t>(j)]; }, keep);
  }

 private:
  std::int64_t window_, kernel_;
};

// ---- pyramid (PyramidInfer) ----
// Budget: layer l keeps s_l = (1-r)(cos(pi*l/L)+1)/2 + r of layer l-1's budget, layer 0 the
// spec's budget B0 = budget_tokens(spec, n); so B_l = round(B0 * s_1 * ... * s_l), never below
// min(floor, B0) (floor 64; a layer never keeps more than layer 0).
// Prefill: observers are the last `recent` (20%) prompt queries, weighted linearly from 1.0
// (oldest observer) to 1.2 (newest); keep the first `sink` tokens, the observers' own tokens
// (the recent window, cut to what the budget leaves) and the top weighted column sums of the
// rest. Decode: h2o's accumulated rule (recent floor(B/2)) that also never evicts the `sink`
// oldest tokens; the weighted column sums seed the scores.
class PyramidPolicy final : public AccumulatedPolicy {
 public:
  PyramidPolicy(const KvSpec& s, std::int64_t l)
      : AccumulatedPolicy(s, l),
        r_(s.param("r")),
        sink_(param_int(s, "sink")),
        observe_(s.param("recent")),
        floor_(param_int(s, "floor")) {}

  std::int64_t budget(std::int64_t layer, std::int64_t n) const override {
    check_layer(layer);
    const std::int64_t b0 = budget_tokens(spec(), n);
    double keep = 1.0;
    for (std::int64_t l = 1; l <= layer; ++l)
      keep *= (1 - r_) * (std::cos(std::numbers::pi * static_cast<double>(l) / static_cast<double>(n_layers())) + 1) / 2 +
              r_;
    const std::int64_t b = std::llround(static_cast<double>(b0) * keep);
    return std::max(b, std::min(floor_, b0));
  }
  std::vector<float> prefill_query_weights(std::int64_t layer, std::int64_t n) const override {
    std::vector<float> w = KvPolicy::prefill_query_weights(layer, n);
    const std::int64_t obs = observers(n);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t k = i - (n - obs);  // index among the observers
      w[static_cast<std::size_t>(i)] =
          k < 0 ? 0.0f : (obs > 1 ? 1.0f + 0.2f * static_cast<float>(k) / static_cast<float>(obs - 1) : 1.0f);
    }
    return w;
  }

 protected:
  std::int64_t observers(std::int64_t n) const {
    return std::clamp<std::int64_t>(std::llround(observe_ * static_cast<double>(n)), 1, std::max<std::int64_t>(n, 1));
  }
  std::int64_t sink_param() const override { return sink_; }
  void prefill_keep(std::int64_t, std::int64_t n, std::span<const float> sums, std::span<const float>, std::int64_t b,
                    std::vector<std::int64_t>& keep) const override {
    const std::int64_t s = std::min(sink_, b);
    const std::int64_t r = std::min(observers(n), b - s);
    keep_range(0, s, keep);
    keep_range(n - r, n, keep);
    keep_top(range(s, n - r), b - s - r, [&](std::int64_t j) { return sums[static_cast<std::size_t>(j)]; }, keep);
  }

 private:
  double r_;
  std::int64_t sink_;
  double observe_;
  std::int64_t floor_;
};

// ---- flex: the engine's own policy ----
// Score of a held token: its decayed peak attention, s <- max(decay * s, p) every decode step
// (p: the attention it received this step, summed over the kv head's query heads), times the
// norm of its value vector to the power `value`: key = s * |v|^value. Protect the `sink`
// oldest and the round(recent * B) newest tokens (at least the current one) and evict the
// lowest key (ties: oldest). Why each part (ablations on stories260K and SmolLM2 in README.md):
//  - |v|: a token changes the attention output by about p * |v - o|; attention alone ignores
//    how far its value pulls. The norm is computed once per token (O(head_dim)), not per step.
//  - decayed peak instead of H2O's sum: the sum favours old tokens that collected many small
//    probabilities (and never forgets them); the peak asks "was it strongly attended lately".
//  - the recent window covers tokens too new to have been attended by many queries; a small
//    one (15% of B) measures best: the decayed peak already keeps what was attended lately.
//  - one sink by default: trained models park attention on the first token, whose value
//    vector is short, so the |v| factor alone would evict it (SmolLM2 at 20%: KL 0.56 -> 0.15).
// Merging (merge=1, the default): the evicted token is not dropped but folded into the kept
// non-sink slot whose key is most similar (cosine; the engine's kv_similarity kernel reads the
// keys, O(B * head_dim) per eviction, like one more query over the cache). Its value is blended
// in by the two tokens' scores, v_j <- (s_e v_e + s_j v_j) / (s_e + s_j), keys untouched, and
// slot j's logit bias grows by log((s_e + s_j) / s_j), capped at log 2: attention then gives j
// the mass the two tokens had (exact for a query that sees both keys alike; ToMe's proportional
// attention), but never more than twice its own. Why each part (tuning chunks, README.md):
// dropping loses all of e's contribution, while with j's key standing in for e's the blend
// keeps most of it; a key average moves j away from the queries that wanted j (stories260K
// 0.2: 0.041 -> 0.071 with ToMe's key-and-value average), no bias gives e's share of j's
// value but not e's share of the attention (SmolLM2 0.146), and an uncapped bias lets a slot
// that absorbed many tokens crowd out the rest (stories260K 0.1: 0.146 vs 0.114 capped).
// Prefill: the prompt's column sums with weights decay^(n-1-i) (newest query 1) rank the older
// prompt tokens (times |v|^value) and, scaled by (1 - decay) to the level of one step's
// attention, seed their scores.
// State: position, score and |v|^value per slot (12 bytes; the power is taken once, when the
// token enters), plus the logit bias when merging (16); a step is one pass over the slots to
// decay, one to pick the victim, like h2o's, and with merging one to pick the target.
class FlexPolicy final : public KvPolicy {
 public:
  FlexPolicy(const KvSpec& s, std::int64_t l)
      : KvPolicy(s, l),
        decay_(static_cast<float>(s.param("decay"))),
        value_(static_cast<float>(s.param("value"))),
        recent_(s.param("recent")),
        sink_(param_int(s, "sink")),
        merge_(s.param("merge") != 0) {}
  bool uses_value_norms() const override { return value_ != 0; }
  bool merges_evictions() const override { return merge_; }
  bool merge_evicted(KvHeadState& st, std::int64_t evicted, std::span<const float> sim, std::int64_t b,
                     KvSlotMerge& merge) const override {
    if (!merge_) return KvPolicy::merge_evicted(st, evicted, sim, b, merge);
    if (evicted < 0 || evicted >= st.capacity() || st.occupied(evicted))
      throw std::logic_error(cat("kv policy '", spec().text, "': merge_evicted needs the slot the step just freed"));
    if (static_cast<std::int64_t>(sim.size()) < st.capacity())
      throw std::invalid_argument(cat("kv policy '", spec().text, "': one similarity per slot is needed"));
    const auto pos = positions(st);
    const auto sc = scores(st);
    const auto bias = logit_biases(st);
    // Sinks stay as they are: the first token's key is where heads park attention.
    const Window w = protect(pos, st.size(), st.last_position(), sinks(b), 0);
    std::int64_t to = -1;
    for (std::size_t s = 0; s < pos.size(); ++s)
      if (pos[s] >= 0 && w.candidate(pos[s]) && (to < 0 || sim[s] > sim[static_cast<std::size_t>(to)]))
        to = static_cast<std::int64_t>(s);
    const auto e = static_cast<std::size_t>(evicted);
    if (to < 0 || sc[e] <= 0) return false;  // nothing to take it, or nothing to keep of it
    const auto t = static_cast<std::size_t>(to);
    merge = {evicted, to, sc[e] / (sc[e] + sc[t])};
    bias[t] = sc[t] > 0 ? std::min(kMaxMergeBias, bias[t] + std::log1p(sc[e] / sc[t])) : kMaxMergeBias;
    return true;
  }
  std::vector<float> prefill_query_weights(std::int64_t layer, std::int64_t n) const override {
    std::vector<float> w = KvPolicy::prefill_query_weights(layer, n);
    float f = 1.0f;
    for (std::int64_t i = n - 1; i >= 0; --i) {
      w[static_cast<std::size_t>(i)] = f;
      f *= decay_;
    }
    return w;
  }

 protected:
  std::int64_t recent(std::int64_t b) const {
    return std::clamp<std::int64_t>(std::llround(recent_ * static_cast<double>(b)), 1, b);
  }
  std::int64_t sinks(std::int64_t b) const { return std::clamp<std::int64_t>(sink_, 0, b - recent(b)); }
  float value_weight(float norm) const override { return std::pow(norm, value_); }
  void prefill_keep(std::int64_t, std::int64_t n, std::span<const float> sums, std::span<const float> norms,
                    std::int64_t b, std::vector<std::int64_t>& keep) const override {
    const std::int64_t r = recent(b), s = sinks(b);
    keep_range(0, s, keep);
    keep_range(n - r, n, keep);
    keep_top(range(s, n - r), b - r - s, [&](std::int64_t j) {
      const auto u = static_cast<std::size_t>(j);
      return norms.empty() ? sums[u] : sums[u] * value_weight(norms[u]);
    }, keep);
  }
  float prefill_score(float col_sum) const override { return (1 - decay_) * col_sum; }
  void observe(KvHeadState& st, std::span<const float> probs) const override {
    const auto pos = positions(st);
    const auto sc = scores(st);
    for (std::size_t s = 0; s < pos.size(); ++s)
      if (pos[s] >= 0) sc[s] = std::max(decay_ * sc[s], probs[s]);
  }
  void evict_some(KvHeadState& st, std::int64_t b, std::vector<std::int64_t>& evict) const override {
    const auto pos = positions(st);
    const auto sc = scores(st);
    const auto vw = value_weights(st);
    const Window w = protect(pos, st.size(), st.last_position(), sinks(b), recent(b));
    std::int64_t best = -1;
    float best_key = 0;
    for (std::size_t s = 0; s < pos.size(); ++s) {
      const std::int32_t p = pos[s];
      if (p < 0 || !w.candidate(p)) continue;
      const float k = vw.empty() ? sc[s] : sc[s] * vw[s];
      if (best < 0 || k < best_key || (k == best_key && p < pos[static_cast<std::size_t>(best)])) {
        best = static_cast<std::int64_t>(s);
        best_key = k;
      }
    }
    if (best >= 0) release(st, best, evict);
  }

 private:
  // A merged slot weighs at most twice its own token (see above).
  static constexpr float kMaxMergeBias = std::numbers::ln2_v<float>;
  float decay_, value_;
  double recent_;
  std::int64_t sink_;
  bool merge_;
};

}  // namespace

std::unique_ptr<KvPolicy> make_kv_policy(const KvSpec& spec, std::int64_t n_layers) {
  if (n_layers < 1)
    throw std::invalid_argument(cat("kv policy '", spec.text, "': the model needs at least one layer"));
  const std::string& n = spec.name;
  if (n == "full") return std::make_unique<FullPolicy>(spec, n_layers);
  if (n == "local") return std::make_unique<LocalPolicy>(spec, n_layers);
  if (n == "streaming") return std::make_unique<StreamingPolicy>(spec, n_layers);
  if (n == "h2o") return std::make_unique<H2oPolicy>(spec, n_layers);
  if (n == "tova") return std::make_unique<TovaPolicy>(spec, n_layers);
  if (n == "scissorhands") return std::make_unique<ScissorhandsPolicy>(spec, n_layers);
  if (n == "snapkv") return std::make_unique<SnapKvPolicy>(spec, n_layers);
  if (n == "pyramid") return std::make_unique<PyramidPolicy>(spec, n_layers);
  if (n == "flex") return std::make_unique<FlexPolicy>(spec, n_layers);
  throw std::invalid_argument(cat("kv policy '", spec.text, "': unknown policy '", n,
                                  "'; valid: full, local, streaming, h2o, tova, scissorhands, pyramid, snapkv, flex"));
}

}  // namespace flexh2o::policy
