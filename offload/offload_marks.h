// Marks on the disk store's files, so that what a killed run (SIGKILL, a crash, the OOM
// killer) leaves in an offload directory is known to be the engine's and is reclaimed by a
// later run, while nothing without the mark is ever touched.
//
// Beside each store file <dir>/flexh2o-offload-XXXXXX the run keeps <that>.lock, holding its
// pid and an flock(2) for as long as it runs. The kernel drops the flock when the process
// dies however it dies, so a .lock whose flock can be taken belongs to a dead run.
#pragma once
#include <string>

namespace flexh2o::offload {

// Creates and locks `store_file` + ".lock" (the pid inside, for people). Returns its
// descriptor, which the caller keeps open while the file is in use and then closes after
// removing both. Throws std::runtime_error naming the path.
int mark_store_file(const std::string& store_file);
// The lock file's path for a store file.
std::string store_lock_path(const std::string& store_file);

// Removes every store file in `dir` whose .lock is held by no one, with its .lock; returns
// how many it removed.
int reclaim_dead_store_files(const std::string& dir);
// Under `base` ($TMPDIR): in each directory named flexh2o-XXXXXX (the fresh directories runs
// make), reclaims dead store files, then removes the directory if that emptied it.
void reclaim_dead_offload_dirs(const std::string& base);

}  // namespace flexh2o::offload
