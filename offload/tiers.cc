#include "offload/tiers.h"

#include <sys/statvfs.h>

#include <cstdlib>
#include <filesystem>

namespace flexh2o::offload {

namespace {

// Free bytes of the filesystem the disk tier will use, so a model that cannot fit fails
// before anything is written instead of filling the disk; unlimited when unknown.
std::int64_t free_disk_bytes(const std::string& offload_dir) {
  std::string dir = offload_dir;
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    dir = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  }
  // A directory not made yet goes into its nearest existing ancestor: check that one's space.
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(dir, ec);
  while (!std::filesystem::exists(p, ec) && p.has_parent_path() && p.parent_path() != p) p = p.parent_path();
  struct statvfs st {};
  if (::statvfs(p.c_str(), &st) != 0) return Budget::kUnlimited;
  return static_cast<std::int64_t>(st.f_bavail) * static_cast<std::int64_t>(st.f_frsize);
}

}  // namespace

Tiers::Tiers(kernels::Backend& backend, TierOptions opts) : backend_(backend), opts_(std::move(opts)) {
  budgets_[0] = std::make_unique<Budget>(Tier::Gpu, opts_.gpu_bytes);
  budgets_[1] = std::make_unique<Budget>(Tier::Cpu, opts_.cpu_bytes);
  const std::int64_t disk = opts_.disk_bytes == Budget::kUnlimited ? free_disk_bytes(opts_.offload_dir) : opts_.disk_bytes;
  budgets_[2] = std::make_unique<Budget>(Tier::Disk, disk);
}

DiskStore& Tiers::disk() {
  std::lock_guard lock(disk_mu_);
  if (!disk_) {
    DiskStore::Options o;
    o.dir = opts_.offload_dir;
    o.force_threads = opts_.force_disk_threads;
    o.budget = &budget(Tier::Disk);
    disk_ = std::make_unique<DiskStore>(std::move(o));
  }
  return *disk_;
}

bool Tiers::disk_open() const {
  std::lock_guard lock(disk_mu_);
  return disk_ != nullptr;
}

}  // namespace flexh2o::offload
