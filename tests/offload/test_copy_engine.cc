// CopyEngine and copy_now: copies between every pair of tiers (io_uring and thread-pool disk
// I/O, direct and staged), lanes, tickets, FIFO order, errors, and the Trace they record.
#include "offload/copy_engine.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include "tests/offload/offload_test_util.h"
#include "tests/support/forwarding_backend.h"
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <functional>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "offload/disk_store.h"
#include "offload/tiers.h"
#include "offload/trace.h"

namespace flexh2o::offload {
namespace {

using namespace test_util;

using Bytes = std::vector<unsigned char>;
constexpr std::array<Tier, 3> kEveryTier{Tier::Gpu, Tier::Cpu, Tier::Disk};

// Releases a gate on scope exit, so a failed assertion cannot leave a lane blocked forever
// (the engine's destructor joins its lanes).
class Gate {
 public:
  Gate() : future_(promise_.get_future().share()) {}
  ~Gate() { open(); }
  void open() {
    if (!opened_.exchange(true)) promise_.set_value();
  }
  std::shared_future<void> future() const { return future_; }

 private:
  std::promise<void> promise_;
  std::shared_future<void> future_;
  std::atomic<bool> opened_{false};
};

// Memory or disk bytes in some tier, with guard bytes on both sides that no copy may touch.
class Region {
 public:
  static constexpr std::int64_t kGuard = 4096;  // keeps shift 0 block-aligned

  Region(Tiers& tiers, Tier tier, std::int64_t bytes, std::int64_t shift, unsigned char guard)
      : tiers_(tiers), tier_(tier), bytes_(bytes), shift_(shift), guard_(guard) {
    const std::int64_t total = kGuard + shift + bytes + kGuard;
    const Bytes fill(static_cast<std::size_t>(total), guard);
    switch (tier) {
      case Tier::Gpu:
        dev_ = kernels::DeviceBuffer(tiers.backend(), static_cast<std::size_t>(total));
        tiers.backend().copy_to_device(dev_.data(), fill.data(), fill.size());
        break;
      case Tier::Cpu:
        host_ = HostBuffer(static_cast<std::size_t>(total));
        std::memcpy(host_.data(), fill.data(), fill.size());
        break;
      case Tier::Disk:
        extent_ = tiers.disk().allocate(total, "test region");
        tiers.disk().wait(tiers.disk().write(extent_, 0, fill.data(), total));
        break;
    }
  }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  ~Region() {
    if (extent_.bytes > 0) tiers_.disk().free(extent_);
  }

  Place place() const {
    const std::int64_t at = kGuard + shift_;
    switch (tier_) {
      case Tier::Gpu: return Place::gpu(static_cast<std::byte*>(dev_.data()) + at);
      case Tier::Cpu: return Place::cpu(static_cast<std::byte*>(host_.data()) + at);
      case Tier::Disk: return Place::disk(extent_, at);
    }
    return {};
  }
  // Everything, guards included.
  Bytes all() const {
    const std::int64_t total = kGuard + shift_ + bytes_ + kGuard;
    Bytes out(static_cast<std::size_t>(total));
    switch (tier_) {
      case Tier::Gpu: tiers_.backend().copy_to_host(out.data(), dev_.data(), out.size()); break;
      case Tier::Cpu: std::memcpy(out.data(), host_.data(), out.size()); break;
      case Tier::Disk: tiers_.disk().wait(tiers_.disk().read(extent_, 0, out.data(), total)); break;
    }
    return out;
  }
  void set(const Bytes& data) {
    const std::int64_t at = kGuard + shift_;
    switch (tier_) {
      case Tier::Gpu:
        tiers_.backend().copy_to_device(static_cast<std::byte*>(dev_.data()) + at, data.data(), data.size());
        break;
      case Tier::Cpu: std::memcpy(static_cast<std::byte*>(host_.data()) + at, data.data(), data.size()); break;
      case Tier::Disk:
        tiers_.disk().wait(tiers_.disk().write(extent_, at, data.data(), static_cast<std::int64_t>(data.size())));
        break;
    }
  }
  // The payload equals `want` and every guard byte is intact.
  ::testing::AssertionResult holds(const Bytes& want) const {
    const Bytes got = all();
    const std::size_t at = static_cast<std::size_t>(kGuard + shift_);
    const Bytes guard(at, guard_);
    if (std::memcmp(got.data(), guard.data(), at) != 0) return ::testing::AssertionFailure() << "guard before the region changed";
    if (std::memcmp(got.data() + at + want.size(), guard.data(), static_cast<std::size_t>(kGuard)) != 0)
      return ::testing::AssertionFailure() << "guard after the region changed";
    if (!want.empty() && std::memcmp(got.data() + at, want.data(), want.size()) != 0) {
      const auto m = std::mismatch(want.begin(), want.end(), got.begin() + static_cast<std::ptrdiff_t>(at));
      return ::testing::AssertionFailure() << "payload differs at byte " << (m.first - want.begin()) << " of "
                                           << want.size();
    }
    return ::testing::AssertionSuccess();
  }

 private:
  Tiers& tiers_;
  Tier tier_;
  std::int64_t bytes_, shift_;
  unsigned char guard_;
  kernels::DeviceBuffer dev_;
  HostBuffer host_;
  Extent extent_{};
};

TEST(Place, AdvancedMovesPointerOrOffset) {
  unsigned char buf[64];
  const Place g = Place::gpu(buf).advanced(10);
  EXPECT_EQ(g.tier, Tier::Gpu);
  EXPECT_EQ(g.ptr, buf + 10);
  EXPECT_EQ(Place::cpu(buf).advanced(63).ptr, buf + 63);
  const Extent e{8192, 5000};
  const Place d = Place::disk(e, 7).advanced(100);
  EXPECT_EQ(d.tier, Tier::Disk);
  EXPECT_EQ(d.extent.offset, 8192);
  EXPECT_EQ(d.extent.bytes, 5000);
  EXPECT_EQ(d.offset, 107);
  EXPECT_EQ(d.ptr, nullptr);
}

TEST(Staging, BuffersArePageAlignedAndReused) {
  Staging staging;
  HostBuffer& a = staging.buffer(0);
  HostBuffer& b = staging.buffer(1);
  EXPECT_NE(&a, &b);
  EXPECT_EQ(static_cast<std::int64_t>(a.bytes()), Staging::kChunkBytes);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % 4096, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % 4096, 0u);
  void* first = a.data();
  EXPECT_EQ(staging.buffer(0).data(), first);  // allocated once
  EXPECT_FALSE(a.pinned());                     // nothing to pin with
}

TEST(CopyTicket, DefaultIsDone) {
  const CopyTicket t;
  EXPECT_TRUE(t.done());
  EXPECT_NO_THROW(t.wait());
}

// ---- Every tier pair, parametrised over disk I/O mode and staging ----------------------------

struct CopyMode {
  bool threads;       // TierOptions::force_disk_threads
  bool always_stage;  // CopyOptions::always_stage
};

class CopyModes : public ::testing::TestWithParam<CopyMode> {
 protected:
  void SetUp() override {
    backend_ = kernels::make_cpu_backend();
    if (!GetParam().threads) {
      Tiers probe(*backend_, tier_options(dir_.path(), false));
      if (!probe.disk().uses_io_uring()) GTEST_SKIP() << "io_uring is unavailable here; the thread-pool params still run";
    }
  }
  void TearDown() override { EXPECT_TRUE(list_dir(dir_.path()).empty()) << "files left in the offload dir"; }
  CopyOptions copy_options() const {
    CopyOptions o;
    o.always_stage = GetParam().always_stage;
    return o;
  }

  ScratchDir dir_;
  std::unique_ptr<kernels::Backend> backend_;
};

TEST_P(CopyModes, EveryTierPairCopiesExactly) {
  Tiers tiers(*backend_, tier_options(dir_.path(), GetParam().threads));
  EXPECT_EQ(tiers.disk().uses_io_uring(), !GetParam().threads);
  CopyEngine engine(tiers, copy_options());
  const int lane = engine.add_lane("copy: pairs");
  Staging staging;
  std::mt19937_64 rng(1234);
  // Odd sizes straddle 4 KiB blocks; 3 x 4096 at shift 0 is the aligned (unstaged) case. (Copies
  // over several 8 MiB staging chunks: TieredIo.LargeTensorSpansSeveralStagingChunks.)
  const std::vector<std::int64_t> sizes = {1, 4095, 4097, 3 * 4096, 300001, 530001};
  int round = 0;
  for (Tier from : kEveryTier) {
    for (Tier to : kEveryTier) {
      for (const std::int64_t n : sizes) {
        const std::int64_t src_shift = n == 3 * 4096 ? 0 : static_cast<std::int64_t>(rng() % 4096);
        const std::int64_t dst_shift = n == 3 * 4096 ? 0 : static_cast<std::int64_t>(rng() % 4096);
        SCOPED_TRACE(std::string(tier_name(from)) + " -> " + std::string(tier_name(to)) + ", " + std::to_string(n) +
                     " bytes, shifts " + std::to_string(src_shift) + "/" + std::to_string(dst_shift));
        Region src(tiers, from, n, src_shift, 0xa5);
        Region dst(tiers, to, n, dst_shift, 0x3c);
        const Bytes data = random_bytes(rng, n);
        src.set(data);
        switch (round++ % 3) {
          case 0: copy_now(tiers, dst.place(), src.place(), n, staging, copy_options()); break;
          case 1: engine.copy(lane, dst.place(), src.place(), n, {"pair", "one"}).wait(); break;
          default: {  // two halves as one job of pieces
            const std::int64_t h = n / 2;
            engine
                .copy(lane, std::vector<CopyPiece>{{dst.place().advanced(h), src.place().advanced(h), n - h},
                                                   {dst.place(), src.place(), h}})
                .wait();
          }
        }
        ASSERT_TRUE(dst.holds(data));
        ASSERT_TRUE(src.holds(data));  // the source is untouched
      }
    }
  }
  EXPECT_EQ(tiers.budget(Tier::Disk).used(), 0);
}

TEST_P(CopyModes, PiecesMixingTiersInOneJob) {
  Tiers tiers(*backend_, tier_options(dir_.path(), GetParam().threads));
  CopyEngine engine(tiers, copy_options());
  const int lane = engine.add_lane("copy: mixed");
  std::mt19937_64 rng(77);
  // One source per tier, copied into one destination per tier, all in a single job.
  std::vector<std::unique_ptr<Region>> srcs, dsts;
  std::vector<Bytes> data;
  std::vector<CopyPiece> pieces;
  for (Tier from : kEveryTier) {
    for (Tier to : kEveryTier) {
      const auto n = static_cast<std::int64_t>(1 + rng() % 200000);
      srcs.push_back(std::make_unique<Region>(tiers, from, n, static_cast<std::int64_t>(rng() % 5000), 0x11));
      dsts.push_back(std::make_unique<Region>(tiers, to, n, static_cast<std::int64_t>(rng() % 5000), 0x22));
      data.push_back(random_bytes(rng, n));
      srcs.back()->set(data.back());
      pieces.push_back({dsts.back()->place(), srcs.back()->place(), n});
    }
  }
  std::int64_t total = 0;
  for (const auto& p : pieces) total += p.bytes;
  engine.copy(lane, pieces, {"mixed", "nine pairs"}).wait();
  for (std::size_t i = 0; i < dsts.size(); ++i) EXPECT_TRUE(dsts[i]->holds(data[i])) << "pair " << i;
  EXPECT_GT(total, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, CopyModes,
                         ::testing::Values(CopyMode{false, false}, CopyMode{false, true}, CopyMode{true, false},
                                           CopyMode{true, true}),
                         [](const ::testing::TestParamInfo<CopyMode>& info) {
                           return std::string(info.param.threads ? "threads" : "uring") +
                                  (info.param.always_stage ? "_staged" : "_direct");
                         });

// ---- Lanes, tickets, order, errors ----------------------------------------------------------

class CopyEngineTest : public ::testing::Test {
 protected:
  void SetUp() override { backend_ = kernels::make_cpu_backend(); }
  void TearDown() override { EXPECT_TRUE(list_dir(dir_.path()).empty()) << "files left in the offload dir"; }
  TierOptions options() const { return tier_options(dir_.path(), false); }

  ScratchDir dir_;
  std::unique_ptr<kernels::Backend> backend_;
};

// 240 neighbouring unaligned regions of one fresh extent (they share 4 KiB blocks, and the
// read-modify-write of each one's edge blocks reads at the end of the file while the other
// lanes' writes extend it), written from host memory by all lanes at once, then read back into
// device memory by all lanes at once; with both disk I/O engines.
TEST_F(CopyEngineTest, ManyTicketsInFlightOnSeveralLanes) {
  for (const bool threads : {false, true}) {
    SCOPED_TRACE(threads ? "thread pool" : "io_uring (or its fallback)");
    Tiers tiers(*backend_, tier_options(dir_.path(), threads));
    CopyOptions stage;
    stage.always_stage = true;
    CopyEngine engine(tiers, stage);
    std::vector<int> lanes;
    for (const char* name : {"copy: weights in", "copy: cache in", "copy: cache out", "copy: spare"})
      lanes.push_back(engine.add_lane(name));
    std::mt19937_64 rng(2024);
    constexpr int kJobs = 240;
    constexpr std::int64_t kStride = 9001;
    const Bytes data = random_bytes(rng, kJobs * kStride);
    DiskStore& disk = tiers.disk();
    const Extent e = disk.allocate(kJobs * kStride, "shared extent");
    std::vector<CopyTicket> tickets;
    for (int i = 0; i < kJobs; ++i) {
      const std::int64_t off = i * kStride;
      tickets.push_back(engine.copy(lanes[static_cast<std::size_t>(i) % lanes.size()], Place::disk(e, off),
                                    Place::cpu(const_cast<unsigned char*>(data.data()) + off), kStride,
                                    {"store", "region " + std::to_string(i)}));
    }
    for (const CopyTicket& t : tickets) t.wait();
    for (const CopyTicket& t : tickets) EXPECT_TRUE(t.done());
    tickets.clear();
    kernels::DeviceBuffer dev(*backend_, data.size());
    for (int i = kJobs - 1; i >= 0; --i) {  // reverse order, staged disk -> gpu
      const std::int64_t off = i * kStride;
      tickets.push_back(engine.copy(lanes[static_cast<std::size_t>(i * 7) % lanes.size()],
                                    Place::gpu(static_cast<std::byte*>(dev.data()) + off), Place::disk(e, off), kStride));
    }
    for (const CopyTicket& t : tickets) t.wait();
    Bytes back(data.size());
    backend_->copy_to_host(back.data(), dev.data(), back.size());
    EXPECT_TRUE(back == data);

    // Again into a second fresh extent as one job per lane whose pieces (every fourth region)
    // the job issues to the store all at once.
    const Extent e2 = disk.allocate(kJobs * kStride, "second extent");
    std::vector<std::vector<CopyPiece>> per_lane(lanes.size());
    for (int i = 0; i < kJobs; ++i) {
      const std::int64_t off = i * kStride;
      per_lane[static_cast<std::size_t>(i) % lanes.size()].push_back(
          {Place::disk(e2, off), Place::cpu(const_cast<unsigned char*>(data.data()) + off), kStride});
    }
    tickets.clear();
    for (std::size_t l = 0; l < lanes.size(); ++l) tickets.push_back(engine.copy(lanes[l], per_lane[l]));
    for (const CopyTicket& t : tickets) t.wait();
    std::fill(back.begin(), back.end(), 0);
    engine.copy(lanes[0], Place::cpu(back.data()), Place::disk(e2), kJobs * kStride).wait();
    EXPECT_TRUE(back == data);
    disk.free(e);
    disk.free(e2);
  }
}

TEST_F(CopyEngineTest, TicketWaitsForItsJobAndLanesAreIndependent) {
  Tiers tiers(*backend_, options());
  CopyEngine engine(tiers);
  const int slow = engine.add_lane("copy: slow");
  const int fast = engine.add_lane("copy: fast");
  Gate gate;
  const Bytes src(100000, 0x42);
  Bytes dst(src.size(), 0);
  Bytes other(src.size(), 0);
  const CopyTicket blocked = engine.submit(slow, [f = gate.future()](Staging&) { f.wait(); }, {"gate", "gate"});
  const CopyTicket queued =
      engine.copy(slow, Place::cpu(dst.data()), Place::cpu(const_cast<unsigned char*>(src.data())), 100000);
  // Another lane is not held up by the blocked one.
  engine.copy(fast, Place::cpu(other.data()), Place::cpu(const_cast<unsigned char*>(src.data())), 100000).wait();
  EXPECT_TRUE(other == src);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(blocked.done());
  EXPECT_FALSE(queued.done());  // behind the gate in its lane
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](unsigned char x) { return x == 0; }));
  gate.open();
  queued.wait();
  EXPECT_TRUE(blocked.done());
  EXPECT_TRUE(queued.done());
  EXPECT_TRUE(dst == src);
  const CopyTicket copy_of_ticket = queued;  // copies share the state
  EXPECT_TRUE(copy_of_ticket.done());
  EXPECT_NO_THROW(copy_of_ticket.wait());
}

TEST_F(CopyEngineTest, JobsRunInFifoOrderWithinALane) {
  Tiers tiers(*backend_, options());
  CopyEngine engine(tiers);
  const int lane = engine.add_lane("copy: fifo");
  const int other_lane = engine.add_lane("copy: other");

  // Two jobs writing the same region: the later one wins even when the first is slow.
  Bytes region(50000, 0);
  engine.submit(lane, [&](Staging&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::fill(region.begin(), region.end(), 0x11);
  }, {"fill", "first"});
  const CopyTicket second = engine.submit(lane, [&](Staging&) { std::fill(region.begin(), region.end(), 0x22); }, {"fill", "second"});
  second.wait();
  EXPECT_TRUE(std::all_of(region.begin(), region.end(), [](unsigned char x) { return x == 0x22; }));

  // A write to disk and a read of the same bytes, queued back to back: the read sees the write.
  std::mt19937_64 rng(8);
  const Bytes data = random_bytes(rng, 70001);
  Bytes back(data.size(), 0);
  const Extent e = tiers.disk().allocate(80000);
  engine.copy(lane, Place::disk(e, 999), Place::cpu(const_cast<unsigned char*>(data.data())), 70001);
  const CopyTicket read = engine.copy(lane, Place::cpu(back.data()), Place::disk(e, 999), 70001);
  read.wait();
  EXPECT_TRUE(back == data);
  tiers.disk().free(e);

  // Many jobs record their position; only the lane's worker touches `order` until the wait.
  std::vector<int> order;
  std::vector<int> other_order;
  CopyTicket last, other_last;
  for (int i = 0; i < 300; ++i) {
    last = engine.submit(lane, [&order, i](Staging&) { order.push_back(i); }, {"order", ""});
    other_last = engine.submit(other_lane, [&other_order, i](Staging&) { other_order.push_back(i); }, {"order", ""});
  }
  last.wait();
  other_last.wait();
  ASSERT_EQ(order.size(), 300u);
  ASSERT_EQ(other_order.size(), 300u);
  for (int i = 0; i < 300; ++i) {
    EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
    EXPECT_EQ(other_order[static_cast<std::size_t>(i)], i);
  }
}

TEST_F(CopyEngineTest, ErrorsAreRethrownAndTheLaneGoesOn) {
  Tiers tiers(*backend_, options());
  CopyEngine engine(tiers);
  const int lane = engine.add_lane("copy: faulty");
  const CopyTicket boom = engine.submit(lane, [](Staging&) { throw std::runtime_error("boom in job 7"); }, {"bad", "7"});
  std::atomic<int> ran{0};
  const CopyTicket after = engine.submit(lane, [&](Staging&) { ++ran; }, {"good", "8"});
  try {
    boom.wait();
    ADD_FAILURE() << "the job's exception was not rethrown";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom in job 7");
  }
  EXPECT_TRUE(boom.done());
  EXPECT_THROW(boom.wait(), std::runtime_error);  // every wait reports it
  EXPECT_NO_THROW(after.wait());
  EXPECT_EQ(ran.load(), 1);

  // Copy errors reach the ticket too: a negative size, a freed extent.
  Bytes a(10), b(10);
  EXPECT_THROW(engine.copy(lane, Place::cpu(a.data()), Place::cpu(b.data()), -1).wait(), std::invalid_argument);
  const Extent freed = tiers.disk().allocate(100);
  tiers.disk().free(freed);
  EXPECT_THROW(engine.copy(lane, Place::cpu(a.data()), Place::disk(freed), 10).wait(), std::invalid_argument);
  Staging staging;
  EXPECT_THROW(copy_now(tiers, Place::cpu(a.data()), Place::cpu(b.data()), -5, staging), std::invalid_argument);

  // ... and the lane still copies afterwards.
  std::fill(b.begin(), b.end(), 9);
  engine.copy(lane, Place::cpu(a.data()), Place::cpu(b.data()), 10).wait();
  EXPECT_EQ(a, b);

  EXPECT_THROW(engine.submit(1, [](Staging&) {}, {}), std::out_of_range);
  EXPECT_THROW(engine.submit(-1, [](Staging&) {}, {}), std::out_of_range);
  EXPECT_THROW(engine.copy(3, Place::cpu(a.data()), Place::cpu(b.data()), 10), std::out_of_range);
}

TEST_F(CopyEngineTest, DestructionFinishesQueuedWork) {
  Tiers tiers(*backend_, options());
  std::atomic<int> ran{0};
  std::vector<CopyTicket> tickets;
  {
    CopyEngine engine(tiers);
    const std::array<int, 2> lanes{engine.add_lane("a"), engine.add_lane("b")};
    for (int i = 0; i < 40; ++i) {
      tickets.push_back(engine.submit(lanes[static_cast<std::size_t>(i % 2)], [&ran](Staging&) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        ++ran;
      }, {"slow", ""}));
    }
    // A failing job at the end: its error stays with its ticket, the destructor does not throw.
    tickets.push_back(engine.submit(lanes[0], [](Staging&) { throw std::runtime_error("late failure"); }, {"bad", ""}));
  }
  EXPECT_EQ(ran.load(), 40);
  for (std::size_t i = 0; i + 1 < tickets.size(); ++i) {
    EXPECT_TRUE(tickets[i].done());
    EXPECT_NO_THROW(tickets[i].wait());
  }
  EXPECT_THROW(tickets.back().wait(), std::runtime_error);
}

// ---- Ordering with compute ------------------------------------------------------------------

// The CPU backend with device-like asynchronous compute: launch() queues an op for a worker
// thread (the compute stream); fence() marks the ops launched so far; a copy waits for the
// ops before its fence, or, without one, for every op launched before the copy.
class AsyncComputeBackend final : public testing::ForwardingBackend {
 public:
  AsyncComputeBackend() : worker_([this] { run(); }) {}
  ~AsyncComputeBackend() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  void launch(std::function<void()> op) {
    {
      std::lock_guard lock(mu_);
      ops_.push_back(std::move(op));
      ++launched_;
    }
    cv_.notify_all();
  }
  std::shared_ptr<const kernels::Fence> fence() override {
    std::lock_guard lock(mu_);
    return std::make_shared<Mark>(launched_);
  }
  void copy_regions(kernels::CopyDirection dir, std::span<const kernels::CopyRegion> regions,
                    const kernels::Fence* after) override {
    wait_for(after ? dynamic_cast<const Mark&>(*after).ops : launched_now());
    ForwardingBackend::copy_regions(dir, regions, nullptr);
  }
  void copy_to_device(void* dst, const void* src, std::size_t bytes) override {
    wait_for(launched_now());
    ForwardingBackend::copy_to_device(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    wait_for(launched_now());
    ForwardingBackend::copy_to_host(dst, src, bytes);
  }
  void synchronize() override { wait_for(launched_now()); }

 private:
  struct Mark final : kernels::Fence {
    explicit Mark(std::int64_t n) : ops(n) {}
    std::int64_t ops;
  };
  std::int64_t launched_now() {
    std::lock_guard lock(mu_);
    return launched_;
  }
  void wait_for(std::int64_t ops) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return completed_ >= ops; });
  }
  void run() {
    for (;;) {
      std::function<void()> op;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !ops_.empty(); });
        if (ops_.empty()) return;
        op = std::move(ops_.front());
        ops_.pop_front();
      }
      op();
      {
        std::lock_guard lock(mu_);
        ++completed_;
      }
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> ops_;
  std::int64_t launched_ = 0, completed_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

bool done_within(const CopyTicket& t, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!t.done() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return t.done();
}

// A copy job waits for the compute issued before it was submitted and for no later compute,
// even when its lane runs it only after that later compute was issued; a copy submitted after
// the compute sees its result. Memory and staged disk copies, both directions.
TEST_F(CopyEngineTest, CopySubmittedBeforeAComputeNeverWaitsForIt) {
  AsyncComputeBackend be;
  for (const bool stage : {false, true}) {
    SCOPED_TRACE(stage ? "staged through disk" : "host <-> device");
    Tiers tiers(be, options());
    CopyOptions opts;
    opts.always_stage = stage;
    constexpr std::int64_t n = 100000;
    kernels::DeviceBuffer dev(be, n);
    const Bytes initial(n, 0x11);
    be.copy_to_device(dev.data(), initial.data(), n);
    const Extent e = tiers.disk().allocate(n, "fence test");
    tiers.disk().wait(tiers.disk().write(e, 0, initial.data(), n));
    Bytes before(n, 0), after(n, 0);
    {
      CopyEngine engine(tiers, opts);
      const int lane = engine.add_lane("copy: out");
      const int in_lane = engine.add_lane("copy: in");
      // Gates after the engine: destroyed (opened) first, so a failure cannot leave it joining a
      // blocked lane.
      Gate lane_gate, compute_gate;
      engine.submit(lane, [f = lane_gate.future()](Staging&) { f.wait(); }, {"gate", "lane"});
      engine.submit(in_lane, [f = lane_gate.future()](Staging&) { f.wait(); }, {"gate", "lane"});
      auto src_of = [&](Bytes& host) { return stage ? Place::disk(e) : Place::cpu(host.data()); };
      Bytes fresh(n, 0x22);
      // Queued before the compute: a read of the device buffer, and a write of another region.
      const CopyTicket read_before =
          stage ? engine.copy(lane, Place::disk(e), Place::gpu(dev.data()), n) : engine.copy(lane, Place::cpu(before.data()), Place::gpu(dev.data()), n);
      kernels::DeviceBuffer other(be, n);
      const CopyTicket write_before = engine.copy(in_lane, Place::gpu(other.data()), src_of(fresh), n);
      be.launch([&, f = compute_gate.future()] {
        f.wait();
        std::memset(dev.data(), 0x77, n);
      });
      const CopyTicket read_after = engine.copy(lane, Place::cpu(after.data()), Place::gpu(dev.data()), n);
      lane_gate.open();
      // Both run while the compute is still held.
      EXPECT_TRUE(done_within(read_before, std::chrono::seconds(10))) << "a copy waited for compute queued after it";
      EXPECT_TRUE(done_within(write_before, std::chrono::seconds(10))) << "a copy waited for compute queued after it";
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      EXPECT_FALSE(read_after.done()) << "a copy did not wait for the compute queued before it";
      compute_gate.open();
      read_after.wait();
      read_before.wait();
      write_before.wait();
    }
    if (stage) tiers.disk().wait(tiers.disk().read(e, 0, before.data(), n));
    EXPECT_TRUE(before == initial);
    EXPECT_TRUE(std::all_of(after.begin(), after.end(), [](unsigned char x) { return x == 0x77; }));
    tiers.disk().free(e);
  }
}

// ---- Trace -----------------------------------------------------------------------------------

TEST_F(CopyEngineTest, TraceRecordsOneSpanPerJobOnTheLaneTrack) {
  Tiers tiers(*backend_, options());
  Trace trace;
  const std::vector<std::string> names = {"copy: weights in", "copy: cache in", "copy: cache out"};
  std::map<std::string, std::int64_t> bytes_by_track;
  std::vector<std::string> submitted_names;
  {
    CopyEngine engine(tiers, {}, &trace);
    std::vector<int> lanes;
    for (const auto& n : names) lanes.push_back(engine.add_lane(n));
    const Bytes src(40000, 1);
    Bytes dst(40000, 0);
    const Extent e = tiers.disk().allocate(40000);
    std::vector<CopyTicket> tickets;
    for (int i = 0; i < 30; ++i) {
      const std::size_t l = static_cast<std::size_t>(i) % lanes.size();
      const std::int64_t n = 1000 + i;
      const std::string name = "job." + std::to_string(i);
      if (l == 0) {  // disk -> host
        tickets.push_back(engine.copy(lanes[l], Place::cpu(dst.data()), Place::disk(e), n, {"load_weight", name}));
      } else if (l == 1) {  // host -> host, as pieces
        tickets.push_back(engine.copy(lanes[l],
                                      std::vector<CopyPiece>{{Place::cpu(dst.data() + 20000), Place::cpu(const_cast<unsigned char*>(src.data())), n - 500},
                                                             {Place::cpu(dst.data() + 30000), Place::cpu(const_cast<unsigned char*>(src.data())), 500}},
                                      {"load_cache", name}));
      } else {  // a submitted job with its own byte count
        tickets.push_back(engine.submit(lanes[l], [](Staging&) {}, {"store_cache", name}, n));
      }
      bytes_by_track[names[l]] += n;
      submitted_names.push_back(name);
      // Tickets within a lane are waited in order, so spans on one track are ordered.
    }
    tickets.push_back(engine.submit(lanes[2], [](Staging&) {}, {"sync", ""}));  // no name: the primitive names it
    for (const CopyTicket& t : tickets) t.wait();
    // Each span is recorded before its ticket completes.
    EXPECT_EQ(trace.spans().size(), 31u);
    tiers.disk().free(e);
  }
  const std::vector<Span> spans = trace.spans();
  ASSERT_EQ(spans.size(), 31u);
  std::map<std::string, std::int64_t> got_bytes;
  std::map<std::string, std::vector<const Span*>> by_track;
  std::set<std::string> got_names;
  for (const Span& s : spans) {
    EXPECT_LE(s.t0, s.t1);
    EXPECT_GE(s.t0, 0.0);
    EXPECT_LE(s.t1, trace.now());
    got_bytes[s.track] += s.bytes;
    by_track[s.track].push_back(&s);
    got_names.insert(s.name);
    if (s.name == "sync") {
      EXPECT_EQ(s.primitive, "sync");
      EXPECT_EQ(s.bytes, 0);
      EXPECT_EQ(s.track, "copy: cache out");
    } else {
      const int i = std::stoi(s.name.substr(4));
      EXPECT_EQ(s.track, names[static_cast<std::size_t>(i) % names.size()]) << s.name;
      EXPECT_EQ(s.bytes, 1000 + i) << s.name;
      EXPECT_EQ(s.primitive, i % 3 == 0 ? "load_weight" : i % 3 == 1 ? "load_cache" : "store_cache") << s.name;
    }
  }
  EXPECT_EQ(got_bytes, bytes_by_track);
  EXPECT_EQ(got_names.size(), 31u);
  EXPECT_EQ(by_track.size(), 3u);
  for (const auto& [track, list] : by_track) {
    // One worker per lane: its spans never overlap and follow the submission order.
    for (std::size_t k = 1; k < list.size(); ++k) {
      EXPECT_LE(list[k - 1]->t1, list[k]->t0) << track;
      if (list[k]->name != "sync") {
        EXPECT_LT(std::stoi(list[k - 1]->name.substr(4)), std::stoi(list[k]->name.substr(4)));
      }
    }
  }
  const auto per_primitive = trace.time_by_primitive();
  EXPECT_EQ(per_primitive.size(), 4u);
  double sum = 0;
  for (const Span& s : spans) sum += s.t1 - s.t0;
  double total = 0;
  for (const auto& [p, t] : per_primitive) total += t;
  EXPECT_NEAR(total, sum, 1e-9);
}

TEST_F(CopyEngineTest, ChromeTraceJsonIsValidWithThreadNames) {
  Trace trace;
  trace.record({"copy: weights in", "load_weight", "mlp.0", 0.001, 0.002, 4096});
  trace.record({"compute", "compute_layer", "layer 0", 0.0015, 0.003, 0});
  trace.record({"copy: weights in", "load_weight", "mlp.1 \"quoted\"\n", 0.002, 0.0025, 123});
  {
    ScopedSpan s(&trace, "copy: cache out", "store_cache", "kv.0", 77);
  }
  { ScopedSpan none(nullptr, "x", "y", "z"); }  // no trace: nothing recorded
  const std::string path = dir_.path() + "/trace.json";
  trace.write_chrome_json(path);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  std::ifstream in(path);
  nlohmann::json doc;
  ASSERT_NO_THROW(doc = nlohmann::json::parse(in));
  ASSERT_TRUE(doc.is_object());
  EXPECT_EQ(doc.value("displayTimeUnit", ""), "ms");
  ASSERT_TRUE(doc["traceEvents"].is_array());
  std::map<int, std::string> thread_names;
  std::vector<nlohmann::json> spans;
  for (const auto& ev : doc["traceEvents"]) {
    ASSERT_TRUE(ev.contains("ph"));
    EXPECT_EQ(ev["pid"], 1);
    if (ev["ph"] == "M") {
      EXPECT_EQ(ev["name"], "thread_name");
      const int tid = ev["tid"].get<int>();
      EXPECT_EQ(thread_names.count(tid), 0u) << "two names for tid " << tid;
      thread_names[tid] = ev["args"]["name"].get<std::string>();
    } else {
      EXPECT_EQ(ev["ph"], "X");
      spans.push_back(ev);
    }
  }
  EXPECT_EQ(thread_names.size(), 3u);
  std::set<std::string> tracks;
  for (const auto& [tid, name] : thread_names) tracks.insert(name);
  EXPECT_EQ(tracks, (std::set<std::string>{"copy: weights in", "compute", "copy: cache out"}));
  ASSERT_EQ(spans.size(), 4u);
  for (const auto& ev : spans) {
    const int tid = ev["tid"].get<int>();
    ASSERT_EQ(thread_names.count(tid), 1u) << "span on an unnamed thread " << tid;
    EXPECT_GE(ev["ts"].get<double>(), 0.0);
    EXPECT_GE(ev["dur"].get<double>(), 0.0);
    const std::string name = ev["name"];
    if (name == "mlp.0") {
      EXPECT_EQ(thread_names[tid], "copy: weights in");
      EXPECT_EQ(ev["cat"], "load_weight");
      EXPECT_NEAR(ev["ts"].get<double>(), 1000.0, 1e-6);  // microseconds
      EXPECT_NEAR(ev["dur"].get<double>(), 1000.0, 1e-6);
      EXPECT_EQ(ev["args"]["bytes"], 4096);
    } else if (name == "mlp.1 \"quoted\"\n") {
      EXPECT_EQ(ev["args"]["bytes"], 123);
    } else if (name == "layer 0") {
      EXPECT_EQ(thread_names[tid], "compute");
      EXPECT_FALSE(ev.contains("args") && ev["args"].contains("bytes"));
    } else {
      EXPECT_EQ(name, "kv.0");
      EXPECT_EQ(thread_names[tid], "copy: cache out");
      EXPECT_EQ(ev["args"]["bytes"], 77);
    }
  }

  // An empty trace is still valid JSON.
  const std::string empty_path = dir_.path() + "/empty.json";
  Trace().write_chrome_json(empty_path);
  std::ifstream empty_in(empty_path);
  const auto empty = nlohmann::json::parse(empty_in);
  EXPECT_TRUE(empty["traceEvents"].is_array());
  EXPECT_TRUE(empty["traceEvents"].empty());

  // An unwritable path is a clear error naming it, and leaves nothing behind.
  const std::string bad = dir_.path() + "/no-such-dir/trace.json";
  try {
    trace.write_chrome_json(bad);
    ADD_FAILURE() << "wrote a trace under a missing directory";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/no-such-dir"));
  std::filesystem::remove(path);
  std::filesystem::remove(empty_path);
}

TEST_F(CopyEngineTest, EngineTraceWritesChromeJsonWithLaneNames) {
  Tiers tiers(*backend_, options());
  Trace trace;
  {
    CopyEngine engine(tiers, {}, &trace);
    const int a = engine.add_lane("copy: weights in");
    const int b = engine.add_lane("copy: cache out");
    Bytes x(1000, 1), y(1000, 0);
    std::vector<CopyTicket> ts;
    for (int i = 0; i < 5; ++i) {
      ts.push_back(engine.copy(a, Place::cpu(y.data()), Place::cpu(x.data()), 1000, {"load_weight", "w" + std::to_string(i)}));
      ts.push_back(engine.submit(b, [](Staging&) {}, {"store_cache", "c" + std::to_string(i)}, 64));
    }
    for (const auto& t : ts) t.wait();
  }
  const std::string path = dir_.path() + "/engine-trace.json";
  trace.write_chrome_json(path);
  std::ifstream in(path);
  const auto doc = nlohmann::json::parse(in);
  std::map<int, std::string> names;
  std::map<std::string, int> per_track;
  for (const auto& ev : doc["traceEvents"])
    if (ev["ph"] == "M") names[ev["tid"].get<int>()] = ev["args"]["name"].get<std::string>();
  for (const auto& ev : doc["traceEvents"])
    if (ev["ph"] == "X") ++per_track[names.at(ev["tid"].get<int>())];
  EXPECT_EQ(per_track, (std::map<std::string, int>{{"copy: weights in", 5}, {"copy: cache out", 5}}));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace flexh2o::offload
