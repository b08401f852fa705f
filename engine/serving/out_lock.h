// The lock a job holds on its --out file for the whole run, so that a second run on the same
// file (a retried scheduler task, --resume started while the first still runs) stops with an
// error instead of duplicating and tearing its lines.
//
// An flock(2) on the file itself: it belongs to the open file, so the kernel drops it when the
// holder dies however it dies (a killed run's lock is simply free), closing another descriptor
// of the file keeps it (unlike fcntl locks), and every path to the file (a symlink, a hard
// link) meets it. On NFS, Linux sends an flock to the server as a whole-file fcntl lock (since
// 2.6.12), so it holds across machines too; docs/batch-jobs.md lists the filesystems where it
// stays local to one machine.
#pragma once
#include <string>

namespace flexh2o::serving {

// Opens `path` for writing (creating it when absent: *created says so) and takes its lock.
// Returns the descriptor. Throws std::runtime_error naming the path and the holder (pid and
// host, when this machine can see it) when another process holds the lock. Where the
// filesystem takes no locks, says so on stderr once and returns the descriptor unlocked.
int open_locked(const std::string& path, bool* created);

// Who holds a lock on the file open at `fd`, as /proc/locks says: "pid N on host H", or what
// to say when no local process does (a holder on another machine of a network filesystem).
std::string lock_holder(int fd);

}  // namespace flexh2o::serving
