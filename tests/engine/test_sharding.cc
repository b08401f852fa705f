// Data-parallel bookkeeping without MPI: rank 0's queue deals whole groups in the job's order
// (or, with prompts, those sharing a prefix to the runner that took it, never stranding one),
// and a rank's hand gives its dealt requests to a runner whose queue cursor only moves forward.
#include "engine/distributed/sharding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace flexh2o::distributed {
namespace {

using Indices = std::vector<std::size_t>;

TEST(Sharding, DealQueueDealsWholeGroupsInOrder) {
  // Requests 1-3 are one OpenAI line's three choices, 5-6 another's.
  DealQueue q({true, true, false, false, true, true, false, true});
  EXPECT_EQ(q.size(), 8u);
  EXPECT_EQ(q.deal(1), (Indices{0}));
  EXPECT_EQ(q.deal(1), (Indices{1, 2, 3}));  // a group is never split
  EXPECT_EQ(q.deal(2), (Indices{4, 5, 6}));
  EXPECT_EQ(q.dealt(), 7u);
  EXPECT_EQ(q.deal(5), (Indices{7}));  // fewer when the queue runs out
  EXPECT_TRUE(q.deal(1).empty());
  EXPECT_TRUE(DealQueue({}).deal(3).empty());
  // The first request begins a group even when the flags say otherwise (a resumed job).
  EXPECT_EQ(DealQueue({false, false, true}).deal(1), (Indices{0, 1}));
}

// Prompts behind 20-token prefixes: request i has prefix families[i], and its own two-token item.
std::vector<std::vector<std::int32_t>> prompts_of(const std::vector<int>& families) {
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::size_t i = 0; i < families.size(); ++i) {
    std::vector<std::int32_t> p;
    for (int t = 0; t < 20; ++t) p.push_back(1000 * families[i] + t);
    p.push_back(50000 + static_cast<std::int32_t>(i));
    p.push_back(60000 + static_cast<std::int32_t>(i));
    prompts.push_back(std::move(p));
  }
  return prompts;
}

// `prefixes` prefixes interleaved: request i has prefix i % prefixes.
std::vector<std::vector<std::int32_t>> interleaved_prompts(int requests, int prefixes) {
  std::vector<int> families;
  for (int i = 0; i < requests; ++i) families.push_back(i % prefixes);
  return prompts_of(families);
}

PrefixDealing prefer(const std::vector<std::vector<std::int32_t>>& prompts, std::size_t recent,
                     std::size_t lookahead = 64) {
  PrefixDealing d;
  for (const auto& p : prompts) d.prompts.emplace_back(p);
  d.min_tokens = 16;
  d.recent = recent;
  d.lookahead = lookahead;
  return d;
}

// Two prefixes over two runners: each runner takes one, in the job's order; the first waiting
// request is passed over only while the other runner may still take it.
TEST(Sharding, DealsEachPrefixToOneRunner) {
  const auto prompts = interleaved_prompts(8, 2);  // A B A B A B A B: A to runner 0, B to 1
  DealQueue q(std::vector<bool>(8, true), 2, prefer(prompts, 4));
  EXPECT_EQ(q.deal(3, 1), (Indices{1, 3, 5}));
  EXPECT_EQ(q.deal(1, 0), (Indices{0}));
  EXPECT_EQ(q.deal(2, 0), (Indices{2, 4}));
  EXPECT_EQ(q.deal(2, 1), (Indices{7}));  // none of its own left, nothing after it
  EXPECT_EQ(q.deal(1, 0), (Indices{6}));
  EXPECT_TRUE(q.deal(1, 0).empty());
  EXPECT_TRUE(q.deal(1, 1).empty());
  EXPECT_EQ(q.dealt(), 8u);
}

// Families go to runners by their requests, the largest first, so that the shares are even:
// A (5 requests) to runner 0, B (3) then C (2) to runner 1. Within the window of the queue's
// first waiting groups only.
TEST(Sharding, GivesFamiliesToRunnersEvenly) {
  const auto prompts = prompts_of({0, 1, 0, 2, 0, 1, 0, 2, 0, 1});
  DealQueue q(std::vector<bool>(10, true), 2, prefer(prompts, 4));
  EXPECT_EQ(q.deal(5, 1), (Indices{1, 3, 5, 7, 9}));
  EXPECT_EQ(q.deal(5, 0), (Indices{0, 2, 4, 6, 8}));

  const auto window = prompts_of({0, 1, 1, 1, 0});  // A B B B A: B to runner 0, A to 1
  for (const std::size_t lookahead : {3u, 4u}) {
    DealQueue w(std::vector<bool>(5, true), 2, prefer(window, 4, lookahead));
    EXPECT_EQ(w.deal(1, 1), (Indices{0}));
    // Its A at 4 is the fourth waiting group: beyond a window of three.
    EXPECT_EQ(w.deal(1, 1), (Indices{lookahead == 3 ? 1u : 4u}));
  }
}

TEST(Sharding, PrefixesShorterThanTheMinimumDealInOrder) {
  auto prompts = interleaved_prompts(4, 2);
  PrefixDealing d = prefer(prompts, 4);
  d.min_tokens = 21;  // the prompts share 20 tokens
  DealQueue q(std::vector<bool>(4, true), 2, d);
  EXPECT_EQ(q.deal(2, 1), (Indices{0, 1}));
  EXPECT_EQ(q.deal(2, 0), (Indices{2, 3}));
  // Without prompts: the job's order, whatever the runner.
  DealQueue plain(std::vector<bool>(4, true), 2);
  EXPECT_EQ(plain.deal(1, 1), (Indices{0}));
  EXPECT_EQ(plain.deal(1, 0), (Indices{1}));
}

// Three prefixes over two runners: A and C to runner 0, B to runner 1, which passes over the
// others while runner 0 may take them; runner 0 then takes what is left in order.
TEST(Sharding, PassesOverARequestOnlyWhileAnotherRunnerMayTakeIt) {
  const auto prompts = interleaved_prompts(6, 3);  // A B C A B C
  DealQueue q(std::vector<bool>(6, true), 2, prefer(prompts, 4));
  EXPECT_EQ(q.deal(2, 1), (Indices{1, 4}));
  EXPECT_EQ(q.deal(3, 0), (Indices{0, 2, 3}));  // runner 1 is past them
  EXPECT_EQ(q.deal(3, 0), (Indices{5}));
  EXPECT_TRUE(q.deal(1, 1).empty());  // nothing after its last
  EXPECT_TRUE(q.deal(1, 0).empty());
}

// Runners asking in a fixed pseudo-random order, until each is dealt none: every request is
// dealt once, whole groups, and each runner's requests in the job's order.
TEST(Sharding, EveryRequestIsDealtOnceInEachRunnersOrder) {
  for (int prefixes : {1, 2, 3, 5}) {
    const auto prompts = interleaved_prompts(40, prefixes);
    std::vector<bool> starts(40, true);
    for (std::size_t i = 3; i < starts.size(); i += 7) starts[i] = false;  // some groups of two
    DealQueue q(starts, 3, prefer(prompts, 3));
    std::vector<Indices> got(3);
    std::vector<bool> done(3, false);
    unsigned seed = 7;
    while (!(done[0] && done[1] && done[2])) {
      seed = seed * 1103515245u + 12345u;
      const auto r = static_cast<int>((seed >> 16) % 3);
      if (done[static_cast<std::size_t>(r)]) continue;
      const Indices d = q.deal(1 + (seed >> 8) % 3, r);
      if (d.empty()) {
        done[static_cast<std::size_t>(r)] = true;
        continue;
      }
      EXPECT_TRUE(starts[d.front()]) << "a group split";
      for (std::size_t i : d) got[static_cast<std::size_t>(r)].push_back(i);
    }
    Indices all;
    for (const Indices& g : got) {
      EXPECT_TRUE(std::ranges::is_sorted(g)) << prefixes << " prefixes";
      all.insert(all.end(), g.begin(), g.end());
    }
    std::ranges::sort(all);
    Indices want(40);
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = i;
    EXPECT_EQ(all, want) << prefixes << " prefixes";
  }
}

TEST(Sharding, HandGivesTheFirstHeldAtOrAfterTheCursor) {
  Hand h;
  EXPECT_FALSE(h.next(0));
  h.add(Indices{2, 5});
  EXPECT_EQ(h.next(0), 2u);
  EXPECT_EQ(h.next(2), 2u);  // the same until the cursor passes it
  EXPECT_EQ(h.next(3), 5u);
  EXPECT_EQ(h.size(), 1u);
  h.add(Indices{9});
  EXPECT_EQ(h.next(6), 9u);
  EXPECT_FALSE(h.next(10));
  EXPECT_THROW(h.add(Indices{8}), std::logic_error);  // dealt out of order
  EXPECT_THROW(h.add(Indices{9}), std::logic_error);
}

}  // namespace
}  // namespace flexh2o::distributed
