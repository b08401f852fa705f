// A thin layer over Open MPI's C API for flexh2o's runs over several ranks: one Mpi per
// process (MPI_Init_thread .. MPI_Finalize), messages of bytes of any size (cut into pieces
// that MPI's int counts carry), non-blocking sends that own their buffers, and MPI_Abort.
// Only the thread that created the Mpi calls MPI (MPI_THREAD_FUNNELED): the engine's worker
// threads never do.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace flexh2o::distributed {

using Bytes = std::vector<std::byte>;

// JSON as the bytes of a message (CBOR), and back.
Bytes to_bytes(const nlohmann::json& j);
nlohmann::json from_bytes(const Bytes& b);

// A non-blocking send; the bytes stay alive until it completes. Destroying it waits.
class PendingSend {
 public:
  PendingSend() = default;
  PendingSend(PendingSend&&) noexcept;
  PendingSend& operator=(PendingSend&&) noexcept;
  ~PendingSend();
  bool test();  // completed (progresses MPI)
  void wait();

 private:
  friend class Mpi;
  std::shared_ptr<const Bytes> bytes_;
  std::vector<MPI_Request> requests_;
};

class Mpi {
 public:
  static constexpr int kAnySource = MPI_ANY_SOURCE;

  Mpi();  // MPI_Init_thread; throws when MPI cannot start
  ~Mpi();  // MPI_Finalize
  Mpi(const Mpi&) = delete;
  Mpi& operator=(const Mpi&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& host() const { return host_; }
  // Ranks of this job on this host (sharing its memory and disk), this one included.
  int ranks_on_host() const { return ranks_on_host_; }
  // Ends every rank of the job with `code` (the launcher kills the others).
  [[noreturn]] void abort(int code) const;
  void barrier() const;

  void send(int dest, int tag, std::span<const std::byte> bytes) const;
  PendingSend isend(int dest, int tag, std::shared_ptr<const Bytes> bytes) const;
  // A whole message of any size; `sender` (optional) says who sent it (for kAnySource).
  Bytes recv(int source, int tag, int* sender = nullptr) const;
  // A message of exactly dst.size() bytes; throws naming `what` when it is not.
  void recv_into(int source, int tag, std::span<std::byte> dst, const char* what) const;
  // Whether a message from `source` with `tag` is waiting (and progresses MPI).
  bool waiting(int source, int tag) const;
  // Until one is: sleeps between probes, where Open MPI's blocking receive would poll and take
  // a core from the ranks computing beside this one.
  void await(int source, int tag) const;

  // Every rank's bytes, in rank order, on `root` (empty elsewhere).
  std::vector<Bytes> gather(std::span<const std::byte> mine, int root) const;
  // Root's bytes on every rank.
  Bytes broadcast(Bytes bytes, int root) const;
  // Whether `mine` is true on any rank (every rank calls it at the same point).
  bool any(bool mine) const;

 private:
  int rank_ = 0, size_ = 1, ranks_on_host_ = 1;
  std::string host_;
};

}  // namespace flexh2o::distributed
