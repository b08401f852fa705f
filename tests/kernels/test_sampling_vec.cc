// The CPU sampler's vectorised vocabulary passes (kernels/cpu/sampling_vec.h), on every
// instruction set this CPU has, against their scalar reference, and the sampler over a large
// vocabulary against the walk of the whole sorted row with every weight and the normaliser
// computed as the scalar reference does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/sampling_vec.h"
#include "tests/kernels/seeded_test.h"

namespace flexh2o::kernels {
namespace {

constexpr double kUnit = 0x1.0p-53;  // half an ulp of 1: the unit roundoff of a double
constexpr float kMasked = -std::numeric_limits<float>::infinity();

class SamplingVecTest : public SeededTest {
 protected:
  // Logits of one of several shapes: narrow, wide, with masked tokens, with ties.
  std::vector<float> random_logits(std::int64_t n, int shape) {
    std::vector<float> z = random_floats(n, shape == 1 ? -60.0f : -8.0f, shape == 1 ? 30.0f : 8.0f);
    if (shape == 2)
      for (std::int64_t i = random_int(0, 3); i < n; i += random_int(1, 9)) z[static_cast<std::size_t>(i)] = kMasked;
    if (shape == 3)
      for (float& v : z) v = std::round(v);  // many equal logits
    return z;
  }
};

TEST_F(SamplingVecTest, ExpSumIsTheReferencesWithinItsErrorBound) {
  for (const std::int64_t n : {1, 3, 4, 7, 8, 9, 17, 1000, 49157}) {
    for (int shape = 0; shape < 4; ++shape) {
      const std::vector<float> z = random_logits(n, shape);
      const float mx = *std::max_element(z.begin(), z.end());
      if (!(mx > kMasked)) continue;
      // Cold temperatures push many terms below exp(-700), into the reference's own path.
      const double temperature = shape == 1 ? 0.02 * static_cast<double>(random_int(1, 5))
                                            : 0.05 * static_cast<double>(random_int(1, 40));
      const sampling_vec::ExpSum want = sampling_vec::exp_sum_reference(z.data(), n, mx, temperature);
      for (const sampling_vec::Isa isa : sampling_vec::supported_isas()) {
        const sampling_vec::ExpSum got = sampling_vec::exp_sum(isa, z.data(), n, mx, temperature);
        EXPECT_EQ(got.positive, want.positive) << "n " << n << " shape " << shape << " isa " << static_cast<int>(isa);
        // Each vector term within (kExpTermUlps + 2|x|) u of exp(x), the reference's within
        // (1 + |x|) u (std::exp and the division), and either sum of nonnegative terms within
        // (n - 1) u of the exact sum of its terms.
        double spread = 0.0;  // sum of e |x|
        for (const float v : z) {
          const double x = static_cast<double>(v - mx) / temperature;
          if (std::isfinite(x)) spread += std::exp(x) * std::abs(x);
        }
        const double terms = sampling_vec::kExpTermUlps + 1.0 + 2.0 * static_cast<double>(n - 1);
        const double bound = 1.01 * kUnit * (terms * want.total + 3.0 * spread);
        EXPECT_NEAR(got.total, want.total, bound)
            << "n " << n << " shape " << shape << " temperature " << temperature << " isa " << static_cast<int>(isa);
      }
    }
  }
}

TEST_F(SamplingVecTest, MaxAndIndicesInARangeAreThePlainLoops) {
  for (const std::int64_t n : {1, 5, 8, 15, 16, 17, 300, 49157}) {
    for (int shape = 0; shape < 4; ++shape) {
      const std::vector<float> z = random_logits(n, shape);
      for (const sampling_vec::Isa isa : sampling_vec::supported_isas())
        EXPECT_EQ(sampling_vec::max_of(isa, z.data(), n), *std::max_element(z.begin(), z.end())) << "n " << n;
      const auto pick = [&] { return z[static_cast<std::size_t>(random_int(0, n - 1))]; };
      float low = pick(), high = pick();
      if (low > high) std::swap(low, high);
      if (random_int(0, 2) == 0) high = std::numeric_limits<float>::infinity();
      if (random_int(0, 2) == 0) low = kMasked;
      std::vector<std::int32_t> want, got = {-1};
      for (std::int32_t i = 0; i < n; ++i)
        if (z[static_cast<std::size_t>(i)] >= low && z[static_cast<std::size_t>(i)] < high) want.push_back(i);
      for (const sampling_vec::Isa isa : sampling_vec::supported_isas()) {
        sampling_vec::indices_in(isa, z.data(), n, low, high, got);
        EXPECT_EQ(got, want) << "n " << n << " shape " << shape << " [" << low << ", " << high << ") isa "
                             << static_cast<int>(isa);
      }
    }
  }
}

// The old sampler's walk, whole: every weight exp(double(z - mx) / t), the normaliser summed in
// index order, all tokens sorted (descending weight, lowest id on ties), then top_k, top_p of
// that mass, min_p, and the first token whose cumulative weight exceeds u x the kept mass.
// `margin`: how far u x kept lies from the nearest cumulative weight, relative to kept.
std::int32_t whole_row_draw(const std::vector<float>& z, const SamplingParams& p, double u, double& margin) {
  const float mx = *std::max_element(z.begin(), z.end());
  const double t = p.temperature;
  struct Weighted {
    double w;
    std::int32_t id;
  };
  std::vector<Weighted> c;
  double total = 0.0;
  for (std::size_t i = 0; i < z.size(); ++i) {
    const double w = std::exp(static_cast<double>(z[i] - mx) / t);
    total += w;
    if (w > 0.0) c.push_back({w, static_cast<std::int32_t>(i)});
  }
  std::sort(c.begin(), c.end(), [](const Weighted& a, const Weighted& b) { return a.w > b.w || (a.w == b.w && a.id < b.id); });
  const std::size_t all = c.size();
  std::size_t keep = all;
  double mass = total;
  if (p.top_k > 0 && static_cast<std::size_t>(p.top_k) < all) {
    keep = static_cast<std::size_t>(p.top_k);
    mass = 0.0;
    for (std::size_t i = 0; i < keep; ++i) mass += c[i].w;
  }
  margin = 1.0;
  if (p.top_p < 1.0f) {
    double acc = 0.0;
    for (std::size_t i = 0; i < keep; ++i) {
      acc += c[i].w / mass;
      margin = std::min(margin, std::abs(acc - p.top_p));
      if (acc >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  std::size_t i = 1;
  while (i < keep && c[i].w >= p.min_p) ++i;
  keep = i;
  double kept = mass;
  if (keep != all) {
    kept = 0.0;
    for (std::size_t j = 0; j < keep; ++j) kept += c[j].w;
  }
  double acc = 0.0;
  for (std::size_t j = 0; j < keep; ++j) {
    acc += c[j].w;
    margin = std::min(margin, std::abs(u * kept - acc) / kept);
    if (u * kept < acc) return c[j].id;
  }
  return c[keep - 1].id;
}

TEST_F(SamplingVecTest, ALargeVocabularyDrawsAsTheWholeRowWalk) {
  // A SmolLM2-sized vocabulary, every truncation. The sampler's normaliser differs from the
  // walk's only in its last bits (a bound of ~1e-11 relative: ExpSumIsTheReferences...), so a
  // token may differ only where u x kept lies that close to a cumulative weight: such a
  // near-tie is detected and skipped.
  constexpr std::int64_t kVocab = 49152;
  auto be = make_cpu_backend();
  int compared = 0;
  for (int i = 0; i < 48; ++i) {
    std::vector<float> z = random_logits(kVocab, i % 4);
    // A few likely tokens above a long tail, as a language model's logits are.
    for (int k = 0; k < 20; ++k) z[static_cast<std::size_t>(random_int(0, kVocab - 1))] += 10.0f + static_cast<float>(k % 5);
    SamplingParams p;
    p.temperature = 0.05f * static_cast<float>(random_int(4, 30));
    p.top_p = i % 2 ? 0.5f + 0.01f * static_cast<float>(random_int(0, 50)) : 1.0f;
    p.top_k = i % 3 == 0 ? static_cast<std::int32_t>(random_int(1, 100)) : 0;
    p.min_p = i % 4 == 1 ? 0.01f * static_cast<float>(random_int(0, 20)) : 0.0f;
    p.seed = static_cast<std::uint64_t>(random_int(0, 1 << 30));
    p.logprobs = static_cast<std::int32_t>(random_int(0, 20));
    const std::vector<std::uint64_t> stream = {static_cast<std::uint64_t>(i)}, step = {0};
    std::vector<std::int32_t> out(1);
    std::vector<float> chosen(1);
    std::vector<std::vector<TokenLogprob>> top(1);
    be->sample({.logits = z.data(), .batch = 1, .vocab = kVocab, .params = std::span(&p, 1), .streams = stream,
                .steps = step, .out = out, .chosen_logprob = chosen, .top_logprobs = top});
    double margin = 0.0;
    const std::int32_t want = whole_row_draw(z, p, sampling_uniform(p.seed, stream[0], 0), margin);
    // The top alternatives: the largest logits, lowest id first on ties.
    std::vector<std::int32_t> order(kVocab);
    std::iota(order.begin(), order.end(), 0);
    const auto better = [&](std::int32_t a, std::int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); };
    std::partial_sort(order.begin(), order.begin() + p.logprobs, order.end(), better);
    ASSERT_EQ(top[0].size(), static_cast<std::size_t>(p.logprobs));
    for (std::size_t k = 0; k < top[0].size(); ++k) EXPECT_EQ(top[0][k].token, order[k]) << "row " << i << " rank " << k;
    if (margin < 1e-9) continue;
    ++compared;
    EXPECT_EQ(out[0], want) << "row " << i;
  }
  EXPECT_GE(compared, 40);
}

TEST_F(SamplingVecTest, AFlatRowDrawsAsTheWholeRowWalkAtAnyDepth) {
  // A small model's row is flat: thousands of tokens within a few temperatures of the best. The
  // sampler walks a head of the most likely tokens, grown band by band until it holds the draw,
  // the nucleus, the top_k or a token below min_p: draws u from near 0 to near 1 reach every
  // depth of it, down to the whole row.
  constexpr std::int64_t kVocab = 49152;
  auto be = make_cpu_backend();
  int compared = 0;
  for (int i = 0; i < 40; ++i) {
    std::vector<float> z = random_floats(kVocab, -3.0f, 3.0f);
    for (float& v : z) v += static_cast<float>(random_int(-3, 3));  // wider than uniform, a bell's shoulders
    for (int k = 0; k < 5; ++k) z[static_cast<std::size_t>(random_int(0, kVocab - 1))] += 3.0f;
    SamplingParams p;
    p.temperature = 0.05f * static_cast<float>(random_int(8, 30));
    p.top_p = i % 4 == 1 ? 0.5f + 0.01f * static_cast<float>(random_int(0, 50)) : 1.0f;
    p.top_k = i % 5 == 2 ? static_cast<std::int32_t>(random_int(1, 2000)) : 0;
    p.min_p = i % 6 == 3 ? 0.001f * static_cast<float>(random_int(0, 50)) : 0.0f;
    p.seed = static_cast<std::uint64_t>(random_int(0, 1 << 30));
    // Streams whose draws lie at both ends and in between.
    std::vector<std::uint64_t> streams;
    const std::vector<std::pair<double, double>> ranges = {{0.0, 1e-3}, {0.3, 0.7}, {0.9, 0.99}, {0.999, 1.0}};
    for (const auto& [lo, hi] : ranges)
      for (std::uint64_t st = 0;; ++st)
        if (const double u = sampling_uniform(p.seed, st, 0); u >= lo && u < hi) {
          streams.push_back(st);
          break;
        }
    for (const std::uint64_t stream : streams) {
      const std::vector<std::uint64_t> stream_of = {stream}, step = {0};
      std::vector<std::int32_t> out(1);
      be->sample({.logits = z.data(), .batch = 1, .vocab = kVocab, .params = std::span(&p, 1), .streams = stream_of,
                  .steps = step, .out = out});
      double margin = 0.0;
      const std::int32_t want = whole_row_draw(z, p, sampling_uniform(p.seed, stream, 0), margin);
      if (margin < 1e-9) continue;  // a near-tie (ALargeVocabularyDrawsAsTheWholeRowWalk)
      ++compared;
      EXPECT_EQ(out[0], want) << "row " << i << " stream " << stream;
    }
  }
  EXPECT_GE(compared, 150);
}

TEST_F(SamplingVecTest, TopLogprobsKeepTheLowestIdAmongEqualLogits) {
  // Rounded logits over a vocabulary of many blocks: ties everywhere, the k-th among them.
  auto be = make_cpu_backend();
  for (const std::int32_t k : {1, 3, 20, 64, 65, 200}) {
    const std::int64_t vocab = 5000;
    std::vector<float> z = random_logits(vocab, 3);
    SamplingParams p;
    p.logprobs = k;
    const std::vector<std::uint64_t> zero = {0};
    std::vector<std::int32_t> out(1);
    std::vector<std::vector<TokenLogprob>> top(1);
    be->sample({.logits = z.data(), .batch = 1, .vocab = vocab, .params = std::span(&p, 1), .streams = zero,
                .steps = zero, .out = out, .top_logprobs = top});
    std::vector<std::int32_t> order(static_cast<std::size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) { return z[a] > z[b]; });
    ASSERT_EQ(top[0].size(), static_cast<std::size_t>(k));
    for (std::size_t i = 0; i < top[0].size(); ++i) EXPECT_EQ(top[0][i].token, order[i]) << "k " << k << " rank " << i;
    EXPECT_EQ(out[0], order[0]);
  }
}

}  // namespace
}  // namespace flexh2o::kernels
