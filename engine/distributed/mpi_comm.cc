#include "engine/distributed/mpi_comm.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <stdexcept>

namespace flexh2o::distributed {

namespace {

// Bytes per MPI message: counts are ints. A message is pieces of kPiece bytes ending with a
// shorter one (possibly empty), so a receiver knows where it ends without a header.
constexpr std::int64_t kPiece = std::int64_t{1} << 30;

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw std::runtime_error(std::string(what) + " failed: " + std::string(text, static_cast<std::size_t>(len)));
}

int piece_count(std::int64_t bytes) { return static_cast<int>(bytes / kPiece) + 1; }
int piece_bytes(std::int64_t bytes, int i) {
  return static_cast<int>(std::min(kPiece, bytes - static_cast<std::int64_t>(i) * kPiece));
}

}  // namespace

Bytes to_bytes(const nlohmann::json& j) {
  const std::vector<std::uint8_t> v = nlohmann::json::to_cbor(j);
  const auto* p = reinterpret_cast<const std::byte*>(v.data());
  return Bytes(p, p + v.size());
}

nlohmann::json from_bytes(const Bytes& b) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(b.data());
  return nlohmann::json::from_cbor(p, p + b.size());
}

PendingSend::PendingSend(PendingSend&& o) noexcept : bytes_(std::move(o.bytes_)), requests_(std::move(o.requests_)) {
  o.requests_.clear();
}

PendingSend& PendingSend::operator=(PendingSend&& o) noexcept {
  if (this != &o) {
    try {
      wait();
    } catch (...) {  // a failed send ends the job where it is waited on explicitly
    }
    bytes_ = std::move(o.bytes_);
    requests_ = std::move(o.requests_);
    o.requests_.clear();
  }
  return *this;
}

PendingSend::~PendingSend() {
  try {
    wait();
  } catch (...) {
  }
}

bool PendingSend::test() {
  if (requests_.empty()) return true;
  int done = 0;
  check(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
  if (done) {
    requests_.clear();
    bytes_.reset();
  }
  return done != 0;
}

void PendingSend::wait() {
  if (requests_.empty()) return;
  check(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  requests_.clear();
  bytes_.reset();
}

Mpi::Mpi() {
  int provided = 0;
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  // Errors come back as codes (and become exceptions) instead of ending the job silently.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  host_.assign(name, static_cast<std::size_t>(len));
  MPI_Comm local;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local) == MPI_SUCCESS) {
    MPI_Comm_size(local, &ranks_on_host_);
    MPI_Comm_free(&local);
  }
  if (provided < MPI_THREAD_FUNNELED) {
    MPI_Finalize();
    throw std::runtime_error("this MPI library does not support MPI_THREAD_FUNNELED");
  }
}

Mpi::~Mpi() { MPI_Finalize(); }

void Mpi::abort(int code) const {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

void Mpi::barrier() const { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

void Mpi::send(int dest, int tag, std::span<const std::byte> bytes) const {
  const auto n = static_cast<std::int64_t>(bytes.size());
  for (int i = 0; i < piece_count(n); ++i)
    check(MPI_Send(bytes.data() + static_cast<std::int64_t>(i) * kPiece, piece_bytes(n, i), MPI_BYTE, dest, tag,
                   MPI_COMM_WORLD),
          "MPI_Send");
}

PendingSend Mpi::isend(int dest, int tag, std::shared_ptr<const Bytes> bytes) const {
  PendingSend s;
  const auto n = static_cast<std::int64_t>(bytes->size());
  s.requests_.resize(static_cast<std::size_t>(piece_count(n)));
  for (int i = 0; i < piece_count(n); ++i)
    check(MPI_Isend(bytes->data() + static_cast<std::int64_t>(i) * kPiece, piece_bytes(n, i), MPI_BYTE, dest, tag,
                    MPI_COMM_WORLD, &s.requests_[static_cast<std::size_t>(i)]),
          "MPI_Isend");
  s.bytes_ = std::move(bytes);
  return s;
}

Bytes Mpi::recv(int source, int tag, int* sender) const {
  Bytes out;
  for (;;) {
    MPI_Status st;
    check(MPI_Probe(source, tag, MPI_COMM_WORLD, &st), "MPI_Probe");
    source = st.MPI_SOURCE;  // the rest of the message comes from the same rank
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    const std::size_t at = out.size();
    out.resize(at + static_cast<std::size_t>(count));
    check(MPI_Recv(out.data() + at, count, MPI_BYTE, source, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
    if (count < kPiece) break;
  }
  if (sender) *sender = source;
  return out;
}

void Mpi::recv_into(int source, int tag, std::span<std::byte> dst, const char* what) const {
  const auto n = static_cast<std::int64_t>(dst.size());
  for (int i = 0; i < piece_count(n); ++i) {
    MPI_Status st;
    check(MPI_Recv(dst.data() + static_cast<std::int64_t>(i) * kPiece, piece_bytes(n, i), MPI_BYTE, source, tag,
                   MPI_COMM_WORLD, &st),
          what);
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    if (count != piece_bytes(n, i))
      throw std::runtime_error(std::string(what) + ": rank " + std::to_string(st.MPI_SOURCE) + " sent " +
                               std::to_string(count) + " bytes where " + std::to_string(piece_bytes(n, i)) +
                               " were expected (the ranks disagree on the schedule)");
  }
}

bool Mpi::waiting(int source, int tag) const {
  int flag = 0;
  check(MPI_Iprobe(source, tag, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE), "MPI_Iprobe");
  return flag != 0;
}

void Mpi::await(int source, int tag) const {
  while (!waiting(source, tag)) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

std::vector<Bytes> Mpi::gather(std::span<const std::byte> mine, int root) const {
  constexpr int kTag = 32000;  // above the tags of the runners
  std::vector<Bytes> all;
  if (rank_ != root) {
    send(root, kTag, mine);
    return all;
  }
  all.resize(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r)
    all[static_cast<std::size_t>(r)] = r == root ? Bytes(mine.begin(), mine.end()) : recv(r, kTag);
  return all;
}

bool Mpi::any(bool mine) const {
  int in = mine ? 1 : 0, out = 0;
  check(MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD), "MPI_Allreduce");
  return out != 0;
}

Bytes Mpi::broadcast(Bytes bytes, int root) const {
  std::int64_t n = static_cast<std::int64_t>(bytes.size());
  check(MPI_Bcast(&n, 1, MPI_INT64_T, root, MPI_COMM_WORLD), "MPI_Bcast");
  bytes.resize(static_cast<std::size_t>(n));
  for (int i = 0; i < piece_count(n); ++i)
    check(MPI_Bcast(bytes.data() + static_cast<std::int64_t>(i) * kPiece, piece_bytes(n, i), MPI_BYTE, root,
                    MPI_COMM_WORLD),
          "MPI_Bcast");
  return bytes;
}

}  // namespace flexh2o::distributed
