// The CUDA backend's layout of shared prefixes for its decode kernels (kernels/cuda/
// decode_cascade.h), without a GPU: the prefix tasks read every prefix slot, from the prefix's
// row, once for each member query head, each member reads only its own slots after the prefix,
// and the combine finds exactly the partials the tasks leave, within the scratch bound.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <utility>
#include <tuple>
#include <vector>

#include "kernels/cuda/decode_cascade.h"
#include "tests/kernels/seeded_test.h"

namespace flexh2o::kernels::cuda {
namespace {

// Queries 1 and 3 share prefix 0 (150 slots of row 5); query 4's prefix has no slots, so it
// reads its row whole as queries 0 and 2 do. Two kv heads of three query heads each.
TEST(KernelDecodeCascade, LaysOutOnePrefix) {
  const std::vector<std::int64_t> lens = {7, 150, 9, 200, 3}, prefix_of = {-1, 0, -1, 0, 1};
  const std::vector<SharedPrefix> prefixes = {{5, 150}, {2, 0}};
  const AttentionDecodeArgs a{.shape = {6, 2, 64, 0.125f}, .lens = lens, .shared_prefixes = prefixes,
                              .prefix_of = prefix_of};
  // 12 tasks wanted over one batch of 6 member heads a kv head: up to 6 chunks, but 150 slots
  // are 3 units of 64.
  const CascadeLayout all = plan_cascade(a, {}, 64, 8, 12);
  const std::vector<PrefixTask> tasks = {{5, 0, 0, 64, 0, 0, 6, 0},   {5, 0, 64, 128, 0, 0, 6, 6},
                                         {5, 0, 128, 150, 0, 0, 6, 12}, {5, 1, 0, 64, 0, 0, 6, 18},
                                         {5, 1, 64, 128, 0, 0, 6, 24}, {5, 1, 128, 150, 0, 0, 6, 30}};
  EXPECT_EQ(all.tasks, tasks);
  EXPECT_EQ(all.member_queries, (std::vector<std::int64_t>{1, 3}));
  EXPECT_EQ(all.refs, (std::vector<PrefixRef>{{}, {0, 3, 6, 18}, {}, {3, 3, 6, 18}, {}}));
  EXPECT_EQ(all.suffix_start, (std::vector<std::int64_t>{0, 150, 0, 150, 0}));
  EXPECT_EQ(all.partials, 36);
  EXPECT_TRUE(reads_in_cascade(a));
  const std::vector<std::int64_t> no_slots = {-1, 1, -1, 1, 1};  // prefix 1 has none
  AttentionDecodeArgs none = a;
  none.prefix_of = no_slots;
  EXPECT_FALSE(reads_in_cascade(none));
  EXPECT_TRUE(plan_cascade(none, {}, 64, 8, 12).tasks.empty());
  // Two tasks wanted: one chunk of three units per kv head. Kernel queries 3, 4, 1 of the call.
  const std::vector<std::int64_t> queries = {3, 4, 1};
  const CascadeLayout some = plan_cascade(a, queries, 64, 8, 2);
  EXPECT_EQ(some.tasks, (std::vector<PrefixTask>{{5, 0, 0, 150, 0, 0, 6, 0}, {5, 1, 0, 150, 0, 0, 6, 6}}));
  EXPECT_EQ(some.member_queries, (std::vector<std::int64_t>{3, 1}));
  EXPECT_EQ(some.refs, (std::vector<PrefixRef>{{0, 1, 6, 6}, {}, {3, 1, 6, 6}}));
  EXPECT_EQ(some.suffix_start, (std::vector<std::int64_t>{150, 0, 150}));
}

// LaysOutOnePrefix's call under a sliding window of 40: query 1 sees from 110 (the prefix from
// the unit at 64 on, two chunks), query 3 from 160 (none of the prefix, past it in its own row).
TEST(KernelDecodeCascade, LaysOutWhatTheWindowsSee) {
  const std::vector<std::int64_t> lens = {7, 150, 9, 200, 3}, prefix_of = {-1, 0, -1, 0, 1};
  const std::vector<SharedPrefix> prefixes = {{5, 150}, {2, 0}};
  AttentionDecodeArgs a{.shape = {6, 2, 64, 0.125f, 0.0f, 40}, .lens = lens, .shared_prefixes = prefixes,
                        .prefix_of = prefix_of};
  EXPECT_TRUE(reads_in_cascade(a));
  const CascadeLayout all = plan_cascade(a, {}, 64, 8, 12);
  EXPECT_EQ(all.tasks, (std::vector<PrefixTask>{{5, 0, 64, 128, 0, 0, 6, 0},
                                                {5, 0, 128, 150, 0, 0, 6, 6},
                                                {5, 1, 64, 128, 0, 0, 6, 12},
                                                {5, 1, 128, 150, 0, 0, 6, 18}}));
  EXPECT_EQ(all.member_queries, (std::vector<std::int64_t>{1, 3}));
  EXPECT_EQ(all.member_first, (std::vector<std::int64_t>{110, 160}));
  EXPECT_EQ(all.refs, (std::vector<PrefixRef>{{}, {0, 2, 6, 12}, {}, {3, 2, 6, 12}, {}}));
  EXPECT_EQ(all.suffix_start, (std::vector<std::int64_t>{0, 150, 0, 160, 0}));
  EXPECT_EQ(all.partials, 24);
  // Query 3 alone in the group: no window reaches the prefix, which has no tasks.
  const std::vector<std::int64_t> alone = {-1, -1, -1, 0, 1};
  a.prefix_of = alone;
  const CascadeLayout unseen = plan_cascade(a, {}, 64, 8, 12);
  EXPECT_TRUE(unseen.tasks.empty());
  EXPECT_EQ(unseen.refs[3], PrefixRef{});
  EXPECT_EQ(unseen.suffix_start, (std::vector<std::int64_t>{0, 110, 0, 160, 0}));  // query 1: its window's first
  EXPECT_EQ(unseen.partials, 0);
}

// 25 members of 3 query heads a kv head: 75 member heads in batches of 8, the last of 3 (a
// member's heads may span two batches).
TEST(KernelDecodeCascade, BatchesManyMembers) {
  std::vector<std::int64_t> lens(25, 70), prefix_of(25, 0);
  const std::vector<SharedPrefix> prefixes = {{0, 64}};
  const AttentionDecodeArgs a{.shape = {3, 1, 64, 0.125f}, .lens = lens, .shared_prefixes = prefixes,
                              .prefix_of = prefix_of};
  const CascadeLayout layout = plan_cascade(a, {}, 64, 8, 1);
  ASSERT_EQ(layout.tasks.size(), 10u);
  EXPECT_EQ(layout.tasks[1], (PrefixTask{0, 0, 0, 64, 0, 8, 8, 8}));
  EXPECT_EQ(layout.tasks[9], (PrefixTask{0, 0, 0, 64, 0, 72, 3, 72}));
  EXPECT_EQ(layout.refs[10], (PrefixRef{30, 1, 75, 75}));
}

class KernelDecodeCascadeRandom : public SeededTest {};

// Random calls (1 to 3 kv heads of 1 to 4 query heads, 0 to 3 prefixes of 0 to 1000 slots,
// members with 0 to 40 slots of their own, queries with none, random subsets, batches of 1 to 9
// member heads, half under a sliding window of 1 to 1200): every (query, query head, slot its
// window sees below its len) is read exactly once, a prefix slot through the prefix's row by a
// task that has the query as a member (which masks the slots before the member's window), any
// other slot through the query's own row; and the combine's refs name exactly the partials the
// tasks write, each written once.
TEST_F(KernelDecodeCascadeRandom, EverySlotOnceAndEveryPartialOnce) {
  for (int call = 0; call < 300; ++call) {
    const std::int64_t Hkv = random_int(1, 3), group = random_int(1, 4), H = Hkv * group;
    std::vector<SharedPrefix> prefixes(static_cast<std::size_t>(random_int(0, 3)));
    for (std::size_t i = 0; i < prefixes.size(); ++i) prefixes[i] = {random_int(0, 40), random_int(0, 1000)};
    std::vector<std::int64_t> lens, prefix_of;
    for (std::int64_t q = random_int(1, 40); q > 0; --q) {
      const std::int64_t i = random_int(-1, static_cast<std::int64_t>(prefixes.size()) - 1);
      prefix_of.push_back(i);
      const std::int64_t own = i >= 0 ? prefixes[static_cast<std::size_t>(i)].len : 1;
      lens.push_back(own + random_int(0, 40));
    }
    std::vector<std::int64_t> queries;
    if (random_int(0, 1))
      for (std::int64_t q = 0; q < static_cast<std::int64_t>(lens.size()); ++q)
        if (random_int(0, 1)) queries.push_back(q);
    const std::int64_t unit = std::int64_t{4} << random_int(0, 4), batch_heads = random_int(1, 9);
    const std::int64_t window = random_int(0, 1) ? random_int(1, 1200) : 0;
    const AttentionDecodeArgs a{.shape = {H, Hkv, 64, 0.125f, 0.0f, window}, .lens = lens,
                                .shared_prefixes = prefixes, .prefix_of = prefix_of};
    auto first_seen = [&](std::int64_t q) { return first_visible(lens[static_cast<std::size_t>(q)] - 1, window); };
    const CascadeLayout layout = plan_cascade(a, queries, unit, batch_heads, random_int(1, 2000));
    SCOPED_TRACE(::testing::Message() << "call " << call << " window " << window);
    const std::size_t n = queries.empty() ? lens.size() : queries.size();
    auto query_of = [&](std::size_t b) { return queries.empty() ? static_cast<std::int64_t>(b) : queries[b]; };
    ASSERT_EQ(layout.refs.size(), n);
    ASSERT_EQ(layout.suffix_start.size(), n);
    // reads[(call query, query head, slot)]; written[partial] = (call query, query head).
    std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, int> reads;
    std::map<std::int64_t, std::pair<std::int64_t, std::int64_t>> written;
    for (const PrefixTask& task : layout.tasks) {
      ASSERT_LT(task.first, task.end);
      ASSERT_EQ(task.first % unit, 0);  // chunks of whole units
      ASSERT_GE(task.heads, 1);
      ASSERT_LE(task.heads, batch_heads);
      for (std::int64_t i = 0; i < task.heads; ++i) {
        const std::int64_t mh = task.heads_first + i, h = task.kv_head * group + mh % group;
        const auto member = static_cast<std::size_t>(task.members_first + mh / group);
        const std::int64_t q = layout.member_queries[member];
        ASSERT_EQ(layout.member_first[member], first_seen(q));
        const SharedPrefix& p = prefixes[static_cast<std::size_t>(prefix_of[static_cast<std::size_t>(q)])];
        ASSERT_EQ(task.row, p.row);  // the prefix's row, not the member's
        ASSERT_LE(task.end, p.len);
        for (std::int64_t s = std::max(task.first, first_seen(q)); s < task.end; ++s) ++reads[{q, h, s}];
        ASSERT_TRUE(written.emplace(task.partials + i, std::pair{q, h}).second);
      }
    }
    for (std::size_t b = 0; b < n; ++b) {
      const std::int64_t q = query_of(b);
      const PrefixRef& ref = layout.refs[b];
      const std::int64_t start = layout.suffix_start[b];
      EXPECT_EQ(start, prefix_member(a, q) ? std::max(prefixes[static_cast<std::size_t>(prefix_of[static_cast<std::size_t>(q)])].len, first_seen(q))
                                           : first_seen(q));
      if (!prefix_member(a, q)) {
        EXPECT_EQ(ref.chunks, 0);
      }
      EXPECT_LE(ref.chunks, kCascadeMaxChunks);
      for (std::int64_t h = 0; h < H; ++h) {
        for (std::int64_t s = start; s < lens[static_cast<std::size_t>(q)]; ++s) ++reads[{q, h, s}];
        for (std::int64_t c = 0; c < ref.chunks; ++c) {
          const std::int64_t at = ref.first + (h / group) * ref.kv_stride + c * ref.chunk_stride + h % group;
          const auto w = written.find(at);
          ASSERT_NE(w, written.end());
          EXPECT_EQ(w->second, std::pair(q, h));
          written.erase(w);
        }
      }
    }
    EXPECT_TRUE(written.empty()) << "partials no ref names";
    std::int64_t expected = 0;
    for (std::size_t b = 0; b < n; ++b) {
      const std::int64_t q = query_of(b);
      expected += H * (lens[static_cast<std::size_t>(q)] - first_seen(q));
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t s = first_seen(q); s < lens[static_cast<std::size_t>(q)]; ++s) ASSERT_EQ((reads[{q, h, s}]), 1);
    }
    EXPECT_EQ(static_cast<std::int64_t>(reads.size()), expected) << "a slot beyond a query's len";
    EXPECT_LE(layout.partials, cascade_partials_bound(a.shape, static_cast<std::int64_t>(n)));
    EXPECT_LE(static_cast<std::int64_t>(layout.tasks.size()),
              cascade_tasks_bound(a.shape, static_cast<std::int64_t>(n), batch_heads));
  }
}

// A tile of a run holding a member goes back to the decode kernel, query by query; other tiles
// stay on tensor cores.
TEST(KernelDecodeCascade, MembersLeaveTheTensorCores) {
  const std::vector<std::int64_t> rows = {0, 0, 0, 1, 1, 1, 2}, lens = {11, 12, 13, 21, 22, 23, 5};
  const std::vector<std::int64_t> prefix_of = {-1, -1, -1, 0, 0, 0, 1};
  const std::vector<SharedPrefix> prefixes = {{1, 20}, {2, 4}};
  const AttentionDecodeArgs a{.shape = {2, 1, 64, 0.125f}, .lens = lens, .cache_rows = rows,
                              .shared_prefixes = prefixes, .prefix_of = prefix_of};
  DecodeQuerySplit split = split_decode_queries(rows, lens, 2, 64);
  ASSERT_EQ(split.tiles.size(), 2u);
  keep_members_off_tiles(a, split);
  EXPECT_EQ(split.tiles, (std::vector<RunTile>{{0, 3, 0, 10}}));
  EXPECT_EQ(split.singles, (std::vector<std::int64_t>{3, 4, 5, 6}));
}

}  // namespace
}  // namespace flexh2o::kernels::cuda
