// ExtentAllocator on random allocate/free sequences: live ranges never overlap, freed space is
// reused (coalesced with its neighbours), and the file shrinks back to nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "offload/extent_allocator.h"

namespace flexh2o::offload {
namespace {

TEST(ExtentAllocator, RandomSequencesKeepRangesDisjointAndShrinkToNothing) {
  std::mt19937_64 rng(std::random_device{}());
  for (int round = 0; round < 20; ++round) {
    ExtentAllocator space;
    std::map<std::int64_t, std::int64_t> live;  // offset -> size
    for (int i = 0; i < 400; ++i) {
      if (live.empty() || rng() % 3 != 0) {
        const std::int64_t size = static_cast<std::int64_t>(1 + rng() % 16) * 4096;
        const std::int64_t off = space.allocate(size);
        ASSERT_GE(off, 0);
        ASSERT_LE(off + size, space.end());
        const auto next = live.lower_bound(off);
        if (next != live.end()) {
          ASSERT_LE(off + size, next->first) << "overlaps the range after it";
        }
        if (next != live.begin()) {
          ASSERT_LE(std::prev(next)->first + std::prev(next)->second, off) << "overlaps the range before it";
        }
        live.emplace(off, size);
      } else {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        space.free(it->first, it->second);
        live.erase(it);
      }
      const std::int64_t last = live.empty() ? 0 : live.rbegin()->first + live.rbegin()->second;
      ASSERT_EQ(space.end(), last) << "the file ends after its last live range";
    }
    for (const auto& [off, size] : live) space.free(off, size);
    EXPECT_EQ(space.end(), 0);
  }
}

TEST(ExtentAllocator, ReusesAFreedGapBeforeGrowing) {
  ExtentAllocator space;
  const std::int64_t a = space.allocate(4096), b = space.allocate(8192), c = space.allocate(4096);
  space.free(b, 8192);
  EXPECT_EQ(space.allocate(4096), b);      // first fit in the gap
  EXPECT_EQ(space.allocate(4096), b + 4096);
  EXPECT_EQ(space.end(), c + 4096);
  space.free(a, 4096);
  space.free(b, 4096);  // coalesces with a's range
  EXPECT_EQ(space.allocate(8192), a);
}

}  // namespace
}  // namespace flexh2o::offload
