// The reference sampler (sampling.h): every backend's tokens and log-probabilities are these.
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
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

// The candidates in descending order, sorted lazily a growing chunk at a time: a nucleus or a
// draw usually ends within the first few hundred of a large vocabulary.
class Descending {
 public:
  explicit Descending(std::vector<Candidate>& c) : c_(c) {}
  std::size_t size() const { return c_.size(); }
  const Candidate& operator[](std::size_t i) {
    if (i >= sorted_) extend(i + 1);
    return c_[i];
  }

 private:
  void extend(std::size_t n) {
    n = std::min(c_.size(), std::max(n, 2 * sorted_ + 64));
    const auto first = c_.begin() + static_cast<std::ptrdiff_t>(sorted_);
    const auto mid = c_.begin() + static_cast<std::ptrdiff_t>(n);
    if (mid != c_.end()) std::nth_element(first, mid, c_.end(), before);
    std::sort(first, mid, before);
    sorted_ = n;
  }
  std::vector<Candidate>& c_;
  std::size_t sorted_ = 0;
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

// The token a draw u in [0, 1) picks among the kept candidates (top_k, then top_p over the
// top-k mass, then min_p); `total` is the mass of all candidates.
std::int32_t draw(Descending& d, double total, const SamplingParams& p, double u) {
  std::size_t keep = d.size();
  double mass = total;
  if (p.top_k > 0 && static_cast<std::size_t>(p.top_k) < keep) {
    keep = static_cast<std::size_t>(p.top_k);
    mass = 0.0;
    for (std::size_t i = 0; i < keep; ++i) mass += d[i].p;
  }
  if (p.top_p < 1.0f) {
    double acc = 0.0;
    for (std::size_t i = 0; i < keep; ++i) {
      acc += d[i].p / mass;
      if (acc >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {  // relative to the most probable token, whose p is 1
    std::size_t i = 1;
    while (i < keep && d[i].p >= p.min_p) ++i;
    keep = i;
  }
  double kept = mass;
  if (keep != d.size()) {
    kept = 0.0;
    for (std::size_t i = 0; i < keep; ++i) kept += d[i].p;
  }
  const double target = u * kept;
  double acc = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    acc += d[i].p;
    if (target < acc) return d[i].id;
  }
  return d[keep - 1].id;
}

// The k largest logits, descending (lowest id first on ties).
std::vector<std::int32_t> top_tokens(const float* z, std::int64_t vocab, std::int32_t k, Scratch& s) {
  s.tokens.resize(static_cast<std::size_t>(vocab));
  std::iota(s.tokens.begin(), s.tokens.end(), 0);
  const auto mid = s.tokens.begin() + std::min<std::ptrdiff_t>(k, vocab);
  std::partial_sort(s.tokens.begin(), mid, s.tokens.end(),
                    [&](std::int32_t x, std::int32_t y) { return z[x] > z[y] || (z[x] == z[y] && x < y); });
  return {s.tokens.begin(), mid};
}

void sample_row(const SampleArgs& a, std::size_t r, Scratch& s) {
  const SamplingParams& p = a.params[r];
  const float* z = a.logits + static_cast<std::int64_t>(r) * a.vocab;
  const auto V = static_cast<std::size_t>(a.vocab);
  if (p.adjusts_logits()) {
    adjust(z, a.vocab, p, a.history.empty() ? std::span<const std::int32_t>() : a.history[r], a.steps[r], a.eos_ids, s);
    z = s.logits.data();
  }
  const bool want_logprobs = p.logprobs >= 0 && (!a.chosen_logprob.empty() || !a.top_logprobs.empty());
  const float mx = *std::max_element(z, z + V);
  if (!(mx > -std::numeric_limits<float>::infinity()))
    throw std::invalid_argument("sample: every token of a row is masked (min_tokens over its stop ids?)");
  const double temperature = p.greedy() ? 1.0 : static_cast<double>(p.temperature);
  double total = 0.0;  // sum of exp((z - mx) / temperature)
  std::int32_t chosen = 0;
  if (p.greedy()) {
    chosen = static_cast<std::int32_t>(std::max_element(z, z + V) - z);
    if (want_logprobs)
      for (std::size_t i = 0; i < V; ++i) total += std::exp(static_cast<double>(z[i] - mx));
  } else {
    s.candidates.clear();
    for (std::size_t i = 0; i < V; ++i) {
      const double e = std::exp(static_cast<double>(z[i] - mx) / temperature);
      total += e;
      if (e > 0.0) s.candidates.push_back({e, static_cast<std::int32_t>(i)});
    }
    Descending d(s.candidates);
    chosen = draw(d, total, p, sampling_uniform(p.seed, a.streams[r], a.steps[r]));
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
  for (const std::int32_t t : top_tokens(z, a.vocab, p.logprobs, s)) top.push_back({t, logprob(t)});
}

}  // namespace

void CpuBackend::do_sample(const SampleArgs& a) {
  tbb::parallel_for(std::int64_t{0}, a.batch, [&](std::int64_t r) {
    thread_local Scratch scratch;
    sample_row(a, static_cast<std::size_t>(r), scratch);
  });
}

}  // namespace flexh2o::kernels
