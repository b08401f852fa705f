// Sequential read and write throughput of offload::DiskStore against fio doing the same
// transfers: O_DIRECT, io_uring, the same file region, block size and queue depth. The ratio
// columns are DiskStore / fio; the target is >= 0.9 on reads.
// Usage: bench_disk_io [--dir DIR] [--total 1GiB] [--chunks 1MiB,4MiB,16MiB,64MiB]
//                      [--queue-depth 16] [--reps 3] [--fio fio] [--io uring|threads]
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <fmt/format.h>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "offload/disk_store.h"

extern char** environ;

using namespace flexh2o;

namespace {

// Runs args[0] (looked up in PATH) and returns its stdout; stderr passes through.
std::string run_capture(const std::vector<std::string>& args) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    throw std::runtime_error(fmt::format("cannot run {}: {}", args[0], std::strerror(rc)));
  }
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n > 0) out.append(buf, static_cast<std::size_t>(n));
    if (n == 0 || (n < 0 && errno != EINTR)) break;
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error(args[0] + " failed");
  return out;
}

// One fio job over [offset, offset + bytes) of an existing file; returns bytes per second.
double fio_bandwidth(const std::string& fio, const std::string& path, bool write, std::int64_t offset,
                     std::int64_t bytes, std::int64_t block, int queue_depth) {
  // allow_file_create=0 and fallocate=none: fio must neither create nor lay out the file;
  // the region belongs to our extent and was written by DiskStore first.
  const std::string out = run_capture(
      {fio, "--name=x", "--filename=" + path, "--direct=1", "--ioengine=io_uring",
       write ? "--rw=write" : "--rw=read", fmt::format("--bs={}", block), fmt::format("--iodepth={}", queue_depth),
       fmt::format("--offset={}", offset), fmt::format("--size={}", bytes), "--numjobs=1", "--allow_file_create=0",
       "--fallocate=none", "--output-format=json"});
  const auto brace = out.find('{');  // fio may print notes before the JSON
  if (brace == std::string::npos) throw std::runtime_error("fio printed no JSON: " + out);
  const auto job = nlohmann::json::parse(out.substr(brace)).at("jobs").at(0);
  if (job.at("error").get<int>() != 0) throw std::runtime_error("fio job failed with error " + job.at("error").dump());
  return job.at(write ? "write" : "read").at("bw_bytes").get<double>();
}

// Streams bytes of `e` in `block`-sized requests with up to queue_depth in flight, cycling
// through queue_depth 4 KiB-aligned buffers so no request is staged; returns bytes per second.
double store_bandwidth(offload::DiskStore& store, offload::Extent e, bool write, std::int64_t block, int queue_depth,
                       std::byte* buf) {
  std::deque<offload::Ticket> in_flight;
  const double sec = bench::seconds_of([&] {
    for (std::int64_t off = 0, i = 0; off < e.bytes; off += block, ++i) {
      if (static_cast<int>(in_flight.size()) == queue_depth) {
        store.wait(in_flight.front());
        in_flight.pop_front();
      }
      std::byte* p = buf + (i % queue_depth) * block;
      in_flight.push_back(write ? store.write(e, off, p, block) : store.read(e, off, p, block));
    }
    for (const auto& t : in_flight) store.wait(t);
  });
  return static_cast<double>(e.bytes) / sec;
}

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DiskStore sequential read/write throughput against fio (O_DIRECT, io_uring)"};
  std::string dir, total_text = "1GiB", fio = "fio", io;
  std::vector<std::string> chunk_texts{"1MiB", "4MiB", "16MiB", "64MiB"};
  // DiskStore's own ceiling: 16 transfers in flight (kSlots in disk_store.cc), aligned
  // requests split into transfers of at most 1 MiB.
  int queue_depth = 16;
  int reps = 3;
  app.add_option("--dir", dir, "directory for the store's file (default: a fresh one under $TMPDIR or /tmp)");
  app.add_option("--total", total_text, "bytes moved per measurement")->capture_default_str();
  app.add_option("--chunks", chunk_texts, "request sizes, multiples of 4 KiB")->delimiter(',')->capture_default_str();
  app.add_option("--queue-depth", queue_depth, "requests in flight, for both DiskStore and fio")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--reps", reps, "measured rounds; medians are reported")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--fio", fio, "fio executable")->capture_default_str();
  app.add_option("--io", io, "DiskStore engine (default: io_uring unless FLEXH2O_DISK_IO=threads)")
      ->check(CLI::IsMember({"uring", "threads"}));
  CLI11_PARSE(app, argc, argv);

  try {
    const std::int64_t total = offload::parse_bytes(total_text);
    std::vector<std::int64_t> chunks;
    for (const auto& t : chunk_texts) {
      const std::int64_t c = offload::parse_bytes(t);
      if (c <= 0 || c % offload::DiskStore::kAlignment != 0 || c > total)
        throw std::invalid_argument("chunk size " + t + " must be a positive multiple of 4 KiB, at most --total");
      chunks.push_back(c);
    }

    offload::DiskStore::Options opts;
    opts.dir = dir;
    if (!io.empty()) opts.force_threads = io == "threads";
    offload::DiskStore store(opts);
    if (!store.uses_direct_io())
      throw std::runtime_error("the filesystem of " + store.dir() + " refuses O_DIRECT; pass --dir on a real disk");
    if (io == "uring" && !store.uses_io_uring()) throw std::runtime_error("io_uring is unavailable; try --io threads");

    bool have_fio = true;
    try {
      run_capture({fio, "--version"});
    } catch (const std::exception& e) {
      have_fio = false;
      fmt::print(stderr, "fio not usable ({}); install it (apt-get install fio) or pass --fio PATH. "
                         "Printing DiskStore numbers only.\n", e.what());
    }

    fmt::print("DiskStore ({}) vs fio, O_DIRECT, {} per measurement, queue depth {}, median of {} interleaved runs\n",
               store.uses_io_uring() ? "io_uring" : "thread pool", offload::format_bytes(total), queue_depth, reps);
    fmt::print("file: {}\n", store.path());
    fmt::print("| chunk | DiskStore read GB/s | fio read GB/s | ratio "
               "| DiskStore write GB/s | fio write GB/s | ratio |\n");
    fmt::print("|---|---|---|---|---|---|---|\n");
    for (const std::int64_t chunk : chunks) {
      const std::int64_t bytes = total / chunk * chunk;  // whole requests only, as fio does
      const offload::Extent e = store.allocate(bytes, "benchmark extent");
      const std::int64_t buf_bytes = std::min<std::int64_t>(queue_depth, bytes / chunk) * chunk;
      std::unique_ptr<std::byte, FreeDeleter> buf(static_cast<std::byte*>(
          std::aligned_alloc(offload::DiskStore::kAlignment, static_cast<std::size_t>(buf_bytes))));
      if (!buf) throw std::bad_alloc();
      std::memset(buf.get(), 0x5a, static_cast<std::size_t>(buf_bytes));  // fault the pages in before timing

      // Order within a round: DiskStore writes first, so fio never reads past the file's end.
      enum { kStoreWrite, kFioWrite, kStoreRead, kFioRead, kVariants };
      std::vector<double> bw[kVariants];
      for (int round = 0; round <= reps; ++round) {  // round 0 is a warm-up
        for (int v = 0; v < kVariants; ++v) {
          const bool write = v == kStoreWrite || v == kFioWrite;
          const bool is_fio = v == kFioWrite || v == kFioRead;
          if (is_fio && !have_fio) continue;
          const double b = is_fio ? fio_bandwidth(fio, store.path(), write, e.offset, bytes, chunk, queue_depth)
                                  : store_bandwidth(store, e, write, chunk, queue_depth, buf.get());
          if (round > 0) bw[v].push_back(b / 1e9);
        }
      }
      store.free(e);

      auto cell = [&](int v) { return bw[v].empty() ? std::string("-") : fmt::format("{:.2f}", bench::median(bw[v])); };
      auto ratio = [&](int ours, int theirs) {
        return bw[theirs].empty() ? std::string("-")
                                  : fmt::format("{:.2f}", bench::median(bw[ours]) / bench::median(bw[theirs]));
      };
      fmt::print("| {} | {} | {} | {} | {} | {} | {} |\n", offload::format_bytes(chunk), cell(kStoreRead),
                 cell(kFioRead), ratio(kStoreRead, kFioRead), cell(kStoreWrite), cell(kFioWrite),
                 ratio(kStoreWrite, kFioWrite));
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_disk_io: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
