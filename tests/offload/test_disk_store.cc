#include "offload/disk_store.h"

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "tests/offload/offload_test_util.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace flexh2o::offload {
namespace {

using namespace test_util;

constexpr std::int64_t kMiB = 1 << 20;

struct AlignedFree {
  void operator()(unsigned char* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<unsigned char, AlignedFree>;
AlignedBuffer aligned_buffer(std::size_t n) {
  return AlignedBuffer(static_cast<unsigned char*>(std::aligned_alloc(4096, std::max<std::size_t>(4096, (n + 4095) / 4096 * 4096))));
}

// The I/O mode is chosen the way users choose it: through FLEXH2O_DISK_IO, which sets the
// default of DiskStore::Options::force_threads.
class DiskStoreIo : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (threads()) {
      ASSERT_EQ(::setenv("FLEXH2O_DISK_IO", "threads", 1), 0);
    } else {
      ASSERT_EQ(::unsetenv("FLEXH2O_DISK_IO"), 0);
    }
  }
  void TearDown() override { ::unsetenv("FLEXH2O_DISK_IO"); }
  bool threads() const { return std::string(GetParam()) == "threads"; }
  DiskStore::Options options(const std::string& dir) const {
    DiskStore::Options o;
    o.dir = dir;
    EXPECT_EQ(o.force_threads, threads());
    return o;
  }
};

TEST_P(DiskStoreIo, RandomRoundTripManyInFlight) {
  ScratchDir dir;
  DiskStore store(options(dir.path()));
  if (threads()) {
    EXPECT_FALSE(store.uses_io_uring());
  }
  std::mt19937_64 rng(42);

  struct Case {
    Extent extent;
    std::int64_t offset = 0;
    std::vector<unsigned char> data;
    std::vector<unsigned char> src;  // data at a random misalignment
    std::size_t src_shift = 0;
    AlignedBuffer aligned;  // used instead of src for the direct (unstaged) path
    std::vector<unsigned char> back;
    std::size_t back_shift = 0;
  };
  // Every fourth case is aligned (the unstaged path); index 7 makes that one span chunks.
  std::vector<std::int64_t> sizes = {0, 1, 4095, 4096, 4097, kMiB + 3, 3 * kMiB + 5, 3 * kMiB, 2 * kMiB, 12288};
  while (sizes.size() < 200) {
    const auto r = rng() % 10;
    sizes.push_back(r == 0 ? static_cast<std::int64_t>(rng() % (2 * kMiB)) : static_cast<std::int64_t>(rng() % 70000));
  }
  std::vector<Case> cases(sizes.size());
  std::vector<Ticket> tickets;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    Case& c = cases[i];
    const std::int64_t n = sizes[i];
    const bool direct = i % 4 == 3;
    if (direct) {
      const std::int64_t blocks = (n + 4095) / 4096;
      c.extent = store.allocate(blocks * 4096 + 4096 * static_cast<std::int64_t>(rng() % 3));
      c.offset = 4096 * static_cast<std::int64_t>(rng() % ((c.extent.bytes - blocks * 4096) / 4096 + 1));
      c.data = random_bytes(rng, static_cast<std::size_t>(blocks * 4096));
      c.aligned = aligned_buffer(c.data.size());
      std::copy(c.data.begin(), c.data.end(), c.aligned.get());
    } else {
      c.extent = store.allocate(n + static_cast<std::int64_t>(rng() % 9000));
      c.offset = c.extent.bytes == n ? 0 : static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(c.extent.bytes - n + 1));
      c.data = random_bytes(rng, static_cast<std::size_t>(n));
      c.src_shift = rng() % 16;
      c.src.resize(c.data.size() + c.src_shift);
      std::copy(c.data.begin(), c.data.end(), c.src.begin() + static_cast<std::ptrdiff_t>(c.src_shift));
    }
    EXPECT_EQ(c.extent.offset % 4096, 0);
    const void* src = c.aligned ? static_cast<const void*>(c.aligned.get()) : c.src.data() + c.src_shift;
    tickets.push_back(store.write(c.extent, c.offset, src, static_cast<std::int64_t>(c.data.size())));
  }
  for (const Ticket& t : tickets) store.wait(t);
  tickets.clear();
  for (Case& c : cases) {
    c.back_shift = c.aligned ? 0 : static_cast<std::size_t>(rng() % 16);
    if (c.aligned) std::fill_n(c.aligned.get(), c.data.size(), 0);
    c.back.assign(c.data.size() + c.back_shift, 0);
    void* dst = c.aligned ? static_cast<void*>(c.aligned.get()) : c.back.data() + c.back_shift;
    tickets.push_back(store.read(c.extent, c.offset, dst, static_cast<std::int64_t>(c.data.size())));
  }
  for (const Ticket& t : tickets) store.wait(t);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const unsigned char* got = c.aligned ? c.aligned.get() : c.back.data() + c.back_shift;
    ASSERT_TRUE(std::equal(c.data.begin(), c.data.end(), got)) << "case " << i << ": " << c.data.size() << " bytes at "
                                                               << c.offset << " of " << c.extent.bytes;
  }
  for (const Case& c : cases) store.free(c.extent);
  EXPECT_EQ(store.budget().used(), 0);
}

// Unaligned neighbours share 4 KiB blocks; all in flight at once, none may clobber another.
TEST_P(DiskStoreIo, AdjacentUnalignedWritesInFlight) {
  ScratchDir dir;
  DiskStore store(options(dir.path()));
  std::mt19937_64 rng(7);
  const std::int64_t total = 256 * 1024 + 100;
  const Extent e = store.allocate(total);
  const std::vector<unsigned char> data = random_bytes(rng, static_cast<std::size_t>(total));
  std::vector<Ticket> tickets;
  for (std::int64_t off = 0; off < total;) {
    const std::int64_t n = std::min<std::int64_t>(total - off, 1 + static_cast<std::int64_t>(rng() % 6000));
    tickets.push_back(store.write(e, off, data.data() + off, n));
    off += n;
  }
  for (const Ticket& t : tickets) store.wait(t);
  std::vector<unsigned char> back(static_cast<std::size_t>(total));
  store.wait(store.read(e, 0, back.data(), total));
  EXPECT_EQ(back, data);

  // Overwriting a middle piece leaves its neighbours intact.
  const std::vector<unsigned char> patch = random_bytes(rng, 5000);
  store.wait(store.write(e, 10001, patch.data(), 5000));
  std::vector<unsigned char> expect = data;
  std::copy(patch.begin(), patch.end(), expect.begin() + 10001);
  store.wait(store.read(e, 0, back.data(), total));
  EXPECT_EQ(back, expect);
}

TEST_P(DiskStoreIo, FreeAndReuse) {
  ScratchDir dir;
  DiskStore store(options(dir.path()));
  const Extent a = store.allocate(10000);
  const Extent b = store.allocate(5000);
  EXPECT_EQ(a.offset, 0);
  EXPECT_EQ(b.offset, 12288);
  EXPECT_EQ(store.budget().used(), 12288 + 8192);
  store.free(a);
  EXPECT_THROW(store.free(a), std::invalid_argument);
  EXPECT_EQ(store.budget().used(), 8192);
  const Extent c = store.allocate(8192);  // first fit: reuses a's space
  EXPECT_EQ(c.offset, 0);
  const Extent d = store.allocate(4000);  // the rest of a's space
  EXPECT_EQ(d.offset, 8192);
  const std::vector<unsigned char> data(4000, 0x5a);
  store.wait(store.write(d, 0, data.data(), 4000));
  std::vector<unsigned char> back(4000);
  store.wait(store.read(d, 0, back.data(), 4000));
  EXPECT_EQ(back, data);
  store.free(b);
  store.free(c);
  store.free(d);
  EXPECT_EQ(store.budget().used(), 0);
  EXPECT_EQ(store.allocate(100).offset, 0);  // everything coalesced back
  EXPECT_EQ(store.budget().peak(), 12288 + 8192);
}

TEST_P(DiskStoreIo, ArgumentChecks) {
  ScratchDir dir;
  DiskStore store(options(dir.path()));
  const Extent e = store.allocate(100);
  std::vector<unsigned char> buf(200);
  EXPECT_THROW(store.write(e, 1, buf.data(), 100), std::out_of_range);
  EXPECT_THROW(store.read(e, -1, buf.data(), 10), std::out_of_range);
  EXPECT_THROW(store.read(e, 0, nullptr, 10), std::invalid_argument);
  EXPECT_THROW(store.allocate(-1), std::invalid_argument);
  const Extent empty = store.allocate(0);
  EXPECT_EQ(empty.bytes, 0);
  const Ticket t = store.write(empty, 0, nullptr, 0);
  EXPECT_TRUE(t.done());
  store.wait(t);
  store.wait(store.read(e, 100, buf.data(), 0));
  store.free(empty);
  store.free(e);
  EXPECT_THROW(store.read(e, 0, buf.data(), 10), std::invalid_argument);  // freed
}

TEST_P(DiskStoreIo, DiskBudgetLimitsAllocation) {
  ScratchDir dir;
  Budget budget(Tier::Disk, 64 * 1024);
  DiskStore::Options o = options(dir.path());
  o.budget = &budget;
  {
    DiskStore store(o);
    store.allocate(40000, "kv.layer0");
    EXPECT_EQ(budget.used(), 40960);
    try {
      store.allocate(30000, "kv.layer1");
      FAIL() << "allocation over the disk budget succeeded";
    } catch (const BudgetExceeded& e) {
      EXPECT_NE(std::string(e.what()).find("disk tier: cannot reserve"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("'kv.layer1'"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(budget.used(), 0);  // the destroyed store returned its extents
}

TEST_P(DiskStoreIo, DestructionRemovesFiles) {
  ScratchDir dir;
  std::string path;
  {
    DiskStore store(options(dir.path()));
    path = store.path();
    EXPECT_EQ(store.dir(), dir.path());
    const Extent e = store.allocate(5000);
    const std::vector<unsigned char> data(5000, 1);
    store.wait(store.write(e, 0, data.data(), 5000));
    EXPECT_EQ(list_dir(dir.path()).size(), 2u);  // the store file and its .lock (offload_marks.h)
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE(list_dir(dir.path()).empty());
  EXPECT_TRUE(std::filesystem::is_directory(dir.path()));  // a user-given directory is kept

  std::string own_dir;
  {
    DiskStore store(options(""));  // a fresh temporary directory
    own_dir = store.dir();
    EXPECT_TRUE(std::filesystem::is_directory(own_dir));
  }
  EXPECT_FALSE(std::filesystem::exists(own_dir));

  const std::string leaf = dir.path() + "/new";
  {
    DiskStore store(options(leaf));  // created because its parent exists, so removed too
    EXPECT_TRUE(std::filesystem::is_directory(leaf));
  }
  EXPECT_FALSE(std::filesystem::exists(leaf));
}

TEST_P(DiskStoreIo, UnwritableDirectoryFailsClearly) {
  ScratchDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0500), 0);
  if (::access(dir.path().c_str(), W_OK) == 0) GTEST_SKIP() << "running as root: chmod does not restrict writes";
  try {
    DiskStore store(options(dir.path()));
    FAIL() << "store created in a read-only directory";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(dir.path()), std::string::npos) << msg;
    EXPECT_NE(msg.find("Permission denied"), std::string::npos) << msg;
    EXPECT_NE(msg.find("an offload directory"), std::string::npos) << msg;
  }
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

TEST_P(DiskStoreIo, MissingParentDirectoryFailsClearly) {
  ScratchDir dir;
  const std::string bad = dir.path() + "/missing/offload";
  try {
    DiskStore store(options(bad));
    FAIL() << "store created under a missing parent";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(bad), std::string::npos) << msg;
    EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("an offload directory"), std::string::npos) << msg;
  }
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

// Child exit codes for the forked fault tests.
enum ChildResult : int { kOk = 0, kNoError = 2, kWrongMessage = 3, kReadNotRefused = 4, kThrew = 5, kSurvived = 6 };

TEST_P(DiskStoreIo, DiskFullGivesClearErrorAndInvalidatesRegion) {
  ScratchDir dir;
  const DiskStore::Options o = options(dir.path());
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) {
    int code = kOk;
    try {
      // Ignoring SIGXFSZ turns the file size limit into EFBIG from write, as a full disk would.
      if (::signal(SIGXFSZ, SIG_IGN) == SIG_ERR) ::_exit(kThrew);
      rlimit lim{};
      if (::getrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(kThrew);
      lim.rlim_cur = 64 * 1024;
      if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(kThrew);
      DiskStore store(o);
      const Extent e = store.allocate(kMiB + 5);
      std::vector<unsigned char> data(static_cast<std::size_t>(kMiB + 5), 0xab);
      try {
        store.wait(store.write(e, 3, data.data(), kMiB));
        code = kNoError;
      } catch (const std::runtime_error& err) {
        const std::string msg = err.what();
        if (msg.find("File too large") == std::string::npos || msg.find("disk is full") == std::string::npos ||
            msg.find("an offload directory") == std::string::npos || msg.find(store.path()) == std::string::npos ||
            msg.find("write") == std::string::npos) {
          std::fprintf(stderr, "unexpected message: %s\n", msg.c_str());
          code = kWrongMessage;
        }
      }
      if (code == kOk) {
        try {
          store.wait(store.read(e, 0, data.data(), 100));  // within the part that did reach the disk
          code = kReadNotRefused;
        } catch (const std::runtime_error& err) {
          if (std::string(err.what()).find("earlier write") == std::string::npos) code = kWrongMessage;
        }
      }
    } catch (...) {
      code = kThrew;
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child died with signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), kOk);
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

TEST_P(DiskStoreIo, SigtermRemovesFiles) {
  ScratchDir dir;
  const std::string user_dir = dir.path() + "/user";
  const std::string tmp_dir = dir.path() + "/tmp";
  ASSERT_TRUE(std::filesystem::create_directory(user_dir));
  ASSERT_TRUE(std::filesystem::create_directory(tmp_dir));
  const DiskStore::Options o = options(user_dir);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) {
    try {
      DiskStore store(o);
      if (::setenv("TMPDIR", tmp_dir.c_str(), 1) != 0) ::_exit(kThrew);
      DiskStore own(DiskStore::Options{});
      const std::vector<unsigned char> data(10000, 7);
      for (DiskStore* s : {&store, &own}) {
        const Extent e = s->allocate(10000);
        s->wait(s->write(e, 0, data.data(), 10000));
      }
      ::raise(SIGTERM);
    } catch (...) {
      ::_exit(kThrew);
    }
    ::_exit(kSurvived);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_TRUE(list_dir(user_dir).empty());
  EXPECT_TRUE(list_dir(tmp_dir).empty());  // the store's own temporary directory is gone too
}

INSTANTIATE_TEST_SUITE_P(Modes, DiskStoreIo, ::testing::Values("uring", "threads"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

std::vector<char> file_contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(DiskStore, BothModesWriteIdenticalFiles) {
  ScratchDir dir_a;
  ScratchDir dir_b;
  DiskStore::Options oa;
  oa.dir = dir_a.path();
  oa.force_threads = false;
  DiskStore::Options ob;
  ob.dir = dir_b.path();
  ob.force_threads = true;
  DiskStore a(oa);
  DiskStore b(ob);
  EXPECT_FALSE(b.uses_io_uring());
  std::mt19937_64 rng(3);
  std::vector<Extent> ea;
  std::vector<Extent> eb;
  for (int i = 0; i < 40; ++i) {
    const auto n = static_cast<std::int64_t>(1 + rng() % 300000);
    ea.push_back(a.allocate(n));
    eb.push_back(b.allocate(n));
    ASSERT_EQ(ea.back().offset, eb.back().offset);
    const auto off = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n));
    const auto len = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n - off + 1));
    const std::vector<unsigned char> data = random_bytes(rng, static_cast<std::size_t>(len));
    const Ticket ta = a.write(ea.back(), off, data.data(), len);
    const Ticket tb = b.write(eb.back(), off, data.data(), len);
    a.wait(ta);
    b.wait(tb);
    if (i % 5 == 4) {  // churn the allocator the same way in both
      a.free(ea[static_cast<std::size_t>(i - 2)]);
      b.free(eb[static_cast<std::size_t>(i - 2)]);
    }
  }
  const std::vector<char> fa = file_contents(a.path());
  const std::vector<char> fb = file_contents(b.path());
  EXPECT_GT(fa.size(), 0u);
  EXPECT_EQ(fa.size(), fb.size());
  EXPECT_TRUE(fa == fb);
}

TEST(DiskStore, ModeOptionAndEnvironment) {
  ASSERT_EQ(::setenv("FLEXH2O_DISK_IO", "threads", 1), 0);
  EXPECT_TRUE(DiskStore::Options{}.force_threads);
  ASSERT_EQ(::unsetenv("FLEXH2O_DISK_IO"), 0);
  EXPECT_FALSE(DiskStore::Options{}.force_threads);
  ScratchDir dir;
  DiskStore::Options o;
  o.dir = dir.path();
  o.force_threads = true;
  DiskStore forced(o);
  EXPECT_FALSE(forced.uses_io_uring());
  o.force_threads = false;
  DiskStore automatic(o);
  std::printf("[ info ] io_uring %s, O_DIRECT %s on %s\n", automatic.uses_io_uring() ? "in use" : "unavailable",
              automatic.uses_direct_io() ? "in use" : "refused", dir.path().c_str());
}

}  // namespace
}  // namespace flexh2o::offload
