#include "offload/disk_store.h"
#include "offload/offload_marks.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

namespace flexh2o::offload {

struct TicketState {
  std::mutex mu;
  std::condition_variable cv;
  std::int64_t remaining = 0;  // chunks not yet finished
  std::exception_ptr error;
};

bool Ticket::done() const {
  if (!state_) return true;
  std::lock_guard lock(state_->mu);
  return state_->remaining == 0;
}

bool disk_io_threads_forced_by_env() {
  const char* v = std::getenv("FLEXH2O_DISK_IO");
  return v != nullptr && std::string_view(v) == "threads";
}

namespace {

constexpr std::int64_t kBlock = DiskStore::kAlignment;
// Requests are split into chunks of at most this many bytes; each chunk in flight owns one
// bounce buffer of this size, so kSlots bounds both memory and queue occupancy. 16 x 256 KiB
// stays under the common 8 MiB RLIMIT_MEMLOCK that registered buffers are charged to.
constexpr std::int64_t kChunkBytes = std::int64_t{256} << 10;
// Transfers straight from/to the caller's aligned memory need no bounce buffer, so they may
// be larger: kSlots requests of up to 64 MiB keep as many bytes queued as fio at the same block
// size and depth (the block layer splits them further). io_uring lengths are 32-bit.
constexpr std::int64_t kDirectChunkBytes = std::int64_t{64} << 20;
constexpr int kSlots = 16;
// Each chunk has at most two operations in flight, so the ring never fills.
constexpr unsigned kQueueDepth = 64;
constexpr int kPoolThreads = 4;

std::int64_t align_down(std::int64_t x) { return x & ~(kBlock - 1); }
std::int64_t align_up(std::int64_t x) { return align_down(x + kBlock - 1); }

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

void note_once(std::atomic<bool>& said, const std::string& text) {
  if (!said.exchange(true)) std::fprintf(stderr, "flexh2o: note: %s\n", text.c_str());
}
std::atomic<bool> g_said_no_uring{false};
std::atomic<bool> g_said_no_direct{false};
std::atomic<bool> g_said_no_register{false};
std::atomic<bool> g_said_no_handlers{false};
std::atomic<bool> g_said_registry_full{false};

// ---- Removal of live files on SIGINT/SIGTERM ----------------------------------------------
// The handler may only touch pre-built C strings, so paths live in fixed slots.

constexpr int kMaxLivePaths = 64;
struct LivePath {
  std::atomic<int> state{0};  // 0 free, 1 being filled, 2 live
  bool is_dir = false;
  char path[PATH_MAX] = {};
};
LivePath g_live[kMaxLivePaths];
struct sigaction g_prev_int;
struct sigaction g_prev_term;
std::once_flag g_handlers_once;

std::atomic<bool> g_signals_external{false};

void on_fatal_signal(int sig, siginfo_t* info, void* ctx) {
  const int saved_errno = errno;
  remove_offload_files_now();
  const struct sigaction& prev = sig == SIGINT ? g_prev_int : g_prev_term;
  // A handler installed before ours still runs (e.g. a graceful-stop handler).
  if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
    prev.sa_sigaction(sig, info, ctx);
    errno = saved_errno;
    return;
  }
  if ((prev.sa_flags & SA_SIGINFO) == 0 && prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
    errno = saved_errno;
    return;
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void install_signal_handlers() {
  for (const auto& [sig, prev] : {std::pair{SIGINT, &g_prev_int}, std::pair{SIGTERM, &g_prev_term}}) {
    struct sigaction cur {};
    bool ok = ::sigaction(sig, nullptr, &cur) == 0;
    // An ignored signal cannot kill us, so there is nothing to clean up for it.
    if (ok && (cur.sa_flags & SA_SIGINFO) == 0 && cur.sa_handler == SIG_IGN) continue;
    *prev = cur;
    struct sigaction sa {};
    sa.sa_sigaction = on_fatal_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    ok = ok && ::sigemptyset(&sa.sa_mask) == 0 && ::sigaddset(&sa.sa_mask, SIGINT) == 0 &&
         ::sigaddset(&sa.sa_mask, SIGTERM) == 0 && ::sigaction(sig, &sa, nullptr) == 0;
    if (!ok) {
      note_once(g_said_no_handlers, "cannot install signal handlers (" + errno_text(errno) +
                                        "); offload files may be left behind if interrupted");
    }
  }
}

// Returns the slot, or -1 when the path cannot be registered (it is then only removed by
// the destructor).
int register_live_path(const std::string& path, bool is_dir) {
  if (!g_signals_external.load()) std::call_once(g_handlers_once, install_signal_handlers);
  if (path.size() >= PATH_MAX) return -1;
  for (int i = 0; i < kMaxLivePaths; ++i) {
    int expected = 0;
    if (!g_live[i].state.compare_exchange_strong(expected, 1)) continue;
    std::memcpy(g_live[i].path, path.c_str(), path.size() + 1);
    g_live[i].is_dir = is_dir;
    g_live[i].state.store(2);
    return i;
  }
  note_once(g_said_registry_full, "too many offload paths to remove on a signal; " + path +
                                      " may be left behind if interrupted");
  return -1;
}

void unregister_live_path(int slot) {
  if (slot >= 0) g_live[slot].state.store(0);
}

}  // namespace

void remove_offload_files_now() noexcept {
  for (bool dirs : {false, true}) {  // files first so their directories are empty
    for (LivePath& p : g_live) {
      if (p.state.load() != 2 || p.is_dir != dirs) continue;
      if (dirs) {
        ::rmdir(p.path);
      } else {
        ::unlink(p.path);
      }
    }
  }
}

void leave_signals_to_caller() { g_signals_external.store(true); }

namespace {

// ---- I/O engines ---------------------------------------------------------------------------

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

// ---- Chunks --------------------------------------------------------------------------------

// A piece of one request: an aligned file range of at most kChunkBytes (staged) or
// kDirectChunkBytes (direct).
struct Chunk {
  std::shared_ptr<TicketState> ticket;
  int slot = 0;
  bool write = false;
  bool staged = false;  // through the bounce buffer (else straight from/to the caller's memory)
  bool rmw = false;     // waiting for the head/tail blocks a partial write must preserve
  bool tail_rmw = false;
  std::int64_t extent_offset = 0;
  std::int64_t file_begin = 0;  // aligned range on disk
  std::int64_t file_end = 0;
  std::int64_t user_begin = 0;  // file offset of the first caller byte in this chunk
  std::int64_t user_len = 0;
  const std::byte* src = nullptr;
  std::byte* dst = nullptr;
  std::byte* bounce = nullptr;
  std::array<std::int64_t, 2> locked{};
  int n_locked = 0;
  std::array<Op, 2> ops;
  std::atomic<int> pending{0};
  std::atomic<int> err{0};
  const Op* failed = nullptr;  // written by the op that set err
};

std::string io_error_message(const std::string& path, const Op& op, int err) {
  std::string msg = "disk store: " + std::string(op.write ? "write" : "read") + " of " +
                    std::to_string(op.len) + " bytes at offset " + std::to_string(op.offset) + " in " + path +
                    " failed: " +
                    (err == kEndOfFile ? "the file ends before data written to it (truncated by someone else?)"
                                       : errno_text(err));
  if (err == ENOSPC || err == EFBIG) {
    msg += "; the offload directory's disk is full";
    if (err == EFBIG) msg += " or the file size limit (ulimit -f) was reached";
    msg += "; free space or use --offload-dir on a larger disk";
  }
  return msg;
}

std::string invalid_region_message(const std::string& path, std::int64_t extent_offset) {
  return "disk store: cannot read the extent at offset " + std::to_string(extent_offset) + " in " + path +
         ": an earlier write to it failed, so its contents are invalid";
}

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};

}  // namespace

// ---- The store -----------------------------------------------------------------------------

struct DiskStore::Impl final : CompletionSink {
  // Owns the directory and file; declared first so it is cleaned up last.
  struct Files {
    std::string dir;
    std::string path;
    bool owns_dir = false;
    int fd = -1;
    int lock_fd = -1;  // holds the flock that marks the file as a live run's (offload_marks.h)
    int dir_slot = -1;
    int file_slot = -1;
    int lock_slot = -1;
    Files() = default;
    Files(const Files&) = delete;
    Files& operator=(const Files&) = delete;
    ~Files() {
      if (fd >= 0 && ::close(fd) != 0) {
        std::fprintf(stderr, "flexh2o: warning: closing %s: %s\n", path.c_str(), errno_text(errno).c_str());
      }
      if (!path.empty() && ::unlink(path.c_str()) != 0 && errno != ENOENT) {
        std::fprintf(stderr, "flexh2o: warning: cannot remove %s: %s\n", path.c_str(), errno_text(errno).c_str());
      }
      unregister_live_path(file_slot);
      if (lock_fd >= 0) {
        ::unlink(store_lock_path(path).c_str());
        ::close(lock_fd);
      }
      unregister_live_path(lock_slot);
      if (owns_dir && ::rmdir(dir.c_str()) != 0 && errno != ENOENT) {
        std::fprintf(stderr, "flexh2o: warning: cannot remove %s: %s\n", dir.c_str(), errno_text(errno).c_str());
      }
      unregister_live_path(dir_slot);
    }
  };

  explicit Impl(const Options& opts) {
    open_files(opts.dir);
    if (opts.budget != nullptr) {
      budget = opts.budget;
    } else {
      own_budget = std::make_unique<Budget>(Tier::Disk);
      budget = own_budget.get();
    }
    bounce.reset(static_cast<std::byte*>(std::aligned_alloc(kBlock, kSlots * kChunkBytes)));
    if (!bounce) throw std::bad_alloc();
    for (int i = 0; i < kSlots; ++i) {
      chunks[static_cast<std::size_t>(i)].slot = i;
      chunks[static_cast<std::size_t>(i)].bounce = bounce.get() + i * kChunkBytes;
      free_slots.push_back(i);
    }
    if (!opts.force_threads) {
      try {
        engine = std::make_unique<UringEngine>(*this, bounce.get(), kChunkBytes, kSlots);
      } catch (const std::system_error& e) {
        note_once(g_said_no_uring, "io_uring unavailable (" + std::string(e.what()) +
                                       "), using a thread pool for disk I/O");
      }
    }
    if (!engine) engine = std::make_unique<ThreadPoolEngine>(*this);
  }

  ~Impl() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return free_slots.size() == static_cast<std::size_t>(kSlots); });
    for (const auto& [offset, bytes] : live_extents) budget->release(align_up(bytes));
  }

  void open_files(const std::string& requested) {
    if (requested.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      const std::string base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
      std::string tmpl = base + "/flexh2o-XXXXXX";
      if (::mkdtemp(tmpl.data()) == nullptr) {
        throw std::runtime_error("cannot create an offload directory under " + base + ": " +
                                 errno_text(errno) + "; set TMPDIR or use --offload-dir");
      }
      files.dir = tmpl;
      files.owns_dir = true;
      reclaim_dead_offload_dirs(base);  // what killed runs left in their own directories
    } else {
      files.dir = requested;
      if (::mkdir(requested.c_str(), 0700) == 0) {
        files.owns_dir = true;
      } else if (errno != EEXIST) {
        throw std::runtime_error("cannot create offload directory " + requested + ": " + errno_text(errno) +
                                 "; use --offload-dir with an existing writable directory");
      }
    }
    if (files.owns_dir) files.dir_slot = register_live_path(files.dir, true);

    std::string tmpl = files.dir + "/flexh2o-offload-XXXXXX";
    const int fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd < 0) {
      throw std::runtime_error("cannot create a file in offload directory " + files.dir + ": " +
                               errno_text(errno) + "; use --offload-dir with a writable directory");
    }
    files.fd = fd;
    files.path = tmpl;
    files.file_slot = register_live_path(files.path, false);
    files.lock_fd = mark_store_file(files.path);
    files.lock_slot = register_live_path(store_lock_path(files.path), false);
    reclaim_dead_store_files(files.dir);  // a killed run's files in --offload-dir

    // O_DIRECT keeps streamed weights/KV out of the page cache; some filesystems refuse it.
    const int fl = ::fcntl(fd, F_GETFL);
    if (fl < 0) throw std::runtime_error("fcntl on " + files.path + ": " + errno_text(errno));
    if (::fcntl(fd, F_SETFL, fl | O_DIRECT) == 0) {
      direct = true;
    } else if (errno == EINVAL) {
      note_once(g_said_no_direct, "the filesystem of " + files.dir +
                                      " refuses O_DIRECT (e.g. tmpfs); using buffered disk I/O");
    } else {
      throw std::runtime_error("cannot enable O_DIRECT on " + files.path + ": " + errno_text(errno));
    }
  }

  Extent allocate(std::int64_t bytes, std::string_view what) {
    if (bytes < 0 || bytes > std::numeric_limits<std::int64_t>::max() - kBlock) {
      throw std::invalid_argument("disk store: invalid extent size " + std::to_string(bytes));
    }
    if (bytes == 0) return Extent{};
    const std::int64_t size = align_up(bytes);
    budget->reserve(size, what);  // the extent holds this charge until free() or destruction
    try {
      std::lock_guard lock(mu);
      std::int64_t offset = end;
      const auto fit =
          std::find_if(free_ranges.begin(), free_ranges.end(), [&](const auto& r) { return r.second >= size; });
      if (fit != free_ranges.end()) {
        offset = fit->first;
        const std::int64_t rest = fit->second - size;
        free_ranges.erase(fit);
        if (rest > 0) free_ranges.emplace(offset + size, rest);
      } else {
        end += size;
      }
      live_extents.emplace(offset, bytes);
      return Extent{offset, bytes};
    } catch (...) {
      budget->release(size);
      throw;
    }
  }

  void free(Extent e) {
    if (e.bytes == 0) return;
    std::int64_t size = align_up(e.bytes);
    {
      std::lock_guard lock(mu);
      const auto it = live_extents.find(e.offset);
      if (it == live_extents.end() || it->second != e.bytes) {
        throw std::invalid_argument("disk store: free of an extent that is not allocated (offset " +
                                    std::to_string(e.offset) + ", " + std::to_string(e.bytes) + " bytes)");
      }
      live_extents.erase(it);
      poisoned.erase(e.offset);
      std::int64_t off = e.offset;
      auto next = free_ranges.lower_bound(off);
      if (next != free_ranges.end() && off + size == next->first) {
        size += next->second;
        next = free_ranges.erase(next);
      }
      if (next != free_ranges.begin()) {
        const auto prev = std::prev(next);
        if (prev->first + prev->second == off) {
          off = prev->first;
          size += prev->second;
          free_ranges.erase(prev);
        }
      }
      if (off + size == end) {
        end = off;
      } else {
        free_ranges.emplace(off, size);
      }
    }
    budget->release(align_up(e.bytes));
  }

  Ticket submit(bool write, Extent e, std::int64_t offset, const std::byte* src, std::byte* dst, std::int64_t bytes) {
    const char* op_name = write ? "write" : "read";
    if (offset < 0 || bytes < 0 || offset > e.bytes - bytes) {
      throw std::out_of_range("disk store: " + std::string(op_name) + " of " + std::to_string(bytes) +
                              " bytes at offset " + std::to_string(offset) + " is outside the extent of " +
                              std::to_string(e.bytes) + " bytes");
    }
    auto state = std::make_shared<TicketState>();
    if (bytes == 0) return Ticket(state);
    if ((write ? static_cast<const void*>(src) : dst) == nullptr) {
      throw std::invalid_argument("disk store: null buffer for a " + std::string(op_name));
    }
    {
      std::lock_guard lock(mu);
      const auto it = live_extents.find(e.offset);
      if (it == live_extents.end() || it->second != e.bytes) {
        throw std::invalid_argument("disk store: " + std::string(op_name) +
                                    " on an extent that is not allocated (offset " + std::to_string(e.offset) + ")");
      }
      if (!write && poisoned.count(e.offset) != 0) {
        state->error = std::make_exception_ptr(std::runtime_error(invalid_region_message(files.path, e.offset)));
        return Ticket(state);
      }
    }

    const std::int64_t a = e.offset + offset;
    const std::int64_t b = a + bytes;
    const std::int64_t fa = align_down(a);
    const std::int64_t fb = align_up(b);
    const auto user_addr = reinterpret_cast<std::uintptr_t>(write ? static_cast<const void*>(src) : dst);
    const bool staged = user_addr % kBlock != 0 || a % kBlock != 0 || bytes % kBlock != 0;
    const std::int64_t extent_end = e.offset + e.bytes;  // bytes past this are padding
    const std::int64_t step = staged ? kChunkBytes : kDirectChunkBytes;
    state->remaining = (fb - fa + step - 1) / step;
    for (std::int64_t p = fa; p < fb; p += step) {
      const std::int64_t pe = std::min(p + step, fb);
      const std::int64_t ub = std::max(a, p);
      const std::int64_t ue = std::min(b, pe);
      // A partial write must preserve the other bytes of its first and last block.
      const bool head_rmw = write && staged && ub > p;
      const bool tail_rmw = write && staged && ue < std::min(pe, extent_end);
      std::array<std::int64_t, 2> lock_blocks{};
      int n_lock = 0;
      if (head_rmw) lock_blocks[static_cast<std::size_t>(n_lock++)] = p;
      if (tail_rmw && !(head_rmw && pe - kBlock == p)) lock_blocks[static_cast<std::size_t>(n_lock++)] = pe - kBlock;

      Chunk* c = nullptr;
      {
        // Waiting here bounds the I/O in flight; blocks under a read-modify-write are
        // taken one chunk at a time so two partial writes to one block cannot interleave.
        std::unique_lock lock(mu);
        cv.wait(lock, [&] {
          if (free_slots.empty()) return false;
          for (int i = 0; i < n_lock; ++i) {
            if (locked_blocks.count(lock_blocks[static_cast<std::size_t>(i)]) != 0) return false;
          }
          return true;
        });
        c = &chunks[static_cast<std::size_t>(free_slots.back())];
        free_slots.pop_back();
        for (int i = 0; i < n_lock; ++i) locked_blocks.insert(lock_blocks[static_cast<std::size_t>(i)]);
      }
      c->ticket = state;
      c->write = write;
      c->staged = staged;
      c->tail_rmw = tail_rmw;
      c->extent_offset = e.offset;
      c->file_begin = p;
      c->file_end = pe;
      c->user_begin = ub;
      c->user_len = ue - ub;
      c->src = write ? src + (ub - a) : nullptr;
      c->dst = write ? nullptr : dst + (ub - a);
      c->locked = lock_blocks;
      c->n_locked = n_lock;
      c->err.store(0);
      c->failed = nullptr;
      start(*c, head_rmw, tail_rmw);
    }
    return Ticket(state);
  }

  void set_op(Chunk& c, Op& op, bool write, std::int64_t file_offset, std::byte* buf, std::int64_t len) {
    op = Op{};
    op.write = write;
    op.fd = files.fd;
    op.offset = file_offset;
    op.buf = buf;
    op.len = len;
    op.fixed_index = c.staged ? c.slot : -1;  // staged ops always use the slot's bounce buffer
    op.chunk = &c;
    if (!write) op.valid_end = written_end.load();
  }

  void start(Chunk& c, bool head_rmw, bool tail_rmw) {
    if (!head_rmw && !tail_rmw) {
      start_main(c);
      return;
    }
    c.rmw = true;
    int n = 0;
    if (head_rmw) set_op(c, c.ops[static_cast<std::size_t>(n++)], false, c.file_begin, c.bounce, kBlock);
    const std::int64_t tail = c.file_end - kBlock;
    if (tail_rmw && !(head_rmw && tail == c.file_begin)) {
      set_op(c, c.ops[static_cast<std::size_t>(n++)], false, tail, c.bounce + (tail - c.file_begin), kBlock);
    }
    c.pending.store(n);
    for (int i = 0; i < n; ++i) engine->submit(c.ops[static_cast<std::size_t>(i)]);
  }

  void start_main(Chunk& c) {
    c.rmw = false;
    const std::int64_t len = c.file_end - c.file_begin;
    std::byte* buf = c.bounce;
    if (!c.staged) {
      buf = c.write ? const_cast<std::byte*>(c.src) : c.dst;  // NOLINT: pwrite never writes to it
    } else if (c.write) {
      const std::int64_t rel = c.user_begin - c.file_begin;
      std::memcpy(c.bounce + rel, c.src, static_cast<std::size_t>(c.user_len));
      // Padding past the extent's bytes is zeroed so no stale data reaches the file.
      if (!c.tail_rmw) std::memset(c.bounce + rel + c.user_len, 0, static_cast<std::size_t>(len - rel - c.user_len));
    }
    set_op(c, c.ops[0], c.write, c.file_begin, buf, len);
    c.pending.store(1);
    engine->submit(c.ops[0]);
  }

  void on_complete(Op& op, int err) noexcept override {
    Chunk& c = *op.chunk;
    if (err == kEndOfFile) {
      // Past everything written so far the file may legitimately end (e.g. the head block of
      // a fresh extent): that reads as zeros. Below it, the file was truncated under us.
      if (op.offset + op.done >= op.valid_end) {
        std::memset(op.buf + op.done, 0, static_cast<std::size_t>(op.len - op.done));
        op.done = op.len;
        err = 0;
      }
    } else if (err == 0 && op.write) {
      std::int64_t end = op.offset + op.len, seen = written_end.load();
      while (seen < end && !written_end.compare_exchange_weak(seen, end)) {
      }
    }
    if (err != 0) {
      int expected = 0;
      if (c.err.compare_exchange_strong(expected, err)) c.failed = &op;
    }
    if (c.pending.fetch_sub(1) != 1) return;
    if (c.err.load() == 0 && c.rmw) {
      start_main(c);
      return;
    }
    if (c.err.load() == 0 && !c.write && c.staged) {
      std::memcpy(c.dst, c.bounce + (c.user_begin - c.file_begin), static_cast<std::size_t>(c.user_len));
    }
    finish(c);
  }

  void finish(Chunk& c) noexcept {
    std::exception_ptr error;
    const int err = c.err.load();
    try {
      if (err != 0) error = std::make_exception_ptr(std::runtime_error(io_error_message(files.path, *c.failed, err)));
    } catch (...) {
      error = std::current_exception();
    }
    std::shared_ptr<TicketState> ticket = std::move(c.ticket);
    {
      std::lock_guard lock(mu);
      try {
        // Nothing half-written may later be read back as valid.
        if (err != 0 && c.write) poisoned.insert(c.extent_offset);
        if (err == 0 && !c.write && poisoned.count(c.extent_offset) != 0) {
          error = std::make_exception_ptr(std::runtime_error(invalid_region_message(files.path, c.extent_offset)));
        }
      } catch (...) {
        error = std::current_exception();
      }
      for (int i = 0; i < c.n_locked; ++i) locked_blocks.erase(c.locked[static_cast<std::size_t>(i)]);
      free_slots.push_back(c.slot);  // capacity reserved up front, cannot throw
    }
    cv.notify_all();
    {
      std::lock_guard lock(ticket->mu);
      if (error && !ticket->error) ticket->error = error;
      if (--ticket->remaining == 0) ticket->cv.notify_all();
    }
  }

  Files files;
  bool direct = false;
  std::unique_ptr<Budget> own_budget;
  Budget* budget = nullptr;
  std::unique_ptr<std::byte, FreeDeleter> bounce;

  std::mutex mu;  // guards everything below up to the engine
  std::condition_variable cv;
  std::int64_t end = 0;                          // bump pointer: file bytes in use
  std::map<std::int64_t, std::int64_t> free_ranges;   // offset -> aligned size, coalesced
  std::map<std::int64_t, std::int64_t> live_extents;  // offset -> requested bytes
  std::set<std::int64_t> poisoned;               // extents whose write failed
  std::atomic<std::int64_t> written_end{0};      // end of the furthest successful write
  std::set<std::int64_t> locked_blocks;          // blocks under a read-modify-write
  std::vector<int> free_slots;
  std::array<Chunk, kSlots> chunks;

  // Declared last: its threads call back into this object, so it must stop first.
  std::unique_ptr<IoEngine> engine;
};

DiskStore::DiskStore() : DiskStore(Options{}) {}
DiskStore::DiskStore(Options opts) : impl_(std::make_unique<Impl>(opts)) {}
DiskStore::~DiskStore() = default;

Extent DiskStore::allocate(std::int64_t bytes, std::string_view what) { return impl_->allocate(bytes, what); }
void DiskStore::free(Extent e) { impl_->free(e); }

Ticket DiskStore::write(Extent e, std::int64_t offset, const void* src, std::int64_t bytes) {
  return impl_->submit(true, e, offset, static_cast<const std::byte*>(src), nullptr, bytes);
}

Ticket DiskStore::read(Extent e, std::int64_t offset, void* dst, std::int64_t bytes) {
  return impl_->submit(false, e, offset, nullptr, static_cast<std::byte*>(dst), bytes);
}

void DiskStore::wait(const Ticket& t) {
  if (!t.state_) return;
  std::unique_lock lock(t.state_->mu);
  t.state_->cv.wait(lock, [&] { return t.state_->remaining == 0; });
  if (t.state_->error) std::rethrow_exception(t.state_->error);
}

const std::string& DiskStore::path() const { return impl_->files.path; }
const std::string& DiskStore::dir() const { return impl_->files.dir; }
bool DiskStore::uses_io_uring() const { return impl_->engine->is_uring(); }
bool DiskStore::uses_direct_io() const { return impl_->direct; }
Budget& DiskStore::budget() { return *impl_->budget; }

}  // namespace flexh2o::offload
