// The CUDA backend's choice of decode queries for its tensor-core kernel (kernels/cuda/
// decode_runs.h), without a GPU: runs of one cache row with lens growing by one become whole
// tiles, everything else stays a single query, each query exactly once; and the one predicate
// that sends a call to the decode kernel instead.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/decode_runs.h"
#include "tests/kernels/seeded_test.h"

namespace flexh2o::kernels::cuda {
namespace {

TEST(KernelDecodeRuns, SplitsAChunkBetweenDecodeRows) {
  // A decode row, a 5-query chunk of row 2 after 10 slots, a run of 2 on row 0, the same row 0
  // again with a gap in its lens, and row 3's queries whose lens grow by one but change row.
  const std::vector<std::int64_t> rows = {1, 2, 2, 2, 2, 2, 0, 0, 0, 4, 3};
  const std::vector<std::int64_t> lens = {7, 11, 12, 13, 14, 15, 3, 4, 9, 10, 11};
  const DecodeQuerySplit s = split_decode_queries(rows, lens, 2, 3);
  const std::vector<RunTile> tiles = {{1, 3, 2, 10}, {4, 2, 2, 13}, {6, 2, 0, 2}};
  EXPECT_EQ(s.tiles, tiles);
  EXPECT_EQ(s.singles, (std::vector<std::int64_t>{0, 8, 9, 10}));
  // Runs below min_run stay singles; without cache_rows every query is one.
  const DecodeQuerySplit longer = split_decode_queries(rows, lens, 3, 64);
  EXPECT_EQ(longer.tiles, (std::vector<RunTile>{{1, 5, 2, 10}}));
  EXPECT_EQ(longer.singles, (std::vector<std::int64_t>{0, 6, 7, 8, 9, 10}));
  const DecodeQuerySplit none = split_decode_queries({}, lens, 2, 64);
  EXPECT_TRUE(none.tiles.empty());
  EXPECT_EQ(none.singles.size(), lens.size());
}

class KernelDecodeRunsRandom : public SeededTest {};

// The longest run of consecutive queries through q (same row, lens up by one), by definition.
std::int64_t run_through(const std::vector<std::int64_t>& rows, const std::vector<std::int64_t>& lens, std::size_t q) {
  std::size_t lo = q, hi = q;
  while (lo > 0 && rows[lo - 1] == rows[lo] && lens[lo - 1] + 1 == lens[lo]) --lo;
  while (hi + 1 < lens.size() && rows[hi + 1] == rows[hi] && lens[hi] + 1 == lens[hi + 1]) ++hi;
  return static_cast<std::int64_t>(hi - lo + 1);
}

// Random calls of chunks (1 to 200 queries after 0 to 1000 slots, on rows that may repeat) and
// decode rows: every query lands once, in a tile of its run when the run is long enough.
TEST_F(KernelDecodeRunsRandom, EveryQueryOnceAndTilesAreRuns) {
  constexpr std::int64_t kMin = 8, kTile = 64;
  for (int call = 0; call < 200; ++call) {
    std::vector<std::int64_t> rows, lens;
    const std::int64_t pieces = random_int(1, 12);
    for (std::int64_t p = 0; p < pieces; ++p) {
      const std::int64_t row = random_int(0, 3), prefix = random_int(0, 1000);
      const std::int64_t n = random_int(0, 1) ? random_int(1, 200) : 1;
      for (std::int64_t i = 0; i < n; ++i) {
        rows.push_back(row);
        lens.push_back(prefix + 1 + i);
      }
    }
    const DecodeQuerySplit s = split_decode_queries(rows, lens, kMin, kTile);
    std::vector<int> seen(lens.size(), 0);
    for (const RunTile& t : s.tiles) {
      ASSERT_GE(t.rows, 1);
      ASSERT_LE(t.rows, kTile);
      EXPECT_EQ(t.cache_row, rows[static_cast<std::size_t>(t.first)]);
      EXPECT_EQ(t.position, lens[static_cast<std::size_t>(t.first)] - 1);
      for (std::int64_t i = 0; i < t.rows; ++i) {
        const auto q = static_cast<std::size_t>(t.first + i);
        ++seen[q];
        EXPECT_EQ(rows[q], t.cache_row);
        EXPECT_EQ(lens[q], t.position + 1 + i);  // query i of the tile sees one slot more than i - 1
        EXPECT_GE(run_through(rows, lens, q), kMin);
      }
      // A tile shorter than kTile ends its run.
      const auto end = static_cast<std::size_t>(t.first + t.rows);
      if (t.rows < kTile && end < lens.size()) {
        EXPECT_FALSE(rows[end] == t.cache_row && lens[end] == t.position + 1 + t.rows);
      }
    }
    for (const std::int64_t q : s.singles) {
      ++seen[static_cast<std::size_t>(q)];
      EXPECT_LT(run_through(rows, lens, static_cast<std::size_t>(q)), kMin);
    }
    for (std::size_t q = 0; q < seen.size(); ++q) ASSERT_EQ(seen[q], 1) << "query " << q;
  }
}

TEST(KernelDecodeRuns, FallbackPredicate) {
  alignas(16) static float q[64], out[64];
  alignas(16) static std::uint16_t k[64], v[64];
  const std::vector<std::int64_t> rows = {0, 0}, lens = {1, 2};
  const AttentionDecodeArgs base{.shape = {4, 2, 64, 0.125f}, .q = q, .k_cache = k, .v_cache = v, .capacity = 2,
                                 .lens = lens, .out = out, .cache_dtype = DType::F16, .cache_rows = rows,
                                 .compute = DType::BF16};
  EXPECT_TRUE(decode_runs_on_tensor_cores(base));
  for (const std::int64_t d : {64, 80, 96, 128, 256}) {
    AttentionDecodeArgs a = base;
    a.shape.head_dim = d;
    EXPECT_TRUE(decode_runs_on_tensor_cores(a)) << "head_dim " << d;
  }
  AttentionDecodeArgs bf16 = base;
  bf16.cache_dtype = DType::BF16;
  EXPECT_TRUE(decode_runs_on_tensor_cores(bf16));
  float bias[4];
  const std::vector<void (*)(AttentionDecodeArgs&)> fallbacks = {
      [](AttentionDecodeArgs& a) { a.compute = DType::F32; },
      [](AttentionDecodeArgs& a) { a.cache_dtype = DType::F32; },
      [](AttentionDecodeArgs& a) { a.cache_dtype = DType::Q8; },
      [](AttentionDecodeArgs& a) { a.cache_dtype = DType::Q4; },
      [](AttentionDecodeArgs& a) { a.shape.head_dim = 72; },
      [](AttentionDecodeArgs& a) { a.shape.head_dim = 512; },
      [](AttentionDecodeArgs& a) { a.cache_rows = {}; },
      [](AttentionDecodeArgs& a) { a.probs = out; },
      [](AttentionDecodeArgs& a) { a.q = q + 1; },
      [](AttentionDecodeArgs& a) { a.k_cache = k + 1; },
      [](AttentionDecodeArgs& a) { a.v_cache = v + 4; },
      [](AttentionDecodeArgs& a) { a.out = out + 1; }};
  for (std::size_t i = 0; i < fallbacks.size(); ++i) {
    AttentionDecodeArgs a = base;
    fallbacks[i](a);
    EXPECT_FALSE(decode_runs_on_tensor_cores(a)) << "fallback " << i;
  }
  AttentionDecodeArgs biased = base;
  biased.slot_bias = bias;
  EXPECT_FALSE(decode_runs_on_tensor_cores(biased));
}

}  // namespace
}  // namespace flexh2o::kernels::cuda
