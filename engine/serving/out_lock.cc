#include "engine/serving/out_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace flexh2o::serving {

namespace {

// Tries before giving up when the path keeps changing under us (created, removed) meanwhile.
constexpr int kOpenAttempts = 100;

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "this host";
  return name;
}

// Whether `path` still names the open file: a run that created it and ended without results
// removes it, and whoever opened it just before then holds a lock on a file no longer there.
bool still_named(int fd, const std::string& path) {
  struct stat open_file {}, named {};
  return ::fstat(fd, &open_file) == 0 && open_file.st_nlink > 0 && ::stat(path.c_str(), &named) == 0 &&
         open_file.st_dev == named.st_dev && open_file.st_ino == named.st_ino;
}

// The file at `path`, opened for writing; created (O_EXCL) when absent.
int open_or_create(const std::string& path, bool* created) {
  for (int attempt = 0; attempt < kOpenAttempts; ++attempt) {
    *created = false;
    int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
      fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_CREAT | O_EXCL, 0644);
      if (fd < 0 && errno == EEXIST) continue;  // another run created it meanwhile: open that one
      *created = fd >= 0;
    }
    if (fd < 0) throw std::runtime_error(path + ": cannot open for writing: " + std::strerror(errno));
    return fd;
  }
  throw std::runtime_error(path + ": cannot open for writing: it keeps being created and removed");
}

}  // namespace

std::string lock_holder(int fd) {
  struct stat st {};
  std::ifstream locks("/proc/locks");
  if (::fstat(fd, &st) == 0 && locks) {
    // "1: FLOCK  ADVISORY  WRITE 4501 fe:00:5308530 0 EOF"; a waiter's line has "->" after the number.
    for (std::string line; std::getline(locks, line);) {
      std::istringstream fields(line);
      std::string number, kind, mode, access, dev_ino;
      long pid = 0;
      if (!(fields >> number >> kind) || kind == "->" || !(fields >> mode >> access >> pid >> dev_ino)) continue;
      unsigned major_id = 0, minor_id = 0;
      unsigned long inode = 0;
      if (std::sscanf(dev_ino.c_str(), "%x:%x:%lu", &major_id, &minor_id, &inode) != 3) continue;
      if (inode == st.st_ino && major_id == major(st.st_dev) && minor_id == minor(st.st_dev) && pid > 0)
        return "pid " + std::to_string(pid) + " on host " + host_name();
    }
  }
  return "a process this machine does not see (on another machine sharing the filesystem?)";
}

int open_locked(const std::string& path, bool* created) {
  for (int attempt = 0; attempt < kOpenAttempts; ++attempt) {
    const int fd = open_or_create(path, created);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        const std::string holder = lock_holder(fd);
        ::close(fd);
        throw std::runtime_error("--out " + path + " is in use by another run (" + holder +
                                 "): two runs on one file would duplicate and tear its lines; wait for that run "
                                 "to end, or give another --out");
      }
      // ENOLCK (NFS mounted nolock, no lockd), ENOSYS or EOPNOTSUPP (Lustre without -o flock).
      std::fprintf(stderr, "flexh2o: warning: cannot lock --out %s (%s): a second run on it would not be stopped\n",
                   path.c_str(), std::strerror(err));
      return fd;
    }
    if (still_named(fd, path)) return fd;
    ::close(fd);  // locked a file removed meanwhile: open the path again
  }
  throw std::runtime_error(path + ": cannot lock it: it keeps being created and removed");
}

}  // namespace flexh2o::serving
