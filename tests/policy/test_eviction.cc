// KV eviction policies: spec parsing, budgets, and every policy's prefill and decode choices
// against brute-force references written from docs/kv-eviction.md ("Definitions") (the references keep
// the full attention history per original position and choose by sorting).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <numbers>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "policy/eviction/kv_policy.h"
#include "policy/eviction/kv_spec.h"

namespace flexh2o::policy {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string parse_error(const std::string& text) {
  try {
    parse_kv_spec(text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

// ---------------------------------------------------------------- spec parsing

TEST(KvSpec, ParsesBudgetsAndParameters) {
  const KvSpec full = parse_kv_spec("full");
  EXPECT_EQ(full.name, "full");
  EXPECT_FALSE(full.fraction);
  EXPECT_FALSE(full.tokens);

  const KvSpec f = parse_kv_spec("h2o:0.2");
  EXPECT_EQ(f.name, "h2o");
  EXPECT_EQ(f.text, "h2o:0.2");
  ASSERT_TRUE(f.fraction);
  EXPECT_DOUBLE_EQ(*f.fraction, 0.2);
  EXPECT_FALSE(f.tokens);

  const KvSpec t = parse_kv_spec("h2o:128");
  ASSERT_TRUE(t.tokens);
  EXPECT_EQ(*t.tokens, 128);
  EXPECT_FALSE(t.fraction);
  EXPECT_TRUE(parse_kv_spec("local:1.0").fraction);  // a decimal point makes a fraction
  EXPECT_EQ(*parse_kv_spec("local:1").tokens, 1);

  const KvSpec hr = parse_kv_spec("h2o:heavy=0.1,recent=0.1");
  EXPECT_FALSE(hr.fraction);
  EXPECT_DOUBLE_EQ(hr.param("heavy"), 0.1);
  EXPECT_DOUBLE_EQ(hr.param("recent"), 0.1);
  const KvSpec ht = parse_kv_spec("h2o:heavy=64, recent=32");
  EXPECT_DOUBLE_EQ(ht.param("heavy"), 64);
  EXPECT_DOUBLE_EQ(ht.param("recent"), 32);

  EXPECT_DOUBLE_EQ(parse_kv_spec("streaming:0.2").param("sink"), 4);
  EXPECT_DOUBLE_EQ(parse_kv_spec("streaming:0.2,sink=2").param("sink"), 2);
  const KvSpec sh = parse_kv_spec("scissorhands:0.2,history=100");
  EXPECT_DOUBLE_EQ(sh.param("history"), 100);
  EXPECT_DOUBLE_EQ(sh.param("recent"), 10);
  EXPECT_DOUBLE_EQ(sh.param("drop"), 1);
  EXPECT_DOUBLE_EQ(sh.param("sink"), 0);  // the paper's rule
  EXPECT_DOUBLE_EQ(parse_kv_spec("scissorhands:0.2,sink=1").param("sink"), 1);
  EXPECT_DOUBLE_EQ(parse_kv_spec("scissorhands:0.2,drop=0.25").param("drop"), 0.25);
  const KvSpec py = parse_kv_spec("pyramid:0.2,r=0.8");
  EXPECT_DOUBLE_EQ(py.param("r"), 0.8);
  EXPECT_DOUBLE_EQ(py.param("sink"), 4);
  EXPECT_DOUBLE_EQ(py.param("recent"), 0.2);
  EXPECT_DOUBLE_EQ(py.param("floor"), 64);
  const KvSpec sk = parse_kv_spec("snapkv:0.2,window=16,kernel=7");
  EXPECT_DOUBLE_EQ(sk.param("window"), 16);
  EXPECT_DOUBLE_EQ(sk.param("kernel"), 7);
  EXPECT_DOUBLE_EQ(parse_kv_spec("snapkv:256").param("kernel"), 5);
  EXPECT_EQ(parse_kv_spec("tova:0.2").name, "tova");
  const KvSpec fx = parse_kv_spec("flex:0.2");
  EXPECT_DOUBLE_EQ(fx.param("decay"), 0.92);
  EXPECT_DOUBLE_EQ(fx.param("value"), 1.5);
  EXPECT_DOUBLE_EQ(fx.param("recent"), 0.15);
  EXPECT_DOUBLE_EQ(fx.param("sink"), 1);
  const KvSpec fy = parse_kv_spec("flex:64,decay=0.5,value=0,recent=0,sink=4");
  EXPECT_EQ(*fy.tokens, 64);
  EXPECT_DOUBLE_EQ(fy.param("decay"), 0.5);
  EXPECT_DOUBLE_EQ(fy.param("value"), 0);
  EXPECT_DOUBLE_EQ(fy.param("recent"), 0);
  EXPECT_DOUBLE_EQ(fy.param("sink"), 4);
  EXPECT_EQ(parse_kv_spec("  H2O:0.5 ").name, "h2o");
  EXPECT_EQ(parse_kv_spec("  H2O:0.5 ").text, "H2O:0.5");
  EXPECT_THROW(f.param("nope"), std::out_of_range);
}

TEST(KvSpec, BadSpecsNameTheTextAndWhatIsValid) {
  EXPECT_THAT(parse_error("foo:0.2"), HasSubstr("kv policy 'foo:0.2'"));
  EXPECT_THAT(parse_error("foo:0.2"), HasSubstr("valid: full, local, streaming, h2o, tova, scissorhands, pyramid, snapkv, flex"));
  EXPECT_THAT(parse_error("h2o"), HasSubstr("kv policy 'h2o': needs a budget"));
  EXPECT_THAT(parse_error("tova"), HasSubstr("tova:0.2"));
  EXPECT_THAT(parse_error("h2o:"), HasSubstr("nothing after ':'"));
  EXPECT_THAT(parse_error("h2o:0"), HasSubstr("at least 1"));
  EXPECT_THAT(parse_error("h2o:1.5"), HasSubstr("outside (0, 1]"));
  EXPECT_THAT(parse_error("h2o:0.0"), HasSubstr("outside (0, 1]"));
  EXPECT_THAT(parse_error("h2o:-0.1"), HasSubstr("outside (0, 1]"));
  EXPECT_THAT(parse_error("h2o:abc"), HasSubstr("'abc' is not a number"));
  EXPECT_THAT(parse_error("h2o:nan"), HasSubstr("not a number"));
  EXPECT_THAT(parse_error("h2o:inf"), HasSubstr("not a number"));
  EXPECT_THAT(parse_error("h2o:0x10"), HasSubstr("not a number"));
  EXPECT_THAT(parse_error("h2o:0.2,0.3"), HasSubstr("must be key=value"));
  EXPECT_THAT(parse_error("h2o:0.2,,"), HasSubstr("empty item"));
  EXPECT_THAT(parse_error("h2o:0.2,sink=4"), HasSubstr("unknown parameter 'sink'; valid for h2o: heavy, recent"));
  EXPECT_THAT(parse_error("local:0.2,sink=4"), HasSubstr("unknown parameter 'sink'; valid for local: decode"));
  EXPECT_THAT(parse_error("full:decode=0"), HasSubstr("full takes no named parameters"));
  EXPECT_THAT(parse_error("tova:0.2,decode=2"), HasSubstr("decode=2 must be a whole number in [0, 1]"));
  EXPECT_THAT(parse_error("h2o:heavy=0.1"), HasSubstr("both heavy= and recent="));
  EXPECT_THAT(parse_error("h2o:0.2,heavy=0.1,recent=0.1"), HasSubstr("not both"));
  EXPECT_THAT(parse_error("h2o:heavy=1.5,recent=0.1"), HasSubstr("heavy=1.5 must be a fraction below 1"));
  EXPECT_THAT(parse_error("h2o:heavy=0.1,recent=0"), HasSubstr("recent= must be positive"));
  EXPECT_THAT(parse_error("h2o:heavy=0.1,heavy=0.1"), HasSubstr("given twice"));
  EXPECT_THAT(parse_error("full:0.2"), HasSubstr("full keeps every token"));
  EXPECT_THAT(parse_error("snapkv:0.2,kernel=4"), HasSubstr("kernel=4 must be an odd whole number"));
  EXPECT_THAT(parse_error("tova:0.2,pool=5,ahead=3"), HasSubstr("ahead= must be at most pool / 2"));
  EXPECT_THAT(parse_error("tova:0.2,ahead=1"), HasSubstr("ahead= must be at most pool / 2"));
  EXPECT_THAT(parse_error("snapkv:0.2,window=0"), HasSubstr("window=0 must be a whole number in [1, "));
  EXPECT_THAT(parse_error("scissorhands:0.2,history=100000"), HasSubstr("history=100000 must be a whole number in [1, 65536]"));
  EXPECT_THAT(parse_error("scissorhands:0.2,history=2.5"), HasSubstr("history=2.5 must be a whole number"));
  EXPECT_THAT(parse_error("scissorhands:0.2,drop=0"), HasSubstr("drop= must be positive"));
  EXPECT_THAT(parse_error("streaming:0.2,sink=x"), HasSubstr("sink='x' is not a number"));
  EXPECT_THAT(parse_error("flex:0.2,decay=1.5"), HasSubstr("decay=1.5 must be in [0, 1]"));
  EXPECT_THAT(parse_error("flex:0.2,value=5"), HasSubstr("value=5 must be in [0, 4]"));
  EXPECT_THAT(parse_error("flex:0.2,recent=-0.1"), HasSubstr("recent=-0.1 must be in [0, 1]"));
  EXPECT_THAT(parse_error("flex:0.2,sink=1.5"), HasSubstr("sink=1.5 must be a whole number"));
  EXPECT_THAT(parse_error("flex"), HasSubstr("needs a budget"));
  EXPECT_THAT(parse_error("pyramid:0.2,r=0"), HasSubstr("r=0 must be a fraction in (0, 1]"));
  EXPECT_THAT(parse_error(""), HasSubstr("empty"));
  EXPECT_THAT(parse_error("   "), HasSubstr("empty"));
}

TEST(KvSpec, ListsSplitOnCommasButKeepParameters) {
  const auto specs = parse_kv_specs("full,local:0.2,h2o:heavy=0.1,recent=0.1,tova:0.2, snapkv:0.3,window=8");
  ASSERT_EQ(specs.size(), 5u);
  EXPECT_EQ(specs[0].text, "full");
  EXPECT_EQ(specs[1].text, "local:0.2");
  EXPECT_EQ(specs[2].text, "h2o:heavy=0.1,recent=0.1");
  EXPECT_DOUBLE_EQ(specs[2].param("recent"), 0.1);
  EXPECT_EQ(specs[3].text, "tova:0.2");
  EXPECT_EQ(specs[4].text, "snapkv:0.3,window=8");
  EXPECT_DOUBLE_EQ(specs[4].param("window"), 8);
  EXPECT_EQ(parse_kv_specs("h2o:0.2").size(), 1u);

  auto list_error = [](const std::string& text) -> std::string {
    try {
      parse_kv_specs(text);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_THAT(list_error("heavy=0.1,h2o:0.2"), HasSubstr("parameter without a policy"));
  EXPECT_THAT(list_error("full,,h2o:0.2"), HasSubstr("empty entry"));
  EXPECT_THAT(list_error("full,bogus:1"), HasSubstr("kv policy 'bogus:1'"));
  EXPECT_THAT(list_error(""), HasSubstr("empty entry"));
}

// ---------------------------------------------------------------- budgets

TEST(KvBudget, FractionsTokensAndTheFloorOfEight) {
  EXPECT_EQ(budget_tokens(parse_kv_spec("h2o:0.2"), 1000), 200);
  EXPECT_EQ(budget_tokens(parse_kv_spec("h2o:0.2"), 512), 102);  // round(102.4)
  EXPECT_EQ(budget_tokens(parse_kv_spec("h2o:0.25"), 50), 13);   // round(12.5) away from zero
  EXPECT_EQ(budget_tokens(parse_kv_spec("h2o:0.2"), 20), 8);     // max(8, 4)
  EXPECT_EQ(budget_tokens(parse_kv_spec("h2o:0.2"), 5), 5);      // never more than n
  EXPECT_EQ(budget_tokens(parse_kv_spec("h2o:0.2"), 0), 0);
  EXPECT_EQ(budget_tokens(parse_kv_spec("local:1.0"), 77), 77);
  EXPECT_EQ(budget_tokens(parse_kv_spec("h2o:128"), 1000), 128);
  EXPECT_EQ(budget_tokens(parse_kv_spec("h2o:128"), 100), 100);
  EXPECT_EQ(budget_tokens(parse_kv_spec("local:3"), 100), 3);  // token budgets have no floor
  EXPECT_EQ(budget_tokens(parse_kv_spec("full"), 321), 321);
  EXPECT_EQ(budget_tokens(parse_kv_spec("h2o:heavy=0.1,recent=0.1"), 1000), 200);
  EXPECT_EQ(budget_tokens(parse_kv_spec("h2o:heavy=0.1,recent=0.1"), 30), 8);
  EXPECT_EQ(budget_tokens(parse_kv_spec("h2o:heavy=64,recent=32"), 1000), 96);
  EXPECT_EQ(budget_tokens(parse_kv_spec("h2o:heavy=64,recent=32"), 50), 50);
  EXPECT_EQ(budget_tokens(parse_kv_spec("h2o:heavy=0.05,recent=16"), 1000), 66);
  EXPECT_THROW(budget_tokens(parse_kv_spec("h2o:0.2"), -1), std::invalid_argument);

  for (const char* text : {"full", "local:0.3", "streaming:0.3", "h2o:0.3", "tova:0.3", "scissorhands:0.3", "snapkv:0.3"}) {
    const auto p = make_kv_policy(parse_kv_spec(text), 4);
    for (std::int64_t n : {0, 1, 7, 8, 9, 100, 1234})
      for (std::int64_t l = 0; l < 4; ++l) EXPECT_EQ(p->budget(l, n), budget_tokens(p->spec(), n)) << text << " " << n;
    EXPECT_THROW(p->budget(4, 10), std::out_of_range);
    EXPECT_THROW(p->budget(-1, 10), std::out_of_range);
  }
  EXPECT_THROW(make_kv_policy(parse_kv_spec("h2o:0.2"), 0), std::invalid_argument);
  EXPECT_EQ(kv_slot_capacity(100), 101);
}

// PyramidInfer: layer l keeps s_l = (1-r)(cos(pi l/L)+1)/2 + r of layer l-1, floor 64.
std::int64_t ref_pyramid_budget(std::int64_t b0, std::int64_t layer, std::int64_t n_layers, double r, std::int64_t floor) {
  double kept = static_cast<double>(b0);
  for (std::int64_t l = 1; l <= layer; ++l)
    kept *= (1 - r) * (std::cos(std::numbers::pi * static_cast<double>(l) / static_cast<double>(n_layers)) + 1) / 2 + r;
  return std::max<std::int64_t>(std::llround(kept), std::min(floor, b0));
}

TEST(KvBudget, DecodeZeroLeavesRoomForTheNewTokensAtPrefill) {
  const auto evicting = make_kv_policy(parse_kv_spec("tova:0.1"), 4);
  EXPECT_TRUE(evicting->evicts_while_decoding());
  EXPECT_EQ(evicting->prefill_budget(300, 32), 300);
  const auto at_prefill = make_kv_policy(parse_kv_spec("tova:0.1,decode=0"), 4);
  EXPECT_FALSE(at_prefill->evicts_while_decoding());
  EXPECT_EQ(at_prefill->prefill_budget(300, 32), 268);
  EXPECT_EQ(at_prefill->prefill_budget(30, 32), 8);  // the new tokens outgrow it: decode evicts again
  EXPECT_EQ(at_prefill->prefill_budget(5, 32), 5);
  EXPECT_EQ(at_prefill->prefill_budget(40, 0), 40);
}

TEST(KvSpec, LayerwiseIsForPoliciesThatRankByAttention) {
  EXPECT_FALSE(make_kv_policy(parse_kv_spec("tova:0.1"), 4)->scores_per_layer());
  EXPECT_TRUE(make_kv_policy(parse_kv_spec("tova:0.1,layerwise=1"), 4)->scores_per_layer());
  EXPECT_THROW(parse_kv_spec("local:0.1,layerwise=1"), std::invalid_argument);
  EXPECT_THROW(parse_kv_spec("flex:0.1,layerwise=1"), std::invalid_argument);
}

TEST(KvBudget, PyramidShrinksWithDepthDownToTheFloor) {
  for (std::int64_t L : {1, 2, 12, 32, 96}) {
    const auto p = make_kv_policy(parse_kv_spec("pyramid:0.5"), L);
    for (std::int64_t n : {10, 100, 200, 1000, 4096}) {
      const std::int64_t b0 = budget_tokens(p->spec(), n);
      std::int64_t prev = b0;
      for (std::int64_t l = 0; l < L; ++l) {
        const std::int64_t b = p->budget(l, n);
        EXPECT_EQ(b, ref_pyramid_budget(b0, l, L, 0.9, 64)) << L << " " << n << " " << l;
        EXPECT_LE(b, prev);
        EXPECT_GE(b, std::min<std::int64_t>(64, b0));
        prev = b;
      }
      EXPECT_EQ(p->budget(0, n), b0);
    }
  }
  // 32 layers, 4096 tokens at 0.5: the deepest layer keeps about 0.95^32 of layer 0.
  const auto p = make_kv_policy(parse_kv_spec("pyramid:0.5"), 32);
  EXPECT_EQ(p->budget(0, 4096), 2048);
  EXPECT_LT(p->budget(31, 4096), 2048 * 0.25);
  EXPECT_GT(p->budget(31, 4096), 2048 * 0.15);
  // Budgets below the floor do not shrink.
  EXPECT_EQ(p->budget(31, 200), 64);  // B0 = 100 would shrink to ~19
  EXPECT_EQ(p->budget(0, 200), 100);
  EXPECT_EQ(make_kv_policy(parse_kv_spec("pyramid:40"), 32)->budget(31, 1000), 40);
  const auto q = make_kv_policy(parse_kv_spec("pyramid:0.5,r=0.5,floor=16"), 8);
  EXPECT_EQ(q->budget(7, 1000), ref_pyramid_budget(500, 7, 8, 0.5, 16));
}

// ---------------------------------------------------------------- prefill

// Brute-force top-k: sort all candidates by (score desc, position desc) and take the first k.
void ref_top(std::vector<std::int64_t> cand, std::int64_t k, const std::vector<double>& score,
             std::vector<std::int64_t>& keep) {
  std::sort(cand.begin(), cand.end(), [&](std::int64_t a, std::int64_t b) {
    if (score[a] != score[b]) return score[a] > score[b];
    return a > b;
  });
  for (std::int64_t i = 0; i < k && i < static_cast<std::int64_t>(cand.size()); ++i) keep.push_back(cand[i]);
}

std::vector<std::int64_t> iota(std::int64_t lo, std::int64_t hi) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = lo; i < hi; ++i) v.push_back(i);
  return v;
}

// A causal attention matrix: row i is a softmax over keys 0..i of random logits; `peaky`
// makes a few keys heavy hitters.
std::vector<std::vector<float>> random_attention(std::int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> g(0, 2);
  std::vector<double> bias(n);
  for (auto& b : bias) b = g(rng);
  std::vector<std::vector<float>> p(n, std::vector<float>(n, 0.0f));
  for (std::int64_t i = 0; i < n; ++i) {
    double z = 0;
    std::vector<double> e(i + 1);
    for (std::int64_t j = 0; j <= i; ++j) z += e[j] = std::exp(bias[j] + g(rng) * 0.5);
    for (std::int64_t j = 0; j <= i; ++j) p[i][j] = static_cast<float>(e[j] / z);
  }
  return p;
}

// What the kernel reports: col[j] = sum_i w[i] p(i, j), i ascending, in fp32.
std::vector<float> weighted_col_sums(const std::vector<std::vector<float>>& p, const std::vector<float>& w) {
  const std::size_t n = p.size();
  std::vector<float> col(n, 0.0f);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = j; i < n; ++i) col[j] += w[i] * p[i][j];
  return col;
}

// h2o's recent window for budget B: floor(B/2) (at least the current token), or the spec's
// split: recent tokens as given; heavy tokens as given and recent the rest; two fractions in
// their proportion.
std::int64_t ref_h2o_recent(const KvSpec& spec, std::int64_t B) {
  if (!spec.params.count("heavy")) return std::max<std::int64_t>(1, B / 2);
  const double h = spec.param("heavy"), r = spec.param("recent");
  if (r >= 1) return std::min(B, static_cast<std::int64_t>(r));
  if (h == 0 || h >= 1) return std::max<std::int64_t>(1, B - std::min(B, static_cast<std::int64_t>(h)));
  return std::clamp<std::int64_t>(std::llround(static_cast<double>(B) * r / (h + r)), 1, B);
}

// flex's recent window: round(recent * B), at least the current token.
std::int64_t ref_flex_recent(const KvSpec& spec, std::int64_t B) {
  return std::clamp<std::int64_t>(std::llround(spec.param("recent") * static_cast<double>(B)), 1, B);
}

// The reference of each policy's prefill, from its definition in docs/kv-eviction.md. Scores come
// straight from the attention matrix when one is given (checks the query-weight contract);
// otherwise from `sums` (random, tie-heavy).
struct PrefillRef {
  std::string name;
  KvSpec spec;
  std::vector<std::int64_t> keep(std::int64_t n, std::int64_t B, const std::vector<std::vector<float>>* attn,
                                 const std::vector<float>& sums, const std::vector<float>& norms = {}) const {
    std::vector<std::int64_t> keep;
    if (B >= n) return iota(0, n);
    // Column score of key j over query rows [first, n) with weight(i).
    auto column = [&](std::int64_t first, auto weight) {
      std::vector<double> s(n, 0.0);
      for (std::int64_t j = 0; j < n; ++j) {
        if (!attn) {
          s[j] = sums[j];
          continue;
        }
        float acc = 0;
        for (std::int64_t i = std::max(first, j); i < n; ++i) acc += weight(i) * (*attn)[i][j];
        s[j] = acc;
      }
      return s;
    };
    auto one = [](std::int64_t) { return 1.0f; };
    if (name == "local") {
      keep = iota(n - B, n);
    } else if (name == "streaming") {
      const std::int64_t s = std::min<std::int64_t>(4, B - 1);
      keep = iota(0, s);
      for (std::int64_t i = n - (B - s); i < n; ++i) keep.push_back(i);
    } else if (name == "h2o") {
      const std::int64_t r = ref_h2o_recent(spec, B);  // floor(B/2) incl. the newest, or the split
      keep = iota(n - r, n);
      ref_top(iota(0, n - r), B - r, column(0, one), keep);
    } else if (name == "tova") {
      // The last query's attention, max-pooled over pool / 2 neighbours each side (ties: its own).
      const std::vector<double> own = column(n - 1, one);
      const auto half = static_cast<std::int64_t>(spec.param("pool")) / 2;
      const auto ahead = static_cast<std::int64_t>(spec.param("ahead"));  // the window moved to after a peak
      std::vector<double> pooled(own.size());
      for (std::int64_t j = 0; j < n; ++j) {
        double most = 0;
        for (std::int64_t i = j - half - ahead; i <= j + half - ahead; ++i)
          if (i >= 0 && i < n) most = std::max(most, static_cast<double>(static_cast<float>(own[i])));
        pooled[j] = half > 0 ? most + 1e-6 * static_cast<float>(own[j]) : own[j];
      }
      ref_top(iota(0, n), B, pooled, keep);
    } else if (name == "scissorhands") {
      const std::int64_t r = std::min<std::int64_t>(static_cast<std::int64_t>(spec.param("recent")), B);
      const std::int64_t s = std::clamp<std::int64_t>(static_cast<std::int64_t>(spec.param("sink")), 0, B - r);
      const std::int64_t h = static_cast<std::int64_t>(spec.param("history"));
      keep = iota(0, s);
      for (std::int64_t i = n - r; i < n; ++i) keep.push_back(i);
      ref_top(iota(s, n - r), B - r - s, column(std::max<std::int64_t>(0, n - h), one), keep);
    } else if (name == "snapkv") {
      const std::int64_t w = std::min(static_cast<std::int64_t>(spec.param("window")), n);
      const std::int64_t k = static_cast<std::int64_t>(spec.param("kernel"));
      const std::int64_t win = std::min(w, B);
      const auto raw = column(n - w, one);  // the observation window's attention
      const std::int64_t prefix = n - win;
      std::vector<double> pooled(n, 0.0);
      for (std::int64_t j = 0; j < prefix; ++j) {
        double acc = 0;
        for (std::int64_t d = -k / 2; d <= k / 2; ++d)
          if (j + d >= 0 && j + d < prefix) acc += raw[j + d];  // zero padding, counted
        pooled[j] = acc / static_cast<double>(k);
      }
      keep = iota(prefix, n);
      ref_top(iota(0, prefix), B - win, pooled, keep);
    } else if (name == "pyramid") {
      const std::int64_t obs = std::clamp<std::int64_t>(std::llround(0.2 * static_cast<double>(n)), 1, n);
      const auto observer_weight = [&](std::int64_t i) {
        const std::int64_t k = i - (n - obs);
        return obs > 1 ? 1.0f + 0.2f * static_cast<float>(k) / static_cast<float>(obs - 1) : 1.0f;
      };
      const auto score = column(n - obs, observer_weight);
      const std::int64_t s = std::min<std::int64_t>(4, B);
      const std::int64_t r = std::min(obs, B - s);
      keep = iota(0, s);
      for (std::int64_t i = n - r; i < n; ++i) keep.push_back(i);
      ref_top(iota(s, n - r), B - s - r, score, keep);
    } else if (name == "flex") {
      // Rank older tokens by the decayed column sum (weights decay^(n-1-i), an fp32 product)
      // times |v|^value; keep the sinks and the recent window.
      const float decay = static_cast<float>(spec.param("decay")), value = static_cast<float>(spec.param("value"));
      std::vector<float> weight(n);
      float f = 1.0f;
      for (std::int64_t i = n - 1; i >= 0; --i, f *= decay) weight[i] = f;
      const auto col = column(0, [&](std::int64_t i) { return weight[i]; });
      std::vector<double> key(n);
      for (std::int64_t j = 0; j < n; ++j)
        key[j] = value == 0 ? static_cast<float>(col[j]) : static_cast<float>(col[j]) * std::pow(norms[j], value);
      const std::int64_t r = ref_flex_recent(spec, B);
      const std::int64_t s = std::clamp<std::int64_t>(static_cast<std::int64_t>(spec.param("sink")), 0, B - r);
      keep = iota(0, s);
      for (std::int64_t i = n - r; i < n; ++i) keep.push_back(i);
      ref_top(iota(s, n - r), B - r - s, key, keep);
    } else if (name == "full") {
      keep = iota(0, n);
    }
    std::sort(keep.begin(), keep.end());
    return keep;
  }
};

const std::vector<std::string> kAllPolicies = {"full", "local:0.2", "streaming:0.2", "h2o:0.2",
                                               "tova:0.2", "tova:0.2,pool=5", "tova:0.2,pool=7,ahead=2", "scissorhands:0.2,history=16,recent=3",
                                               "scissorhands:0.2,history=16,recent=2,sink=2",
                                               "snapkv:0.2,window=6,kernel=3", "pyramid:0.2",
                                               "flex:0.2,sink=2", "flex:0.2,value=0"};

// Value-vector norms for policies that use them (flex): positive, some equal.
std::vector<float> random_norms(std::int64_t n, std::mt19937_64& rng) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = rng() % 3 == 0 ? 1.0f : std::uniform_real_distribution<float>(0.1f, 3.0f)(rng);
  return v;
}

TEST(KvPrefill, QueryWeightsSayWhichRowsTheKernelSums) {
  const auto w = [](const std::string& text, std::int64_t n) {
    return make_kv_policy(parse_kv_spec(text), 2)->prefill_query_weights(1, n);
  };
  EXPECT_THAT(w("h2o:0.2", 4), ElementsAre(1, 1, 1, 1));
  EXPECT_THAT(w("local:0.2", 3), ElementsAre(1, 1, 1));
  EXPECT_THAT(w("tova:0.2", 4), ElementsAre(0, 0, 0, 1));
  EXPECT_THAT(w("snapkv:0.2,window=2", 5), ElementsAre(0, 0, 0, 1, 1));
  EXPECT_THAT(w("snapkv:0.2,window=8", 3), ElementsAre(1, 1, 1));
  EXPECT_THAT(w("scissorhands:0.2,history=3", 5), ElementsAre(0, 0, 1, 1, 1));
  EXPECT_THAT(w("flex:0.2,decay=0.5", 4), ElementsAre(0.125, 0.25, 0.5, 1));  // decayed towards older rows
  EXPECT_THAT(w("flex:0.2,decay=1", 3), ElementsAre(1, 1, 1));
  const auto py = w("pyramid:0.2", 20);  // 4 observers: 1.0, 1.0667, 1.1333, 1.2
  for (int i = 0; i < 16; ++i) EXPECT_EQ(py[i], 0.0f);
  EXPECT_FLOAT_EQ(py[16], 1.0f);
  EXPECT_FLOAT_EQ(py[17], 1.0f + 0.2f / 3);
  EXPECT_FLOAT_EQ(py[19], 1.2f);
  EXPECT_THAT(w("pyramid:0.2", 2), ElementsAre(0, 1));
  EXPECT_TRUE(w("h2o:0.2", 0).empty());
  const auto full = make_kv_policy(parse_kv_spec("full"), 1);
  EXPECT_FALSE(full->uses_prefill_scores());
  EXPECT_FALSE(full->uses_decode_probs());
  EXPECT_FALSE(make_kv_policy(parse_kv_spec("streaming:8"), 1)->uses_decode_probs());
  EXPECT_TRUE(make_kv_policy(parse_kv_spec("h2o:8"), 1)->uses_decode_probs());
}

TEST(KvPrefill, EveryPolicyMatchesItsBruteForceReference) {
  std::mt19937_64 rng(1234);
  for (const std::string& text : kAllPolicies) {
    const KvSpec spec = parse_kv_spec(text);
    const auto pol = make_kv_policy(spec, 1);
    const PrefillRef ref{spec.name, spec};
    for (int c = 0; c < 120; ++c) {
      const std::int64_t n = std::uniform_int_distribution<std::int64_t>(0, 70)(rng);
      std::int64_t B = std::uniform_int_distribution<std::int64_t>(1, 80)(rng);
      if (spec.is_full()) B = std::max<std::int64_t>(n, 1);
      const bool from_matrix = c % 2 == 0;
      std::vector<std::vector<float>> attn;
      std::vector<float> sums(n);
      if (from_matrix) {
        attn = random_attention(n, rng);
        sums = weighted_col_sums(attn, pol->prefill_query_weights(0, n));
      } else {  // small integers: many exact ties
        for (auto& s : sums) s = static_cast<float>(std::uniform_int_distribution<int>(0, 3)(rng));
      }
      const auto norms = random_norms(n, rng);
      KvHeadState st = pol->make_state(kv_slot_capacity(B));
      pol->on_prefill(0, n, sums, B, st, norms);
      const auto want = ref.keep(n, B, from_matrix ? &attn : nullptr, sums, norms);
      ASSERT_EQ(st.kept_positions(), want) << text << " case " << c << " n=" << n << " B=" << B;
      // Slots 0..kept-1 hold the kept positions ascending, with their initial scores.
      ASSERT_EQ(st.size(), static_cast<std::int64_t>(want.size()));
      for (std::size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(st.position(static_cast<std::int64_t>(i)), want[i]);
        const bool seeded = spec.name == "h2o" || spec.name == "tova" || spec.name == "snapkv" || spec.name == "pyramid";
        const float decay = spec.name == "flex" ? static_cast<float>(spec.param("decay")) : 0.0f;
        const float score = seeded ? sums[want[i]] : spec.name == "flex" ? (1 - decay) * sums[want[i]] : 0.0f;
        ASSERT_EQ(st.score(static_cast<std::int64_t>(i)), score) << text;
        const bool has_norms = spec.name == "flex" && spec.param("value") != 0;
        const float weight = has_norms ? std::pow(norms[want[i]], static_cast<float>(spec.param("value"))) : 0.0f;
        ASSERT_EQ(st.value_weight(static_cast<std::int64_t>(i)), weight) << text;
      }
      EXPECT_EQ(st.free_slot(), st.size() < st.capacity() ? st.size() : -1);
      EXPECT_EQ(st.last_position(), n - 1);
    }
  }
}

TEST(KvPrefill, PyramidLayersKeepTheirOwnShrinkingBudget) {
  std::mt19937_64 rng(77);
  const std::int64_t L = 16;
  for (const char* text : {"pyramid:0.6", "pyramid:0.9,floor=8", "pyramid:200,r=0.7,floor=20"}) {
    const auto pol = make_kv_policy(parse_kv_spec(text), L);
    const PrefillRef ref{"pyramid", pol->spec()};
    for (std::int64_t n : {30, 120, 300}) {
      const auto attn = random_attention(n, rng);
      std::int64_t prev = n;
      for (std::int64_t l = 0; l < L; ++l) {
        const std::int64_t B = pol->budget(l, n);
        const auto sums = weighted_col_sums(attn, pol->prefill_query_weights(l, n));
        KvHeadState st = pol->make_state(kv_slot_capacity(B));
        pol->on_prefill(l, n, sums, st);  // the layer's own budget
        EXPECT_EQ(st.size(), std::min(n, B));
        EXPECT_LE(st.size(), prev);
        prev = st.size();
        ASSERT_EQ(st.kept_positions(), ref.keep(n, B, &attn, sums)) << text << " n=" << n << " layer " << l;
      }
    }
  }
}

TEST(KvPrefill, RejectsBadSizes) {
  const auto pol = make_kv_policy(parse_kv_spec("h2o:4"), 1);
  std::vector<float> sums(10, 1.0f);
  KvHeadState small = pol->make_state(3);
  EXPECT_THROW(pol->on_prefill(0, 10, sums, 4, small), std::invalid_argument);  // 4 kept > 3 slots
  KvHeadState st = pol->make_state(5);
  EXPECT_THROW(pol->on_prefill(0, 10, std::span<const float>(sums).first(9), 4, st), std::invalid_argument);
  EXPECT_THROW(pol->on_prefill(0, 10, sums, 0, st), std::invalid_argument);
  EXPECT_THROW(pol->on_prefill(1, 10, sums, 4, st), std::out_of_range);
  KvHeadState empty;
  EXPECT_THROW(pol->on_prefill(0, 10, sums, 4, empty), std::invalid_argument);
  EXPECT_THROW(pol->make_state(0), std::invalid_argument);
  // Policies that need no scores accept empty column sums.
  const auto local = make_kv_policy(parse_kv_spec("local:4"), 1);
  KvHeadState ls = local->make_state(5);
  local->on_prefill(0, 10, {}, 4, ls);
  EXPECT_EQ(ls.kept_positions(), (std::vector<std::int64_t>{6, 7, 8, 9}));
  const auto full = make_kv_policy(parse_kv_spec("full"), 1);
  KvHeadState fs = full->make_state(11);
  full->on_prefill(0, 10, {}, fs);
  EXPECT_EQ(fs.size(), 10);
  EXPECT_THROW(full->on_prefill(0, 10, {}, 5, fs), std::logic_error);
}

// ---------------------------------------------------------------- decode

// Brute-force decode reference. It remembers, per original position, the prefill score and
// every probability the token received (and for scissorhands whether it was below the step's
// uniform share, of the non-sink tokens when sink > 0), and chooses victims from those
// histories by sorting.
class DecodeRef {
 public:
  explicit DecodeRef(const KvSpec& spec) : spec_(spec), name_(spec.name) {}

  void prefill(const std::vector<std::int64_t>& kept, const std::vector<float>& sums) {
    for (std::int64_t p : kept) {
      held_.insert(p);
      ensure(p);
      const bool seeded = name_ == "h2o" || name_ == "snapkv" || name_ == "pyramid";
      init_[p] = seeded ? sums[p] : name_ == "flex" ? (1 - static_cast<float>(spec_.param("decay"))) * sums[p] : 0.0f;
      entry_[p] = 0;
    }
  }
  // flex: the norm of position p's value vector.
  void set_norm(std::int64_t p, float v) {
    ensure(p);
    norm_[p] = v;
  }

  // One step under budget B: token `pos` enters; prob_of[p] for every held p (incl. pos).
  // Returns the victims.
  std::vector<std::int64_t> step(std::int64_t pos, const std::map<std::int64_t, float>& prob_of, std::int64_t B) {
    held_.insert(pos);
    ensure(pos);
    init_[pos] = 0.0f;
    entry_[pos] = step_;
    // scissorhands' sinks: the `sink` oldest held tokens, left out of the share.
    const std::int64_t held = static_cast<std::int64_t>(held_.size());
    const std::int64_t n_sinks =
        name_ == "scissorhands" ? std::min<std::int64_t>(static_cast<std::int64_t>(spec_.param("sink")), held) : 0;
    std::set<std::int64_t> sinks(held_.begin(), std::next(held_.begin(), n_sinks));
    double total = 0, sink_mass = 0;
    for (const auto& [p, q] : prob_of) {
      total += q;
      if (sinks.count(p)) sink_mass += q;
    }
    const double share = n_sinks < held ? (total - sink_mass) / static_cast<double>(held - n_sinks)
                                        : total / static_cast<double>(held);
    for (const auto& [p, q] : prob_of) {
      received_[p].push_back(q);
      below_[p].push_back(static_cast<double>(q) < share);
    }
    std::vector<std::int64_t> victims;
    while (static_cast<std::int64_t>(held_.size()) > B) {
      const auto some = choose(B);
      if (some.empty()) {
        ADD_FAILURE() << "reference found no victim";
        break;
      }
      for (std::int64_t v : some) {
        held_.erase(v);
        victims.push_back(v);
      }
    }
    ++step_;
    return victims;
  }

  std::vector<std::int64_t> held() const { return {held_.begin(), held_.end()}; }

 private:
  void ensure(std::int64_t p) {
    if (static_cast<std::int64_t>(init_.size()) <= p) {
      init_.resize(p + 1);
      received_.resize(p + 1);
      below_.resize(p + 1);
      entry_.resize(p + 1);
      norm_.resize(p + 1);
    }
  }
  // Accumulated attention, recomputed from the whole history in step order (fp32).
  float accumulated(std::int64_t p) const {
    float s = init_[p];
    for (float q : received_[p]) s += q;
    return s;
  }
  // flex: the decayed peak, s <- max(decay * s, p) over the history in step order (fp32),
  // times |v|^value.
  float flex_key(std::int64_t p) const {
    const float decay = static_cast<float>(spec_.param("decay")), value = static_cast<float>(spec_.param("value"));
    float s = init_[p];
    for (float q : received_[p]) s = std::max(decay * s, q);
    return value == 0 ? s : s * std::pow(norm_[p], value);
  }
  // Steps within the last `history` (and since the token entered) it was below the share.
  std::int64_t unimportant(std::int64_t p, std::int64_t history) const {
    const auto& b = below_[p];
    std::int64_t count = 0;
    const std::int64_t first = std::max<std::int64_t>(entry_[p], step_ - history + 1);
    for (std::int64_t s = first; s <= step_; ++s) count += b[s - entry_[p]] ? 1 : 0;
    return count;
  }
  std::vector<std::int64_t> choose(std::int64_t B) const {
    const std::vector<std::int64_t> h(held_.begin(), held_.end());  // ascending positions
    const auto N = static_cast<std::int64_t>(h.size());
    auto lowest_by = [&](std::int64_t lo, std::int64_t hi, auto score) {  // candidates h[lo, hi)
      std::vector<std::int64_t> c(h.begin() + lo, h.begin() + hi);
      std::sort(c.begin(), c.end(), [&](std::int64_t a, std::int64_t b) {
        if (score(a) != score(b)) return score(a) < score(b);
        return a < b;
      });
      return std::vector<std::int64_t>{c.front()};
    };
    if (name_ == "local") return {h[0]};
    if (name_ == "streaming") return {h[std::min<std::int64_t>(4, B - 1)]};  // oldest non-sink
    if (name_ == "tova") {
      return lowest_by(0, N, [&](std::int64_t p) { return received_[p].back(); });
    }
    if (name_ == "h2o" || name_ == "snapkv" || name_ == "pyramid") {
      const std::int64_t r = name_ == "h2o" ? ref_h2o_recent(spec_, B) : std::max<std::int64_t>(1, B / 2);
      const std::int64_t s = name_ == "pyramid" ? std::min<std::int64_t>(4, B - r) : 0;
      return lowest_by(s, N - r, [&](std::int64_t p) { return accumulated(p); });
    }
    if (name_ == "flex") {
      const std::int64_t r = ref_flex_recent(spec_, B);
      const std::int64_t s = std::clamp<std::int64_t>(static_cast<std::int64_t>(spec_.param("sink")), 0, B - r);
      return lowest_by(s, N - r, [&](std::int64_t p) { return flex_key(p); });
    }
    if (name_ == "scissorhands") {
      const std::int64_t r = std::min<std::int64_t>(static_cast<std::int64_t>(spec_.param("recent")), B);
      const std::int64_t hist = static_cast<std::int64_t>(spec_.param("history"));
      const double d = spec_.param("drop");
      const std::int64_t drop = d < 1 ? std::max<std::int64_t>(1, std::llround(d * static_cast<double>(B)))
                                      : static_cast<std::int64_t>(d);
      const std::int64_t s = std::clamp<std::int64_t>(static_cast<std::int64_t>(spec_.param("sink")), 0, B - r);
      std::vector<std::int64_t> c(h.begin() + std::min(s, N - r), h.begin() + (N - r));
      std::sort(c.begin(), c.end(), [&](std::int64_t a, std::int64_t b) {
        const auto ua = unimportant(a, hist), ub = unimportant(b, hist);
        if (ua != ub) return ua > ub;
        return a < b;
      });
      const std::int64_t m = std::min<std::int64_t>(std::max(drop, N - B), static_cast<std::int64_t>(c.size()));
      return {c.begin(), c.begin() + m};
    }
    ADD_FAILURE() << "no reference for " << name_;
    return {};
  }

  KvSpec spec_;
  std::string name_;
  std::int64_t step_ = 0;
  std::set<std::int64_t> held_;
  std::vector<float> init_;
  std::vector<std::vector<float>> received_;
  std::vector<std::vector<bool>> below_;
  std::vector<std::int64_t> entry_;
  std::vector<float> norm_;
};

// Random probabilities over the slots attention covers (`occ`) that sum to exactly `group`
// (the number of query heads per kv head): multiples of 1/denom, skewed so that some tokens
// are heavy. A coarse denominator makes exact ties common. Other slots get NaN, which the
// policy must ignore.
void random_probs(const std::vector<std::int64_t>& occ, std::int64_t group, std::int64_t denom, std::mt19937_64& rng,
                  std::vector<float>& probs) {
  std::uniform_real_distribution<double> u(0, 1);
  std::fill(probs.begin(), probs.end(), std::numeric_limits<float>::quiet_NaN());
  std::vector<double> w(occ.size());
  double z = 0;
  for (auto& x : w) z += x = std::pow(u(rng), 3.0) + 1e-9;
  const std::int64_t units = group * denom;
  std::vector<std::int64_t> k(occ.size());
  std::int64_t used = 0;
  for (std::size_t i = 0; i < occ.size(); ++i) used += k[i] = static_cast<std::int64_t>(w[i] / z * static_cast<double>(units));
  for (; used < units; ++used) ++k[std::uniform_int_distribution<std::size_t>(0, occ.size() - 1)(rng)];
  for (std::size_t i = 0; i < occ.size(); ++i)
    probs[occ[i]] = static_cast<float>(static_cast<double>(k[i]) / static_cast<double>(denom));
}

struct DecodeCase {
  std::int64_t budget = 1;
  std::int64_t prompt = 0;
  std::int64_t steps = 0;
  std::int64_t group = 1;        // query heads per kv head (the probabilities sum to it)
  std::int64_t denom = 4;        // probabilities are multiples of 1/denom
  bool use_prefill = false;
  std::int64_t start = 0;        // first position when there is no prefill
  bool vary_budget = false;      // each step's budget drawn from [1, budget]
};

// Drives one (layer, sequence, kv head) like the engine does and checks it against DecodeRef
// after every step: the kept positions, the budget, the freed slots and slot contiguity.
void run_decode_case(const KvPolicy& pol, const DecodeCase& c, std::mt19937_64& rng, const std::string& label) {
  const std::int64_t Bmax = c.budget;
  KvHeadState st = pol.make_state(kv_slot_capacity(Bmax));
  DecodeRef ref(pol.spec());
  std::vector<std::int64_t> slot_pos(kv_slot_capacity(Bmax), -1);  // the engine's view of its rows
  std::int64_t next = c.start;
  if (c.use_prefill) {
    const auto attn = random_attention(c.prompt, rng);
    const auto sums = weighted_col_sums(attn, pol.prefill_query_weights(0, c.prompt));
    const auto norms = random_norms(c.prompt, rng);
    pol.on_prefill(0, c.prompt, sums, Bmax, st, norms);
    const auto want = PrefillRef{pol.spec().name, pol.spec()}.keep(c.prompt, Bmax, &attn, sums, norms);
    ASSERT_EQ(st.kept_positions(), want) << label;
    for (std::int64_t p = 0; p < c.prompt; ++p) ref.set_norm(p, norms[p]);
    ref.prefill(want, sums);
    for (std::size_t i = 0; i < want.size(); ++i) slot_pos[i] = want[i];
    next = c.prompt;
  }
  std::vector<float> probs(st.capacity());
  std::vector<std::int64_t> evict;
  std::vector<KvSlotMove> moves;
  for (std::int64_t t = 0; t < c.steps; ++t, ++next) {
    const std::int64_t B = c.vary_budget ? std::uniform_int_distribution<std::int64_t>(1, Bmax)(rng) : Bmax;
    // The kernel contract: the held slots plus the new token's slot are exactly [0, size]
    // (attention runs over slots [0, len) with len = size + 1).
    const std::int64_t slot = st.free_slot();
    ASSERT_GE(slot, 0) << label;
    ASSERT_LE(slot, st.size()) << label << " step " << t;
    for (std::int64_t s = 0; s < st.capacity(); ++s) ASSERT_EQ(st.occupied(s) || s == slot, s <= st.size()) << label;
    slot_pos[slot] = next;
    std::vector<std::int64_t> occ;
    for (std::int64_t s = 0; s <= st.size(); ++s) occ.push_back(s);
    random_probs(occ, c.group, c.denom, rng, probs);
    std::map<std::int64_t, float> prob_of;
    for (std::int64_t s : occ) prob_of[slot_pos[s]] = probs[s];

    const float norm = random_norms(1, rng)[0];
    ref.set_norm(next, norm);
    pol.on_decode_step(st, slot, next, probs, B, evict, norm);
    const auto victims = ref.step(next, prob_of, B);

    std::vector<std::int64_t> evicted_pos;
    for (std::int64_t s : evict) {
      ASSERT_GE(slot_pos[s], 0) << label;
      ASSERT_FALSE(st.occupied(s)) << label;
      evicted_pos.push_back(slot_pos[s]);
      slot_pos[s] = -1;
    }
    std::sort(evicted_pos.begin(), evicted_pos.end());
    std::vector<std::int64_t> want_victims = victims;
    std::sort(want_victims.begin(), want_victims.end());
    ASSERT_EQ(evicted_pos, want_victims) << label << " step " << t << " pos " << next << " B " << B;
    ASSERT_EQ(st.kept_positions(), ref.held()) << label << " step " << t;
    ASSERT_LE(st.size(), B) << label;
    if (pol.spec().name != "scissorhands" && !c.vary_budget) {
      // Exactly one eviction per step once full.
      ASSERT_EQ(st.size(), std::min(B, next - c.start + 1)) << label;
    }
    if (evict.size() > 1) {  // holes: close them like the engine would
      moves.clear();
      st.compact(moves);
      for (const auto& m : moves) {
        ASSERT_GE(slot_pos[m.from], 0);
        ASSERT_EQ(slot_pos[m.to], -1);
        slot_pos[m.to] = slot_pos[m.from];
        slot_pos[m.from] = -1;
      }
    }
    for (std::int64_t s = 0; s < st.capacity(); ++s) ASSERT_EQ(st.position(s), slot_pos[s]) << label;
    ASSERT_EQ(st.steps(), t + 1);
  }
}

void run_policy_cases(const std::string& text, std::uint64_t seed, int cases) {
  const KvSpec spec = parse_kv_spec(text);
  const auto pol = make_kv_policy(spec, 1);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < cases; ++i) {
    DecodeCase c;
    c.budget = std::uniform_int_distribution<std::int64_t>(1, 24)(rng);
    c.use_prefill = i % 3 != 0;  // a third start empty: the evaluation protocol, token by token
    c.prompt = c.use_prefill ? std::uniform_int_distribution<std::int64_t>(0, 40)(rng) : 0;
    c.start = !c.use_prefill && i % 2 == 1 ? 1000 : 0;  // positions need not start at 0
    c.vary_budget = i % 7 == 3;                          // the budget may change between steps
    c.steps = std::uniform_int_distribution<std::int64_t>(0, 90)(rng);
    c.group = std::array<std::int64_t, 3>{1, 2, 4}[i % 3];
    c.denom = i % 2 == 0 ? 4 : (1 << 16);  // coarse: ties everywhere; fine: rare ties
    const std::string label = text + " case " + std::to_string(i) + " B=" + std::to_string(c.budget) +
                              " prompt=" + std::to_string(c.prompt) + " steps=" + std::to_string(c.steps) +
                              (c.vary_budget ? " varying" : "");
    run_decode_case(*pol, c, rng, label);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(KvDecode, LocalMatchesReference) { run_policy_cases("local:0.2", 11, 150); }
TEST(KvDecode, StreamingMatchesReference) { run_policy_cases("streaming:0.2", 12, 150); }
TEST(KvDecode, H2oMatchesReference) { run_policy_cases("h2o:0.2", 13, 200); }
TEST(KvDecode, H2oExplicitSplitMatchesReference) {
  run_policy_cases("h2o:heavy=5,recent=3", 14, 80);             // recent fixed, heavy the rest
  run_policy_cases("h2o:heavy=0.15,recent=0.05", 23, 80);       // fractions: split 3:1
  run_policy_cases("h2o:heavy=4,recent=0.1", 24, 60);           // heavy fixed, recent the rest
  run_policy_cases("h2o:heavy=0,recent=0.1", 25, 40);           // no heavy hitters: local
}
TEST(KvDecode, TovaMatchesReference) { run_policy_cases("tova:0.2", 15, 200); }
TEST(KvDecode, ScissorhandsMatchesReference) {
  run_policy_cases("scissorhands:0.2,history=7,recent=3", 16, 150);
  run_policy_cases("scissorhands:0.2,history=70,recent=2", 17, 100);  // two words of bits per slot
  run_policy_cases("scissorhands:0.2", 18, 60);                       // defaults: 400 steps, recent 10
}
TEST(KvDecode, ScissorhandsWithSinksMatchesReference) {
  // The sinks are never dropped and the share is that of the other tokens.
  run_policy_cases("scissorhands:0.2,history=7,recent=1,sink=1", 30, 150);
  run_policy_cases("scissorhands:0.2,history=40,recent=3,sink=3", 31, 120);
  run_policy_cases("scissorhands:0.2,history=9,recent=2,sink=2,drop=3", 32, 100);
}
TEST(KvDecode, ScissorhandsDroppingSeveralAtOnceMatchesReference) {
  run_policy_cases("scissorhands:0.2,history=9,recent=2,drop=3", 19, 120);
  run_policy_cases("scissorhands:0.2,history=30,recent=1,drop=0.25", 20, 120);
}
TEST(KvDecode, SnapKvMatchesReference) { run_policy_cases("snapkv:0.2,window=5,kernel=3", 21, 150); }
TEST(KvDecode, PyramidMatchesReference) { run_policy_cases("pyramid:0.2", 22, 150); }
TEST(KvDecode, FlexMatchesReference) {
  run_policy_cases("flex:0.2", 26, 200);                                // defaults
  run_policy_cases("flex:0.2,decay=0.5,value=2,recent=0.5,sink=2", 27, 150);
  run_policy_cases("flex:0.2,decay=1,value=0,recent=0", 28, 100);      // plain peak, no norms
  run_policy_cases("flex:0.2,decay=0,recent=0.2,sink=1", 29, 100);     // this step's attention only
}

TEST(KvDecode, ABudgetCoveringTheSequenceKeepsEverything) {
  std::mt19937_64 rng(5);
  for (const std::string& text : kAllPolicies) {
    const auto pol = make_kv_policy(parse_kv_spec(text), 1);
    for (int i = 0; i < 20; ++i) {
      const std::int64_t prompt = std::uniform_int_distribution<std::int64_t>(0, 30)(rng);
      const std::int64_t steps = std::uniform_int_distribution<std::int64_t>(0, 30)(rng);
      const std::int64_t B = prompt + steps + std::uniform_int_distribution<std::int64_t>(0, 3)(rng);
      if (B == 0) continue;
      KvHeadState st = pol->make_state(kv_slot_capacity(B));
      const auto attn = random_attention(prompt, rng);
      pol->on_prefill(0, prompt, weighted_col_sums(attn, pol->prefill_query_weights(0, prompt)), B, st,
                      random_norms(prompt, rng));
      std::vector<float> probs(st.capacity(), 0.0f);
      std::vector<std::int64_t> evict;
      for (std::int64_t t = 0; t < steps; ++t) {
        for (std::int64_t s = 0; s <= st.size(); ++s) probs[s] = 1.0f / static_cast<float>(st.size() + 1);
        pol->on_decode_step(st, st.free_slot(), prompt + t, probs, B, evict, 1.0f);
        ASSERT_TRUE(evict.empty()) << text;
      }
      EXPECT_EQ(st.kept_positions(), iota(0, prompt + steps)) << text;
    }
  }
}

TEST(KvDecode, HeavyHittersSurviveAndRecentTokensStay) {
  // A hand-checked h2o run: B = 4 (recent 2, heavy 2), token 1 receives most attention.
  const auto pol = make_kv_policy(parse_kv_spec("h2o:4"), 1);
  KvHeadState st = pol->make_state(kv_slot_capacity(4));
  std::vector<float> probs(5);
  std::vector<std::int64_t> evict;
  for (std::int64_t pos = 0; pos < 10; ++pos) {
    const std::int64_t slot = st.free_slot();
    for (std::int64_t s = 0; s < 5; ++s) probs[s] = 0.0f;
    for (std::int64_t s = 0; s < 5; ++s)
      if (st.occupied(s) || s == slot) probs[s] = (s < st.capacity() && st.occupied(s) && st.position(s) == 1) ? 0.7f : 0.05f;
    pol->on_decode_step(st, slot, pos, probs, 4, evict);
  }
  // Kept: heavy hitter 1, the next-best accumulated (0, the oldest survivor with most steps),
  // and the two newest tokens.
  EXPECT_EQ(st.kept_positions(), (std::vector<std::int64_t>{0, 1, 8, 9}));
}

TEST(KvDecode, FlexKeepsRecentPeaksWeightedByValueNorm) {
  // flex:4,decay=0.5,value=1,recent=0.25: one protected recent token, three scored. Token 1 is
  // rarely attended but carries a value vector 4x longer than the others.
  const auto pol = make_kv_policy(parse_kv_spec("flex:4,decay=0.5,value=1,recent=0.25"), 1);
  KvHeadState st = pol->make_state(kv_slot_capacity(4));
  const std::vector<float> norm = {1, 4, 1, 1, 1, 1};
  // probs[step][position] (the tokens held at that step).
  const std::vector<std::vector<float>> attn = {
      {1.0f}, {0.5f, 0.5f}, {0.2f, 0.1f, 0.7f}, {0.1f, 0.1f, 0.1f, 0.7f}, {0.6f, 0.1f, 0.1f, 0.1f, 0.1f}};
  std::vector<float> probs(5);
  std::vector<std::int64_t> evict;
  auto step = [&](std::int64_t pos, const std::map<std::int64_t, float>& p) {
    const std::int64_t slot = st.free_slot();
    std::fill(probs.begin(), probs.end(), 0.0f);
    for (std::int64_t s = 0; s < st.capacity(); ++s) {
      const std::int64_t held = s == slot ? pos : (st.occupied(s) ? st.position(s) : -1);
      if (held >= 0) probs[s] = p.at(held);
    }
    pol->on_decode_step(st, slot, pos, probs, 4, evict, norm[pos]);
  };
  for (std::int64_t pos = 0; pos < 5; ++pos) {
    std::map<std::int64_t, float> p;
    for (std::int64_t j = 0; j <= pos; ++j) p[j] = attn[pos][j];
    step(pos, p);
  }
  // Decayed peaks after step 4: 0.6, 0.1, 0.175, 0.35, 0.1; keys (x |v|): 0.6, 0.4, 0.175, 0.35
  // and token 4 protected. h2o's sums (2.4, 0.8, 0.9, 0.8) would drop token 1; flex drops 2.
  ASSERT_EQ(evict.size(), 1u);
  EXPECT_EQ(st.kept_positions(), (std::vector<std::int64_t>{0, 1, 3, 4}));
  for (std::int64_t s = 0; s < st.capacity(); ++s) {
    if (!st.occupied(s)) continue;
    const std::int64_t p = st.position(s);
    EXPECT_EQ(st.value_weight(s), norm[p]);  // value=1: the norm itself
    const float want[] = {0.6f, 0.1f, 0.0f, 0.5f * 0.7f, 0.1f};
    EXPECT_FLOAT_EQ(st.score(s), want[p]) << p;
  }
  // Uniform attention: peaks 0.3, 0.2, 0.2, 0.2 (token 5 protected); keys 0.3, 0.8, 0.2, 0.2:
  // the tie between 3 and 4 goes against the older.
  step(5, {{0, 0.2f}, {1, 0.2f}, {3, 0.2f}, {4, 0.2f}, {5, 0.2f}});
  EXPECT_EQ(st.kept_positions(), (std::vector<std::int64_t>{0, 1, 4, 5}));

  // The same run without value norms keeps the peaks only: token 1 (peak 0.1) goes first.
  const auto plain = make_kv_policy(parse_kv_spec("flex:4,decay=0.5,value=0,recent=0.25"), 1);
  EXPECT_FALSE(plain->uses_value_norms());
  EXPECT_TRUE(pol->uses_value_norms());
}

TEST(KvDecode, FlexMergesTheEvictedTokenIntoTheMostSimilarKeptOne) {
  // flex:4,decay=0.5,value=0,recent=0.25: sink 0, one protected recent token, two scored.
  const auto pol = make_kv_policy(parse_kv_spec("flex:4,decay=0.5,value=0,recent=0.25"), 1);
  ASSERT_TRUE(pol->merges_evictions());
  KvHeadState st = pol->make_state(kv_slot_capacity(4));
  std::vector<float> probs(5);
  std::vector<std::int64_t> evict;
  // Token 2 gets the least attention in every step, so step 4 evicts it (slot 2).
  const float attn[] = {0.5f, 0.3f, 0.05f, 0.15f, 0.2f};
  for (std::int64_t pos = 0; pos < 5; ++pos) {
    for (std::int64_t s = 0; s < 5; ++s) probs[static_cast<std::size_t>(s)] = s <= pos ? attn[s] : 0.0f;
    pol->on_decode_step(st, pos, pos, probs, 4, evict);
  }
  ASSERT_EQ(evict, (std::vector<std::int64_t>{2}));
  // Scores after step 4 (decayed peaks): 0.5, 0.3, (evicted) 0.05, 0.15, 0.2.
  const float s_e = st.score(2), s_3 = st.score(3);
  EXPECT_FLOAT_EQ(s_e, 0.05f);
  // The sink (slot 0) is the most similar but stays as it is; of the others slot 3 is.
  const std::vector<float> sim = {0.99f, 0.1f, 1.0f, 0.8f, 0.7f};
  KvSlotMerge m;
  ASSERT_TRUE(pol->merge_evicted(st, 2, sim, 4, m));
  EXPECT_EQ(m.from, 2);
  EXPECT_EQ(m.to, 3);
  EXPECT_FLOAT_EQ(m.weight, s_e / (s_e + s_3));
  // Attention gives slot 3 the mass of both tokens: log((s_e + s_3) / s_3).
  EXPECT_FLOAT_EQ(st.logit_bias(3), std::log((s_e + s_3) / s_3));
  EXPECT_EQ(st.logit_bias(1), 0.0f);
  EXPECT_EQ(st.bytes_per_slot(), 12);  // position, score, logit bias (value=0: no norm weight)

  // Step 5 writes token 5 to slot 2 (bias 0 again) and evicts token 3 (peak 0.075 against 1's
  // 0.15 and 4's 0.1). Merged into the new token (score 0.01, most similar; protected from
  // eviction, not from merging) it would weigh 8.5x: the bias stops at log 2.
  for (std::int64_t s = 0; s < 5; ++s) probs[static_cast<std::size_t>(s)] = 0.01f;
  pol->on_decode_step(st, 2, 5, probs, 4, evict);
  ASSERT_EQ(evict, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(st.logit_bias(2), 0.0f);
  ASSERT_TRUE(pol->merge_evicted(st, 3, std::vector<float>{0.0f, 0.1f, 0.9f, 1.0f, 0.2f}, 4, m));
  EXPECT_EQ(m.to, 2);
  EXPECT_FLOAT_EQ(m.weight, 0.075f / 0.085f);
  EXPECT_EQ(st.logit_bias(2), std::numbers::ln2_v<float>);

  // A slot still held cannot be merged; merge=0 and other policies do not merge.
  EXPECT_THROW(pol->merge_evicted(st, 1, sim, 4, m), std::logic_error);
  const auto dropping = make_kv_policy(parse_kv_spec("flex:4,merge=0"), 1);
  EXPECT_FALSE(dropping->merges_evictions());
  KvHeadState st2 = dropping->make_state(kv_slot_capacity(4));
  EXPECT_THROW(dropping->merge_evicted(st2, 0, sim, 4, m), std::logic_error);
  EXPECT_FALSE(make_kv_policy(parse_kv_spec("h2o:4"), 1)->merges_evictions());
}

TEST(KvDecode, StateBytesPerSlotDoNotGrowWithTheSequence) {
  auto bytes = [](const std::string& text, std::int64_t capacity) {
    return make_kv_policy(parse_kv_spec(text), 1)->make_state(capacity).bytes_per_slot();
  };
  for (const std::int64_t cap : {9, 1025}) {
    EXPECT_EQ(bytes("h2o:0.2", cap), 8);
    EXPECT_EQ(bytes("tova:0.2", cap), 8);
    EXPECT_EQ(bytes("flex:0.2", cap), 16);          // + the value norm and the logit bias
    EXPECT_EQ(bytes("flex:0.2,merge=0", cap), 12);
    EXPECT_EQ(bytes("flex:0.2,value=0,merge=0", cap), 8);
    EXPECT_EQ(bytes("scissorhands:0.2", cap), 8 + 7 * 8);  // 400 steps of bits
  }
  // A flex state holds the same after a long run as after a short one.
  const auto pol = make_kv_policy(parse_kv_spec("flex:8"), 1);
  KvHeadState st = pol->make_state(kv_slot_capacity(8));
  std::vector<float> probs(9, 0.1f);
  std::vector<std::int64_t> evict;
  for (std::int64_t pos = 0; pos < 1000; ++pos) pol->on_decode_step(st, st.free_slot(), pos, probs, 8, evict, 1.0f);
  EXPECT_EQ(st.size(), 8);
  EXPECT_EQ(st.capacity(), 9);
  EXPECT_EQ(st.bytes_per_slot(), 16);
}

TEST(KvDecode, MisuseIsReported) {
  const auto pol = make_kv_policy(parse_kv_spec("h2o:2"), 1);
  KvHeadState st = pol->make_state(kv_slot_capacity(2));
  std::vector<float> probs(3, 0.5f);
  std::vector<std::int64_t> evict;
  pol->on_decode_step(st, 0, 0, probs, 2, evict);
  EXPECT_THROW(pol->on_decode_step(st, 0, 1, probs, 2, evict), std::logic_error);   // slot taken
  EXPECT_THROW(pol->on_decode_step(st, 3, 1, probs, 2, evict), std::logic_error);   // no such slot
  EXPECT_THROW(pol->on_decode_step(st, 1, 0, probs, 2, evict), std::logic_error);   // position not new
  EXPECT_THROW(pol->on_decode_step(st, 1, 1, std::span<const float>(probs).first(2), 2, evict),
               std::invalid_argument);                                              // too few probs
  EXPECT_THROW(pol->on_decode_step(st, 1, 1, probs, 0, evict), std::invalid_argument);
  try {
    KvHeadState tight = pol->make_state(2);
    pol->on_decode_step(tight, 0, 0, probs, 2, evict);
    pol->on_decode_step(tight, 1, 1, probs, 2, evict);
    pol->on_decode_step(tight, tight.free_slot(), 2, probs, 2, evict);
    ADD_FAILURE() << "a full state took a third token";
  } catch (const std::logic_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("kv_slot_capacity(budget)"));
  }
  // A state of another policy (scissorhands keeps history bits).
  const auto sh = make_kv_policy(parse_kv_spec("scissorhands:4"), 1);
  KvHeadState foreign = pol->make_state(5);
  std::vector<float> p5(5, 0.2f);
  EXPECT_THROW(sh->on_decode_step(foreign, 0, 0, p5, 4, evict), std::logic_error);
  // full never evicts: a budget below the sequence is an error, not a silent drop.
  const auto full = make_kv_policy(parse_kv_spec("full"), 1);
  KvHeadState fs = full->make_state(3);
  full->on_decode_step(fs, 0, 0, {}, 2, evict);
  full->on_decode_step(fs, 1, 1, {}, 2, evict);
  EXPECT_THROW(full->on_decode_step(fs, 2, 2, {}, 2, evict), std::logic_error);
}

TEST(KvDecode, SelectEvictionsShrinksToANewBudgetAndCompactCloses) {
  const auto pol = make_kv_policy(parse_kv_spec("local:8"), 1);
  KvHeadState st = pol->make_state(kv_slot_capacity(8));
  pol->on_prefill(0, 8, {}, 8, st);
  std::vector<std::int64_t> evict;
  pol->select_evictions(st, 3, evict);
  EXPECT_EQ(evict, (std::vector<std::int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(st.kept_positions(), (std::vector<std::int64_t>{5, 6, 7}));
  std::vector<KvSlotMove> moves;
  st.compact(moves);
  ASSERT_EQ(moves.size(), 3u);
  EXPECT_EQ(moves[0].from, 7);
  EXPECT_EQ(moves[0].to, 0);
  for (std::int64_t s = 0; s < 3; ++s) EXPECT_TRUE(st.occupied(s));
  EXPECT_EQ(st.free_slot(), 3);
  EXPECT_EQ(st.kept_positions(), (std::vector<std::int64_t>{5, 6, 7}));
  moves.clear();
  st.compact(moves);
  EXPECT_TRUE(moves.empty());
  st.clear();
  EXPECT_EQ(st.size(), 0);
  EXPECT_EQ(st.free_slot(), 0);
}

}  // namespace
}  // namespace flexh2o::policy
