// The model's rates kept for later runs (engine/job/model_rates.h): a slow pass does not set them.
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "engine/job/model_rates.h"

namespace flexh2o::job {
namespace {

// One pass's rates, every rate scaled by `speed` (0.5: a pass with a core taken away).
ModelRates pass_at(double speed) {
  ModelRates r;
  r.units.layer_by_rows = {{1, 13e9 * speed}, {4, 17e9 * speed}, {64, 25e9 * speed}, {256, 32e9 * speed}};
  r.units.head_by_rows = {{1, 23e9 * speed}, {64, 60e9 * speed}};
  r.attn_decode_by_len = {{64, 15e9 * speed}, {1024, 14e9 * speed}};
  r.attn_read_share = speed;  // tells which pass's share was kept
  r.host_row = 0.7e-6 / speed;
  return r;
}

// Passes at these speeds in turn; counts the passes taken.
struct Passes {
  std::vector<double> speeds;
  int taken = 0;
  ModelRates operator()() { return pass_at(speeds.at(static_cast<std::size_t>(taken++))); }
};

TEST(ModelRates, AHalfSpeedFirstPassIsMeasuredAgainAndLeftOut) {
  Passes passes{{0.5, 1.0, 1.0}};
  const ModelRates r = faster_of_passes(std::ref(passes));
  EXPECT_EQ(passes.taken, 3);  // the two passes disagree: a third
  EXPECT_DOUBLE_EQ(r.units.layer_by_rows.back().second, 32e9);
  EXPECT_DOUBLE_EQ(r.units.head_by_rows.front().second, 23e9);
  EXPECT_DOUBLE_EQ(r.attn_decode_by_len.back().second, 14e9);
  EXPECT_DOUBLE_EQ(r.attn_read_share, 1.0);
  EXPECT_DOUBLE_EQ(r.host_row, 0.7e-6);
}

TEST(ModelRates, ASlowPointInOnePassIsTakenFromTheOther) {
  ModelRates slow_layers = pass_at(1.0);
  slow_layers.units.layer_by_rows[2].second /= 2;  // one point of the first pass disturbed
  int taken = 0;
  const ModelRates r = faster_of_passes([&] { return taken++ == 0 ? slow_layers : pass_at(1.0); });
  EXPECT_EQ(taken, 3);
  EXPECT_DOUBLE_EQ(r.units.layer_by_rows[2].second, 25e9);
}

TEST(ModelRates, TwoPassesThatAgreeAreEnough) {
  Passes passes{{1.0, 0.9}};
  const ModelRates r = faster_of_passes(std::ref(passes));
  EXPECT_EQ(passes.taken, 2);
  EXPECT_DOUBLE_EQ(r.units.layer_by_rows.front().second, 13e9);
  EXPECT_DOUBLE_EQ(r.attn_read_share, 1.0);
}

}  // namespace
}  // namespace flexh2o::job
