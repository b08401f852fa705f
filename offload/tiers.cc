#include "offload/tiers.h"

namespace flexh2o::offload {

Tiers::Tiers(kernels::Backend& backend, TierOptions opts) : backend_(backend), opts_(std::move(opts)) {
  budgets_[0] = std::make_unique<Budget>(Tier::Gpu, opts_.gpu_bytes);
  budgets_[1] = std::make_unique<Budget>(Tier::Cpu, opts_.cpu_bytes);
  budgets_[2] = std::make_unique<Budget>(Tier::Disk, opts_.disk_bytes);
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
