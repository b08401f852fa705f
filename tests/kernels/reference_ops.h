// Naive double-precision reference implementations of the backend ops, for the op tests
// of every backend. Plain loops over host data with double accumulators: slow, but each
// follows the formula in the op's header line by line. Inputs are the exact fp32 values
// the backend sees (weights stored as fp16/bf16 are passed already rounded to fp32).
// Where an op leaves part of its output alone, the reference takes that output's prior
// contents and returns them unchanged there.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <span>
#include <vector>

#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"

namespace flexh2o::kernels::ref {

inline std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

// y[m, n] = x[m, k] @ w[n, k]^T + bias[n] + beta * y_prior; `bias` may be empty. With
// beta == 0, y_prior is not read (the BLAS convention), so it may hold NaN poison.
inline std::vector<double> gemm(std::span<const float> x, std::int64_t m, std::span<const float> w, std::int64_t n,
                                std::int64_t k, std::span<const float> bias, float beta,
                                std::span<const float> y_prior) {
  std::vector<double> y(sz(m * n));
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (std::int64_t p = 0; p < k; ++p) acc += static_cast<double>(x[sz(i * k + p)]) * w[sz(j * k + p)];
      if (!bias.empty()) acc += bias[sz(j)];
      if (beta != 0.0f) acc += static_cast<double>(beta) * y_prior[sz(i * n + j)];
      y[sz(i * n + j)] = acc;
    }
  }
  return y;
}

// (x - mean) / sqrt(var + eps) * weight + bias per row, population variance; `bias` may be empty.
inline std::vector<double> layer_norm(std::span<const float> x, std::int64_t rows, std::int64_t cols,
                                      std::span<const float> weight, std::span<const float> bias, float eps) {
  std::vector<double> y(sz(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = x.data() + r * cols;
    double mean = 0.0;
    for (std::int64_t c = 0; c < cols; ++c) mean += row[c];
    mean /= static_cast<double>(cols);
    double var = 0.0;
    for (std::int64_t c = 0; c < cols; ++c) var += (row[c] - mean) * (row[c] - mean);
    var /= static_cast<double>(cols);
    const double inv = 1.0 / std::sqrt(var + eps);
    for (std::int64_t c = 0; c < cols; ++c) {
      double v = (row[c] - mean) * inv * weight[sz(c)];
      if (!bias.empty()) v += bias[sz(c)];
      y[sz(r * cols + c)] = v;
    }
  }
  return y;
}

// x / sqrt(mean(x^2) + eps) * (weight + offset) per row.
inline std::vector<double> rms_norm(std::span<const float> x, std::int64_t rows, std::int64_t cols,
                                    std::span<const float> weight, float eps, float offset = 0.0f) {
  std::vector<double> y(sz(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = x.data() + r * cols;
    double ss = 0.0;
    for (std::int64_t c = 0; c < cols; ++c) ss += static_cast<double>(row[c]) * row[c];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(cols) + eps);
    for (std::int64_t c = 0; c < cols; ++c) y[sz(r * cols + c)] = row[c] * inv * (weight[sz(c)] + static_cast<double>(offset));
  }
  return y;
}

// Pair i of every head of token t rotates by positions[t] * inv_freq[i], cos and sin scaled by
// attention_factor; the pair is (i, i + rotary_dim/2) for RotateHalf and (2i, 2i+1) for
// Interleaved; elements from rotary_dim on pass through.
inline std::vector<double> rope(std::span<const float> x, std::int64_t tokens, std::int64_t heads,
                                std::int64_t head_dim, std::int64_t rotary_dim, std::span<const std::int32_t> positions,
                                std::span<const float> inv_freq, float attention_factor, RopeLayout layout) {
  std::vector<double> y(x.begin(), x.end());
  const std::int64_t half = rotary_dim / 2;
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t base = (t * heads + h) * head_dim;
      for (std::int64_t i = 0; i < half; ++i) {
        const double angle = positions[sz(t)] * static_cast<double>(inv_freq[sz(i)]);
        const double c = std::cos(angle) * attention_factor, sn = std::sin(angle) * attention_factor;
        const std::int64_t i0 = base + (layout == RopeLayout::Interleaved ? 2 * i : i);
        const std::int64_t i1 = base + (layout == RopeLayout::Interleaved ? 2 * i + 1 : i + half);
        const double x0 = x[sz(i0)], x1 = x[sz(i1)];
        y[sz(i0)] = x0 * c - x1 * sn;
        y[sz(i1)] = x0 * sn + x1 * c;
      }
    }
  }
  return y;
}

// One activation in double: relu, exact gelu x/2 (1 + erf(x / sqrt 2)), tanh gelu
// x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), silu x / (1 + e^-x).
inline double activate(Activation act, double v) {
  switch (act) {
    case Activation::Relu: return std::max(v, 0.0);
    case Activation::Gelu: return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    case Activation::GeluTanh:
      return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
    case Activation::Silu: return v / (1.0 + std::exp(-v));
  }
  return v;
}

inline std::vector<double> activation(Activation act, std::span<const float> x) {
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = activate(act, x[i]);
  return y;
}

// act(gate) * up.
inline std::vector<double> glu(Activation act, std::span<const float> gate, std::span<const float> up) {
  std::vector<double> y(gate.size());
  for (std::size_t i = 0; i < gate.size(); ++i) y[i] = activate(act, gate[i]) * up[i];
  return y;
}

// cap * tanh(x / cap).
inline std::vector<double> softcap(std::span<const float> x, double cap) {
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = cap * std::tanh(x[i] / cap);
  return y;
}

inline std::vector<double> add(std::span<const float> x, std::span<const float> y) {
  std::vector<double> z(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) z[i] = static_cast<double>(x[i]) + y[i];
  return z;
}

// out[i, :] = (accumulate ? out_prior[i, :] : 0) + scale * table[ids[i] + offset, :], for a
// table of `cols` columns given as its fp32 values.
inline std::vector<double> embedding(std::span<const std::int32_t> ids, std::int64_t offset,
                                     std::span<const float> table, std::int64_t cols, bool accumulate,
                                     std::span<const float> out_prior, float scale = 1.0f) {
  std::vector<double> out(ids.size() * sz(cols));
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::int64_t row = ids[i] + offset;
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::size_t o = i * sz(cols) + sz(c);
      out[o] = (accumulate ? static_cast<double>(out_prior[o]) : 0.0) +
               static_cast<double>(scale) * table[sz(row * cols + c)];
    }
  }
  return out;
}

// Softmax of attention scores, max-subtracted.
inline void softmax_in_place(std::vector<double>& p) {
  const double mx = *std::max_element(p.begin(), p.end());
  double sum = 0.0;
  for (double& e : p) sum += e = std::exp(e - mx);
  for (double& e : p) e /= sum;
}

struct PrefillResult {
  std::vector<double> out;       // [T, n_heads * head_dim]
  std::vector<double> col_sums;  // [T * n_kv_heads], layout of AttentionPrefillArgs::col_sums
};

// A scaled score after the shape's soft-cap (none when 0).
inline double capped_score(const AttentionShape& s, double x) {
  return s.softcap == 0.0f ? x : s.softcap * std::tanh(x / s.softcap);
}
// The first key position a query at position i sees under the shape's window.
inline std::int64_t first_key(const AttentionShape& s, std::int64_t i) {
  return s.window > 0 ? std::max<std::int64_t>(0, i - s.window + 1) : 0;
}

// Causal attention within each sequence of a ragged batch, within the shape's window; query
// head h reads kv head h / (n_heads / n_kv_heads).
inline PrefillResult attention_prefill(const AttentionShape& s, std::span<const float> q, std::span<const float> k,
                                       std::span<const float> v, std::span<const std::int64_t> seq_offsets,
                                       std::span<const float> query_weights = {}) {
  const std::int64_t T = seq_offsets.back(), D = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const std::int64_t q_stride = s.n_heads * D, kv_stride = s.n_kv_heads * D;
  PrefillResult r{std::vector<double>(sz(T * q_stride)), std::vector<double>(sz(T * s.n_kv_heads))};
  for (std::size_t b = 0; b + 1 < seq_offsets.size(); ++b) {
    const std::int64_t t0 = seq_offsets[b], n = seq_offsets[b + 1] - t0;
    for (std::int64_t h = 0; h < s.n_heads; ++h) {
      const std::int64_t g = h / group;
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t j0 = first_key(s, i);
        std::vector<double> p(sz(i + 1 - j0));
        for (std::int64_t j = j0; j <= i; ++j) {
          double dot = 0.0;
          for (std::int64_t d = 0; d < D; ++d)
            dot +=
                static_cast<double>(q[sz((t0 + i) * q_stride + h * D + d)]) * k[sz((t0 + j) * kv_stride + g * D + d)];
          p[sz(j - j0)] = capped_score(s, s.scale * dot);
        }
        softmax_in_place(p);
        for (std::int64_t d = 0; d < D; ++d) {
          double acc = 0.0;
          for (std::int64_t j = j0; j <= i; ++j) acc += p[sz(j - j0)] * v[sz((t0 + j) * kv_stride + g * D + d)];
          r.out[sz((t0 + i) * q_stride + h * D + d)] = acc;
        }
        const double w = query_weights.empty() ? 1.0 : query_weights[sz(t0 + i)];
        for (std::int64_t j = j0; j <= i; ++j) r.col_sums[sz(t0 * s.n_kv_heads + g * n + j)] += w * p[sz(j - j0)];
      }
    }
  }
  return r;
}

struct DecodeResult {
  std::vector<double> out;    // [B, n_heads * head_dim]
  std::vector<double> probs;  // [B, n_kv_heads, capacity], layout of AttentionDecodeArgs::probs
};

// One query per sequence against slots [0, lens[b]) of its cache (slot = position: the
// window keeps the last `window`); probs_prior is the prior content of the probs buffer, kept
// in slots >= lens[b]. slot_bias ([B, n_kv_heads, capacity], may be empty) is added to the
// capped scores.
inline DecodeResult attention_decode(const AttentionShape& s, std::span<const float> q, std::span<const float> k_cache,
                                     std::span<const float> v_cache, std::int64_t capacity,
                                     std::span<const std::int64_t> lens, std::span<const float> probs_prior,
                                     std::span<const float> slot_bias = {}) {
  const std::int64_t B = static_cast<std::int64_t>(lens.size()), D = s.head_dim, group = s.n_heads / s.n_kv_heads;
  DecodeResult r{std::vector<double>(sz(B * s.n_heads * D)),
                 std::vector<double>(probs_prior.begin(), probs_prior.end())};
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t n = lens[sz(b)];
    for (std::int64_t g = 0; g < s.n_kv_heads; ++g)
      std::fill_n(r.probs.begin() + (b * s.n_kv_heads + g) * capacity, n, 0.0);
    for (std::int64_t h = 0; h < s.n_heads; ++h) {
      const std::int64_t g = h / group, cache = (b * s.n_kv_heads + g) * capacity * D;
      const std::int64_t j0 = first_key(s, n - 1);
      std::vector<double> p(sz(n - j0));
      for (std::int64_t j = j0; j < n; ++j) {
        double dot = 0.0;
        for (std::int64_t d = 0; d < D; ++d)
          dot += static_cast<double>(q[sz((b * s.n_heads + h) * D + d)]) * k_cache[sz(cache + j * D + d)];
        p[sz(j - j0)] = capped_score(s, s.scale * dot);
        if (!slot_bias.empty()) p[sz(j - j0)] += slot_bias[sz((b * s.n_kv_heads + g) * capacity + j)];
      }
      softmax_in_place(p);
      for (std::int64_t d = 0; d < D; ++d) {
        double acc = 0.0;
        for (std::int64_t j = j0; j < n; ++j) acc += p[sz(j - j0)] * v_cache[sz(cache + j * D + d)];
        r.out[sz((b * s.n_heads + h) * D + d)] = acc;
      }
      for (std::int64_t j = j0; j < n; ++j) r.probs[sz((b * s.n_kv_heads + g) * capacity + j)] += p[sz(j - j0)];
    }
  }
  return r;
}

// kv_similarity on an fp32 cache [B, n_kv_heads, capacity, head_dim]: out_prior with row i's
// slots j < len replaced by the cosine of keys (slot, j) of query i (0 if either is zero).
inline std::vector<double> kv_similarity(std::span<const float> cache, std::int64_t n_kv_heads, std::int64_t head_dim,
                                         std::int64_t capacity, std::span<const KvSimilarityQuery> queries,
                                         std::span<const float> out_prior) {
  std::vector<double> out(out_prior.begin(), out_prior.end());
  for (std::size_t i = 0; i < queries.size(); ++i) {
    const KvSimilarityQuery& q = queries[i];
    const float* head = cache.data() + (q.seq * n_kv_heads + q.head) * capacity * head_dim;
    for (std::int64_t j = 0; j < q.len; ++j) {
      double dot = 0, ns = 0, nr = 0;
      for (std::int64_t d = 0; d < head_dim; ++d) {
        const double x = head[q.slot * head_dim + d], y = head[j * head_dim + d];
        dot += x * y;
        ns += x * x;
        nr += y * y;
      }
      out[sz(static_cast<std::int64_t>(i) * capacity + j)] = ns > 0 && nr > 0 ? dot / std::sqrt(ns * nr) : 0.0;
    }
  }
  return out;
}

// kv_merge on an fp32 cache: row to <- (1 - w) row to + w row from, in order.
inline std::vector<double> kv_merge(std::span<const float> cache, std::int64_t n_kv_heads, std::int64_t head_dim,
                                    std::int64_t capacity, std::span<const KvMerge> merges) {
  std::vector<double> out(cache.begin(), cache.end());
  for (const KvMerge& m : merges) {
    const std::int64_t head = (m.seq * n_kv_heads + m.head) * capacity * head_dim;
    for (std::int64_t d = 0; d < head_dim; ++d) {
      double& to = out[sz(head + m.to * head_dim + d)];
      to = (1.0 - m.weight) * to + static_cast<double>(m.weight) * out[sz(head + m.from * head_dim + d)];
    }
  }
  return out;
}

// The cache after row r of src ([rows, n_kv_heads * head_dim]) went to (seq[r], slot[r]) of
// every kv head; cache layout [B, n_kv_heads, capacity, head_dim].
inline std::vector<double> kv_write(std::span<const float> src, std::span<const float> cache_prior,
                                    std::int64_t n_kv_heads, std::int64_t head_dim, std::int64_t capacity,
                                    std::span<const std::int64_t> seq, std::span<const std::int64_t> slot) {
  std::vector<double> cache(cache_prior.begin(), cache_prior.end());
  for (std::size_t r = 0; r < seq.size(); ++r)
    for (std::int64_t g = 0; g < n_kv_heads; ++g)
      for (std::int64_t d = 0; d < head_dim; ++d)
        cache[sz(((seq[r] * n_kv_heads + g) * capacity + slot[r]) * head_dim + d)] =
            src[r * sz(n_kv_heads * head_dim) + sz(g * head_dim + d)];
  return cache;
}

// kv_write with a slot per (row, kv head), -1 = not stored.
inline std::vector<double> kv_write_per_head(std::span<const float> src, std::span<const float> cache_prior,
                                             std::int64_t n_kv_heads, std::int64_t head_dim, std::int64_t capacity,
                                             std::span<const std::int64_t> seq, std::span<const std::int64_t> head_slot) {
  std::vector<double> cache(cache_prior.begin(), cache_prior.end());
  for (std::size_t r = 0; r < seq.size(); ++r)
    for (std::int64_t g = 0; g < n_kv_heads; ++g) {
      const std::int64_t slot = head_slot[r * sz(n_kv_heads) + sz(g)];
      if (slot < 0) continue;
      for (std::int64_t d = 0; d < head_dim; ++d)
        cache[sz(((seq[r] * n_kv_heads + g) * capacity + slot) * head_dim + d)] =
            src[r * sz(n_kv_heads * head_dim) + sz(g * head_dim + d)];
    }
  return cache;
}

// Tokens of one logits row in the order inverse-CDF sampling walks them (descending
// probability at `temperature`, ties lowest id first), cut to the nucleus: the shortest
// prefix whose probability reaches top_p. `weight` is unnormalised.
struct Candidate {
  std::int32_t id;
  double weight;
};
inline std::vector<Candidate> nucleus(std::span<const float> logits, float temperature, float top_p) {
  const double mx = *std::max_element(logits.begin(), logits.end());
  std::vector<Candidate> c(logits.size());
  double total = 0.0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    c[i] = {static_cast<std::int32_t>(i), std::exp((logits[i] - mx) / temperature)};
    total += c[i].weight;
  }
  std::stable_sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) { return a.weight > b.weight; });
  if (top_p < 1.0f) {
    double mass = 0.0;
    for (std::size_t i = 0; i < c.size(); ++i) {
      mass += c[i].weight / total;
      if (mass >= top_p) {
        c.resize(i + 1);
        break;
      }
    }
  }
  return c;
}

// Sampling probability of every token (zero outside the nucleus).
inline std::vector<double> sampling_distribution(std::span<const float> logits, float temperature, float top_p) {
  const std::vector<Candidate> c = nucleus(logits, temperature, top_p);
  double kept = 0.0;
  for (const Candidate& e : c) kept += e.weight;
  std::vector<double> p(logits.size(), 0.0);
  for (const Candidate& e : c) p[sz(e.id)] = e.weight / kept;
  return p;
}

// The token a row picks given its uniform draw u in [0, 1): greedy (lowest id on ties) at
// temperature <= 0, else the first nucleus token whose cumulative weight exceeds u * total.
inline std::int32_t sample_token(std::span<const float> logits, const SamplingParams& p, double u) {
  if (p.temperature <= 0.0f)
    return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const std::vector<Candidate> c = nucleus(logits, p.temperature, p.top_p);
  double kept = 0.0;
  for (const Candidate& e : c) kept += e.weight;
  double acc = 0.0;
  for (const Candidate& e : c) {
    acc += e.weight;
    if (u * kept < acc) return e.id;
  }
  return c.back().id;
}

}  // namespace flexh2o::kernels::ref
