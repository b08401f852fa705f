#include "offload/offload_marks.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace flexh2o::offload {

namespace {

constexpr const char* kStorePrefix = "flexh2o-offload-";
constexpr const char* kLockSuffix = ".lock";
constexpr const char* kRunDirPrefix = "flexh2o-";
constexpr std::size_t kTemplateChars = 6;  // mkstemp's XXXXXX

// "<prefix>XXXXXX<suffix>" with six characters from mkstemp's alphabet.
bool matches(const std::string& name, const std::string& prefix, const std::string& suffix) {
  if (name.size() != prefix.size() + kTemplateChars + suffix.size()) return false;
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return false;
  for (std::size_t i = prefix.size(); i < prefix.size() + kTemplateChars; ++i) {
    const char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) return false;
  }
  return true;
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (const dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  return names;
}

// True when the lock file at `path` is held by no process (its run is dead).
bool lock_is_dead(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  const bool dead = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  return dead;
}

}  // namespace

std::string store_lock_path(const std::string& store_file) { return store_file + kLockSuffix; }

int mark_store_file(const std::string& store_file) {
  // Written and locked under a name reclaiming ignores, then renamed into place (the flock
  // goes with the file), so no other run ever sees the mark unlocked.
  const std::string dir = store_file.substr(0, store_file.rfind('/') + 1);
  std::string tmp = dir + ".flexh2o-mark-XXXXXX";
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot create a lock file in " + dir + ": " + std::strerror(errno));
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0 || ::write(fd, pid.data(), pid.size()) != static_cast<ssize_t>(pid.size()) ||
      ::rename(tmp.c_str(), store_lock_path(store_file).c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    ::close(fd);
    throw std::runtime_error("cannot mark " + store_file + " as this run's: " + std::strerror(err));
  }
  return fd;
}

int reclaim_dead_store_files(const std::string& dir) {
  int removed = 0;
  for (const std::string& name : entries(dir)) {
    if (!matches(name, kStorePrefix, kLockSuffix)) continue;
    const std::string lock = dir + "/" + name;
    if (!lock_is_dead(lock)) continue;
    const std::string store = lock.substr(0, lock.size() - std::strlen(kLockSuffix));
    if (::unlink(store.c_str()) == 0 || errno == ENOENT) {
      ::unlink(lock.c_str());
      ++removed;
    }
  }
  return removed;
}

void reclaim_dead_offload_dirs(const std::string& base) {
  for (const std::string& name : entries(base)) {
    if (!matches(name, kRunDirPrefix, "")) continue;
    const std::string dir = base + "/" + name;
    // rmdir removes only an empty directory: one holding anything else stays.
    if (reclaim_dead_store_files(dir) > 0) ::rmdir(dir.c_str());
  }
}

}  // namespace flexh2o::offload
