// TieredTensor: the row split across tiers, budget accounting, data integrity while rows move
// between tiers through the CopyEngine (io_uring and thread-pool disk I/O, direct and staged
// copies), column-band pieces, and faults (budgets, unusable offload dir, disk full, a
// truncated offload file).
#include "offload/tiered_tensor.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "tests/offload/offload_test_util.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "offload/budget.h"
#include "offload/copy_engine.h"
#include "offload/disk_store.h"
#include "offload/tiers.h"

namespace flexh2o::offload {
namespace {

using namespace test_util;

using Bytes = std::vector<unsigned char>;
constexpr std::array<Tier, 3> kAllTiers{Tier::Gpu, Tier::Cpu, Tier::Disk};

std::int64_t disk_charge(std::int64_t bytes) {
  return (bytes + DiskStore::kAlignment - 1) / DiskStore::kAlignment * DiskStore::kAlignment;
}

std::string describe(const TierFractions& f) {
  std::ostringstream s;
  s.precision(17);
  s << f.gpu << "/" << f.cpu << "/" << f.disk;
  return s.str();
}

Bytes read_all(const TieredTensor& t, Staging& staging) {
  Bytes out(static_cast<std::size_t>(t.bytes()), 0xee);
  t.read_rows(0, t.rows(), out.data(), staging);
  return out;
}

// The copies that move rows [r0, r1) of src into the same rows of dst, whatever the tiers of
// either: one pieces() call per dst tier segment, whose memory is contiguous.
std::vector<CopyPiece> rows_between(const TieredTensor& src, const TieredTensor& dst, std::int64_t r0, std::int64_t r1) {
  std::vector<CopyPiece> out;
  for (Tier t : kAllTiers) {
    const auto i = static_cast<std::size_t>(t);
    const std::int64_t lo = std::max(r0, dst.split().begin[i]);
    const std::int64_t hi = std::min(r1, dst.split().end[i]);
    if (lo >= hi) continue;
    const auto p = src.pieces(lo, hi, dst.place(lo), false);
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

// ---- RowSplit / TierFractions ----------------------------------------------------------------

void expect_split(std::int64_t rows, const TierFractions& f, std::int64_t g, std::int64_t c, std::int64_t d) {
  SCOPED_TRACE("rows " + std::to_string(rows) + ", fractions " + describe(f));
  const RowSplit s = RowSplit::of(rows, f);
  EXPECT_EQ(s.rows(Tier::Gpu), g);
  EXPECT_EQ(s.rows(Tier::Cpu), c);
  EXPECT_EQ(s.rows(Tier::Disk), d);
}

TEST(RowSplit, HandPickedCases) {
  expect_split(0, {1, 0, 0}, 0, 0, 0);
  expect_split(0, {0.2, 0.3, 0.5}, 0, 0, 0);
  expect_split(7, {1, 0, 0}, 7, 0, 0);
  expect_split(7, {0, 1, 0}, 0, 7, 0);
  expect_split(7, {0, 0, 1}, 0, 0, 7);
  expect_split(1, {0.5, 0.5, 0}, 1, 0, 0);   // 0.5 rounds away from zero
  expect_split(1, {0.4, 0.2, 0.4}, 0, 1, 0);  // cpu ends at round(0.6) = 1
  expect_split(1, {0.25, 0.25, 0.5}, 0, 1, 0);
  expect_split(3, {0.5, 0, 0.5}, 2, 0, 1);    // gpu round(1.5) = 2
  expect_split(4, {0.125, 0.5, 0.375}, 1, 2, 1);  // round(0.5) = 1, round(2.5) = 3
  expect_split(10, {1.0 / 3, 1.0 / 3, 1.0 / 3}, 3, 4, 3);
  expect_split(2, {0, 0.5, 0.5}, 0, 1, 1);
  expect_split(1000, {0.001, 0.998, 0.001}, 1, 998, 1);
}

TEST(RowSplit, RandomFractionsAreExactToTheRow) {
  std::mt19937_64 rng(20240611);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int i = 0; i < 5000; ++i) {
    const auto rows = static_cast<std::int64_t>(i < 100 ? i : rng() % 100000);
    TierFractions f;
    switch (rng() % 4) {
      case 0: {  // boundaries on exact half rows: the rounding decides
        const auto k = rows > 0 ? static_cast<double>(rng() % static_cast<std::uint64_t>(rows)) : 0.0;
        f.gpu = rows > 0 ? (k + 0.5) / static_cast<double>(rows) : 0.0;
        f.cpu = (1.0 - f.gpu) / 2;
        f.disk = 1.0 - f.gpu - f.cpu;
        break;
      }
      case 1: {  // one tier empty
        const double a = u(rng);
        const int empty = static_cast<int>(rng() % 3);
        f = empty == 0 ? TierFractions{0, a, 1 - a} : empty == 1 ? TierFractions{a, 0, 1 - a} : TierFractions{a, 1 - a, 0};
        break;
      }
      default: {
        double a = u(rng), b = u(rng);
        if (a > b) std::swap(a, b);
        f = {a, b - a, 1 - b};
      }
    }
    SCOPED_TRACE("case " + std::to_string(i) + ": rows " + std::to_string(rows) + ", fractions " + describe(f));
    ASSERT_NO_THROW(f.validate("random"));
    const RowSplit s = RowSplit::of(rows, f);
    // The documented rule: gpu count round(rows * gpu), cpu range ends at round(rows * (gpu + cpu)).
    EXPECT_EQ(s.end[0], std::llround(static_cast<double>(rows) * f.gpu));
    EXPECT_EQ(s.end[1], std::llround(static_cast<double>(rows) * (f.gpu + f.cpu)));
    std::int64_t sum = 0;
    for (Tier t : kAllTiers) {
      const auto k = static_cast<std::size_t>(t);
      EXPECT_GE(s.rows(t), 0) << tier_name(t);
      // Two roundings at most: never more than a row away from the exact share.
      EXPECT_LE(std::abs(static_cast<double>(s.rows(t)) - static_cast<double>(rows) * f.of(t)), 1.0 + 1e-6)
          << tier_name(t);
      if (f.of(t) == 0.0) {
        EXPECT_EQ(s.rows(t), 0) << tier_name(t);
      }
      sum += s.rows(t);
      if (k > 0) {
        EXPECT_EQ(s.begin[k], s.end[k - 1]);
      }
    }
    EXPECT_EQ(s.begin[0], 0);
    EXPECT_EQ(s.end[2], rows);
    EXPECT_EQ(sum, rows);
    EXPECT_LE(std::abs(static_cast<double>(s.rows(Tier::Gpu)) - static_cast<double>(rows) * f.gpu), 0.5);
    if (rows > 0) {
      for (std::int64_t r : {std::int64_t{0}, rows / 2, rows - 1}) {
        const Tier t = s.tier_of(r);
        const auto k = static_cast<std::size_t>(t);
        EXPECT_TRUE(s.begin[k] <= r && r < s.end[k]) << "row " << r << " said to be on " << tier_name(t);
      }
    }
  }
}

TEST(TierFractions, ValidateNamesTheProblem) {
  EXPECT_NO_THROW((TierFractions{1, 0, 0}.validate("x")));
  EXPECT_NO_THROW((TierFractions{0.1, 0.2, 0.7}.validate("x")));
  const std::vector<TierFractions> bad = {{0.5, 0.6, -0.1}, {1.5, 0, -0.5}, {0.5, 0.2, 0.2}, {0.5, 0.5, 0.5},
                                          {std::nan(""), 0.5, 0.5}, {0, 0, 0}};
  for (const auto& f : bad) {
    try {
      f.validate("placement of w.bad");
      ADD_FAILURE() << "accepted " << describe(f);
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("placement of w.bad"), std::string::npos) << e.what();
    }
  }
}

TEST(TieredTensor, RejectsBadShapeAndFractionsNamingTheTensor) {
  auto backend = kernels::make_cpu_backend();
  ScratchDir dir;
  {
    Tiers tiers(*backend, tier_options(dir.path(), false));
    try {
      TieredTensor t(tiers, "w.neg", kernels::DType::F32, -1, 4, {1, 0, 0});
      ADD_FAILURE() << "negative shape accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("w.neg"), std::string::npos) << e.what();
    }
    try {
      TieredTensor t(tiers, "w.frac", kernels::DType::F32, 10, 4, {0.5, 0.6, 0});
      ADD_FAILURE() << "fractions summing to 1.1 accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("w.frac"), std::string::npos) << e.what();
    }
    for (Tier t : kAllTiers) EXPECT_EQ(tiers.budget(t).used(), 0);
    EXPECT_FALSE(tiers.disk_open());
  }
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

TEST(TieredTensor, EmptyTensorsAllocateNothing) {
  auto backend = kernels::make_cpu_backend();
  ScratchDir dir;
  Tiers tiers(*backend, tier_options(dir.path(), false));
  Staging staging;
  TieredTensor no_rows(tiers, "e.rows", kernels::DType::F16, 0, 100, {0.2, 0.3, 0.5});
  TieredTensor no_cols(tiers, "e.cols", kernels::DType::F32, 5, 0, {0.2, 0.3, 0.5});
  for (const TieredTensor* t : {&no_rows, &no_cols}) {
    EXPECT_EQ(t->bytes(), 0);
    for (Tier tier : kAllTiers) EXPECT_EQ(t->bytes_on(tier), 0);
    t->read_rows(0, t->rows(), nullptr, staging);
    EXPECT_TRUE(t->pieces(0, 0, Place::cpu(nullptr), false).empty());
  }
  no_cols.write_rows(0, 5, nullptr, staging);
  EXPECT_EQ(no_cols.split().rows(Tier::Disk), 2);  // rows are split even when they hold no bytes (1/2/2)
  for (Tier t : kAllTiers) EXPECT_EQ(tiers.budget(t).used(), 0);
  EXPECT_FALSE(tiers.disk_open());  // nothing to put there
}

TEST(TieredTensor, PiecesShapeAndArgumentChecks) {
  auto backend = kernels::make_cpu_backend();
  ScratchDir dir;
  Tiers tiers(*backend, tier_options(dir.path(), false));
  // 10 rows of 1000 bytes: 3 gpu, 4 cpu, 3 disk.
  TieredTensor t(tiers, "w.pieces", kernels::DType::BF16, 10, 500, {0.3, 0.4, 0.3});
  ASSERT_EQ(t.row_bytes(), 1000);
  Bytes host(10 * 1000);
  const Place other = Place::cpu(host.data());

  auto whole = t.pieces(0, 10, other, false);
  ASSERT_EQ(whole.size(), 3u);  // one contiguous piece per tier
  EXPECT_EQ(whole[0].src.tier, Tier::Gpu);
  EXPECT_EQ(whole[1].src.tier, Tier::Cpu);
  EXPECT_EQ(whole[2].src.tier, Tier::Disk);
  EXPECT_EQ(whole[0].bytes, 3000);
  EXPECT_EQ(whole[1].bytes, 4000);
  EXPECT_EQ(whole[2].bytes, 3000);
  EXPECT_EQ(whole[0].dst.ptr, host.data());
  EXPECT_EQ(whole[1].dst.ptr, host.data() + 3000);
  EXPECT_EQ(whole[2].dst.ptr, host.data() + 7000);
  EXPECT_EQ(whole[2].src.offset, 0);

  const auto writes = t.pieces(2, 8, other, true);  // rows 2 (gpu), 3..6 (cpu), 7 (disk)
  ASSERT_EQ(writes.size(), 3u);
  EXPECT_EQ(writes[0].dst.tier, Tier::Gpu);
  EXPECT_EQ(writes[0].bytes, 1000);
  EXPECT_EQ(writes[0].src.ptr, host.data());
  EXPECT_EQ(writes[1].src.ptr, host.data() + 1000);
  EXPECT_EQ(writes[2].dst.tier, Tier::Disk);
  EXPECT_EQ(writes[2].dst.offset, 0);
  EXPECT_EQ(writes[2].src.ptr, host.data() + 5000);

  const auto band = t.pieces(1, 9, other, true, 100, 350);  // one 2-D piece per tier: a row per tensor row
  ASSERT_EQ(band.size(), 3u);
  const std::int64_t first_row[] = {1, 3, 7}, band_rows[] = {2, 4, 2};
  for (std::size_t i = 0; i < band.size(); ++i) {
    EXPECT_EQ(band[i].bytes, 250);
    EXPECT_EQ(band[i].rows, band_rows[i]);
    EXPECT_EQ(band[i].src_pitch, 1000);
    EXPECT_EQ(band[i].dst_pitch, 1000);
    EXPECT_EQ(band[i].total(), 250 * band_rows[i]);
    EXPECT_EQ(band[i].src.ptr, host.data() + (first_row[i] - 1) * 1000 + 100);
    EXPECT_EQ(band[i].dst.tier, t.split().tier_of(first_row[i]));
  }
  EXPECT_EQ(band.back().dst.offset, 100);

  // Several bands per row (a KV row's heads): one 2-D piece per tensor row, a row per band;
  // bands that touch merge into one.
  const auto heads = t.pieces(2, 4, other, false, RowBands{10, 90, 4, 200});
  ASSERT_EQ(heads.size(), 2u);
  for (std::size_t i = 0; i < heads.size(); ++i) {
    EXPECT_EQ(heads[i].rows, 4);
    EXPECT_EQ(heads[i].bytes, 90);
    EXPECT_EQ(heads[i].src_pitch, 200);
    EXPECT_EQ(heads[i].dst_pitch, 200);
    EXPECT_EQ(heads[i].dst.ptr, host.data() + static_cast<std::ptrdiff_t>(i) * 1000 + 10);
  }
  EXPECT_EQ(heads[0].src.tier, Tier::Gpu);
  EXPECT_EQ(heads[1].src.tier, Tier::Cpu);
  const auto touching = t.pieces(3, 5, other, false, RowBands{0, 250, 4, 250});  // whole rows
  ASSERT_EQ(touching.size(), 1u);
  EXPECT_EQ(touching[0].bytes, 2000);
  EXPECT_TRUE(touching[0].contiguous());
  const auto merged = t.pieces(3, 5, other, false, RowBands{100, 200, 4, 200});
  ASSERT_EQ(merged.size(), 1u);
  EXPECT_EQ(merged[0].bytes, 800);
  EXPECT_EQ(merged[0].rows, 2);
  for (const RowBands& bad : {RowBands{-1, 10, 1, 0}, RowBands{0, 300, 4, 250}, RowBands{0, 200, 6, 200},
                              RowBands{0, 10, 0, 10}, RowBands{950, 60, 1, 0}}) {
    EXPECT_THROW(t.pieces(0, 1, other, false, bad), std::out_of_range)
        << bad.offset << " " << bad.width << " " << bad.count << " " << bad.pitch;
  }

  EXPECT_TRUE(t.pieces(4, 4, other, false).empty());
  for (auto [r0, r1, b0, b1] : std::vector<std::array<std::int64_t, 4>>{
           {-1, 3, 0, -1}, {0, 11, 0, -1}, {5, 4, 0, -1}, {0, 1, -1, 10}, {0, 1, 0, 1001}, {0, 1, 20, 10}}) {
    try {
      t.pieces(r0, r1, other, false, b0, b1);
      ADD_FAILURE() << "accepted rows [" << r0 << ", " << r1 << ") bytes [" << b0 << ", " << b1 << ")";
    } catch (const std::out_of_range& e) {
      EXPECT_NE(std::string(e.what()).find("w.pieces"), std::string::npos) << e.what();
    }
  }
}

// ---- Data integrity across tiers, parametrised over disk I/O mode and staging ----------------

struct IoMode {
  bool threads;       // TierOptions::force_disk_threads
  bool always_stage;  // CopyOptions::always_stage
};

std::string io_mode_name(const ::testing::TestParamInfo<IoMode>& info) {
  return std::string(info.param.threads ? "threads" : "uring") + (info.param.always_stage ? "_staged" : "_direct");
}

class TieredIo : public ::testing::TestWithParam<IoMode> {
 protected:
  void SetUp() override {
    backend_ = kernels::make_cpu_backend();
    if (!threads()) {
      Tiers probe(*backend_, tier_options(dir_.path(), false));
      if (!probe.disk().uses_io_uring()) GTEST_SKIP() << "io_uring is unavailable here; the thread-pool params still run";
    }
  }
  void TearDown() override {
    EXPECT_TRUE(list_dir(dir_.path()).empty()) << "files left in the offload dir";
  }
  bool threads() const { return GetParam().threads; }
  CopyOptions copy_options() const {
    CopyOptions o;
    o.always_stage = GetParam().always_stage;
    return o;
  }
  TierOptions options() const { return tier_options(dir_.path(), threads()); }

  ScratchDir dir_;
  std::unique_ptr<kernels::Backend> backend_;
};

TierFractions random_fractions(std::mt19937_64& rng, std::int64_t rows) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  switch (rng() % 10) {
    case 0: return {1, 0, 0};
    case 1: return {0, 1, 0};
    case 2: return {0, 0, 1};
    case 3: return {0, 0.5, 0.5};
    case 4: return {0.5, 0, 0.5};
    case 5: return {1.0 / 3, 1.0 / 3, 1.0 / 3};
    case 6: {  // a boundary on half a row
      if (rows == 0) return {0.25, 0.25, 0.5};
      const double g = (static_cast<double>(rng() % static_cast<std::uint64_t>(rows)) + 0.5) / static_cast<double>(rows);
      return {g, (1 - g) / 2, 1 - g - (1 - g) / 2};
    }
    default: {
      double a = u(rng), b = u(rng);
      if (a > b) std::swap(a, b);
      return {a, b - a, 1 - b};
    }
  }
}

struct Shape {
  kernels::DType dtype;
  std::int64_t rows, cols;
};

Shape random_shape(std::mt19937_64& rng) {
  static constexpr std::array<kernels::DType, 3> kTypes{kernels::DType::F32, kernels::DType::F16, kernels::DType::BF16};
  Shape s{kTypes[rng() % 3], 0, 0};
  const auto kind = rng() % 10;
  if (kind == 0) {
    s.rows = static_cast<std::int64_t>(rng() % 3);  // 0, 1 or 2 rows
    s.cols = 1 + static_cast<std::int64_t>(rng() % 3000);
  } else if (kind <= 6) {
    s.rows = 1 + static_cast<std::int64_t>(rng() % 40);
    s.cols = 1 + static_cast<std::int64_t>(rng() % 700);
  } else {
    s.rows = 40 + static_cast<std::int64_t>(rng() % 100);
    s.cols = 300 + static_cast<std::int64_t>(rng() % 1000);
  }
  // Row bytes that are never a multiple of the 4 KiB disk block: rows straddle blocks.
  if (s.cols * static_cast<std::int64_t>(kernels::dtype_size(s.dtype)) % DiskStore::kAlignment == 0) ++s.cols;
  return s;
}

std::pair<std::int64_t, std::int64_t> random_rows(std::mt19937_64& rng, std::int64_t rows) {
  if (rows == 0) return {0, 0};
  if (rng() % 4 == 0) return {0, rows};
  std::int64_t a = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(rows + 1));
  std::int64_t b = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(rows + 1));
  if (a > b) std::swap(a, b);
  return {a, b};
}

void expect_budgets(Tiers& tiers, const std::vector<const TieredTensor*>& live) {
  for (Tier t : kAllTiers) {
    std::int64_t want = 0;
    for (const TieredTensor* x : live) want += t == Tier::Disk ? disk_charge(x->bytes_on(t)) : x->bytes_on(t);
    EXPECT_EQ(tiers.budget(t).used(), want) << tier_name(t) << " budget";
  }
}

std::string first_difference(const Bytes& want, const Bytes& got) {
  if (want.size() != got.size()) return "sizes " + std::to_string(want.size()) + " vs " + std::to_string(got.size());
  const auto m = std::mismatch(want.begin(), want.end(), got.begin());
  if (m.first == want.end()) return "equal";
  return "first difference at byte " + std::to_string(m.first - want.begin()) + " of " + std::to_string(want.size());
}

TEST_P(TieredIo, RandomShapesSurviveEveryTierRoundTrip) {
  Tiers tiers(*backend_, options());
  EXPECT_EQ(tiers.disk().uses_io_uring(), !threads());
  EXPECT_EQ(tiers.options().force_disk_threads, threads());
  CopyEngine engine(tiers, copy_options());
  EXPECT_EQ(engine.options().always_stage, GetParam().always_stage);
  const std::array<int, 3> lanes{engine.add_lane("copy: a"), engine.add_lane("copy: b"), engine.add_lane("copy: c")};
  Staging staging;

  constexpr int kCases = 50;
  for (int seed = 1; seed <= kCases; ++seed) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 7919);
    Shape shape = random_shape(rng);
    TierFractions fa = random_fractions(rng, shape.rows);
    TierFractions fb = random_fractions(rng, shape.rows);
    // The edge cases are always in the set, whatever the generator draws.
    if (seed == 1) shape.rows = 0;
    if (seed == 2) shape.rows = 1;
    if (seed == 3) {
      fa = {1, 0, 0};
      fb = {0, 0, 1};
    }
    if (seed == 4) {
      fa = {0, 0, 1};
      fb = {0, 1, 0};
    }
    if (seed == 5) {  // 0/2/1 and 2/1/0 rows: half rows round up
      shape.rows = 3;
      fa = {0, 0.5, 0.5};
      fb = {0.5, 0.5, 0};
    }
    std::ostringstream what;
    what << "seed " << seed << ": " << kernels::dtype_name(shape.dtype) << " [" << shape.rows << ", " << shape.cols
         << "], A " << describe(fa) << ", B " << describe(fb);
    SCOPED_TRACE(what.str());
    auto lane = [&] { return lanes[rng() % lanes.size()]; };

    {
      TieredTensor a(tiers, "a" + std::to_string(seed), shape.dtype, shape.rows, shape.cols, fa);
      expect_budgets(tiers, {&a});
      TieredTensor b(tiers, "b" + std::to_string(seed), shape.dtype, shape.rows, shape.cols, fb);
      expect_budgets(tiers, {&a, &b});
      const std::int64_t rb = a.row_bytes();
      ASSERT_EQ(rb, shape.cols * static_cast<std::int64_t>(kernels::dtype_size(shape.dtype)));
      ASSERT_NE(rb % DiskStore::kAlignment, 0);
      for (const TieredTensor* t : {&a, &b}) {
        std::int64_t sum = 0;
        for (Tier tier : kAllTiers) {
          EXPECT_EQ(t->bytes_on(tier), t->split().rows(tier) * rb);
          sum += t->split().rows(tier);
        }
        EXPECT_EQ(sum, shape.rows);
        EXPECT_EQ(t->split().rows(Tier::Gpu), std::llround(static_cast<double>(shape.rows) * (t == &a ? fa : fb).gpu));
      }

      // Whole-tensor writes of known bytes, then sub-range overwrites from unaligned memory.
      Bytes ref_a = random_bytes(rng, a.bytes());
      Bytes ref_b = random_bytes(rng, b.bytes());
      a.write_rows(0, a.rows(), ref_a.data(), staging);
      b.write_rows(0, b.rows(), ref_b.data(), staging);
      for (int i = 0; i < 3; ++i) {
        const auto [r0, r1] = random_rows(rng, a.rows());
        const auto shift = static_cast<std::size_t>(rng() % 8);
        Bytes src = random_bytes(rng, (r1 - r0) * rb + static_cast<std::int64_t>(shift));
        a.write_rows(r0, r1, src.data() + shift, staging);
        std::copy(src.begin() + static_cast<std::ptrdiff_t>(shift), src.end(), ref_a.begin() + r0 * rb);
      }
      ASSERT_TRUE(read_all(a, staging) == ref_a) << first_difference(ref_a, read_all(a, staging));
      ASSERT_TRUE(read_all(b, staging) == ref_b) << first_difference(ref_b, read_all(b, staging));

      // Rows wander between the tensors, host memory, device memory and raw disk extents.
      for (int step = 0; step < 8; ++step) {
        const auto op = rng() % 8;
        const auto [r0, r1] = random_rows(rng, shape.rows);
        const std::int64_t n = (r1 - r0) * rb;
        SCOPED_TRACE("step " + std::to_string(step) + ", op " + std::to_string(op) + ", rows [" + std::to_string(r0) +
                     ", " + std::to_string(r1) + ")");
        switch (op) {
          case 0: {  // A -> B
            engine.copy(lane(), rows_between(a, b, r0, r1), {"move", "a->b"}).wait();
            std::copy_n(ref_a.begin() + r0 * rb, n, ref_b.begin() + r0 * rb);
            break;
          }
          case 1: {  // B -> A
            engine.copy(lane(), rows_between(b, a, r0, r1), {"move", "b->a"}).wait();
            std::copy_n(ref_b.begin() + r0 * rb, n, ref_a.begin() + r0 * rb);
            break;
          }
          case 2: {  // A -> unaligned host memory
            const auto shift = static_cast<std::size_t>(rng() % 64);
            Bytes host(static_cast<std::size_t>(n) + shift, 0);
            engine.copy(lane(), a.pieces(r0, r1, Place::cpu(host.data() + shift), false)).wait();
            ASSERT_TRUE(std::equal(host.begin() + static_cast<std::ptrdiff_t>(shift), host.end(), ref_a.begin() + r0 * rb));
            break;
          }
          case 3: {  // unaligned host memory -> A
            const auto shift = static_cast<std::size_t>(rng() % 64);
            Bytes host = random_bytes(rng, n + static_cast<std::int64_t>(shift));
            engine.copy(lane(), a.pieces(r0, r1, Place::cpu(host.data() + shift), true)).wait();
            std::copy(host.begin() + static_cast<std::ptrdiff_t>(shift), host.end(), ref_a.begin() + r0 * rb);
            break;
          }
          case 4: {  // A -> device buffer -> B (disk <-> gpu is staged under always_stage)
            kernels::DeviceBuffer dev(*backend_, static_cast<std::size_t>(n));
            engine.copy(lane(), a.pieces(r0, r1, Place::gpu(dev.data()), false)).wait();
            Bytes check(static_cast<std::size_t>(n));
            if (n > 0) backend_->copy_to_host(check.data(), dev.data(), static_cast<std::size_t>(n));
            ASSERT_TRUE(std::equal(check.begin(), check.end(), ref_a.begin() + r0 * rb));
            engine.copy(lane(), b.pieces(r0, r1, Place::gpu(dev.data()), true)).wait();
            std::copy_n(ref_a.begin() + r0 * rb, n, ref_b.begin() + r0 * rb);
            break;
          }
          case 5: {  // A -> a raw disk extent at an unaligned offset -> B
            DiskStore& disk = tiers.disk();
            const auto off = static_cast<std::int64_t>(rng() % 5000);
            const Extent e = disk.allocate(n + off, "scratch extent");
            const Place there = Place::disk(e, off);
            engine.copy(lane(), a.pieces(r0, r1, there, false)).wait();
            Bytes check(static_cast<std::size_t>(n));
            disk.wait(disk.read(e, off, check.data(), n));
            ASSERT_TRUE(std::equal(check.begin(), check.end(), ref_a.begin() + r0 * rb));
            engine.copy(lane(), b.pieces(r0, r1, there, true)).wait();
            std::copy_n(ref_a.begin() + r0 * rb, n, ref_b.begin() + r0 * rb);
            disk.free(e);
            break;
          }
          case 6: {  // synchronous partial write and read of B
            Bytes src = random_bytes(rng, n);
            b.write_rows(r0, r1, src.data(), staging);
            std::copy(src.begin(), src.end(), ref_b.begin() + r0 * rb);
            Bytes back(static_cast<std::size_t>(n), 0);
            b.read_rows(r0, r1, back.data(), staging);
            ASSERT_EQ(back, src);
            break;
          }
          default: {  // both tensors read at once on two lanes
            Bytes ha(static_cast<std::size_t>(n)), hb(static_cast<std::size_t>(n));
            const CopyTicket ta = engine.copy(lanes[0], a.pieces(r0, r1, Place::cpu(ha.data()), false));
            const CopyTicket tb = engine.copy(lanes[1], b.pieces(r0, r1, Place::cpu(hb.data()), false));
            ta.wait();
            tb.wait();
            ASSERT_TRUE(std::equal(ha.begin(), ha.end(), ref_a.begin() + r0 * rb));
            ASSERT_TRUE(std::equal(hb.begin(), hb.end(), ref_b.begin() + r0 * rb));
          }
        }
      }
      const Bytes got_a = read_all(a, staging);
      const Bytes got_b = read_all(b, staging);
      ASSERT_TRUE(got_a == ref_a) << "A: " << first_difference(ref_a, got_a);
      ASSERT_TRUE(got_b == ref_b) << "B: " << first_difference(ref_b, got_b);
      expect_budgets(tiers, {&a, &b});
    }
    for (Tier t : kAllTiers) ASSERT_EQ(tiers.budget(t).used(), 0) << tier_name(t) << " budget after destruction";
  }
}

// Several staging chunks (8 MiB each) on the disk <-> gpu and disk <-> disk paths, so the
// double buffering reuses each buffer. Only with always_stage (the disk <-> disk path stages
// either way), to keep the I/O volume down.
class TieredStagedIo : public TieredIo {};

TEST_P(TieredStagedIo, LargeTensorSpansSeveralStagingChunks) {
  ASSERT_TRUE(GetParam().always_stage);
  Tiers tiers(*backend_, options());
  CopyEngine engine(tiers, copy_options());
  const int lane = engine.add_lane("copy: big");
  Staging staging;
  std::mt19937_64 rng(99);
  // 4423 rows of 4098 bytes: ~17.3 MiB, three staging chunks.
  const std::int64_t rows = 4423, cols = 2049;
  ASSERT_GT(rows * cols * 2, 2 * Staging::kChunkBytes);
  TieredTensor on_disk(tiers, "big.disk", kernels::DType::F16, rows, cols, {0, 0, 1});
  TieredTensor on_gpu(tiers, "big.gpu", kernels::DType::BF16, rows, cols, {1, 0, 0});
  TieredTensor on_disk2(tiers, "big.disk2", kernels::DType::F16, rows, cols, {0, 0, 1});
  const Bytes ref = random_bytes(rng, on_disk.bytes());
  on_disk.write_rows(0, rows, ref.data(), staging);
  engine.copy(lane, rows_between(on_disk, on_gpu, 0, rows)).wait();  // disk -> gpu
  ASSERT_TRUE(read_all(on_gpu, staging) == ref);
  const Bytes ref2 = random_bytes(rng, on_gpu.bytes());
  on_gpu.write_rows(0, rows, ref2.data(), staging);
  engine.copy(lane, rows_between(on_gpu, on_disk2, 0, rows)).wait();  // gpu -> disk
  engine.copy(lane, rows_between(on_disk2, on_disk, 1, rows - 1)).wait();  // disk -> disk, unaligned start
  Bytes want = ref2;  // ref2 everywhere but the first and last row, which keep ref
  std::copy_n(ref.begin(), cols * 2, want.begin());
  std::copy_n(ref.end() - cols * 2, cols * 2, want.end() - cols * 2);
  const Bytes got = read_all(on_disk, staging);
  EXPECT_TRUE(got == want) << first_difference(want, got);
}

// Rows of exactly 4 KiB from page-aligned memory take the store's unstaged path.
TEST_P(TieredIo, AlignedRowsRoundTrip) {
  Tiers tiers(*backend_, options());
  CopyEngine engine(tiers, copy_options());
  const int lane = engine.add_lane("copy: aligned");
  Staging staging;
  std::mt19937_64 rng(5);
  TieredTensor a(tiers, "aligned.a", kernels::DType::F32, 300, 1024, {0.2, 0.3, 0.5});
  TieredTensor b(tiers, "aligned.b", kernels::DType::F32, 300, 1024, {0.5, 0, 0.5});
  const Bytes ref = random_bytes(rng, a.bytes());
  HostBuffer host(static_cast<std::size_t>(a.bytes()));
  std::copy(ref.begin(), ref.end(), host.as<unsigned char>());
  engine.copy(lane, a.pieces(0, 300, Place::cpu(host.data()), true)).wait();
  engine.copy(lane, rows_between(a, b, 0, 300)).wait();
  std::fill_n(host.as<unsigned char>(), ref.size(), 0);
  engine.copy(lane, b.pieces(0, 300, Place::cpu(host.data()), false)).wait();
  EXPECT_TRUE(std::equal(ref.begin(), ref.end(), host.as<unsigned char>()));
  EXPECT_TRUE(read_all(a, staging) == ref);
}

// A band of bytes within each row (one KV slot per row, say) written and read through pieces().
TEST_P(TieredIo, ColumnBandTouchesOnlyTheBand) {
  Tiers tiers(*backend_, options());
  CopyEngine engine(tiers, copy_options());
  const std::array<int, 2> lanes{engine.add_lane("copy: cache out"), engine.add_lane("copy: cache in")};
  Staging staging;
  std::mt19937_64 rng(17);
  for (int seed = 0; seed < 9; ++seed) {
    const auto dtype = seed % 3 == 0 ? kernels::DType::F32 : seed % 3 == 1 ? kernels::DType::F16 : kernels::DType::BF16;
    const std::int64_t rows = 1 + static_cast<std::int64_t>(rng() % 40);
    const std::int64_t cols = 1 + static_cast<std::int64_t>(rng() % 3000);
    const TierFractions f = random_fractions(rng, rows);
    TieredTensor t(tiers, "kv" + std::to_string(seed), dtype, rows, cols, f);
    const std::int64_t rb = t.row_bytes();
    SCOPED_TRACE("seed " + std::to_string(seed) + ": [" + std::to_string(rows) + ", " + std::to_string(cols) + "] " +
                 std::string(kernels::dtype_name(dtype)) + ", " + describe(f));
    Bytes ref = random_bytes(rng, t.bytes());
    t.write_rows(0, rows, ref.data(), staging);
    for (int round = 0; round < 5; ++round) {
      const auto [r0, r1] = random_rows(rng, rows);
      std::int64_t b0 = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(rb + 1));
      std::int64_t b1 = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(rb + 1));
      if (b0 > b1) std::swap(b0, b1);
      if (round == 0) b1 = std::min(rb, b0 + 1);  // a single byte
      if (round == 1) b0 = 0;
      if (round == 2) b1 = rb;
      SCOPED_TRACE("round " + std::to_string(round) + ": rows [" + std::to_string(r0) + ", " + std::to_string(r1) +
                   "), bytes [" + std::to_string(b0) + ", " + std::to_string(b1) + ")");
      // The band source is laid out like full rows; only its band bytes may be read.
      Bytes src = random_bytes(rng, (r1 - r0) * rb);
      const bool via_device = round % 2 == 1;
      kernels::DeviceBuffer dev(*backend_, src.size());
      Place from = Place::cpu(src.data());
      if (via_device && !src.empty()) {
        backend_->copy_to_device(dev.data(), src.data(), src.size());
        from = Place::gpu(dev.data());
      }
      const auto pieces = t.pieces(r0, r1, from, true, b0, b1);
      // One piece per tier the rows touch: whole rows, or a 2-D piece of the band.
      EXPECT_EQ(pieces.size(), static_cast<std::size_t>(std::count_if(kAllTiers.begin(), kAllTiers.end(), [&](Tier x) {
                  const auto i = static_cast<std::size_t>(x);
                  return std::max(r0, t.split().begin[i]) < std::min(r1, t.split().end[i]);
                })));
      engine.copy(lanes[static_cast<std::size_t>(round % 2)], pieces, {"store_cache", "band"}).wait();
      for (std::int64_t r = r0; r < r1; ++r)
        std::copy(src.begin() + (r - r0) * rb + b0, src.begin() + (r - r0) * rb + b1, ref.begin() + r * rb + b0);
      const Bytes got = read_all(t, staging);
      ASSERT_TRUE(got == ref) << first_difference(ref, got);

      // Reading the band back fills only the band of the destination.
      Bytes back((r1 - r0) * static_cast<std::size_t>(rb), 0x5a);
      Bytes want = back;
      for (std::int64_t r = r0; r < r1; ++r)
        std::copy(ref.begin() + r * rb + b0, ref.begin() + r * rb + b1, want.begin() + (r - r0) * rb + b0);
      engine.copy(lanes[static_cast<std::size_t>(1 - round % 2)], t.pieces(r0, r1, Place::cpu(back.data()), false, b0, b1))
          .wait();
      ASSERT_TRUE(back == want) << first_difference(want, back);
    }
  }
  for (Tier tier : kAllTiers) EXPECT_EQ(tiers.budget(tier).used(), 0);
}

// A KV row's heads: several bands per row (the valid slots of each head, random count, width
// and pitch), written and read through 2-D pieces in every tier; only the bands move.
TEST_P(TieredIo, HeadBandsTouchOnlyTheirBytes) {
  Tiers tiers(*backend_, options());
  CopyEngine engine(tiers, copy_options());
  const int lane = engine.add_lane("copy: cache");
  Staging staging;
  std::mt19937_64 rng(23);
  for (int seed = 0; seed < 8; ++seed) {
    const std::int64_t heads = 1 + static_cast<std::int64_t>(rng() % 9);
    const std::int64_t head_bytes = 1 + static_cast<std::int64_t>(rng() % 900);
    const std::int64_t rows = 1 + static_cast<std::int64_t>(rng() % 30);
    const TierFractions f = random_fractions(rng, rows);
    TieredTensor t(tiers, "heads" + std::to_string(seed), kernels::DType::F32, rows, 1, f, heads * head_bytes);
    const std::int64_t rb = t.row_bytes();
    Bytes ref = random_bytes(rng, t.bytes());
    t.write_rows(0, rows, ref.data(), staging);
    for (int round = 0; round < 4; ++round) {
      const auto [r0, r1] = random_rows(rng, rows);
      const std::int64_t width = round == 3 ? head_bytes : static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(head_bytes + 1));
      const std::int64_t offset = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(head_bytes - width + 1));
      const RowBands bands{offset, width, heads, head_bytes};
      SCOPED_TRACE("seed " + std::to_string(seed) + " round " + std::to_string(round) + ": " + std::to_string(heads) +
                   " heads of " + std::to_string(head_bytes) + " bytes, band [" + std::to_string(offset) + ", +" +
                   std::to_string(width) + "), rows [" + std::to_string(r0) + ", " + std::to_string(r1) + "), " +
                   describe(f));
      Bytes src = random_bytes(rng, (r1 - r0) * rb);
      kernels::DeviceBuffer dev(*backend_, src.size());
      Place from = Place::cpu(src.data());
      if (round % 2 == 1 && !src.empty()) {
        backend_->copy_to_device(dev.data(), src.data(), src.size());
        from = Place::gpu(dev.data());
      }
      engine.copy(lane, t.pieces(r0, r1, from, true, bands), {"store_cache", "heads"}).wait();
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t h = 0; h < heads; ++h) {
          const std::int64_t at = r * rb + h * head_bytes + offset;
          std::copy(src.begin() + (at - r0 * rb), src.begin() + (at - r0 * rb) + width, ref.begin() + at);
        }
      ASSERT_TRUE(read_all(t, staging) == ref) << first_difference(ref, read_all(t, staging));

      Bytes back((r1 - r0) * static_cast<std::size_t>(rb), 0x5a);
      Bytes want = back;
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t h = 0; h < heads; ++h) {
          const std::int64_t at = r * rb + h * head_bytes + offset;
          std::copy(ref.begin() + at, ref.begin() + at + width, want.begin() + (at - r0 * rb));
        }
      engine.copy(lane, t.pieces(r0, r1, Place::cpu(back.data()), false, bands)).wait();
      ASSERT_TRUE(back == want) << first_difference(want, back);
    }
  }
  for (Tier tier : kAllTiers) EXPECT_EQ(tiers.budget(tier).used(), 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, TieredIo,
                         ::testing::Values(IoMode{false, false}, IoMode{false, true}, IoMode{true, false},
                                           IoMode{true, true}),
                         io_mode_name);
INSTANTIATE_TEST_SUITE_P(Modes, TieredStagedIo, ::testing::Values(IoMode{false, true}, IoMode{true, true}),
                         io_mode_name);

// ---- Faults ----------------------------------------------------------------------------------

class TieredFaults : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    backend_ = kernels::make_cpu_backend();
    if (!threads()) {
      Tiers probe(*backend_, tier_options(dir_.path(), false));
      if (!probe.disk().uses_io_uring()) GTEST_SKIP() << "io_uring is unavailable here; the thread-pool param still runs";
    }
  }
  void TearDown() override { EXPECT_TRUE(list_dir(dir_.path()).empty()) << "files left in the scratch dir"; }
  bool threads() const { return GetParam(); }
  TierOptions options() const { return tier_options(dir_.path(), threads()); }

  ScratchDir dir_;
  std::unique_ptr<kernels::Backend> backend_;
};

TEST_P(TieredFaults, BudgetExceededNamesTierAndTensor) {
  struct Case {
    Tier tier;
    TierFractions fractions;
  };
  // 100 rows of 600 bytes = 60000 bytes; each case fails on its tier after the tiers before it
  // were charged, which must be undone.
  for (const Case& c : {Case{Tier::Gpu, {1, 0, 0}}, Case{Tier::Cpu, {0.5, 0.5, 0}}, Case{Tier::Disk, {0.2, 0.3, 0.5}}}) {
    SCOPED_TRACE(std::string(tier_name(c.tier)));
    TierOptions o = options();
    const std::int64_t limit = 20000;
    (c.tier == Tier::Gpu ? o.gpu_bytes : c.tier == Tier::Cpu ? o.cpu_bytes : o.disk_bytes) = limit;
    Tiers tiers(*backend_, o);
    Staging staging;
    {
      // Something already resident that fits keeps its charge.
      TieredTensor resident(tiers, "resident", kernels::DType::F16, 10, 300, c.fractions);
      std::vector<std::int64_t> before;
      for (Tier t : kAllTiers) before.push_back(tiers.budget(t).used());
      try {
        TieredTensor t(tiers, "layers.3.mlp.w1", kernels::DType::F16, 100, 300, c.fractions);
        ADD_FAILURE() << "tensor over the " << tier_name(c.tier) << " budget was created";
      } catch (const BudgetExceeded& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(std::string(tier_name(c.tier)) + " tier"), std::string::npos) << msg;
        EXPECT_NE(msg.find("'layers.3.mlp.w1'"), std::string::npos) << msg;
        EXPECT_NE(msg.find("the " + std::string(tier_name(c.tier)) + " tier's capacity"), std::string::npos) << msg;
      }
      for (Tier t : kAllTiers) EXPECT_EQ(tiers.budget(t).used(), before[static_cast<std::size_t>(t)]) << tier_name(t);
      // The resident tensor is intact.
      std::mt19937_64 rng(1);
      const Bytes data = random_bytes(rng, resident.bytes());
      resident.write_rows(0, resident.rows(), data.data(), staging);
      EXPECT_TRUE(read_all(resident, staging) == data);
    }
    for (Tier t : kAllTiers) EXPECT_EQ(tiers.budget(t).used(), 0) << tier_name(t);
    for (Tier t : kAllTiers) EXPECT_LE(tiers.budget(t).peak(), tiers.budget(t).capacity());
  }
}

TEST_P(TieredFaults, BudgetExactlyFullFitsOneMoreRowDoesNot) {
  TierOptions o = options();
  o.gpu_bytes = 60000;
  Tiers tiers(*backend_, o);
  TieredTensor t(tiers, "exact", kernels::DType::F32, 100, 150, {1, 0, 0});
  EXPECT_EQ(tiers.budget(Tier::Gpu).used(), 60000);
  EXPECT_EQ(tiers.budget(Tier::Gpu).available(), 0);
  EXPECT_THROW(TieredTensor(tiers, "one.more", kernels::DType::F32, 1, 1, {1, 0, 0}), BudgetExceeded);
  EXPECT_NO_THROW(TieredTensor(tiers, "no.gpu", kernels::DType::F32, 1, 1, {0, 1, 0}));
  EXPECT_EQ(tiers.budget(Tier::Gpu).used(), 60000);
}

TEST_P(TieredFaults, UnusableOffloadDirFailsClearlyWhenDiskIsNeeded) {
  const std::string file = dir_.path() + "/a-regular-file";
  { std::ofstream(file) << "not a directory"; }
  for (const std::string& bad : {file + "/sub", dir_.path() + "/missing/sub"}) {
    SCOPED_TRACE(bad);
    TierOptions o = options();
    o.offload_dir = bad;
    Tiers tiers(*backend_, o);
    {
      // Nothing on disk: the offload dir is never touched.
      TieredTensor fine(tiers, "fine", kernels::DType::F16, 10, 10, {0.5, 0.5, 0});
      EXPECT_FALSE(tiers.disk_open());
    }
    for (int attempt = 0; attempt < 2; ++attempt) {
      try {
        TieredTensor t(tiers, "needs.disk", kernels::DType::F16, 10, 10, {0.3, 0.3, 0.4});
        ADD_FAILURE() << "tensor with a disk part created under " << bad;
      } catch (const std::runtime_error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(bad), std::string::npos) << msg;
        EXPECT_NE(msg.find("an offload directory"), std::string::npos) << msg;
      }
      for (Tier t : kAllTiers) EXPECT_EQ(tiers.budget(t).used(), 0) << tier_name(t);
      EXPECT_FALSE(tiers.disk_open());
    }
  }
  EXPECT_TRUE(std::filesystem::is_regular_file(file));
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/missing"));
  std::filesystem::remove(file);
}

// Child exit codes for the forked disk-full test.
enum TieredChildResult : int {
  kChildOk = 0,
  kChildNoError = 2,
  kChildWrongMessage = 3,
  kChildReadNotRefused = 4,
  kChildThrew = 5,
  kChildLeak = 6,
  kChildLeftFiles = 7,
  kChildSetup = 8
};

TEST_P(TieredFaults, DiskFullGivesClearErrorAndCleansUp) {
  const std::string offload = dir_.path() + "/offload";  // created by the store, removed with it
  const TierOptions o = [&] {
    TierOptions x = options();
    x.offload_dir = offload;
    return x;
  }();
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) {
    int code = kChildOk;
    try {
      // With SIGXFSZ ignored, writes past RLIMIT_FSIZE fail with EFBIG, as on a full disk.
      if (::signal(SIGXFSZ, SIG_IGN) == SIG_ERR) ::_exit(kChildSetup);
      rlimit lim{};
      if (::getrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(kChildSetup);
      lim.rlim_cur = 64 * 1024;
      if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(kChildSetup);
      auto backend = kernels::make_cpu_backend();
      {
        Tiers tiers(*backend, o);
        Staging staging;
        {
          // 512 rows of 2002 bytes, half on disk: ~500 KiB there, far over the 64 KiB limit.
          TieredTensor t(tiers, "kv.full", kernels::DType::F16, 512, 1001, {0.25, 0.25, 0.5});
          std::mt19937_64 rng(3);
          const Bytes data = random_bytes(rng, t.bytes());
          try {
            t.write_rows(0, t.rows(), data.data(), staging);
            code = kChildNoError;
          } catch (const std::runtime_error& e) {
            const std::string msg = e.what();
            if (msg.find("File too large") == std::string::npos || msg.find("ulimit -f") == std::string::npos ||
                msg.find("disk is full") == std::string::npos || msg.find(tiers.disk().path()) == std::string::npos) {
              std::fprintf(stderr, "unexpected message: %s\n", msg.c_str());
              code = kChildWrongMessage;
            }
          }
          if (code == kChildOk) {
            Bytes back(data.size());
            try {
              t.read_rows(0, t.rows(), back.data(), staging);
              code = kChildReadNotRefused;
            } catch (const std::runtime_error& e) {
              if (std::string(e.what()).find("earlier write") == std::string::npos) {
                std::fprintf(stderr, "unexpected message: %s\n", e.what());
                code = kChildWrongMessage;
              }
            }
          }
        }
        for (Tier t : kAllTiers)
          if (code == kChildOk && tiers.budget(t).used() != 0) code = kChildLeak;
      }
      if (code == kChildOk && std::filesystem::exists(offload)) code = kChildLeftFiles;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child threw: %s\n", e.what());
      code = kChildThrew;
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child died with signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), kChildOk)
      << "2 no error, 3 wrong message, 4 read of the failed region not refused, 5 threw, 6 budget leak, 7 files left";
  EXPECT_FALSE(std::filesystem::exists(offload));
}

TEST_P(TieredFaults, TruncatedOffloadFileIsAnErrorNotGarbage) {
  {
    Tiers tiers(*backend_, options());
    CopyEngine engine(tiers);
    const int lane = engine.add_lane("copy: in");
    Staging staging;
    std::mt19937_64 rng(11);
    TieredTensor t(tiers, "w.trunc", kernels::DType::BF16, 64, 3001, {0.25, 0.25, 0.5});
    ASSERT_GT(t.bytes_on(Tier::Disk), 0);
    const Bytes data = random_bytes(rng, t.bytes());
    t.write_rows(0, t.rows(), data.data(), staging);
    ASSERT_TRUE(read_all(t, staging) == data);

    ASSERT_EQ(::truncate(tiers.disk().path().c_str(), 0), 0) << std::strerror(errno);
    Bytes back(data.size(), 0);
    try {
      t.read_rows(0, t.rows(), back.data(), staging);
      ADD_FAILURE() << "read of a truncated offload file succeeded"
                    << (std::all_of(back.begin() + t.split().begin[2] * t.row_bytes(), back.end(),
                                    [](unsigned char x) { return x == 0; })
                            ? " and returned zeros for the disk rows"
                            : "");
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(tiers.disk().path()), std::string::npos) << e.what();
    }
    // The same through a copy lane: the ticket reports it, the lane goes on.
    Bytes disk_rows(static_cast<std::size_t>(t.bytes_on(Tier::Disk)));
    const CopyTicket ticket =
        engine.copy(lane, t.pieces(t.split().begin[2], t.rows(), Place::cpu(disk_rows.data()), false));
    EXPECT_THROW(ticket.wait(), std::runtime_error);
    Bytes gpu_rows(static_cast<std::size_t>(t.bytes_on(Tier::Gpu)));
    engine.copy(lane, t.pieces(0, t.split().end[0], Place::cpu(gpu_rows.data()), false)).wait();
    EXPECT_TRUE(std::equal(gpu_rows.begin(), gpu_rows.end(), data.begin()));
  }
  EXPECT_TRUE(list_dir(dir_.path()).empty());
}

INSTANTIATE_TEST_SUITE_P(Modes, TieredFaults, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "threads" : "uring");
                         });

}  // namespace
}  // namespace flexh2o::offload
