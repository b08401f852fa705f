// The per-request sampler (kernels/sampling.h) on the CPU backend, the reference every backend
// matches: each logits adjustment checked through the log-probabilities it reports (the
// log-softmax of the final logits) against a plain re-implementation, the truncations through
// draw frequencies, and a row's result independent of the rows beside it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <stdexcept>
#include <vector>

#include "kernels/backend.h"
#include "tests/kernels/reference_ops.h"
#include "tests/kernels/seeded_test.h"

namespace flexh2o::kernels {
namespace {

constexpr float kMasked = -std::numeric_limits<float>::infinity();

// One row to sample: its logits, sampling and history.
struct Row {
  std::vector<float> logits;
  SamplingParams p;
  std::vector<std::int32_t> history;  // prompt + generated
  std::uint64_t generated = 0;        // the last `generated` of history are new tokens
  std::uint64_t stream = 0;
};

struct Sampled {
  std::vector<std::int32_t> tokens;
  std::vector<float> chosen;
  std::vector<std::vector<TokenLogprob>> top;
};

class SamplingTest : public SeededTest {
 protected:
  // `allowed`: the rows' allowed-token masks (SampleArgs::allowed), or none.
  Sampled sample(const std::vector<Row>& rows, std::span<const std::int32_t> eos = {},
                 std::span<const std::uint32_t> allowed = {}) {
    const auto B = rows.size();
    const auto V = rows.front().logits.size();
    std::vector<float> logits;
    std::vector<SamplingParams> params;
    std::vector<std::uint64_t> streams, steps;
    std::vector<std::span<const std::int32_t>> history;
    for (const Row& r : rows) {
      logits.insert(logits.end(), r.logits.begin(), r.logits.end());
      params.push_back(r.p);
      streams.push_back(r.stream);
      steps.push_back(r.generated);
      history.emplace_back(r.history);
    }
    Sampled s{std::vector<std::int32_t>(B, -1), std::vector<float>(B), std::vector<std::vector<TokenLogprob>>(B)};
    be_->sample({.logits = logits.data(),
                 .batch = static_cast<std::int64_t>(B),
                 .vocab = static_cast<std::int64_t>(V),
                 .params = params,
                 .streams = streams,
                 .steps = steps,
                 .history = history,
                 .eos_ids = eos,
                 .allowed = allowed,
                 .out = s.tokens,
                 .chosen_logprob = s.chosen,
                 .top_logprobs = s.top});
    return s;
  }

  Row random_row(std::int64_t vocab) {
    Row r;
    r.logits = random_floats(vocab, -4.0f, 4.0f);
    for (int i = random_int(1, 30); i > 0; --i) r.history.push_back(static_cast<std::int32_t>(random_int(0, vocab - 1)));
    r.generated = static_cast<std::uint64_t>(random_int(0, static_cast<std::int64_t>(r.history.size())));
    r.stream = static_cast<std::uint64_t>(random_int(0, 1 << 30));
    r.p.seed = static_cast<std::uint64_t>(random_int(0, 1 << 30));
    return r;
  }

  // The reported log-probability of every token (logprobs = vocab) of a row, by token id.
  std::vector<double> all_logprobs(Row r, std::span<const std::int32_t> eos = {},
                                   std::span<const std::uint32_t> allowed = {}) {
    r.p.logprobs = static_cast<std::int32_t>(r.logits.size());
    const Sampled s = sample({r}, eos, allowed);
    std::vector<double> lp(r.logits.size(), std::nan(""));
    for (const TokenLogprob& t : s.top[0]) lp[static_cast<std::size_t>(t.token)] = t.logprob;
    return lp;
  }

  // A random allowed-token mask of `vocab` tokens (each allowed with probability `share`, at
  // least one), with every bit past the vocabulary set (the sampler must ignore them).
  std::vector<std::uint32_t> random_mask(std::int64_t vocab, double share) {
    std::vector<std::uint32_t> mask(static_cast<std::size_t>(mask_words(vocab)), ~0u);
    for (std::int64_t i = 0; i < vocab; ++i)
      if (random_int(0, 999) >= share * 1000) mask[static_cast<std::size_t>(i / 32)] &= ~(1u << (i % 32));
    const std::int64_t one = random_int(0, vocab - 1);
    mask[static_cast<std::size_t>(one / 32)] |= 1u << (one % 32);
    return mask;
  }

  std::unique_ptr<Backend> be_ = make_cpu_backend();
};

// log-softmax of z / temperature.
std::vector<double> log_softmax(const std::vector<double>& z, double temperature = 1.0) {
  double mx = -std::numeric_limits<double>::infinity();
  for (const double v : z) mx = std::max(mx, v);
  double total = 0.0;
  for (const double v : z) total += std::exp((v - mx) / temperature);
  std::vector<double> out;
  for (const double v : z) out.push_back((v - mx) / temperature - std::log(total));
  return out;
}

void expect_logprobs(const std::vector<double>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) EXPECT_TRUE(std::isinf(got[i]) && got[i] < 0) << what << ": token " << i << " " << got[i];
    else  // the logits are fp32: a few roundings of the value's size
      EXPECT_NEAR(got[i], want[i], 1e-5 + 4 * 1.2e-7 * std::abs(want[i])) << what << ": token " << i;
  }
}

std::vector<double> as_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

TEST_F(SamplingTest, RepetitionPenaltyIsHfs) {
  // HF: every token of prompt + generated, once: a positive logit divided, a negative multiplied.
  Row r = random_row(64);
  r.p.repetition_penalty = 1.0f + static_cast<float>(random_int(1, 20)) / 10.0f;
  std::vector<double> z = as_double(r.logits);
  for (const std::int32_t t : std::set<std::int32_t>(r.history.begin(), r.history.end())) {
    double& v = z[static_cast<std::size_t>(t)];
    v = v < 0 ? v * r.p.repetition_penalty : v / r.p.repetition_penalty;
  }
  expect_logprobs(all_logprobs(r), log_softmax(z), "repetition");
  const std::int32_t want = static_cast<std::int32_t>(std::max_element(z.begin(), z.end()) - z.begin());
  EXPECT_EQ(sample({r}).tokens[0], want) << "greedy takes the penalised argmax";
}

TEST_F(SamplingTest, PresenceAndFrequencyPenaltiesCountGeneratedTokensOnly) {
  Row r = random_row(64);
  r.generated = std::max<std::uint64_t>(r.generated, 1);
  r.history.insert(r.history.end(), {5, 5, 5});  // a repeated new token
  r.generated += 3;
  r.p.presence_penalty = static_cast<float>(random_int(-20, 20)) / 10.0f;
  r.p.frequency_penalty = static_cast<float>(random_int(-20, 20)) / 10.0f;
  std::map<std::int32_t, int> count;
  for (std::size_t i = r.history.size() - r.generated; i < r.history.size(); ++i) ++count[r.history[i]];
  std::vector<double> z = as_double(r.logits);
  for (const auto& [t, n] : count)
    z[static_cast<std::size_t>(t)] -= r.p.presence_penalty + r.p.frequency_penalty * n;
  expect_logprobs(all_logprobs(r), log_softmax(z), "presence/frequency");
}

TEST_F(SamplingTest, LogitBiasAddsToTheLogit) {
  Row r = random_row(50);
  for (std::int32_t t = 0; t < 50; t += static_cast<std::int32_t>(random_int(1, 9)))
    r.p.logit_bias.push_back({t, static_cast<float>(random_int(-100, 100))});
  std::vector<double> z = as_double(r.logits);
  for (const LogitBias& b : r.p.logit_bias) z[static_cast<std::size_t>(b.token)] += b.bias;
  expect_logprobs(all_logprobs(r), log_softmax(z), "logit_bias");
  // A large bias decides the greedy token.
  Row forced = random_row(50);
  forced.p.logit_bias = {{17, 100.0f}};
  EXPECT_EQ(sample({forced}).tokens[0], 17);
}

TEST_F(SamplingTest, MinTokensMasksStopIdsUntilReached) {
  const std::vector<std::int32_t> eos = {3};
  Row r = random_row(40);
  r.logits[3] = r.logits[9] = 50.0f;  // EOS and a stop id would win
  r.p.stop_token_ids = {9};
  r.p.min_tokens = 4;
  r.generated = 2;
  r.history.resize(std::max<std::size_t>(r.history.size(), 2));
  std::vector<double> z = as_double(r.logits);
  z[3] = z[9] = kMasked;
  expect_logprobs(all_logprobs(r, eos), log_softmax(z), "below min_tokens");
  EXPECT_NE(sample({r}, eos).tokens[0], 3);
  r.p.ignore_eos = true;  // then EOS is no stop id: only stop_token_ids are masked
  z[3] = r.logits[3];
  expect_logprobs(all_logprobs(r, eos), log_softmax(z), "ignore_eos below min_tokens");
  r.p.ignore_eos = false;
  r.history.resize(std::max<std::size_t>(r.history.size(), 4));
  r.generated = 4;  // reached: nothing masked
  expect_logprobs(all_logprobs(r, eos), log_softmax(as_double(r.logits)), "at min_tokens");
}

TEST_F(SamplingTest, LogprobsAreTheLogSoftmaxAtTheTemperature) {
  Row r = random_row(80);
  r.p.temperature = static_cast<float>(random_int(2, 20)) / 10.0f;
  expect_logprobs(all_logprobs(r), log_softmax(as_double(r.logits), r.p.temperature), "temperature");
  // The chosen token's log-probability, and the top alternatives in descending order.
  r.p.logprobs = 5;
  const Sampled s = sample({r});
  const std::vector<double> want = log_softmax(as_double(r.logits), r.p.temperature);
  EXPECT_NEAR(s.chosen[0], want[static_cast<std::size_t>(s.tokens[0])], 1e-5);
  ASSERT_EQ(s.top[0].size(), 5u);
  std::vector<std::int32_t> order(80);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return want[static_cast<std::size_t>(a)] > want[static_cast<std::size_t>(b)]; });
  for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(s.top[0][i].token, order[i]) << "rank " << i;
}

// Draws of one row: `copies` rows of it (streams 0..copies-1) at steps 0..steps-1.
std::map<std::int32_t, double> frequencies(SamplingTest& t, const Row& row, int copies, int steps,
                                           const std::function<Sampled(const std::vector<Row>&)>& sample) {
  std::map<std::int32_t, double> f;
  for (int s = 0; s < steps; ++s) {
    std::vector<Row> rows(static_cast<std::size_t>(copies), row);
    for (int c = 0; c < copies; ++c) {
      rows[static_cast<std::size_t>(c)].stream = static_cast<std::uint64_t>(c);
      rows[static_cast<std::size_t>(c)].history.resize(row.history.size() + static_cast<std::size_t>(s));
      rows[static_cast<std::size_t>(c)].generated = static_cast<std::uint64_t>(s);
    }
    for (const std::int32_t tok : sample(rows).tokens) f[tok] += 1.0 / (copies * steps);
  }
  (void)t;
  return f;
}

// Probabilities at temperature 1 of the `keep` set, renormalised.
std::map<std::int32_t, double> renormalised(const std::vector<float>& logits, const std::set<std::int32_t>& keep) {
  std::map<std::int32_t, double> p;
  double total = 0.0;
  for (const std::int32_t t : keep) total += p[t] = std::exp(static_cast<double>(logits[static_cast<std::size_t>(t)]));
  for (auto& [t, v] : p) v /= total;
  return p;
}

constexpr double kFrequencyTol = 0.02;  // > 5 sigma of a frequency over 20000 draws

void expect_frequencies(const std::map<std::int32_t, double>& got, const std::map<std::int32_t, double>& want) {
  for (const auto& [t, f] : got) EXPECT_TRUE(want.count(t)) << "token " << t << " drawn but outside the kept set";
  for (const auto& [t, p] : want) EXPECT_NEAR(got.count(t) ? got.at(t) : 0.0, p, kFrequencyTol) << "token " << t;
}

TEST_F(SamplingTest, TopKKeepsTheKMostLikely) {
  Row r = random_row(30);
  r.p.temperature = 1.0f;
  r.p.top_k = static_cast<std::int32_t>(random_int(2, 5));
  std::vector<std::int32_t> order(30);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return r.logits[static_cast<std::size_t>(a)] > r.logits[static_cast<std::size_t>(b)]; });
  const std::set<std::int32_t> keep(order.begin(), order.begin() + r.p.top_k);
  expect_frequencies(frequencies(*this, r, 100, 200, [&](const auto& rows) { return sample(rows); }),
                     renormalised(r.logits, keep));
}

TEST_F(SamplingTest, MinPDropsTokensBelowAFractionOfTheBest) {
  Row r = random_row(30);
  r.p.temperature = 1.0f;
  r.p.min_p = 0.2f;
  const float best = *std::max_element(r.logits.begin(), r.logits.end());
  std::set<std::int32_t> keep;
  for (std::int32_t t = 0; t < 30; ++t)
    if (std::exp(r.logits[static_cast<std::size_t>(t)] - best) >= 0.2f) keep.insert(t);
  expect_frequencies(frequencies(*this, r, 100, 200, [&](const auto& rows) { return sample(rows); }),
                     renormalised(r.logits, keep));
}

TEST_F(SamplingTest, TopPAppliesToTheTopKMass) {
  // Probabilities {0.4, 0.3, 0.2, 0.1}: top_k 2 leaves {4/7, 3/7}; top_p 0.5 of that keeps the
  // first alone (4/7 >= 0.5), where over the whole mass it would keep two (0.4 < 0.5).
  Row r;
  r.logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  r.p.temperature = 1.0f;
  r.p.top_k = 2;
  r.p.top_p = 0.5f;
  r.p.seed = static_cast<std::uint64_t>(random_int(0, 1 << 30));
  expect_frequencies(frequencies(*this, r, 50, 20, [&](const auto& rows) { return sample(rows); }), {{0, 1.0}});
}

TEST_F(SamplingTest, NucleusOverALargeVocabularyMatchesTheReference) {
  // The sampler sorts lazily, a chunk at a time; the reference sorts the whole row.
  constexpr std::int64_t kVocab = 20000;
  for (int i = 0; i < 8; ++i) {
    Row r = random_row(kVocab);
    r.p.temperature = static_cast<float>(random_int(3, 15)) / 10.0f;
    r.p.top_p = static_cast<float>(random_int(50, 100)) / 100.0f;
    const double u = sampling_uniform(r.p.seed, r.stream, r.generated);
    EXPECT_EQ(sample({r}).tokens[0], ref::sample_token(r.logits, r.p, u)) << "row " << i;
  }
}

// The draw with every truncation, over the whole sorted row (the sampler walks a head of the
// most likely tokens first and falls back to all of them when an answer lies beyond it).
std::int32_t reference_draw(const std::vector<float>& logits, const SamplingParams& p, double u) {
  std::vector<ref::Candidate> c = ref::nucleus(logits, p.temperature, 1.0f);
  double total = 0.0;
  for (const auto& e : c) total += e.weight;
  std::erase_if(c, [](const ref::Candidate& e) { return e.weight <= 0.0; });
  if (p.top_k > 0 && static_cast<std::size_t>(p.top_k) < c.size()) c.resize(static_cast<std::size_t>(p.top_k));
  double mass = 0.0;
  for (const auto& e : c) mass += e.weight;
  if (p.top_p < 1.0f) {
    double acc = 0.0;
    for (std::size_t i = 0; i < c.size(); ++i)
      if ((acc += c[i].weight / mass) >= p.top_p) {
        c.resize(i + 1);
        break;
      }
  }
  std::size_t keep = 1;
  while (keep < c.size() && c[keep].weight >= p.min_p) ++keep;
  c.resize(keep);
  double kept = 0.0;
  for (const auto& e : c) kept += e.weight;
  double acc = 0.0;
  for (const auto& e : c)
    if (u * kept < (acc += e.weight)) return e.id;
  return c.back().id;
}

TEST_F(SamplingTest, TruncationsReachingPastTheLikelyTokensMatchTheFullWalk) {
  // A cold temperature over a wide range leaves most tokens with a negligible share: top_k of
  // almost all of them, a min_p of almost nothing, or a nucleus of almost all the mass reach
  // past the tokens the sampler walks first.
  constexpr std::int64_t kVocab = 3000;
  for (int i = 0; i < 60; ++i) {
    Row r = random_row(kVocab);
    r.logits = random_floats(kVocab, -20.0f, 20.0f);
    r.p.temperature = 0.5f;
    if (i % 3 == 0) r.p.top_k = kVocab - 1;
    if (i % 3 == 1) r.p.min_p = 1e-30f;
    if (i % 3 == 2) r.p.top_p = 0.999999f;
    for (std::uint64_t step = 0; step < 5; ++step) {
      r.generated = 0;
      r.stream = step + 100 * static_cast<std::uint64_t>(i);
      const double u = sampling_uniform(r.p.seed, r.stream, 0);
      EXPECT_EQ(sample({r}).tokens[0], reference_draw(r.logits, r.p, u)) << "row " << i << " u " << u;
    }
  }
}

TEST_F(SamplingTest, ARowsResultDoesNotDependOnTheRowsBesideIt) {
  // Rows of every kind of setting in one batch give what each gives alone, in any order.
  constexpr std::int64_t kVocab = 200;
  std::vector<Row> rows;
  for (int i = 0; i < 12; ++i) {
    Row r = random_row(kVocab);
    r.p.temperature = i % 3 == 0 ? 0.0f : static_cast<float>(random_int(3, 15)) / 10.0f;
    r.p.top_p = i % 4 == 1 ? 0.8f : 1.0f;
    r.p.top_k = i % 5 == 2 ? 10 : 0;
    r.p.min_p = i % 6 == 3 ? 0.05f : 0.0f;
    r.p.repetition_penalty = i % 2 ? 1.2f : 1.0f;
    r.p.presence_penalty = i % 3 == 1 ? 0.5f : 0.0f;
    r.p.frequency_penalty = i % 4 == 2 ? 0.3f : 0.0f;
    if (i % 5 == 0) r.p.logit_bias = {{7, 2.0f}, {100, -3.0f}};
    r.p.logprobs = static_cast<std::int32_t>(i % 4);
    rows.push_back(r);
  }
  const Sampled batch = sample(rows);
  std::vector<Row> reversed(rows.rbegin(), rows.rend());
  const Sampled back = sample(reversed);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Sampled alone = sample({rows[i]});
    const std::size_t j = rows.size() - 1 - i;
    EXPECT_EQ(batch.tokens[i], alone.tokens[0]) << "row " << i;
    EXPECT_EQ(back.tokens[j], alone.tokens[0]) << "row " << i << " reversed";
    EXPECT_EQ(batch.chosen[i], alone.chosen[0]) << "row " << i;
    ASSERT_EQ(batch.top[i].size(), alone.top[0].size());
    for (std::size_t k = 0; k < alone.top[0].size(); ++k) EXPECT_EQ(batch.top[i][k].token, alone.top[0][k].token);
  }
}

TEST_F(SamplingTest, ARowDrawsAtItsOwnStep) {
  // Two rows of one stream at different new-token indices draw as each would at its index.
  Row r = random_row(300);
  r.p.temperature = 1.0f;
  std::vector<Row> rows(40, r);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    rows[i].history.resize(r.history.size() + i);
    rows[i].generated = i;
  }
  const Sampled s = sample(rows);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const double u = sampling_uniform(r.p.seed, r.stream, i);
    EXPECT_EQ(s.tokens[i], ref::sample_token(r.logits, r.p, u)) << "step " << i;
  }
  EXPECT_GE(std::set<std::int32_t>(s.tokens.begin(), s.tokens.end()).size(), 10u) << "steps should draw independently";
}

TEST_F(SamplingTest, BadSettingsAreErrorsNamingTheField) {
  const auto error = [&](SamplingParams p, bool history = true) -> std::string {
    Row r = random_row(10);
    r.p = p;
    try {
      if (history) sample({r});
      else {
        std::vector<std::int32_t> out(1);
        const std::vector<std::uint64_t> zero = {0};
        be_->sample({.logits = r.logits.data(), .batch = 1, .vocab = 10, .params = std::span(&r.p, 1),
                     .streams = zero, .steps = zero, .out = out});
      }
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error({.logit_bias = {{5, 1.0f}, {2, 1.0f}}}).find("sorted"), std::string::npos);
  EXPECT_NE(error({.logit_bias = {{10, 1.0f}}}).find("logit_bias"), std::string::npos);
  EXPECT_NE(error({.top_p = 0.0f}).find("top_p"), std::string::npos);
  EXPECT_NE(error({.top_k = -1}).find("top_k"), std::string::npos);
  EXPECT_NE(error({.min_p = 1.5f}).find("min_p"), std::string::npos);
  EXPECT_NE(error({.repetition_penalty = 0.0f}).find("repetition_penalty"), std::string::npos);
  EXPECT_NE(error({.stop_token_ids = {11}}).find("stop token id"), std::string::npos);
  EXPECT_NE(error({.repetition_penalty = 1.5f}, false).find("history"), std::string::npos);
}

// The row with the tokens `mask` leaves out at -inf: what a masked row must sample like.
Row masked_by_hand(Row r, std::span<const std::uint32_t> mask) {
  for (std::size_t t = 0; t < r.logits.size(); ++t)
    if (!mask_allows(mask, static_cast<std::int32_t>(t))) r.logits[t] = kMasked;
  return r;
}

TEST_F(SamplingTest, AMaskedRowSamplesAsItsLogitsWithTheOthersAtMinusInfinity) {
  // Every sampling mode (greedy, temperature, top-k, top-p, min_p, penalties, seeds): tokens and
  // log-probabilities equal those of the row whose left-out logits are -inf, and are allowed.
  constexpr std::int64_t kVocab = 203;  // not a multiple of 32: the last word is partial
  for (int i = 0; i < 40; ++i) {
    Row r = random_row(kVocab);
    r.p.temperature = i % 4 == 0 ? 0.0f : static_cast<float>(random_int(3, 15)) / 10.0f;
    r.p.top_p = i % 3 == 1 ? 0.7f : 1.0f;
    r.p.top_k = i % 5 == 2 ? 5 : 0;
    r.p.min_p = i % 7 == 3 ? 0.1f : 0.0f;
    r.p.repetition_penalty = i % 2 ? 1.3f : 1.0f;
    r.p.presence_penalty = i % 3 == 2 ? 0.5f : 0.0f;
    r.p.logprobs = 3;
    const std::vector<std::uint32_t> mask = random_mask(kVocab, i % 2 ? 0.05 : 0.5);
    const Row by_hand = masked_by_hand(r, mask);
    for (std::uint64_t stream = 0; stream < 5; ++stream) {
      r.stream = stream;
      Row want_row = by_hand;
      want_row.stream = stream;
      const Sampled got = sample({r}, {}, mask), want = sample({want_row});
      EXPECT_TRUE(mask_allows(mask, got.tokens[0])) << "row " << i << " drew a masked token";
      EXPECT_EQ(got.tokens[0], want.tokens[0]) << "row " << i;
      EXPECT_EQ(got.chosen[0], want.chosen[0]) << "row " << i;
      ASSERT_EQ(got.top[0].size(), want.top[0].size());
      for (std::size_t k = 0; k < want.top[0].size(); ++k) {
        EXPECT_EQ(got.top[0][k].token, want.top[0][k].token);
        EXPECT_EQ(got.top[0][k].logprob, want.top[0][k].logprob);
      }
    }
    // Log-probabilities are over the allowed tokens (vLLM's), the others -inf.
    if (r.p.repetition_penalty != 1.0f || r.p.presence_penalty != 0.0f) continue;  // compared above
    expect_logprobs(all_logprobs(r, {}, mask), log_softmax(as_double(by_hand.logits), r.p.greedy() ? 1.0 : r.p.temperature),
                    "masked");
  }
}

TEST_F(SamplingTest, AMaskOfEveryTokenIsNoMaskAndOneOfOneTokenForcesIt) {
  constexpr std::int64_t kVocab = 70;
  Row r = random_row(kVocab);
  r.p.temperature = 1.0f;
  r.p.logprobs = 2;
  const std::vector<std::uint32_t> all(static_cast<std::size_t>(mask_words(kVocab)), ~0u);
  const Sampled plain = sample({r}), masked = sample({r}, {}, all);
  EXPECT_EQ(masked.tokens[0], plain.tokens[0]);
  EXPECT_EQ(masked.chosen[0], plain.chosen[0]);
  const auto only = static_cast<std::int32_t>(random_int(0, kVocab - 1));
  std::vector<std::uint32_t> one(static_cast<std::size_t>(mask_words(kVocab)), 0u);
  one[static_cast<std::size_t>(only / 32)] = 1u << (only % 32);
  for (const float temperature : {0.0f, 0.7f, 1.5f}) {
    r.p.temperature = temperature;
    for (std::uint64_t stream = 0; stream < 10; ++stream) {
      r.stream = stream;
      const Sampled s = sample({r}, {}, one);
      EXPECT_EQ(s.tokens[0], only);
      EXPECT_EQ(s.chosen[0], 0.0f) << "the only allowed token has probability 1";
      ASSERT_EQ(s.top[0].size(), 2u);
      EXPECT_EQ(s.top[0][0].token, only);
      EXPECT_TRUE(std::isinf(s.top[0][1].logprob) && s.top[0][1].logprob < 0) << "a masked alternative is -inf";
    }
  }
}

TEST_F(SamplingTest, AMaskAllowingNoTokenOrOfTheWrongSizeIsAnError) {
  constexpr std::int64_t kVocab = 40;
  Row r = random_row(kVocab);
  std::vector<std::uint32_t> none(static_cast<std::size_t>(mask_words(kVocab)), 0u);
  none.back() = ~0u << (kVocab % 32);  // bits past the vocabulary do not count
  std::vector<Row> rows = {r, r};
  std::vector<std::uint32_t> two(2 * none.size(), ~0u);
  std::copy(none.begin(), none.end(), two.begin() + static_cast<std::ptrdiff_t>(none.size()));
  try {
    sample(rows, {}, two);
    ADD_FAILURE() << "a mask allowing no token sampled";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("mask of row 1 allows no token"), std::string::npos) << e.what();
  }
  try {
    sample(rows, {}, none);
    ADD_FAILURE() << "a mask of one row for two sampled";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("allowed-token mask"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace flexh2o::kernels
