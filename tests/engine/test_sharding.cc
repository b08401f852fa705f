// Data-parallel bookkeeping without MPI: dealing prompts to ranks by cost, and putting results
// that finish out of order back into the job's order.
#include "engine/distributed/sharding.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

namespace flexh2o::distributed {
namespace {

TEST(Sharding, DealKeepsRanksBalancedAndInOrder) {
  const std::vector<std::int64_t> equal(7, 10);
  EXPECT_EQ(deal_balanced(equal, 3), (std::vector<int>{0, 1, 2, 0, 1, 2, 0}));
  // A long prompt weighs as much as several short ones: its rank gets no more until the others catch up.
  const std::vector<std::int64_t> costs{100, 10, 10, 10, 10, 10, 60};
  const std::vector<int> owner = deal_balanced(costs, 2);
  EXPECT_EQ(owner, (std::vector<int>{0, 1, 1, 1, 1, 1, 1}));
  std::vector<std::int64_t> load(2, 0);
  for (std::size_t i = 0; i < costs.size(); ++i) load[static_cast<std::size_t>(owner[i])] += costs[i];
  EXPECT_EQ(load[0], 100);
  EXPECT_EQ(load[1], 110);
  EXPECT_EQ(deal_balanced(equal, 1), std::vector<int>(7, 0));
  EXPECT_TRUE(deal_balanced({}, 4).empty());
  EXPECT_THROW(deal_balanced(equal, 0), std::invalid_argument);
}

TEST(Sharding, InOrderReleasesEachTextOnceWhenAllBeforeItArrived) {
  InOrder order(4);
  order.put(2, "c");
  EXPECT_TRUE(order.take_ready().empty());
  order.put(0, "a");
  EXPECT_EQ(order.take_ready(), (std::vector<std::string>{"a"}));
  EXPECT_TRUE(order.take_ready().empty());
  order.put(1, "b");
  order.put(3, "d");
  EXPECT_EQ(order.take_ready(), (std::vector<std::string>{"b", "c", "d"}));
  EXPECT_TRUE(order.complete());
  EXPECT_EQ(order.released(), 4u);
  EXPECT_THROW(order.put(1, "again"), std::logic_error);
  EXPECT_THROW(order.put(4, "past the end"), std::logic_error);
  InOrder twice(2);
  twice.put(1, "x");
  EXPECT_THROW(twice.put(1, "x"), std::logic_error);
}

}  // namespace
}  // namespace flexh2o::distributed
