#include "offload/disk_io_engines.h"

#include <liburing.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "offload/io_text.h"

namespace flexh2o::offload::disk_io {

namespace {

// Each chunk has at most two operations in flight, so the ring never fills.
constexpr unsigned kQueueDepth = 64;
constexpr int kPoolThreads = 4;
std::atomic<bool> g_said_no_register{false};

class ThreadPoolEngine final : public IoEngine {
 public:
  explicit ThreadPoolEngine(CompletionSink& sink) : sink_(sink) {
    try {
      for (int i = 0; i < kPoolThreads; ++i) workers_.emplace_back([this] { run(); });
    } catch (...) {
      stop();
      throw;
    }
  }
  ~ThreadPoolEngine() override { stop(); }

  void submit(Op& op) noexcept override {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(&op);
    }
    cv_.notify_one();
  }
  bool is_uring() const override { return false; }

 private:
  void stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }

  void run() {
    for (;;) {
      Op* op = nullptr;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        op = queue_.front();
        queue_.pop_front();
      }
      sink_.on_complete(*op, execute(*op));
    }
  }

  // Resumes short transfers and retries EINTR; a read that reaches the end of the file stops
  // there and reports kEndOfFile.
  static int execute(Op& op) {
    while (op.done < op.len) {
      std::byte* p = op.buf + op.done;
      const auto n = static_cast<std::size_t>(op.len - op.done);
      const off_t off = op.offset + op.done;
      const ssize_t r = op.write ? ::pwrite(op.fd, p, n, off) : ::pread(op.fd, p, n, off);
      if (r < 0) {
        if (errno == EINTR) continue;
        return errno;
      }
      if (r == 0) return op.write ? EIO : kEndOfFile;
      op.done += r;
    }
    return 0;
  }

  CompletionSink& sink_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op*> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

[[noreturn]] void fatal_ring_error(const char* what, int err) {
  std::fprintf(stderr, "flexh2o: fatal: %s failed: %s\n", what, errno_text(err).c_str());
  std::abort();
}

class UringEngine final : public IoEngine {
 public:
  // Throws std::system_error when the ring cannot be created.
  UringEngine(CompletionSink& sink, std::byte* bounce, std::int64_t slot_bytes, int slots) : sink_(sink) {
    const int rc = ::io_uring_queue_init(kQueueDepth, &ring_, 0);
    if (rc < 0) throw std::system_error(-rc, std::generic_category(), "io_uring_queue_init");
    std::vector<iovec> iov(static_cast<std::size_t>(slots));
    for (int i = 0; i < slots; ++i) iov[static_cast<std::size_t>(i)] = {bounce + i * slot_bytes, static_cast<std::size_t>(slot_bytes)};
    // Registration pins the bounce buffers once instead of per request; it can fail under a
    // low RLIMIT_MEMLOCK, and plain reads/writes still work then.
    const int reg = ::io_uring_register_buffers(&ring_, iov.data(), static_cast<unsigned>(slots));
    registered_ = reg == 0;
    if (!registered_) {
      note_once(g_said_no_register, "io_uring could not register I/O buffers (" + errno_text(-reg) +
                                        "); using unregistered buffers");
    }
    try {
      reaper_ = std::thread([this] { reap(); });
    } catch (...) {
      ::io_uring_queue_exit(&ring_);
      throw;
    }
  }

  ~UringEngine() override {
    // A NOP without an op tells the reaper to stop; the store has drained all I/O by now.
    {
      std::lock_guard lock(sq_mu_);
      io_uring_sqe* sqe = get_sqe_locked();
      ::io_uring_prep_nop(sqe);
      ::io_uring_sqe_set_data(sqe, nullptr);
      submit_locked();
    }
    reaper_.join();
    // Ring teardown is deferred in the kernel; unregistering now returns the pinned-memory
    // charge at once, so a store created right after this one can register its buffers.
    if (registered_) {
      const int rc = ::io_uring_unregister_buffers(&ring_);
      if (rc < 0) std::fprintf(stderr, "flexh2o: warning: io_uring_unregister_buffers: %s\n", errno_text(-rc).c_str());
    }
    ::io_uring_queue_exit(&ring_);
  }

  void submit(Op& op) noexcept override {
    std::lock_guard lock(sq_mu_);
    io_uring_sqe* sqe = get_sqe_locked();
    std::byte* p = op.buf + op.done;
    const auto n = static_cast<unsigned>(op.len - op.done);
    const auto off = static_cast<std::uint64_t>(op.offset + op.done);
    if (registered_ && op.fixed_index >= 0) {
      if (op.write) {
        ::io_uring_prep_write_fixed(sqe, op.fd, p, n, off, op.fixed_index);
      } else {
        ::io_uring_prep_read_fixed(sqe, op.fd, p, n, off, op.fixed_index);
      }
    } else if (op.write) {
      ::io_uring_prep_write(sqe, op.fd, p, n, off);
    } else {
      ::io_uring_prep_read(sqe, op.fd, p, n, off);
    }
    ::io_uring_sqe_set_data(sqe, &op);
    handoff_.fetch_add(1, std::memory_order_release);
    submit_locked();
  }
  bool is_uring() const override { return true; }

 private:
  io_uring_sqe* get_sqe_locked() {
    for (;;) {
      if (io_uring_sqe* sqe = ::io_uring_get_sqe(&ring_)) return sqe;
      submit_locked();
    }
  }

  // EINTR/EAGAIN/EBUSY are transient (the reaper frees completion space); anything else
  // means the ring itself is broken, and an SQE left queued would complete twice later.
  void submit_locked() {
    for (;;) {
      const int rc = ::io_uring_submit(&ring_);
      if (rc >= 0) return;
      if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) {
        std::this_thread::yield();
        continue;
      }
      fatal_ring_error("io_uring_submit", -rc);
    }
  }

  void reap() {
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      const int rc = ::io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) fatal_ring_error("io_uring_wait_cqe", -rc);
      static_cast<void>(handoff_.load(std::memory_order_acquire));
      auto* op = static_cast<Op*>(::io_uring_cqe_get_data(cqe));
      const int res = cqe->res;
      ::io_uring_cqe_seen(&ring_, cqe);
      if (op == nullptr) return;
      if (res == -EINTR || res == -EAGAIN) {
        submit(*op);
        continue;
      }
      if (res < 0) {
        sink_.on_complete(*op, -res);
        continue;
      }
      if (res == 0) {
        sink_.on_complete(*op, op->write ? EIO : kEndOfFile);
        continue;
      } else {
        op->done += res;
      }
      if (op->done < op->len) {
        submit(*op);  // resume a short transfer
        continue;
      }
      sink_.on_complete(*op, 0);
    }
  }

  CompletionSink& sink_;
  io_uring ring_{};
  bool registered_ = false;
  std::mutex sq_mu_;  // submitters: callers and the reaper (resubmissions)
  // The ring's own barriers order an op's setup before its completion, but through the
  // kernel, where ThreadSanitizer cannot see it; this pair makes the ordering visible.
  std::atomic<std::uint64_t> handoff_{0};
  std::thread reaper_;
};

}  // namespace

std::unique_ptr<IoEngine> make_uring_engine(CompletionSink& sink, std::byte* bounce, std::int64_t slot_bytes,
                                            int slots) {
  return std::make_unique<UringEngine>(sink, bounce, slot_bytes, slots);
}

std::unique_ptr<IoEngine> make_thread_pool_engine(CompletionSink& sink) {
  return std::make_unique<ThreadPoolEngine>(sink);
}

}  // namespace flexh2o::offload::disk_io
