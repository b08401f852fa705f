// The disk store's two ways to run aligned transfers against its file: io_uring (registered
// bounce buffers, a reaper thread) and a pread/pwrite thread pool for where io_uring is
// unavailable. Both resume short transfers and retry EINTR, and report each op once to a sink.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace flexh2o::offload::disk_io {

struct Chunk;

// One aligned transfer against the file.
struct Op {
  bool write = false;
  int fd = -1;
  std::int64_t offset = 0;  // file offset of buf[0]
  std::byte* buf = nullptr;
  std::int64_t len = 0;
  int fixed_index = -1;  // registered buffer, or -1 for plain I/O
  // Reads: written_end when the read was issued. The file was at least this long then, so
  // reaching its end below this means it was truncated; a later write does not count.
  std::int64_t valid_end = 0;
  std::int64_t done = 0;
  Chunk* chunk = nullptr;
};

// A read reached the end of the file at op.offset + op.done (not an errno value).
constexpr int kEndOfFile = -1;

class CompletionSink {
 public:
  // err is 0, an errno value or kEndOfFile; called once per submitted op, on an engine thread.
  virtual void on_complete(Op& op, int err) noexcept = 0;

 protected:
  ~CompletionSink() = default;
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  // Never throws; failures are reported through the sink.
  virtual void submit(Op& op) noexcept = 0;
  virtual bool is_uring() const = 0;
};

// Throws std::system_error when the ring cannot be created. `slots` buffers of `slot_bytes`
// at `bounce` are registered with the ring where the memlock limit allows.
std::unique_ptr<IoEngine> make_uring_engine(CompletionSink& sink, std::byte* bounce, std::int64_t slot_bytes,
                                            int slots);
std::unique_ptr<IoEngine> make_thread_pool_engine(CompletionSink& sink);

}  // namespace flexh2o::offload::disk_io
