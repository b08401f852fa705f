// The CPU decode attention's own loops (kernels/cpu/attention_vec.h, kernels/cpu/vec.h) on every
// path this CPU has, and its blocked reading of the cache, on fresh random data against
// double-precision references. Shapes cross the loops' edges: slots by tiles of 4 and 8 and the
// remainder, heads by threes and the remainder, columns by blocks of 32 and 64, by 8 and one at a
// time (head_dim 20, 72, 100), and sequence lengths across the 64-slot blocks the cache is read in. Tolerances follow from the arithmetic (tests/support/fp_tolerance.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "kernels/attention.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention_vec.h"
#include "kernels/cpu/vec.h"
#include "kernels/quantize.h"
#include "tests/kernels/reference_ops.h"
#include "tests/kernels/seeded_test.h"
#include "tests/support/fp_tolerance.h"

namespace flexh2o::kernels {
namespace {

using flexh2o::testing::kF32Eps;
using flexh2o::testing::sum_tolerance;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

using VecLoops = SeededTest;

// Column counts around the vector widths: short, 8-wide with and without a tail, 64-blocks with tails.
constexpr std::int64_t kWidths[] = {1, 7, 8, 20, 64, 72, 100, 136};
// Row counts around the eight-row groups.
constexpr std::int64_t kRows[] = {1, 7, 8, 9, 17, 64};

using GroupLoops = SeededTest;

// Heads by threes and the remainder (1..7), every path this CPU has, every dtype read in place.
constexpr std::int64_t kHeads[] = {1, 2, 3, 4, 7};
constexpr DType kSlotDtypes[] = {DType::F32, DType::F16, DType::BF16};

// Slots stored in t, and the values they hold.
struct StoredSlots {
  std::vector<std::uint8_t> bytes;
  std::vector<float> values;
};
StoredSlots store_slots(const std::vector<float>& x, DType t, std::int64_t m, std::int64_t d) {
  StoredSlots s{stored_rows(x, t, m, d), std::vector<float>(x.size())};
  convert_rows(s.bytes.data(), t, s.values.data(), DType::F32, m, d);
  return s;
}

// f(isa, dtype, heads, d, m) for every path this CPU runs, slot dtype, group size, width and
// slot count, each under its own trace; stops at the first fatal failure.
template <class F>
void for_each_case(F&& f) {
  for (const Isa isa : attention_vec::supported_isas())
    for (const DType t : kSlotDtypes)
      for (const std::int64_t heads : kHeads)
        for (const std::int64_t d : kWidths)
          for (const std::int64_t m : kRows) {
            SCOPED_TRACE(::testing::Message() << "isa " << static_cast<int>(isa) << " " << dtype_name(t) << " heads "
                                              << heads << " m " << m << " d " << d);
            f(isa, t, heads, d, m);
            if (::testing::Test::HasFatalFailure()) return;
          }
}

// Each score is an fp32 sum of d products, the vector path's in another order than the plain
// loops': both within the rounding of such a sum of the double-precision value.
TEST_F(GroupLoops, ScoresMatchDoubleReference) {
  for_each_case([&](Isa isa, DType t, std::int64_t heads, std::int64_t d, std::int64_t m) {
    const std::vector<float> q = random_floats(heads * d, -3, 3);
    const StoredSlots k = store_slots(random_floats(m * d), t, m, d);
    const float scale = 0.125f;
    const std::int64_t ld = m + 3;  // rows of the score matrix apart, the gaps never written
    std::vector<float> out(static_cast<std::size_t>(heads * ld), kNaN);
    attention_vec::scores(isa, q.data(), heads, {k.bytes.data(), t, m, d}, scale, out.data(), ld);
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t j = 0; j < m; ++j) {
        double want = 0, size = 0;
        for (std::int64_t i = 0; i < d; ++i) {
          const double p = static_cast<double>(q[h * d + i]) * k.values[j * d + i];
          want += p;
          size += std::abs(p);
        }
        ASSERT_NEAR(out[h * ld + j], scale * want, scale * sum_tolerance(kF32Eps, d, size)) << h << " " << j;
      }
      for (std::int64_t j = m; j < ld; ++j) ASSERT_TRUE(std::isnan(out[h * ld + j])) << "wrote past m";
    }
  });
}

// Each output is acc plus an fp32 sum of m products, in order of the slots on every path.
TEST_F(GroupLoops, WeightedSumMatchesDoubleReference) {
  for_each_case([&](Isa isa, DType t, std::int64_t heads, std::int64_t d, std::int64_t m) {
    const std::int64_t ld = m + 3;
    const std::vector<float> w = random_floats(heads * ld, 0, 1), acc0 = random_floats(heads * d);
    const StoredSlots v = store_slots(random_floats(m * d), t, m, d);
    std::vector<float> acc = acc0;
    acc.push_back(kNaN);
    attention_vec::weighted_sum(isa, w.data(), ld, heads, {v.bytes.data(), t, m, d}, acc.data());
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < d; ++i) {
        double want = acc0[h * d + i], size = std::abs(acc0[h * d + i]);
        for (std::int64_t j = 0; j < m; ++j) {
          const double p = static_cast<double>(w[h * ld + j]) * v.values[j * d + i];
          want += p;
          size += std::abs(p);
        }
        ASSERT_NEAR(acc[h * d + i], want, sum_tolerance(kF32Eps, m + 1, size)) << h << " " << i;
      }
    EXPECT_TRUE(std::isnan(acc[heads * d])) << "wrote past the heads' columns";
  });
}

// The vector path sums each score's lanes in one fixed order whatever the slot's place among
// the tiles of 4 or 8 slots and the head's among the tiles of 3 heads: a slot's score does not
// depend on how many slots or heads are read with it.
TEST_F(GroupLoops, ScoresDoNotDependOnTheTiling) {
  for (const Isa isa : attention_vec::supported_isas())
    for (const DType t : kSlotDtypes) {
      const std::int64_t heads = 7, d = 72, m = 13;
      const std::vector<float> q = random_floats(heads * d, -3, 3);
      const StoredSlots k = store_slots(random_floats(m * d), t, m, d);
      std::vector<float> all(static_cast<std::size_t>(heads * m));
      attention_vec::scores(isa, q.data(), heads, {k.bytes.data(), t, m, d}, 0.5f, all.data(), m);
      const std::int64_t slot = static_cast<std::int64_t>(row_bytes(t, d));
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t j = 0; j < m; ++j) {
          float one = kNaN;
          attention_vec::scores(isa, q.data() + h * d, 1, {k.bytes.data() + j * slot, t, 1, d}, 0.5f, &one, 1);
          ASSERT_EQ(one, all[h * m + j]) << dtype_name(t) << " head " << h << " slot " << j;
        }
    }
}

TEST_F(GroupLoops, RefusesCompressedSlots) {
  const std::vector<std::uint8_t> bytes(static_cast<std::size_t>(row_bytes(DType::Q8, 64)));
  const std::vector<float> q(64);
  std::vector<float> out(1);
  EXPECT_THROW(attention_vec::scores(q.data(), 1, {bytes.data(), DType::Q8, 1, 64}, 1.0f, out.data(), 1),
               std::invalid_argument);
}

TEST_F(VecLoops, MaxIsExact) {
  for (const std::int64_t n : {1, 5, 8, 9, 31, 64, 100}) {
    std::vector<float> x = random_floats(n, -50, 50);
    x[static_cast<std::size_t>(random_int(0, n - 1))] = 60.0f;  // anywhere, the tail included
    EXPECT_EQ(vec::max(x.data(), n), *std::max_element(x.begin(), x.end())) << n;
  }
  EXPECT_EQ(vec::max(nullptr, 0), -std::numeric_limits<float>::infinity());
}

// exp to a few ulp over the range softmax feeds it (x - max <= 0), down to the subnormal
// results it flushes to 0; the sum it returns is an fp32 sum of n terms.
TEST_F(VecLoops, ExpShiftedWithinUlpsOfExp) {
  for (const std::int64_t n : {1, 3, 8, 13, 64, 301}) {
    SCOPED_TRACE(::testing::Message() << "n " << n);
    std::vector<float> x = random_floats(n, -95, 0);
    const float shift = 2.5f;
    for (float& e : x) e += shift;
    if (n > 2) x[1] = shift;  // exp(0) = 1 exactly
    std::vector<float> y = x;
    y.push_back(kNaN);
    const float sum = vec::exp_shifted(y.data(), n, shift);
    double want_sum = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const float shifted = x[i] - shift;  // as the kernel rounds it
      const double want = std::exp(static_cast<double>(shifted));
      want_sum += want;
      if (want < 0x1p-126) {
        EXPECT_LE(y[i], 0x1p-126) << i;  // flushed, or std::exp's subnormal
      } else {
        EXPECT_NEAR(y[i], want, 4 * kF32Eps * want) << i << " x " << shifted;
      }
    }
    if (n > 2) {
      EXPECT_EQ(y[1], 1.0f);
    }
    EXPECT_NEAR(sum, want_sum, 4 * kF32Eps * want_sum + sum_tolerance(kF32Eps, n, want_sum));
    EXPECT_TRUE(std::isnan(y[n])) << "wrote past n";
  }
}

// silu(x) * up: the exp within 2 ulp, then 1 + e, a division and a product each rounded once:
// 8 ulp of the exact value; below -80 two exps of x / 2 and two products, as many. Where the
// exact value is subnormal (x below about -87.3 - ln 88) only its size is checked. Gates cover
// the whole fp32 range of exp(-x), both sides of -80 and the overflow of exp(-x) near -88.7.
TEST_F(VecLoops, SiluTimesWithinUlpsOfExact) {
  for (const std::int64_t n : {1, 7, 8, 13, 301}) {
    for (const bool with_up : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << (with_up ? " times up" : " alone"));
      std::vector<float> gate = random_floats(n, -200, 100), up = random_floats(n, -2, 2);
      const float edges[] = {0.0f, -80.0f, -80.0001f, -87.5f, -88.5f, -88.8f, -100.0f, -174.0f, -180.0f, 88.0f, 1e-30f};
      for (std::size_t i = 0; i < std::size(edges) && static_cast<std::int64_t>(i) < n; ++i) gate[i] = edges[i];
      std::vector<float> out(gate.size() + 1, kNaN);
      vec::silu_times(gate.data(), with_up ? up.data() : nullptr, out.data(), n);
      std::vector<float> aliased = gate;  // out over gate
      vec::silu_times(aliased.data(), with_up ? up.data() : nullptr, aliased.data(), n);
      for (std::int64_t i = 0; i < n; ++i) {
        const double g = gate[i], want = g / (1.0 + std::exp(-g)) * (with_up ? up[i] : 1.0);
        if (std::abs(want) < 0x1p-126) {
          EXPECT_LE(std::abs(out[i]), 0x1p-126) << i << " gate " << g;
        } else {
          EXPECT_NEAR(out[i], want, 8 * kF32Eps * std::abs(want)) << i << " gate " << g;
        }
        EXPECT_EQ(aliased[i], out[i]) << i;
      }
      EXPECT_TRUE(std::isnan(out[n])) << "wrote past n";
    }
  }
}

TEST_F(VecLoops, ExpShiftedAtTheEdges) {
  // A whole vector of zeros and of huge negatives, and values just above the flush point.
  std::vector<float> x = {0, 0, 0, 0, 0, 0, 0, 0, -1e30f, -200, -87.0f, -80.0f, -0.5f};
  const std::vector<float> in = x;
  vec::exp_shifted(x.data(), static_cast<std::int64_t>(x.size()), 0.0f);
  for (std::size_t i = 0; i < 8; ++i) EXPECT_EQ(x[i], 1.0f);
  EXPECT_EQ(x[8], 0.0f);
  EXPECT_EQ(x[9], 0.0f);
  for (std::size_t i = 10; i < x.size(); ++i)
    EXPECT_NEAR(x[i], std::exp(static_cast<double>(in[i])), 4 * kF32Eps * std::exp(static_cast<double>(in[i])));
}

using DecodeBlocks = SeededTest;

// Decode over caches in every dtype a KV cache takes, with lengths on both sides of the 64-slot
// blocks and a window that starts inside one, groups of 3 (as SmolLM2's), 4 and 1 query heads,
// plain and with a soft cap and slot biases (merged tokens' mass), against the reference on the
// decoded cache.
TEST_F(DecodeBlocks, EveryCacheDtypeAcrossSlotBlocks) {
  auto be = make_cpu_backend();
  const std::vector<std::int64_t> lens = {1, 63, 64, 65, 130, 200};
  const std::int64_t B = static_cast<std::int64_t>(lens.size()), cap = 208;
  const std::pair<std::int64_t, std::int64_t> heads[] = {{6, 2}, {8, 2}, {3, 3}};  // query heads, kv heads
  for (const DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8, DType::Q4G32})
    for (const std::int64_t head_dim : {20, 64, 72})
      for (const std::int64_t window : {0, 100})
        for (const auto& [n_heads, n_kv_heads] : heads)
          for (const bool capped : {false, true}) {
            const float softcap = capped ? 5.0f : 0.0f;
            const AttentionShape shape{n_heads, n_kv_heads, head_dim, 1.0f / std::sqrt(static_cast<float>(head_dim)),
                                       softcap, window};
            const std::int64_t H = shape.n_kv_heads, D = head_dim;
            SCOPED_TRACE(::testing::Message() << dtype_name(t) << " head_dim " << D << " window " << window << " heads "
                                              << n_heads << "/" << n_kv_heads << (capped ? " capped, biased" : ""));
            // The cache as stored, and the values it decodes to (NaN beyond each length: never read).
            const std::vector<float> k = random_floats(B * H * cap * D, -2, 2), v = random_floats(B * H * cap * D, -2, 2);
            const std::vector<std::uint8_t> kc = stored_rows(k, t, B * H * cap, D), vc = stored_rows(v, t, B * H * cap, D);
            std::vector<float> k_ref(k.size()), v_ref(v.size());
            convert_rows(kc.data(), t, k_ref.data(), DType::F32, B * H * cap, D);
            convert_rows(vc.data(), t, v_ref.data(), DType::F32, B * H * cap, D);
            for (std::int64_t b = 0; b < B; ++b)
              for (std::int64_t g = 0; g < H; ++g) {
                const std::int64_t end = (b * H + g + 1) * cap * D;
                std::fill(k_ref.begin() + (b * H + g) * cap * D + lens[b] * D, k_ref.begin() + end, kNaN);
                std::fill(v_ref.begin() + (b * H + g) * cap * D + lens[b] * D, v_ref.begin() + end, kNaN);
              }
            const std::vector<float> q = random_floats(B * shape.n_heads * D, -1, 1);
            const std::vector<float> bias = capped ? random_floats(B * H * cap, -1, 0) : std::vector<float>{};
            std::vector<float> out(q.size(), kNaN), probs(static_cast<std::size_t>(B * H * cap), -7.0f);
            be->attention_decode({.shape = shape, .q = q.data(), .k_cache = kc.data(), .v_cache = vc.data(),
                                  .capacity = cap, .lens = lens, .out = out.data(), .probs = probs.data(),
                                  .cache_dtype = t, .slot_bias = capped ? bias.data() : nullptr});
            const auto ref = ref::attention_decode(shape, q, k_ref, v_ref, cap, lens,
                                                   std::vector<float>(probs.size(), -7.0f), bias);
            // As KvCacheOpsOnCompressedSlots: a score is an fp32 dot product of |q| <= 1 and |k| <= 2
            // over D, scaled (at most 2 sqrt(D)); the cap (a division, tanh within a few ulp, a
            // product) and the bias add a few roundings of at most 2 sqrt(D) + 1. Its error moves each
            // probability by that much relative, an output (|v| <= 2) or a group's probability sum by
            // that times 2 or the group's heads, plus the rounding of the sums over up to `cap` keys.
            const double score_max = 2 * std::sqrt(static_cast<double>(D));
            const double score_tol =
                sum_tolerance(kF32Eps, D, score_max) + (capped ? 4 * kF32Eps * (score_max + 1) : 0.0);
            const double group = static_cast<double>(n_heads / n_kv_heads);
            const double out_tol = 2 * score_tol + sum_tolerance(kF32Eps, cap, 2);
            const double probs_tol = group * (score_tol + sum_tolerance(kF32Eps, cap, 1));
            for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref.out[i], out_tol) << i;
            for (std::size_t i = 0; i < probs.size(); ++i) ASSERT_NEAR(probs[i], ref.probs[i], probs_tol) << i;
          }
}


using SharedPrefixDecode = SeededTest;

// A decode call over cache rows some of which hold one prefix's bytes (tests of cascade
// attention): per query its cache row, length and prefix (-1: none).
struct PrefixCall {
  std::vector<std::int64_t> rows, lens, prefix_of;
  std::vector<SharedPrefix> prefixes;
  std::int64_t n_rows = 0, capacity = 0;
};

// Groups of 1, 2, 5 and 32 members, group i's prefix kPrefixLens[(round + i) % 10] slots long (so
// the rounds pair every size with every length, across the 64-slot blocks and 256-slot chunks the
// CPU reads), and two queries of no group. A member's own slots after the prefix: 1..80, or none
// (`own` false: a member's length is its prefix's, at least 1). Odd groups keep their prefix in a
// row no query reads; `extend`: each member row is read by two queries (lens n - 1 and n), as the
// rows of a prompt after a shared prefix.
constexpr std::int64_t kPrefixLens[] = {0, 1, 63, 64, 65, 255, 256, 257, 1000, 1030};
PrefixCall prefix_call(std::int64_t round, bool own, bool extend, const std::function<std::int64_t(std::int64_t, std::int64_t)>& draw) {
  PrefixCall c;
  const std::int64_t sizes[] = {1, 2, 5, 32};
  auto add_query = [&](std::int64_t row, std::int64_t len, std::int64_t prefix) {
    const std::int64_t shared = prefix >= 0 ? c.prefixes[static_cast<std::size_t>(prefix)].len : 0;
    if (extend && len - 1 >= std::max<std::int64_t>(shared, 1)) {
      c.rows.push_back(row);
      c.lens.push_back(len - 1);
      c.prefix_of.push_back(prefix);
    }
    c.rows.push_back(row);
    c.lens.push_back(len);
    c.prefix_of.push_back(prefix);
  };
  for (std::int64_t i = 0; i < 4; ++i) {
    const std::int64_t P = kPrefixLens[(round + i) % 10];
    const bool apart = i % 2 == 1;
    c.prefixes.push_back({c.n_rows, P});
    if (apart) ++c.n_rows;  // the prefix's own row, read by no query
    for (std::int64_t m = 0; m < sizes[i]; ++m)
      add_query(c.n_rows++, std::max<std::int64_t>(P + (own ? draw(1, 80) : 0), 1), i);
  }
  for (int u = 0; u < 2; ++u) add_query(c.n_rows++, draw(1, 1100), -1);
  c.capacity = 1110;
  return c;
}

// Outputs equal bit for bit.
void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i])) << "output " << i;
}

// A sliding window per round: none, one that leaves most members' windows past their prefix
// (own slots 1..80), and one that starts within the long prefixes.
std::int64_t window_of_round(std::int64_t round) {
  const std::int64_t windows[] = {0, 40, 300};
  return windows[round % 3];
}

// Cascade attention (AttentionDecodeArgs::shared_prefixes) against the plain per-query reading
// of the same rows, in every cache dtype, GQA (9/3 as SmolLM2, 8/2) and MHA (4/4), with and
// without a soft cap and a sliding window: the members' own rows below their prefix are then overwritten with NaN
// bytes, which the grouped path must not read. Equal bit for bit: the grouped path computes each
// query head's scores, softmax and weighted sum as the plain one does (the same loops, a score
// per slot, each value's terms in slot order), only loading the prefix's slots once for many.
TEST_F(SharedPrefixDecode, MatchesPerQueryReading) {
  auto be = make_cpu_backend();
  ASSERT_TRUE(be->reads_shared_prefixes_once());
  auto draw = [&](std::int64_t lo, std::int64_t hi) { return random_int(lo, hi); };
  const std::pair<std::int64_t, std::int64_t> heads[] = {{9, 3}, {8, 2}, {4, 4}};
  const std::int64_t D = 64;
  for (const DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8, DType::Q4G32})
    for (const auto& [n_heads, n_kv_heads] : heads) {
      // Every call has as many rows (two groups keep their prefix apart): fresh K/V per dtype and
      // shape, each call's member rows then copied from its prefixes' rows.
      const std::int64_t H = n_kv_heads, rows = prefix_call(0, true, false, draw).n_rows, cap = 1110;
      const std::int64_t slot = kv_slot_bytes(t, D), head_bytes = cap * slot;
      const std::vector<std::uint8_t> k_drawn = stored_rows(random_floats(rows * H * cap * D, -2, 2), t, rows * H * cap, D);
      const std::vector<std::uint8_t> v_drawn = stored_rows(random_floats(rows * H * cap * D, -2, 2), t, rows * H * cap, D);
      for (std::int64_t round = 0; round < 10; round += (t == DType::F16 ? 1 : 4))
        for (const bool own : {true, false})
          for (const bool extend : {false, true}) {
            const float softcap = round % 2 == 1 || round == 4 ? 5.0f : 0.0f;  // every dtype meets one
            const std::int64_t window = window_of_round(round);
            const AttentionShape shape{n_heads, n_kv_heads, D, 1.0f / std::sqrt(static_cast<float>(D)), softcap, window};
            SCOPED_TRACE(::testing::Message() << dtype_name(t) << " heads " << n_heads << "/" << n_kv_heads << " round "
                                              << round << " window " << window << (own ? " own slots" : " prefix only")
                                              << (extend ? " extend rows" : ""));
            const PrefixCall c = prefix_call(round, own, extend, draw);
            ASSERT_EQ(c.n_rows, rows);
            ASSERT_EQ(c.capacity, cap);
            std::vector<std::uint8_t> kc = k_drawn, vc = v_drawn;
            // Each member row holds its prefix's bytes; then, for the grouped call, NaN bytes there.
            auto for_member_prefixes = [&](auto&& f) {
              for (std::size_t b = 0; b < c.rows.size(); ++b) {
                if (c.prefix_of[b] < 0) continue;
                const SharedPrefix& p = c.prefixes[static_cast<std::size_t>(c.prefix_of[b])];
                if (c.rows[b] == p.row) continue;
                for (std::int64_t g = 0; g < H; ++g) f((c.rows[b] * H + g) * head_bytes, (p.row * H + g) * head_bytes, p.len * slot);
              }
            };
            for_member_prefixes([&](std::int64_t to, std::int64_t from, std::int64_t n) {
              std::copy_n(kc.begin() + from, n, kc.begin() + to);
              std::copy_n(vc.begin() + from, n, vc.begin() + to);
            });
            const std::vector<float> q = random_floats(static_cast<std::int64_t>(c.lens.size()) * n_heads * D, -1, 1);
            AttentionDecodeArgs a{.shape = shape, .q = q.data(), .k_cache = kc.data(), .v_cache = vc.data(),
                                  .capacity = cap, .lens = c.lens, .cache_dtype = t, .cache_rows = c.rows};
            std::vector<float> want(q.size(), kNaN), got(q.size(), kNaN);
            a.out = want.data();
            be->attention_decode(a);
            for_member_prefixes([&](std::int64_t to, std::int64_t, std::int64_t n) {
              std::fill_n(kc.begin() + to, n, std::uint8_t{0xff});
              std::fill_n(vc.begin() + to, n, std::uint8_t{0xff});
            });
            a.out = got.data();
            a.shared_prefixes = c.prefixes;
            a.prefix_of = c.prefix_of;
            ASSERT_TRUE(shared_prefix_applies(a));
            be->attention_decode(a);
            expect_bitwise(got, want);
          }
    }
}

// Prefixes held once apart from the rows that use them (AttentionDecodeArgs::prefix_cache), each
// member row starting after its prefix (row_base): the call of MatchesPerQueryReading with every
// prefix moved into a prefix cache of another capacity and every member row's own slots moved to
// its slot 0 on, against the plain reading of the rows whole. Everything outside what a query
// may read holds NaN bytes (the prefix cache past each prefix, a member row past its own slots),
// so that a read of it shows; equal bit for bit, as MatchesPerQueryReading (with its windows).
TEST_F(SharedPrefixDecode, RowsAfterAPrefixHeldApart) {
  auto be = make_cpu_backend();
  auto draw = [&](std::int64_t lo, std::int64_t hi) { return random_int(lo, hi); };
  const std::int64_t D = 64, cap = 1110, prefix_cap = 1040;
  for (const DType t : {DType::F32, DType::F16, DType::Q8, DType::Q4G32})
    for (const auto& [n_heads, H] : {std::pair<std::int64_t, std::int64_t>{9, 3}, {4, 4}}) {
      const std::int64_t slot = kv_slot_bytes(t, D), head_bytes = cap * slot, prefix_head_bytes = prefix_cap * slot;
      const std::int64_t n = prefix_call(0, true, false, draw).n_rows * H * cap;
      const std::vector<std::uint8_t> k_drawn = stored_rows(random_floats(n * D, -2, 2), t, n, D);
      const std::vector<std::uint8_t> v_drawn = stored_rows(random_floats(n * D, -2, 2), t, n, D);
      for (const std::int64_t round : {0, 3, 4, 8})
        for (const bool extend : {false, true}) {
          const std::int64_t window = window_of_round(round);
          SCOPED_TRACE(::testing::Message() << dtype_name(t) << " heads " << n_heads << "/" << H << " round " << round
                                            << " window " << window << (extend ? " extend rows" : ""));
          const PrefixCall c = prefix_call(round, true, extend, draw);
          const std::int64_t n_prefixes = static_cast<std::int64_t>(c.prefixes.size());
          std::vector<std::uint8_t> kc = k_drawn, vc = v_drawn;
          // Each member row holds its prefix's bytes below P for the plain reading.
          std::vector<std::int64_t> base_of_row(static_cast<std::size_t>(c.n_rows), 0);
          for (std::size_t b = 0; b < c.rows.size(); ++b) {
            if (c.prefix_of[b] < 0) continue;
            const SharedPrefix& p = c.prefixes[static_cast<std::size_t>(c.prefix_of[b])];
            base_of_row[static_cast<std::size_t>(c.rows[b])] = p.len;
            if (c.rows[b] == p.row) continue;
            for (std::int64_t g = 0; g < H; ++g)
              for (auto* cache : {&kc, &vc})
                std::copy_n(cache->begin() + (p.row * H + g) * head_bytes, p.len * slot,
                            cache->begin() + (c.rows[b] * H + g) * head_bytes);
          }
          const std::vector<float> q = random_floats(static_cast<std::int64_t>(c.lens.size()) * n_heads * D, -1, 1);
          AttentionDecodeArgs a{.shape = {n_heads, H, D, 1.0f / std::sqrt(static_cast<float>(D)), 0.0f, window}, .q = q.data(),
                                .k_cache = kc.data(), .v_cache = vc.data(), .capacity = cap, .lens = c.lens,
                                .cache_dtype = t, .cache_rows = c.rows};
          std::vector<float> want(q.size(), kNaN), got(q.size(), kNaN);
          a.out = want.data();
          be->attention_decode(a);
          // Prefix i moves to row i of the prefix cache; a member row's slots [P, cap) to [0, cap - P).
          std::vector<std::uint8_t> pk(static_cast<std::size_t>(n_prefixes * H * prefix_head_bytes), 0xff), pv = pk;
          std::vector<SharedPrefix> held;
          for (std::int64_t i = 0; i < n_prefixes; ++i) {
            const SharedPrefix& p = c.prefixes[static_cast<std::size_t>(i)];
            held.push_back({i, p.len});
            for (std::int64_t g = 0; g < H; ++g) {
              std::copy_n(kc.begin() + (p.row * H + g) * head_bytes, p.len * slot, pk.begin() + (i * H + g) * prefix_head_bytes);
              std::copy_n(vc.begin() + (p.row * H + g) * head_bytes, p.len * slot, pv.begin() + (i * H + g) * prefix_head_bytes);
            }
          }
          for (std::int64_t r = 0; r < c.n_rows; ++r) {
            const std::int64_t P = base_of_row[static_cast<std::size_t>(r)];
            for (std::int64_t g = 0; g < H; ++g)
              for (auto* cache : {&kc, &vc}) {
                const auto head = cache->begin() + (r * H + g) * head_bytes;
                std::copy(head + P * slot, head + head_bytes, head);
                std::fill(head + head_bytes - P * slot, head + head_bytes, std::uint8_t{0xff});
              }
          }
          std::vector<std::int64_t> bases;
          for (const std::int64_t row : c.rows) bases.push_back(base_of_row[static_cast<std::size_t>(row)]);
          a.out = got.data();
          a.shared_prefixes = held;
          a.prefix_of = c.prefix_of;
          a.prefix_cache = {pk.data(), pv.data(), prefix_cap};
          a.row_base = bases;
          be->attention_decode(a);
          expect_bitwise(got, want);
        }
    }
}

// Where the grouped path cannot apply (shared_prefix_applies: probs, slot biases), a call with
// shared prefixes is the call without them, bit for bit.
TEST_F(SharedPrefixDecode, FallsBackToPerQueryReading) {
  auto be = make_cpu_backend();
  auto draw = [&](std::int64_t lo, std::int64_t hi) { return random_int(lo, hi); };
  const std::int64_t D = 64, n_heads = 9, H = 3;
  const PrefixCall c = prefix_call(4, true, false, draw);
  const std::int64_t cap = c.capacity;
  // probs and slot_bias are per cache row: one query per row.
  std::vector<std::int64_t> lens_by_row(static_cast<std::size_t>(c.n_rows), 1);
  for (std::size_t b = 0; b < c.rows.size(); ++b) lens_by_row[static_cast<std::size_t>(c.rows[b])] = c.lens[b];
  std::vector<std::int64_t> prefix_by_row(static_cast<std::size_t>(c.n_rows), -1);
  for (std::size_t b = 0; b < c.rows.size(); ++b) prefix_by_row[static_cast<std::size_t>(c.rows[b])] = c.prefix_of[b];
  for (const DType t : {DType::F16, DType::Q8}) {
    const std::int64_t rows = c.n_rows;
    const std::vector<std::uint8_t> kc = stored_rows(random_floats(rows * H * cap * D, -2, 2), t, rows * H * cap, D);
    const std::vector<std::uint8_t> vc = stored_rows(random_floats(rows * H * cap * D, -2, 2), t, rows * H * cap, D);
    const std::vector<float> q = random_floats(rows * n_heads * D, -1, 1), bias = random_floats(rows * H * cap, -1, 0);
    for (const int feature : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << (feature == 1 ? " probs" : " slot bias"));
      const AttentionShape shape{n_heads, H, D, 0.125f, 0.0f, feature == 1 ? 100 : 0};
      std::vector<float> probs_plain(static_cast<std::size_t>(rows * H * cap), 0.0f), probs_grouped = probs_plain;
      AttentionDecodeArgs a{.shape = shape, .q = q.data(), .k_cache = kc.data(), .v_cache = vc.data(),
                            .capacity = cap, .lens = lens_by_row, .cache_dtype = t,
                            .slot_bias = feature == 2 ? bias.data() : nullptr};
      std::vector<float> plain(q.size(), kNaN), grouped(q.size(), kNaN);
      a.out = plain.data();
      a.probs = feature == 1 ? probs_plain.data() : nullptr;
      be->attention_decode(a);
      a.shared_prefixes = c.prefixes;
      a.prefix_of = prefix_by_row;
      a.out = grouped.data();
      a.probs = feature == 1 ? probs_grouped.data() : nullptr;
      ASSERT_FALSE(shared_prefix_applies(a));
      be->attention_decode(a);
      for (std::size_t i = 0; i < plain.size(); ++i) ASSERT_EQ(std::bit_cast<std::uint32_t>(grouped[i]), std::bit_cast<std::uint32_t>(plain[i])) << i;
      EXPECT_EQ(probs_grouped, probs_plain);
    }
  }
}

using DecodeRuns = SeededTest;

// Runs of a prompt's rows among a decode call's queries (kernels/decode_runs.h: consecutive
// queries on one cache row, lens up by one) are computed as prefill tiles. Against each query
// read alone (a call of one query, the per-query loops), in every cache dtype, GQA and MHA, head
// dims on and off the vector widths, with a soft cap and a window: a run of 70 after 100 cached
// slots (a tile of 64 and one of 6), one of 20 from position 0, one of 5 (below the run length:
// per query) and decode rows between them. Then the same runs as members of shared prefixes,
// held apart (row_base) and copied into their rows, whose own slots below the prefix hold NaN
// bytes that a tile must not read.
TEST_F(DecodeRuns, TilesMatchQueriesReadAlone) {
  auto be = make_cpu_backend();
  struct Run {
    std::int64_t row, first_len, n;
  };
  const std::vector<Run> runs = {{0, 40, 1}, {2, 101, 70}, {1, 7, 1}, {3, 1, 20}, {4, 30, 5}, {5, 250, 1}};
  std::vector<std::int64_t> rows, lens;
  for (const Run& r : runs)
    for (std::int64_t i = 0; i < r.n; ++i) {
      rows.push_back(r.row);
      lens.push_back(r.first_len + i);
    }
  const auto B = static_cast<std::int64_t>(lens.size());
  const std::int64_t n_rows = 6, cap = 256;
  for (const DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8, DType::Q4G32})
    for (const auto& [n_heads, H] : {std::pair<std::int64_t, std::int64_t>{9, 3}, {4, 4}})
      for (const std::int64_t D : {20, 64})
        for (const std::int64_t window : {0, 50}) {
          const float softcap = window > 0 ? 5.0f : 0.0f;
          const AttentionShape shape{n_heads, H, D, 1.0f / std::sqrt(static_cast<float>(D)), softcap, window};
          SCOPED_TRACE(::testing::Message() << dtype_name(t) << " heads " << n_heads << "/" << H << " head_dim " << D
                                            << " window " << window);
          const std::vector<std::uint8_t> kc = stored_rows(random_floats(n_rows * H * cap * D, -2, 2), t, n_rows * H * cap, D);
          const std::vector<std::uint8_t> vc = stored_rows(random_floats(n_rows * H * cap * D, -2, 2), t, n_rows * H * cap, D);
          const std::vector<float> q = random_floats(B * n_heads * D, -1, 1);
          AttentionDecodeArgs a{.shape = shape, .q = q.data(), .k_cache = kc.data(), .v_cache = vc.data(),
                                .capacity = cap, .lens = lens, .cache_dtype = t, .cache_rows = rows};
          std::vector<float> got(q.size(), kNaN), alone(q.size(), kNaN);
          a.out = got.data();
          be->attention_decode(a);
          for (std::int64_t b = 0; b < B; ++b) {
            AttentionDecodeArgs one = a;
            one.q = q.data() + b * n_heads * D;
            one.out = alone.data() + b * n_heads * D;
            one.lens = std::span(lens).subspan(static_cast<std::size_t>(b), 1);
            one.cache_rows = std::span(rows).subspan(static_cast<std::size_t>(b), 1);
            be->attention_decode(one);
          }
          // Both are fp32 computations of one value (DecodeBlocks' bound on each): a score's dot
          // product over D with |q| <= 1, |k| <= 2, the cap's roundings, then sums over the keys.
          const double score_max = 2 * std::sqrt(static_cast<double>(D));
          const double score_tol = sum_tolerance(kF32Eps, D, score_max) + 4 * kF32Eps * (score_max + 1);
          const double tol = 2 * (2 * score_tol + sum_tolerance(kF32Eps, cap, 2));
          for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], alone[i], tol) << i;
          // The 70-query run as members of a prefix: row 0's first P slots, copied into row 2
          // (read from row 0; row 2's own bytes there NaN), then held apart in a prefix cache with
          // row 2 holding its positions from P on at slot 0 (its slots past them NaN).
          const std::int64_t P = 30, slot = kv_slot_bytes(t, D), head_bytes = cap * slot;
          std::vector<std::int64_t> prefix_of(static_cast<std::size_t>(B), -1), bases(static_cast<std::size_t>(B), 0);
          for (std::int64_t b = 0; b < B; ++b)
            if (rows[static_cast<std::size_t>(b)] == 2) prefix_of[static_cast<std::size_t>(b)] = 0, bases[static_cast<std::size_t>(b)] = P;
          auto row2 = [&](std::vector<std::uint8_t>& c, std::int64_t g) { return c.begin() + (2 * H + g) * head_bytes; };
          std::vector<std::uint8_t> kcopy = kc, vcopy = vc;
          for (std::int64_t g = 0; g < H; ++g) {
            std::copy_n(kc.begin() + g * head_bytes, P * slot, row2(kcopy, g));
            std::copy_n(vc.begin() + g * head_bytes, P * slot, row2(vcopy, g));
          }
          AttentionDecodeArgs plain = a;
          plain.k_cache = kcopy.data();
          plain.v_cache = vcopy.data();
          std::vector<float> want(q.size(), kNaN);
          plain.out = want.data();
          be->attention_decode(plain);
          const std::vector<SharedPrefix> prefixes = {{0, P}};
          std::vector<std::uint8_t> kheld = kcopy, vheld = vcopy;
          for (std::int64_t g = 0; g < H; ++g)
            for (auto* c : {&kcopy, &vcopy}) std::fill_n(row2(*c, g), P * slot, std::uint8_t{0xff});
          AttentionDecodeArgs copied = plain;
          copied.k_cache = kcopy.data();
          copied.v_cache = vcopy.data();
          copied.shared_prefixes = prefixes;
          copied.prefix_of = prefix_of;
          std::vector<float> from_copies(q.size(), kNaN);
          copied.out = from_copies.data();
          be->attention_decode(copied);
          for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(from_copies[i], want[i], tol) << "copied " << i;
          std::vector<std::uint8_t> pk(static_cast<std::size_t>(H * head_bytes), 0xff), pv = pk;
          for (std::int64_t g = 0; g < H; ++g) {
            std::copy_n(kc.begin() + g * head_bytes, P * slot, pk.begin() + g * head_bytes);
            std::copy_n(vc.begin() + g * head_bytes, P * slot, pv.begin() + g * head_bytes);
            for (auto* c : {&kheld, &vheld}) {
              const auto head = row2(*c, g);
              std::copy(head + P * slot, head + head_bytes, head);
              std::fill(head + head_bytes - P * slot, head + head_bytes, std::uint8_t{0xff});
            }
          }
          AttentionDecodeArgs held = copied;
          held.k_cache = kheld.data();
          held.v_cache = vheld.data();
          held.prefix_cache = {pk.data(), pv.data(), cap};
          held.row_base = bases;
          std::vector<float> from_held(q.size(), kNaN);
          held.out = from_held.data();
          be->attention_decode(held);
          for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(from_held[i], want[i], tol) << "held " << i;
        }
}

// Shared prefixes are checked on every backend: a member longer than its query, a prefix_of
// entry naming none, or one entry short.
TEST_F(SharedPrefixDecode, RejectsMalformedGroups) {
  auto be = make_cpu_backend();
  const AttentionShape shape{2, 1, 8, 0.35f};
  const std::vector<float> kc(2 * 16 * 8, 0.5f), vc(2 * 16 * 8, 0.25f), q(2 * 2 * 8, 0.1f);
  std::vector<float> out(q.size());
  const std::vector<std::int64_t> lens = {5, 9};
  auto call = [&](std::vector<SharedPrefix> prefixes, std::vector<std::int64_t> prefix_of) {
    be->attention_decode({.shape = shape, .q = q.data(), .k_cache = kc.data(), .v_cache = vc.data(), .capacity = 16,
                          .lens = lens, .out = out.data(), .shared_prefixes = prefixes, .prefix_of = prefix_of});
  };
  EXPECT_NO_THROW(call({{1, 5}}, {0, 0}));
  EXPECT_THROW(call({{1, 6}}, {0, 0}), std::invalid_argument);
  EXPECT_THROW(call({{1, 5}}, {0, 1}), std::out_of_range);
  EXPECT_THROW(call({{1, 5}}, {0}), std::invalid_argument);
  EXPECT_THROW(call({{-1, 5}}, {0, 0}), std::out_of_range);
}

// A row that starts after its prefix (row_base) is read only through that prefix: a base that
// is not the query's prefix's len, a base without a prefix, with probs (per cache row), or one
// entry short is refused; so is a prefix cache without values, or a prefix past its capacity.
TEST_F(SharedPrefixDecode, RejectsMalformedRowBases) {
  auto be = make_cpu_backend();
  const std::vector<float> kc(2 * 16 * 8, 0.5f), vc(2 * 16 * 8, 0.25f), pk(4 * 8, 0.5f), q(2 * 2 * 8, 0.1f);
  std::vector<float> out(q.size()), probs(2 * 16);
  const std::vector<std::int64_t> lens = {5, 9};
  auto call = [&](std::vector<SharedPrefix> prefixes, std::vector<std::int64_t> prefix_of,
                  std::vector<std::int64_t> bases, float* probs = nullptr, AttentionDecodeArgs::PrefixCache held = {}) {
    be->attention_decode({.shape = {2, 1, 8, 0.35f}, .q = q.data(), .k_cache = kc.data(), .v_cache = vc.data(),
                          .capacity = 16, .lens = lens, .out = out.data(), .probs = probs,
                          .shared_prefixes = prefixes, .prefix_of = prefix_of, .prefix_cache = held, .row_base = bases});
  };
  const AttentionDecodeArgs::PrefixCache held{pk.data(), pk.data(), 4};
  EXPECT_NO_THROW(call({{0, 4}}, {0, 0}, {4, 4}, nullptr, held));
  EXPECT_NO_THROW(call({{1, 4}}, {-1, 0}, {0, 4}));
  EXPECT_THROW(call({{1, 4}}, {0, 0}, {3, 4}), std::invalid_argument);
  EXPECT_THROW(call({{1, 4}}, {-1, 0}, {4, 4}), std::invalid_argument);
  EXPECT_THROW(call({{1, 4}}, {0, 0}, {4, 4}, probs.data()), std::invalid_argument);
  EXPECT_THROW(call({{1, 4}}, {0, 0}, {4}), std::invalid_argument);
  EXPECT_THROW(call({{1, 4}}, {0, 0}, {-1, 0}), std::out_of_range);
  EXPECT_THROW(call({{0, 5}}, {0, 0}, {5, 5}, nullptr, held), std::out_of_range);
  EXPECT_THROW(call({{0, 4}}, {0, 0}, {4, 4}, nullptr, {pk.data(), nullptr, 4}), std::invalid_argument);
}

}  // namespace
}  // namespace flexh2o::kernels
