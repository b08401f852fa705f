#include "offload/budget.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace flexh2o::offload {
namespace {

constexpr std::int64_t kKiB = 1024;
constexpr std::int64_t kMiB = kKiB * 1024;
constexpr std::int64_t kGiB = kMiB * 1024;

TEST(ParseBytes, UnitsAndNumbers) {
  EXPECT_EQ(parse_bytes("123"), 123);
  EXPECT_EQ(parse_bytes("0"), 0);
  EXPECT_EQ(parse_bytes("16GiB"), 16 * kGiB);
  EXPECT_EQ(parse_bytes("512MiB"), 512 * kMiB);
  EXPECT_EQ(parse_bytes("4KiB"), 4 * kKiB);
  EXPECT_EQ(parse_bytes("2TiB"), 2 * 1024 * kGiB);
  EXPECT_EQ(parse_bytes("1.5GB"), 1'500'000'000);
  EXPECT_EQ(parse_bytes("1KB"), 1000);
  EXPECT_EQ(parse_bytes("3MB"), 3'000'000);
  EXPECT_EQ(parse_bytes("1TB"), 1'000'000'000'000);
  EXPECT_EQ(parse_bytes("1.5GiB"), 3 * kGiB / 2);
  EXPECT_EQ(parse_bytes("0.5KiB"), 512);
  EXPECT_EQ(parse_bytes(".5KiB"), 512);
  EXPECT_EQ(parse_bytes("7B"), 7);
  EXPECT_EQ(parse_bytes(" 4 gib "), 4 * kGiB);
  EXPECT_EQ(parse_bytes("1.0000001KB"), 1000);  // rounded to the nearest byte
}

TEST(ParseBytes, RejectsBadTextAndNamesIt) {
  for (const char* bad : {"", "abc", "12XB", "-5", "1.2.3", "GiB", "16 G i B", "99999999999TiB",
                          "99999999999999999999"}) {
    try {
      parse_bytes(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'" + std::string(bad) + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(FormatBytes, PicksBinaryUnits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(3 * kGiB / 2), "1.50 GiB");
  EXPECT_EQ(format_bytes(16 * kGiB), "16.00 GiB");
  EXPECT_EQ(format_bytes(5 * kMiB + 300 * kKiB), "5.29 MiB");
  EXPECT_EQ(format_bytes(-2048), "-2.00 KiB");
  EXPECT_EQ(parse_bytes(format_bytes(16 * kGiB)), 16 * kGiB);
}

TEST(Budget, ReserveReleaseAndPeak) {
  Budget b(Tier::Cpu, 100);
  EXPECT_EQ(b.tier(), Tier::Cpu);
  EXPECT_FALSE(b.unlimited());
  b.reserve(60, "a");
  b.reserve(40, "b");  // exactly full is allowed
  EXPECT_EQ(b.used(), 100);
  EXPECT_EQ(b.available(), 0);
  b.release(70);
  EXPECT_EQ(b.used(), 30);
  EXPECT_EQ(b.peak(), 100);
  b.reserve(10, "c");
  EXPECT_EQ(b.peak(), 100);
  EXPECT_THROW(b.reserve(-1, "negative"), std::invalid_argument);
  // A placement tried and undone: the peak before it, but never below what is in use.
  b.restore_peak(20);
  EXPECT_EQ(b.peak(), 40);
  b.release(30);
  b.restore_peak(20);
  EXPECT_EQ(b.peak(), 20);
}

TEST(Budget, OverBudgetMessageSaysWhatToDo) {
  Budget b(Tier::Gpu, 16 * kGiB);
  b.reserve(parse_bytes("15.2GiB"), "earlier layers");
  const std::int64_t before = b.used();
  try {
    b.reserve(kGiB, "layers.3.wq");
    FAIL() << "over-budget reservation succeeded";
  } catch (const BudgetExceeded& e) {
    EXPECT_STREQ(e.what(),
                 "gpu tier: cannot reserve 1.00 GiB for 'layers.3.wq': 819.20 MiB of 16.00 GiB free (15.20 GiB in use); "
                 "raise the gpu tier's capacity or move more to cpu/disk");
    // The option it names, as the CLI says it with its flag.
    EXPECT_EQ(e.text([](kernels::Option o) { return o == kernels::Option::GpuMem ? "--gpu-mem" : "?"; }),
              "gpu tier: cannot reserve 1.00 GiB for 'layers.3.wq': 819.20 MiB of 16.00 GiB free (15.20 GiB in use); "
              "raise --gpu-mem or move more to cpu/disk");
  }
  EXPECT_EQ(b.used(), before);  // a refused reservation changes nothing

  Budget disk(Tier::Disk, 10);
  try {
    disk.reserve(11, "kv.0");
    FAIL();
  } catch (const std::runtime_error& e) {  // BudgetExceeded is a runtime_error
    EXPECT_NE(std::string(e.what()).find("disk tier"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("an offload directory"), std::string::npos);
  }
}

TEST(Budget, UnlimitedAcceptsAnything) {
  Budget b(Tier::Disk);
  EXPECT_TRUE(b.unlimited());
  b.reserve(1000 * 1024 * kGiB, "huge");
  EXPECT_EQ(b.used(), 1000 * 1024 * kGiB);
  EXPECT_THROW(Budget(Tier::Cpu, -1), std::invalid_argument);
}

TEST(Budget, ReservationReleasesOnDestructionAndMoves) {
  Budget b(Tier::Cpu, 1000);
  {
    Reservation r = b.reserve_scoped(300, "r");
    EXPECT_EQ(r.bytes(), 300);
    EXPECT_EQ(b.used(), 300);
    Reservation moved = std::move(r);
    EXPECT_EQ(r.bytes(), 0);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
    EXPECT_EQ(b.used(), 300);
    Reservation other = b.reserve_scoped(100, "other");
    other = std::move(moved);  // releases other's 100
    EXPECT_EQ(b.used(), 300);
  }
  EXPECT_EQ(b.used(), 0);
  EXPECT_EQ(b.peak(), 400);
  EXPECT_THROW(b.reserve_scoped(1001, "too big"), BudgetExceeded);
  EXPECT_EQ(b.used(), 0);
}

TEST(Budget, ThreadSafe) {
  Budget b(Tier::Cpu, 64);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        try {
          Reservation r = b.reserve_scoped(16, "x");
        } catch (const BudgetExceeded&) {
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(b.used(), 0);
  EXPECT_LE(b.peak(), 64);
  EXPECT_GE(b.peak(), 16);
}

TEST(Tier, Names) {
  EXPECT_EQ(tier_name(Tier::Gpu), "gpu");
  EXPECT_EQ(tier_name(Tier::Cpu), "cpu");
  EXPECT_EQ(tier_name(Tier::Disk), "disk");
}

}  // namespace
}  // namespace flexh2o::offload
