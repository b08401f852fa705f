// What a killed run leaves in an offload directory is reclaimed by the next one, and nothing
// without the engine's mark is touched.
#include "offload/offload_marks.h"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>

#include "offload/disk_store.h"
#include "tests/offload/offload_test_util.h"

namespace flexh2o::offload {
namespace {

namespace fs = std::filesystem;
using namespace test_util;

void touch(const std::string& path) { std::ofstream(path) << "x"; }

// A child that marks `store` as its own and is then killed with SIGKILL: no cleanup runs.
void killed_run_marks(const std::string& store) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    touch(store);
    mark_store_file(store);
    ::raise(SIGKILL);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
}

TEST(OffloadMarks, DeadRunsFilesAreReclaimedLiveAndUnmarkedOnesKept) {
  ScratchDir dir;
  const std::string dead = dir.path() + "/flexh2o-offload-dead01";
  killed_run_marks(dead);
  ASSERT_TRUE(fs::exists(dead));
  ASSERT_TRUE(fs::exists(store_lock_path(dead)));

  const std::string live = dir.path() + "/flexh2o-offload-live01";
  touch(live);
  const int live_lock = mark_store_file(live);
  const std::string unmarked = dir.path() + "/flexh2o-offload-user01";  // the name, but no lock
  touch(unmarked);
  const std::string users = dir.path() + "/notes.txt";
  touch(users);

  EXPECT_EQ(reclaim_dead_store_files(dir.path()), 1);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_FALSE(fs::exists(store_lock_path(dead)));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(store_lock_path(live)));
  EXPECT_TRUE(fs::exists(unmarked));
  EXPECT_TRUE(fs::exists(users));
  ::close(live_lock);
}

TEST(OffloadMarks, KilledRunsTempDirectoriesAreRemoved) {
  ScratchDir base;
  const std::string run_dir = base.path() + "/flexh2o-Ab12Cd";
  fs::create_directory(run_dir);
  killed_run_marks(run_dir + "/flexh2o-offload-Xy98Zw");
  // A user's directory of the same shape without the mark, and one with other files too.
  fs::create_directory(base.path() + "/flexh2o-userdr");
  const std::string mixed = base.path() + "/flexh2o-mixed1";
  fs::create_directory(mixed);
  killed_run_marks(mixed + "/flexh2o-offload-Qq11Ww");
  touch(mixed + "/keep.txt");

  reclaim_dead_offload_dirs(base.path());
  EXPECT_FALSE(fs::exists(run_dir));
  EXPECT_TRUE(fs::exists(base.path() + "/flexh2o-userdr"));
  EXPECT_TRUE(fs::exists(mixed + "/keep.txt"));
  EXPECT_FALSE(fs::exists(mixed + "/flexh2o-offload-Qq11Ww"));
}

TEST(OffloadMarks, AStoreMarksItsFileAndRemovesTheMark) {
  ScratchDir dir;
  {
    DiskStore::Options o;
    o.dir = dir.path();
    DiskStore store(std::move(o));
    int locks = 0;
    for (const auto& e : fs::directory_iterator(dir.path())) locks += e.path().extension() == ".lock";
    EXPECT_EQ(locks, 1);
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

}  // namespace
}  // namespace flexh2o::offload
