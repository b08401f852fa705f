#include "tests/support/refill_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engine/runtime/block_executor.h"
#include "engine/serving/generate.h"
#include "offload/tiers.h"
#include "policy/eviction/kv_spec.h"
#include "tests/support/test_models.h"

namespace flexh2o::testing {

namespace {

struct Run {
  std::vector<std::int32_t> tokens;
  std::vector<std::vector<float>> logits;  // that picked each token
};

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

std::vector<Run> solo_runs(kernels::Backend& be, const engine::ModelConfig& cfg, const engine::WeightSource& source,
                           const policy::Policy& pol, const engine::GenerationRequest& req) {
  const engine::ModelConfig stored = engine::with_weight_dtype(cfg, pol.weight_dtype(cfg.dtype));
  const auto host = engine::load_weights(stored, source);
  engine::Generator plain(be, stored, host, pol.cache_dtype(cfg.dtype));
  const auto kv = pol.kv == "full" ? nullptr : policy::make_kv_policy(policy::parse_kv_spec(pol.kv), cfg.n_layers);
  std::vector<Run> out;
  for (std::size_t b = 0; b < req.sequences.size(); ++b) {
    engine::GenerationRequest one;
    const engine::Sequence& seq = req.sequences[b];
    one.sequences = {{.prompt = seq.prompt, .stream = seq.stream.value_or(b)}};
    one.max_new_tokens = engine::new_tokens_limit(req, b);
    one.sampling = engine::sampling_of(req, b);
    one.kv = kv.get();
    Run r;
    engine::GenerationHooks keep;
    keep.on_logits = [&](std::int64_t, std::span<const float> l) { r.logits.emplace_back(l.begin(), l.end()); };
    r.tokens = plain.generate(one, keep).tokens[0];
    out.push_back(std::move(r));
  }
  return out;
}

// fp32 rounding of a forward pass; a narrower cache re-rounds each K/V value, and a value the
// step's summation order moves across a rounding boundary moves a whole step of the cache's
// type: one ulp of a 16-bit float (2^-10 relative for f16, 2^-7 for bf16, at most), or one
// quantization step of a compressed cache (1 / (2^bits - 1) of its group's range). The logits
// then move by up to that fraction of their magnitude.
double tolerance(const policy::Policy& pol, const engine::ModelConfig& cfg, std::int64_t tokens,
                 const std::vector<float>& logits) {
  const double fp32 = forward_tolerance(cfg, tokens, logits);
  double step = 0;
  switch (pol.cache_dtype(cfg.dtype)) {
    case kernels::DType::F16: step = std::ldexp(1.0, -10); break;
    case kernels::DType::BF16: step = std::ldexp(1.0, -7); break;
    case kernels::DType::Q8:
    case kernels::DType::Q4: step = 1.0 / ((1 << pol.compress_bits) - 1); break;
    default: return fp32;
  }
  double scale = 0;
  for (const float l : logits) scale = std::max(scale, std::abs(static_cast<double>(l)));
  return fp32 + scale * step;
}

}  // namespace

RefillComparison expect_refill_matches_solo(kernels::Backend& be, const engine::ModelConfig& cfg,
                                            const engine::WeightSource& source, const policy::Policy& pol,
                                            const engine::GenerationRequest& req, offload::CopyOptions copy,
                                            serving::SequenceFeed* feed) {
  const std::vector<Run> want = solo_runs(be, cfg, source, pol, req);
  const std::size_t n = req.sequences.size();
  std::vector<Run> got(n);
  std::vector<int> finished(n, 0);
  engine::GenerationRequest refill = req;
  refill.slots = pol.block_size();
  engine::GenerationHooks hooks;
  hooks.on_sequence_logits = [&](std::size_t b, std::int64_t index, std::span<const float> l) {
    EXPECT_EQ(index, static_cast<std::int64_t>(got[b].logits.size())) << "request " << b;
    got[b].logits.emplace_back(l.begin(), l.end());
  };
  hooks.on_finished = [&](std::size_t b, const engine::GenerationResult& own) {
    ++finished[b];
    ASSERT_EQ(own.tokens.size(), 1u) << "request " << b;
    got[b].tokens = own.tokens[0];
  };
  TempDir dir;
  offload::TierOptions to;
  to.offload_dir = dir.path();
  offload::Tiers tiers(be, to);
  {
    engine::BlockExecutor sched(be, tiers, cfg, source, pol, nullptr, copy);
    const auto result = serving::generate(sched, refill, hooks, feed);
    for (std::size_t b = 0; b < n; ++b) EXPECT_EQ(result.tokens[b], got[b].tokens) << "request " << b;
    EXPECT_EQ(result.sequences, std::ranges::count(finished, 1)) << "only the requests taken count";
    std::int64_t generated = 0;
    for (const auto& t : result.tokens) generated += static_cast<std::int64_t>(t.size());
    EXPECT_EQ(result.sequence_steps, generated) << "continuous batching computes only live sequences";
  }
  for (offload::Tier t : {offload::Tier::Gpu, offload::Tier::Cpu, offload::Tier::Disk})
    EXPECT_EQ(tiers.budget(t).used(), 0) << tier_name(t);

  const engine::ModelConfig stored = engine::with_weight_dtype(cfg, pol.weight_dtype(cfg.dtype));
  RefillComparison c;
  for (std::size_t b = 0; b < n; ++b) {
    SCOPED_TRACE("request " + std::to_string(b));
    if (feed && finished[b] == 0) {  // another runner's
      EXPECT_TRUE(got[b].tokens.empty() && got[b].logits.empty());
      continue;
    }
    ++c.requests;
    EXPECT_EQ(finished[b], 1);
    const Run &w = want[b], &g = got[b];
    EXPECT_EQ(g.logits.size(), g.tokens.size());
    if (g.logits.size() != g.tokens.size()) continue;
    if (g.tokens == w.tokens) ++c.exact;
    if (g.tokens == w.tokens && g.logits == w.logits) ++c.bitwise;
    const auto tokens = static_cast<std::int64_t>(req.sequences[b].prompt.size() + w.tokens.size());
    bool tie = false;
    for (std::size_t i = 0; i < std::min(g.tokens.size(), w.tokens.size()) && !tie; ++i) {
      const double tol = tolerance(pol, stored, tokens, w.logits[i]);
      if (g.tokens[i] != w.tokens[i]) {
        // A different pick is only rounding when the solo run's token ties with refill's within it.
        const auto& l = w.logits[i];
        EXPECT_GE(l[static_cast<std::size_t>(g.tokens[i])], l[static_cast<std::size_t>(w.tokens[i])] - 2 * tol)
            << "token " << i << ": refill picked " << g.tokens[i] << ", alone " << w.tokens[i];
        ++c.near_ties;
        tie = true;
        continue;
      }
      EXPECT_LE(max_diff(g.logits[i], w.logits[i]), tol) << "logits of token " << i;
    }
    if (!tie) {
      EXPECT_EQ(g.tokens.size(), w.tokens.size());
    }
  }
  EXPECT_LT(c.near_ties, std::max<std::size_t>(n, 1)) << "every request ended in a near-tie: nothing was compared";
  return c;
}

}  // namespace flexh2o::testing
