#include "offload/disk_store.h"
#include "offload/offload_marks.h"

#include "kernels/option_error.h"
#include "offload/disk_io_engines.h"
#include "offload/extent_allocator.h"
#include "offload/io_text.h"
#include "offload/offload_cleanup.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <system_error>
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

std::int64_t align_down(std::int64_t x) { return x & ~(kBlock - 1); }
std::int64_t align_up(std::int64_t x) { return align_down(x + kBlock - 1); }

std::atomic<bool> g_said_no_uring{false};
std::atomic<bool> g_said_no_direct{false};

}  // namespace

using disk_io::CompletionSink;
using disk_io::kEndOfFile;
using disk_io::Op;

// ---- Chunks --------------------------------------------------------------------------------

// A piece of one request: an aligned file range of at most kChunkBytes (staged) or
// kDirectChunkBytes (direct).
struct disk_io::Chunk {
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
using disk_io::Chunk;

namespace {

kernels::OptionRuntimeError io_error(const std::string& path, const Op& op, int err) {
  std::string msg = "disk store: " + std::string(op.write ? "write" : "read") + " of " +
                    std::to_string(op.len) + " bytes at offset " + std::to_string(op.offset) + " in " + path +
                    " failed: " +
                    (err == kEndOfFile ? "the file ends before data written to it (truncated by someone else?)"
                                       : errno_text(err));
  if (err == ENOSPC || err == EFBIG) {
    msg += "; the offload directory's disk is full";
    if (err == EFBIG) msg += " or the file size limit (ulimit -f) was reached";
    return kernels::OptionRuntimeError{msg + "; free space or use ", kernels::Option::OffloadDir, " on a larger disk"};
  }
  return kernels::OptionRuntimeError{msg};
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
        engine = disk_io::make_uring_engine(*this, bounce.get(), kChunkBytes, kSlots);
      } catch (const std::system_error& e) {
        note_once(g_said_no_uring, "io_uring unavailable (" + std::string(e.what()) +
                                       "), using a thread pool for disk I/O");
      }
    }
    if (!engine) engine = disk_io::make_thread_pool_engine(*this);
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
        throw kernels::OptionRuntimeError{
            "cannot create an offload directory under " + base + ": " + errno_text(errno) + "; set TMPDIR or use ",
            kernels::Option::OffloadDir};
      }
      files.dir = tmpl;
      files.owns_dir = true;
      reclaim_dead_offload_dirs(base);  // what killed runs left in their own directories
    } else {
      files.dir = requested;
      if (::mkdir(requested.c_str(), 0700) == 0) {
        files.owns_dir = true;
      } else if (errno != EEXIST) {
        throw kernels::OptionRuntimeError{"cannot create offload directory " + requested + ": " + errno_text(errno) +
                                              "; use ",
                                          kernels::Option::OffloadDir, " in an existing writable directory"};
      }
    }
    if (files.owns_dir) files.dir_slot = register_live_path(files.dir, true);

    std::string tmpl = files.dir + "/flexh2o-offload-XXXXXX";
    const int fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd < 0) {
      throw kernels::OptionRuntimeError{"cannot create a file in offload directory " + files.dir + ": " +
                                            errno_text(errno) + "; use ",
                                        kernels::Option::OffloadDir, " on a writable disk"};
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
      const std::int64_t offset = space.allocate(size);
      live_extents.emplace(offset, bytes);
      return Extent{offset, bytes};
    } catch (...) {
      budget->release(size);
      throw;
    }
  }

  void free(Extent e) {
    if (e.bytes == 0) return;
    {
      std::lock_guard lock(mu);
      const auto it = live_extents.find(e.offset);
      if (it == live_extents.end() || it->second != e.bytes) {
        throw std::invalid_argument("disk store: free of an extent that is not allocated (offset " +
                                    std::to_string(e.offset) + ", " + std::to_string(e.bytes) + " bytes)");
      }
      live_extents.erase(it);
      poisoned.erase(e.offset);
      space.free(e.offset, align_up(e.bytes));
    }
    budget->release(align_up(e.bytes));
  }

  // A free chunk slot, its first n_lock blocks of `lock_blocks` locked. Waiting here bounds the
  // I/O in flight; blocks under a read-modify-write are taken one chunk at a time so two
  // partial writes to one block cannot interleave.
  Chunk& take_chunk(const std::array<std::int64_t, 2>& lock_blocks, int n_lock) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] {
      if (free_slots.empty()) return false;
      for (int i = 0; i < n_lock; ++i) {
        if (locked_blocks.count(lock_blocks[static_cast<std::size_t>(i)]) != 0) return false;
      }
      return true;
    });
    Chunk& c = chunks[static_cast<std::size_t>(free_slots.back())];
    free_slots.pop_back();
    for (int i = 0; i < n_lock; ++i) locked_blocks.insert(lock_blocks[static_cast<std::size_t>(i)]);
    return c;
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

      Chunk* c = &take_chunk(lock_blocks, n_lock);
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
      if (err != 0) error = std::make_exception_ptr(io_error(files.path, *c.failed, err));
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
  ExtentAllocator space;                         // the file's aligned ranges
  std::map<std::int64_t, std::int64_t> live_extents;  // offset -> requested bytes
  std::set<std::int64_t> poisoned;               // extents whose write failed
  std::atomic<std::int64_t> written_end{0};      // end of the furthest successful write
  std::set<std::int64_t> locked_blocks;          // blocks under a read-modify-write
  std::vector<int> free_slots;
  std::array<Chunk, kSlots> chunks;

  // Declared last: its threads call back into this object, so it must stop first.
  std::unique_ptr<disk_io::IoEngine> engine;
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
