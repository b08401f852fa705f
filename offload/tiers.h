// The memory hierarchy of one run: the compute backend (whose memory is the "gpu" tier; on
// the CPU backend a budgeted region of host memory), host memory, and the disk store, each
// with its Budget. The disk store is opened on first use, so runs that keep nothing on disk
// never touch --offload-dir.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/backend.h"
#include "offload/budget.h"
#include "offload/disk_store.h"
#include "offload/tier.h"

namespace flexh2o::offload {

struct TierOptions {
  std::int64_t gpu_bytes = Budget::kUnlimited;  // --gpu-mem
  std::int64_t cpu_bytes = Budget::kUnlimited;  // --cpu-mem
  std::int64_t disk_bytes = Budget::kUnlimited; // --disk-mem; unlimited: the free space there
  std::string offload_dir;                      // --offload-dir; empty: a fresh temp directory
  bool pin_host = false;                        // pin cpu-tier memory (policy pin_weight)
  bool force_disk_threads = disk_io_threads_forced_by_env();
};

class Tiers {
 public:
  Tiers(kernels::Backend& backend, TierOptions opts);
  Tiers(const Tiers&) = delete;
  Tiers& operator=(const Tiers&) = delete;

  kernels::Backend& backend() { return backend_; }
  const kernels::Backend& backend() const { return backend_; }
  Budget& budget(Tier t) { return *budgets_[static_cast<std::size_t>(t)]; }
  const Budget& budget(Tier t) const { return *budgets_[static_cast<std::size_t>(t)]; }
  const TierOptions& options() const { return opts_; }
  // Opens the store on first call; throws a clear error when the offload dir is unusable.
  DiskStore& disk();
  bool disk_open() const;

 private:
  kernels::Backend& backend_;
  TierOptions opts_;
  std::array<std::unique_ptr<Budget>, 3> budgets_;
  mutable std::mutex disk_mu_;
  std::unique_ptr<DiskStore> disk_;
};

}  // namespace flexh2o::offload
