// Data-parallel bookkeeping without MPI: rank 0's queue deals whole groups in the job's order,
// and a rank's hand gives its dealt requests to a runner whose queue cursor only moves forward.
#include "engine/distributed/sharding.h"

#include <gtest/gtest.h>

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
