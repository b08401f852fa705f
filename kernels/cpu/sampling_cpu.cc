// The reference sampler (sampling.h): every backend's tokens and log-probabilities are these.
#include <tbb/parallel_for.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/sampling_vec.h"
#include "kernels/hash.h"

namespace flexh2o::kernels {

double sampling_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t step) {
  const std::uint64_t h = splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ step);
  return unit_interval(h);
}

namespace {

struct Candidate {
  double p;  // unnormalised probability
  std::int32_t id;
};

// Descending probability, lowest id first on ties: a total order, so any algorithm that sorts
// by it gives the same sequence.
bool before(const Candidate& x, const Candidate& y) { return x.p > y.p || (x.p == y.p && x.id < y.id); }

// The candidates in descending order, sorted lazily a growing head at a time: a nucleus or a
// draw usually ends within the first few hundred of a large vocabulary.
class Descending {
 public:
  explicit Descending(std::vector<Candidate>& c) : c_(c) {}
  std::size_t size() const { return c_.size(); }
  const Candidate& operator[](std::size_t i) {
    if (i >= sorted_) extend(i + 1);
    return c_[i];
  }
  // Sorts at least the head holding `mass`, or every candidate of weight >= `weight` (either
  // when the candidates hold it): a hint for a walk about to go that far, which would
  // otherwise extend the head many times. One pass bins the unsorted candidates by binary
  // exponent, one partition takes the bins the walk needs, one sort orders them.
  void cover(double mass, double weight) {
    const bool weight_held = weight <= 0.0 || (sorted_ > 0 && c_[sorted_ - 1].p < weight);
    if (sorted_ == c_.size() || (head_mass_ >= mass && weight_held)) return;
    std::array<double, 2048> bin_mass{};
    for (std::size_t i = sorted_; i < c_.size(); ++i) bin_mass[static_cast<std::size_t>(exponent(c_[i].p))] += c_[i].p;
    // The bins from the top down to `cut`, until they hold the mass and reach the weight's bin.
    const int weight_bin = weight > 0.0 ? exponent(weight) : static_cast<int>(bin_mass.size());
    int cut = static_cast<int>(bin_mass.size()) - 1;
    double have = head_mass_ + bin_mass.back();
    while (cut > 0 && (have < mass || cut > weight_bin)) have += bin_mass[static_cast<std::size_t>(--cut)];
    const auto first = c_.begin() + static_cast<std::ptrdiff_t>(sorted_);
    const auto mid = std::partition(first, c_.end(), [&](const Candidate& x) { return exponent(x.p) >= cut; });
    std::sort(first, mid, before);
    sorted_ = static_cast<std::size_t>(mid - c_.begin());
    head_mass_ = have;
  }

 private:
  // The biased binary exponent: a bin of weights within a factor 2, in order.
  static int exponent(double p) { return static_cast<int>((std::bit_cast<std::uint64_t>(p) >> 52) & 0x7ff); }
  void extend(std::size_t n) {
    n = std::min(c_.size(), std::max(n, 2 * sorted_ + 64));
    const auto first = c_.begin() + static_cast<std::ptrdiff_t>(sorted_);
    const auto mid = c_.begin() + static_cast<std::ptrdiff_t>(n);
    if (mid != c_.end()) std::nth_element(first, mid, c_.end(), before);
    std::sort(first, mid, before);
    for (auto it = first; it != mid; ++it) head_mass_ += it->p;
    sorted_ = n;
  }
  std::vector<Candidate>& c_;
  std::size_t sorted_ = 0;
  double head_mass_ = 0.0;  // of the sorted head (the walk sums it again in its own order)
};

struct Scratch {
  std::vector<float> logits;
  std::vector<std::int32_t> tokens;
  std::vector<Candidate> candidates;
};

// HF's repetition penalty over every distinct token of prompt + generated.
void apply_repetition(std::vector<float>& z, std::span<const std::int32_t> history, float penalty,
                      std::vector<std::int32_t>& tokens) {
  tokens.assign(history.begin(), history.end());
  std::sort(tokens.begin(), tokens.end());
  tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
  for (const std::int32_t t : tokens) {
    float& v = z[static_cast<std::size_t>(t)];
    v = v < 0.0f ? v * penalty : v / penalty;
  }
}

// OpenAI's presence and frequency penalties over the generated tokens.
void apply_occurrence(std::vector<float>& z, std::span<const std::int32_t> generated, const SamplingParams& p,
                      std::vector<std::int32_t>& tokens) {
  tokens.assign(generated.begin(), generated.end());
  std::sort(tokens.begin(), tokens.end());
  for (std::size_t i = 0; i < tokens.size();) {
    std::size_t j = i;
    while (j < tokens.size() && tokens[j] == tokens[i]) ++j;
    z[static_cast<std::size_t>(tokens[i])] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(j - i);
    i = j;
  }
}

// The row's final logits before the temperature (sampling.h), in s.logits.
void adjust(const float* raw, std::int64_t vocab, const SamplingParams& p, std::span<const std::int32_t> history,
            std::uint64_t step, std::span<const std::int32_t> eos_ids, Scratch& s) {
  s.logits.assign(raw, raw + vocab);
  if (p.repetition_penalty != 1.0f) apply_repetition(s.logits, history, p.repetition_penalty, s.tokens);
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f)
    apply_occurrence(s.logits, history.subspan(history.size() - step), p, s.tokens);
  for (const LogitBias& b : p.logit_bias) s.logits[static_cast<std::size_t>(b.token)] += b.bias;
  if (static_cast<std::int64_t>(step) < p.min_tokens) {
    constexpr float kMasked = -std::numeric_limits<float>::infinity();
    if (!p.ignore_eos)
      for (const std::int32_t id : eos_ids) s.logits[static_cast<std::size_t>(id)] = kMasked;
    for (const std::int32_t id : p.stop_token_ids) s.logits[static_cast<std::size_t>(id)] = kMasked;
  }
}

// The token a draw u in [0, 1) picks among the kept tokens (top_k, then top_p over the top-k
// mass, then min_p) of the `all` tokens of positive weight, whose mass is `total`. `d` holds the
// most likely of them, maybe not all: nullopt when the answer needs one beyond those.
std::optional<std::int32_t> draw(Descending& d, std::size_t all, double total, const SamplingParams& p, double u) {
  const std::size_t held = d.size();
  std::size_t keep = all;
  double mass = total;
  if (p.top_k > 0 && static_cast<std::size_t>(p.top_k) < all) {
    keep = static_cast<std::size_t>(p.top_k);
    if (keep > held) return std::nullopt;
    mass = 0.0;
    for (std::size_t i = 0; i < keep; ++i) mass += d[i].p;
  }
  if (p.top_p < 1.0f) {
    d.cover(p.top_p * mass, 0.0);
    double acc = 0.0;
    for (std::size_t i = 0; i < keep; ++i) {
      if (i >= held) return std::nullopt;
      acc += d[i].p / mass;
      if (acc >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {  // relative to the most probable token, whose weight is 1
    if (keep == all) d.cover(0.0, p.min_p);  // else the head holds the kept tokens already
    std::size_t i = 1;
    for (; i < keep; ++i) {
      if (i >= held) return std::nullopt;
      if (d[i].p < p.min_p) break;
    }
    keep = i;
  }
  double kept = mass;
  if (keep != all) {
    kept = 0.0;
    for (std::size_t i = 0; i < keep; ++i) kept += d[i].p;  // keep <= held here
  }
  const double target = u * kept;
  d.cover(target, 0.0);
  double acc = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    if (i >= held) return std::nullopt;
    acc += d[i].p;
    if (target < acc) return d[i].id;
  }
  if (keep > held) return std::nullopt;
  return d[keep - 1].id;
}

// A token's unnormalised probability exp((z - mx) / temperature), as the reference computes it:
// every weight the draw walks is this one.
double weight(float z, float mx, double temperature) { return std::exp(static_cast<double>(z - mx) / temperature); }

// A row's logits with their largest and the sampling temperature.
struct Row {
  const float* z;
  std::int64_t vocab;
  float mx;
  double temperature;
};

// A logit bound below (side -1) or above (side +1) every token of weight w: a weight reaches w
// only where z >= mx + temperature ln(w), and the margin is far above the roundings of either
// side, so the bound lets a few tokens too many through (their exact weight then drops them).
float logit_bound(const Row& row, double w, double side) {
  if (w <= 0.0) return -std::numeric_limits<float>::infinity();
  if (std::isinf(w)) return std::numeric_limits<float>::infinity();
  const double logit = row.mx + row.temperature * std::log(w);
  const double margin = 1e-3 * (1.0 + std::abs(row.mx) + std::abs(logit - row.mx));
  return static_cast<float>(logit + side * margin);
}

// Adds the tokens of weight in [low, high) (and positive) to s.candidates; returns their mass.
double take_band(const Row& row, Scratch& s, double low, double high) {
  sampling_vec::indices_in(row.z, row.vocab, logit_bound(row, low, -1.0), logit_bound(row, high, 1.0), s.tokens);
  double mass = 0.0;
  for (const std::int32_t id : s.tokens) {
    const double w = weight(row.z[id], row.mx, row.temperature);
    if (w > 0.0 && w >= low && w < high) {
      s.candidates.push_back({w, id});
      mass += w;
    }
  }
  return mass;
}

// Whether the `held` most likely tokens, of weight >= `cutoff` and mass `mass`, hold what the draw
// needs: the top_k, else the nucleus' mass, else a token below min_p, else the mass up to the
// draw. Only a hint where the sums round: the draw itself says when they do not.
bool head_suffices(std::size_t held, double mass, double cutoff, std::size_t positive, double total,
                   const SamplingParams& p, double u) {
  if (held == positive) return true;
  if (p.top_k > 0 && static_cast<std::size_t>(p.top_k) < positive) return held >= static_cast<std::size_t>(p.top_k);
  if (p.top_p < 1.0f) return mass >= static_cast<double>(p.top_p) * total;
  if (p.min_p > 0.0f) return cutoff < static_cast<double>(p.min_p);
  return mass > u * total;
}

// The head's cutoffs, as depths below the largest logit in units of the temperature (a weight is
// e^depth). Of a flat row of a small model, tens of its 49152 tokens are above e^-4, hundreds
// above e^-6 and thousands above e^-9; of a peaked one, a handful hold almost all the mass. A
// band costs a pass over the row's logits (no exp, as much as ~100 candidates' exact weights),
// a candidate its exact weight and its sort: the bands are finest where they grow fastest.
constexpr std::array<double, 8> kHeadDepths = {-4.0, -6.0, -7.0, -8.0, -9.0, -10.0, -12.0, -15.0};

// The sampled token. The draw walks the most likely tokens, so it runs over a head of them, grown
// a band of weights at a time until it holds what the draw needs (by the depths above, then down
// to the tokens holding all but a 1e-4 share of the mass, then all): a head gives the token the
// whole row gives, or none.
std::int32_t draw_from_head(const Row& row, Scratch& s, const sampling_vec::ExpSum& sum, const SamplingParams& p,
                            double u) {
  const auto positive = static_cast<std::size_t>(sum.positive);
  std::array<double, kHeadDepths.size() + 2> cutoffs;
  std::size_t n = 0;
  for (const double depth : kHeadDepths) cutoffs[n++] = std::exp(depth);
  const double tail = sum.total * 1e-4 / static_cast<double>(row.vocab);
  if (tail < cutoffs[n - 1]) cutoffs[n++] = tail;
  cutoffs[n++] = 0.0;
  s.candidates.clear();
  double mass = 0.0, high = std::numeric_limits<double>::infinity();
  for (std::size_t c = 0; c < n; high = cutoffs[c++]) {
    mass += take_band(row, s, cutoffs[c], high);
    if (!head_suffices(s.candidates.size(), mass, cutoffs[c], positive, sum.total, p, u)) continue;
    Descending d(s.candidates);
    if (const auto token = draw(d, positive, sum.total, p, u)) return *token;
  }
  throw std::logic_error("sample: the draw over every token found none");
}

// The row's logits with the tokens its mask leaves out at -inf, in s.logits (already there
// when `z` is s.logits). Throws when the mask allows none of them.
void apply_mask(const float* z, std::int64_t vocab, std::span<const std::uint32_t> allowed, std::size_t r, Scratch& s) {
  if (z != s.logits.data()) s.logits.assign(z, z + vocab);
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  bool any = false;
  for (std::int64_t w = 0; w * 32 < vocab; ++w) {
    const std::int64_t begin = w * 32, end = std::min(vocab, begin + 32);
    const std::uint32_t in_vocab = end - begin == 32 ? ~0u : (1u << (end - begin)) - 1u;
    const std::uint32_t bits = allowed[static_cast<std::size_t>(w)] & in_vocab;
    float* row = s.logits.data();
    if (bits == 0) {  // most words of a narrow mask: all 32 out
      std::fill(row + begin, row + end, kMasked);
      continue;
    }
    any = true;
    if (bits == in_vocab) continue;
    for (std::int64_t t = begin; t < end; ++t)
      if (!((bits >> (t & 31)) & 1u)) row[t] = kMasked;
  }
  if (!any)
    throw std::invalid_argument("sample: the allowed-token mask of row " + std::to_string(r) +
                                " allows no token of the vocabulary");
}

// The k largest logits, descending (lowest id first on ties), in s.tokens.
void top_tokens(const float* z, std::int64_t vocab, std::int32_t k, Scratch& s) {
  const auto n = static_cast<std::size_t>(std::min<std::int64_t>(k, vocab));
  const auto better = [&](std::int32_t x, std::int32_t y) { return z[x] > z[y] || (z[x] == z[y] && x < y); };
  std::vector<std::int32_t>& top = s.tokens;
  top.clear();
  if (n > 64) {  // many: a partial sort of the row
    top.resize(static_cast<std::size_t>(vocab));
    std::iota(top.begin(), top.end(), 0);
    std::partial_sort(top.begin(), top.begin() + static_cast<std::ptrdiff_t>(n), top.end(), better);
    top.resize(n);
    return;
  }
  // One pass holding the best n in order; a block of logits none above the n-th is skipped whole.
  constexpr std::int64_t kBlock = 64;
  for (std::int64_t b = 0; b < vocab; b += kBlock) {
    const std::int64_t e = std::min(b + kBlock, vocab);
    if (top.size() == n && !(sampling_vec::max_of(z + b, e - b) > z[top.back()])) continue;
    for (auto i = static_cast<std::int32_t>(b); i < e; ++i) {
      if (top.size() == n) {
        if (!(z[i] > z[top.back()])) continue;  // a tie goes to the lower id, already held
        top.pop_back();
      }
      top.insert(std::upper_bound(top.begin(), top.end(), i, better), i);
    }
  }
}

// Whether any of the n values is NaN (a max over them would skip it, silently).
bool holds_nan(const float* z, std::int64_t n) {
  bool nan = false;
  for (std::int64_t i = 0; i < n; ++i) nan |= std::isnan(z[i]);
  return nan;
}

void sample_row(const SampleArgs& a, std::size_t r, Scratch& s) {
  const SamplingParams& p = a.params[r];
  const float* z = a.logits + static_cast<std::int64_t>(r) * a.vocab;
  if (holds_nan(z, a.vocab))
    throw std::runtime_error("sample: the model's logits of row " + std::to_string(r) +
                             " hold NaN (corrupt weights, or values beyond the compute dtype's range)");
  if (p.adjusts_logits()) {
    adjust(z, a.vocab, p, a.history.empty() ? std::span<const std::int32_t>() : a.history[r], a.steps[r], a.eos_ids, s);
    z = s.logits.data();
  }
  if (!a.allowed.empty()) {  // after the adjustments is as before them: -inf stays -inf through each
    const auto words = static_cast<std::size_t>(mask_words(a.vocab));
    apply_mask(z, a.vocab, a.allowed.subspan(r * words, words), r, s);
    z = s.logits.data();
  }
  const bool want_logprobs = p.logprobs >= 0 && (!a.chosen_logprob.empty() || !a.top_logprobs.empty());
  const float mx = sampling_vec::max_of(z, a.vocab);
  if (!(mx > -std::numeric_limits<float>::infinity()))
    throw std::invalid_argument(
        "sample: every token of a row is masked (min_tokens over its stop ids, where its allowed-token mask allows "
        "only those?)");
  const double temperature = p.greedy() ? 1.0 : static_cast<double>(p.temperature);
  double total = 0.0;  // sum of exp((z - mx) / temperature)
  std::int32_t chosen = 0;
  if (p.greedy()) {
    chosen = static_cast<std::int32_t>(std::find(z, z + a.vocab, mx) - z);  // the first largest
    if (want_logprobs) total = sampling_vec::exp_sum(z, a.vocab, mx, temperature).total;
  } else {
    const sampling_vec::ExpSum sum = sampling_vec::exp_sum(z, a.vocab, mx, temperature);
    total = sum.total;
    const Row row{z, a.vocab, mx, temperature};
    const double u = sampling_uniform(p.seed, a.streams[r], a.steps[r]);
    chosen = draw_from_head(row, s, sum, p, u);
  }
  a.out[r] = chosen;
  if (!want_logprobs) return;
  const double log_total = std::log(total);
  const auto logprob = [&](std::int32_t t) {
    return static_cast<float>(static_cast<double>(z[t] - mx) / temperature - log_total);
  };
  if (!a.chosen_logprob.empty()) a.chosen_logprob[r] = logprob(chosen);
  if (a.top_logprobs.empty()) return;
  auto& top = a.top_logprobs[r];
  top.clear();
  if (p.logprobs == 0) return;
  top_tokens(z, a.vocab, p.logprobs, s);
  for (const std::int32_t t : s.tokens) top.push_back({t, logprob(t)});
}

}  // namespace

void CpuBackend::do_sample(const SampleArgs& a) {
  tbb::parallel_for(std::int64_t{0}, a.batch, [&](std::int64_t r) {
    thread_local Scratch scratch;
    sample_row(a, static_cast<std::size_t>(r), scratch);
  });
}

}  // namespace flexh2o::kernels
