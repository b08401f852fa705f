// Copies between any two tiers, synchronously (copy_now) or asynchronously on named lanes
// (CopyEngine). A lane is one FIFO of copies run in order by its own worker, so transfers
// run concurrently with compute and with other lanes (weights in, cache in, cache out, ...).
// On the CPU backend the "gpu" tier is host memory and copies are memcpy/disk I/O; a CUDA
// backend's copies go through the backend's copy functions (its own streams).
//
// Ordering with compute: a job takes the backend's fence when it is submitted, and its copies
// to and from device memory wait for the ops issued before that and for no later one, so a
// prefetch queued before compute(k) runs beside it instead of behind it. A job that needs the
// results of later ops must be submitted after them.
//
// Disk <-> gpu goes through host staging buffers (pinned when the backend can pin) unless the
// gpu tier is host-addressable (CPU backend), where the disk store reads straight into it.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "offload/host_memory.h"
#include "offload/tiers.h"
#include "offload/trace.h"

namespace flexh2o::offload {

// One end of a copy: device memory (gpu), host memory (cpu) or a byte offset in a disk extent.
struct Place {
  Tier tier = Tier::Cpu;
  void* ptr = nullptr;
  Extent extent{};
  std::int64_t offset = 0;

  static Place gpu(void* p) { return {Tier::Gpu, p, {}, 0}; }
  static Place cpu(void* p) { return {Tier::Cpu, p, {}, 0}; }
  static Place disk(Extent e, std::int64_t offset = 0) { return {Tier::Disk, nullptr, e, offset}; }
  // The place `bytes` further on.
  Place advanced(std::int64_t bytes) const;
};

// A lane's copy context (not thread-safe): the host buffers that disk <-> device copies pass
// through, and the fence of the job it runs.
class Staging {
 public:
  static constexpr std::int64_t kChunkBytes = std::int64_t{8} << 20;
  explicit Staging(kernels::Backend* pin_with = nullptr) : pin_with_(pin_with) {}
  HostBuffer& buffer(int i);
  // The ops this job's device copies wait for (the backend's fence when the job was
  // submitted), set by the lane per job; null outside a lane: a copy then waits for every op
  // issued before it.
  const kernels::Fence* after = nullptr;

 private:
  kernels::Backend* pin_with_;
  HostBuffer buffers_[2];
};

struct CopyOptions {
  // Stage disk <-> gpu copies through host buffers even on a host-addressable gpu tier (the
  // CPU backend), so tests exercise the path a real device takes.
  bool always_stage = false;
};

// Copies `bytes` from src to dst and returns when done. Throws on I/O errors.
void copy_now(Tiers& tiers, Place dst, Place src, std::int64_t bytes, Staging& staging, CopyOptions opts = {});

// `rows` rows of `bytes` bytes, row i from src + i * src_pitch to dst + i * dst_pitch (one
// row: a plain copy). A 2-D piece between host and device memory is one strided copy.
struct CopyPiece {
  Place dst, src;
  std::int64_t bytes = 0;
  std::int64_t rows = 1;
  std::int64_t dst_pitch = 0, src_pitch = 0;
  std::int64_t total() const { return bytes * rows; }
  bool contiguous() const { return rows == 1 || (dst_pitch == bytes && src_pitch == bytes); }
};
// Runs disjoint copies now; direct disk transfers are issued together so they overlap, and the
// copies between host and device memory go to the backend as one batch per direction (one wait).
void copy_pieces_now(Tiers& tiers, const std::vector<CopyPiece>& pieces, Staging& staging, CopyOptions opts = {});

// Names a job in the trace: its primitive ("load_weight") and this instance ("mlp.3").
struct CopyLabel {
  std::string primitive = "copy";
  std::string name;
};

struct CopyJobState;

// Handle to an asynchronous copy; copyable; waiting rethrows the copy's error.
class CopyTicket {
 public:
  CopyTicket() = default;
  bool done() const;
  void wait() const;

 private:
  friend class CopyEngine;
  explicit CopyTicket(std::shared_ptr<CopyJobState> s) : state_(std::move(s)) {}
  std::shared_ptr<CopyJobState> state_;
};

class CopyEngine {
 public:
  CopyEngine(Tiers& tiers, CopyOptions opts = {}, Trace* trace = nullptr);
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;
  // Finishes queued work (errors are dropped: their tickets report them).
  ~CopyEngine();

  // Adds a lane; its name is the trace track ("copy: weights in", ...).
  int add_lane(const std::string& name);
  CopyTicket copy(int lane, Place dst, Place src, std::int64_t bytes, CopyLabel label = {});
  // Several disjoint copies as one job (e.g. the parts of a tiered tensor), one ticket.
  CopyTicket copy(int lane, std::vector<CopyPiece> pieces, CopyLabel label = {});
  // Any work that must run in a lane's order (e.g. a write-back that reads device memory).
  CopyTicket submit(int lane, std::function<void(Staging&)> job, CopyLabel label, std::int64_t bytes = 0);

  Tiers& tiers() { return tiers_; }
  const CopyOptions& options() const { return opts_; }

 private:
  struct Lane;
  void run_lane(Lane& lane);

  Tiers& tiers_;
  CopyOptions opts_;
  Trace* trace_;
  std::vector<std::unique_ptr<Lane>> lanes_;
};

}  // namespace flexh2o::offload
