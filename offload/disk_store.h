// The disk tier: one large O_DIRECT file under an offload directory, carved into 4 KiB-aligned
// extents, with asynchronous reads and writes (io_uring, or a pread/pwrite thread pool where
// io_uring is unavailable or FLEXH2O_DISK_IO=threads). Callers may pass any buffer, offset and
// length; the store stages unaligned transfers through its own aligned buffers.
//
// Concurrency: requests may be issued from any thread. Requests whose byte ranges overlap
// must be ordered by the caller (wait for one before issuing the other); requests that only
// share a 4 KiB block are ordered by the store. Every ticket must be waited on or dropped
// before the store is destroyed; the destructor drains outstanding I/O.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "offload/budget.h"

namespace flexh2o::offload {

// A range of the store's file. `bytes` is what the caller asked for; the file space behind it
// is rounded up to 4 KiB.
struct Extent {
  std::int64_t offset = 0;
  std::int64_t bytes = 0;
};

struct TicketState;

// Handle to one asynchronous request; copyable. Wait on it with DiskStore::wait.
class Ticket {
 public:
  Ticket() = default;
  bool done() const;

 private:
  friend class DiskStore;
  explicit Ticket(std::shared_ptr<TicketState> s) : state_(std::move(s)) {}
  std::shared_ptr<TicketState> state_;
};

bool disk_io_threads_forced_by_env();

class DiskStore {
 public:
  static constexpr std::int64_t kAlignment = 4096;

  struct Options {
    // Empty: a fresh directory under $TMPDIR (or /tmp), removed with the store. Otherwise the
    // directory is kept (created if its parent exists) and only the store's file is removed.
    std::string dir;
    // Use the pread/pwrite thread pool even where io_uring works.
    bool force_threads = disk_io_threads_forced_by_env();
    // Charged for every extent; null means an unlimited budget owned by the store.
    Budget* budget = nullptr;
  };

  DiskStore();
  explicit DiskStore(Options opts);
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;
  ~DiskStore();

  // Throws BudgetExceeded when the disk budget is exhausted.
  Extent allocate(std::int64_t bytes, std::string_view what = "disk extent");
  void free(Extent e);

  // src/dst must stay valid until the ticket completes. offset + bytes must lie within e.
  Ticket write(Extent e, std::int64_t offset, const void* src, std::int64_t bytes);
  Ticket read(Extent e, std::int64_t offset, void* dst, std::int64_t bytes);
  // Blocks until the request finishes; rethrows its I/O error (std::runtime_error).
  void wait(const Ticket& t);

  const std::string& path() const;
  const std::string& dir() const;
  bool uses_io_uring() const;
  bool uses_direct_io() const;
  Budget& budget();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flexh2o::offload
