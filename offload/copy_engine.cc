#include "offload/copy_engine.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <stdexcept>

namespace flexh2o::offload {

Place Place::advanced(std::int64_t bytes) const {
  Place p = *this;
  if (tier == Tier::Disk)
    p.offset += bytes;
  else
    p.ptr = static_cast<std::byte*>(ptr) + bytes;
  return p;
}

HostBuffer& Staging::buffer(int i) {
  auto& b = buffers_[i];
  if (b.data() == nullptr) b = HostBuffer(static_cast<std::size_t>(kChunkBytes), pin_with_);
  return b;
}

namespace {

using kernels::CopyDirection;
using kernels::CopyRegion;

kernels::CopyRegion region_of(const CopyPiece& p) {
  return {p.dst.ptr, p.src.ptr, static_cast<std::size_t>(p.bytes), static_cast<std::size_t>(p.rows),
          static_cast<std::size_t>(p.dst_pitch), static_cast<std::size_t>(p.src_pitch)};
}

// Row i of a piece as a plain copy.
CopyPiece row_of(const CopyPiece& p, std::int64_t i) {
  return {p.dst.advanced(i * p.dst_pitch), p.src.advanced(i * p.src_pitch), p.bytes};
}

// Rows of a piece as plain copies, whole when contiguous.
std::vector<CopyPiece> rows_of(const CopyPiece& p) {
  if (p.contiguous()) return {CopyPiece{p.dst, p.src, p.total()}};
  std::vector<CopyPiece> out;
  for (std::int64_t i = 0; i < p.rows; ++i) out.push_back(row_of(p, i));
  return out;
}

// Copies between host and device memory (no disk side), by tier pair: host <-> device as
// strided regions in one backend call per direction, device <-> device on the compute order,
// host <-> host by memcpy per contiguous run.
void copy_in_memory(kernels::Backend& be, std::span<const CopyPiece> pieces, const kernels::Fence* after) {
  std::vector<CopyRegion> to_device, to_host;
  for (const CopyPiece& p : pieces) {
    if (p.bytes == 0 || p.rows == 0) continue;
    if (p.src.tier == Tier::Gpu && p.dst.tier == Tier::Gpu) {
      for (const CopyPiece& r : rows_of(p)) be.copy_on_device(r.dst.ptr, r.src.ptr, static_cast<std::size_t>(r.bytes));
    } else if (p.dst.tier == Tier::Gpu) {
      to_device.push_back(region_of(p));
    } else if (p.src.tier == Tier::Gpu) {
      to_host.push_back(region_of(p));
    } else {
      for (const CopyPiece& r : rows_of(p)) std::memcpy(r.dst.ptr, r.src.ptr, static_cast<std::size_t>(r.bytes));
    }
  }
  if (!to_device.empty()) be.copy_regions(CopyDirection::ToDevice, to_device, after);
  if (!to_host.empty()) be.copy_regions(CopyDirection::ToHost, to_host, after);
}

void copy_in_memory(kernels::Backend& be, Place dst, Place src, std::int64_t bytes, const kernels::Fence* after) {
  const CopyPiece p{dst, src, bytes};
  copy_in_memory(be, std::span<const CopyPiece>(&p, 1), after);
}

// Disk <-> gpu (or disk <-> disk) in chunks through two host buffers: the next chunk is
// fetched while the current one is handed on.
void copy_staged(Tiers& tiers, Place dst, Place src, std::int64_t bytes, Staging& staging) {
  DiskStore& disk = tiers.disk();
  kernels::Backend& be = tiers.backend();
  const std::int64_t chunk = Staging::kChunkBytes;
  const std::int64_t chunks = (bytes + chunk - 1) / chunk;
  Ticket got[2], put[2];
  auto size_of = [&](std::int64_t c) { return std::min(chunk, bytes - c * chunk); };
  auto get = [&](std::int64_t c) {
    const int b = static_cast<int>(c % 2);
    void* buf = staging.buffer(b).data();
    const Place from = src.advanced(c * chunk);
    if (from.tier == Tier::Disk)
      got[b] = disk.read(from.extent, from.offset, buf, size_of(c));
    else
      copy_in_memory(be, Place::cpu(buf), from, size_of(c), staging.after);
  };
  try {
    get(0);
    for (std::int64_t c = 0; c < chunks; ++c) {
      const int b = static_cast<int>(c % 2);
      disk.wait(got[b]);
      if (c + 1 < chunks) {
        disk.wait(put[1 - b]);  // the other buffer is free once its write-out finished
        get(c + 1);
      }
      const Place to = dst.advanced(c * chunk);
      void* buf = staging.buffer(b).data();
      if (to.tier == Tier::Disk)
        put[b] = disk.write(to.extent, to.offset, buf, size_of(c));
      else
        copy_in_memory(be, to, Place::cpu(buf), size_of(c), staging.after);
    }
    disk.wait(put[0]);
    disk.wait(put[1]);
  } catch (...) {
    // Nothing may still read or fill a staging buffer once this returns.
    for (const Ticket& t : {got[0], got[1], put[0], put[1]}) {
      try {
        disk.wait(t);
      } catch (...) {  // the first error is the one reported
      }
    }
    throw;
  }
}

// The disk store reads into and writes from host memory itself, no staging needed.
bool host_addressable(Tiers& tiers, Tier t, const CopyOptions& opts) {
  return t == Tier::Cpu || (t == Tier::Gpu && tiers.backend().kind() == kernels::DeviceKind::Cpu && !opts.always_stage);
}

// A disk transfer the store can do without staging.
bool direct_disk(Tiers& tiers, const CopyPiece& p, const CopyOptions& opts) {
  return (p.src.tier == Tier::Disk && host_addressable(tiers, p.dst.tier, opts)) ||
         (p.dst.tier == Tier::Disk && host_addressable(tiers, p.src.tier, opts));
}

bool touches_disk(const CopyPiece& p) { return p.src.tier == Tier::Disk || p.dst.tier == Tier::Disk; }

}  // namespace

void copy_now(Tiers& tiers, Place dst, Place src, std::int64_t bytes, Staging& staging, CopyOptions opts) {
  if (bytes < 0) throw std::invalid_argument("copy of a negative byte count");
  if (bytes == 0) return;
  if (src.tier != Tier::Disk && dst.tier != Tier::Disk) return copy_in_memory(tiers.backend(), dst, src, bytes, staging.after);
  DiskStore& disk = tiers.disk();
  if (src.tier == Tier::Disk && host_addressable(tiers, dst.tier, opts)) return disk.wait(disk.read(src.extent, src.offset, dst.ptr, bytes));
  if (dst.tier == Tier::Disk && host_addressable(tiers, src.tier, opts)) return disk.wait(disk.write(dst.extent, dst.offset, src.ptr, bytes));
  copy_staged(tiers, dst, src, bytes, staging);
}

void copy_pieces_now(Tiers& tiers, const std::vector<CopyPiece>& pieces, Staging& staging, CopyOptions opts) {
  for (const CopyPiece& p : pieces)
    if (p.bytes < 0 || p.rows < 0) throw std::invalid_argument("copy of a negative byte or row count");
  // Direct disk transfers are issued first and waited last; the rest run meanwhile: memory
  // copies as one batch, then staged disk transfers row by row.
  std::vector<Ticket> pending;
  std::exception_ptr error;
  try {
    std::vector<CopyPiece> memory;
    for (const auto& p : pieces) {
      if (p.bytes == 0 || p.rows == 0) continue;
      if (!touches_disk(p)) {
        memory.push_back(p);
        continue;
      }
      if (!direct_disk(tiers, p, opts)) continue;
      for (const CopyPiece& r : rows_of(p)) {
        if (r.src.tier == Tier::Disk)
          pending.push_back(tiers.disk().read(r.src.extent, r.src.offset, r.dst.ptr, r.bytes));
        else
          pending.push_back(tiers.disk().write(r.dst.extent, r.dst.offset, r.src.ptr, r.bytes));
      }
    }
    copy_in_memory(tiers.backend(), memory, staging.after);
    for (const auto& p : pieces)
      if (p.bytes > 0 && touches_disk(p) && !direct_disk(tiers, p, opts))
        for (const CopyPiece& r : rows_of(p)) copy_staged(tiers, r.dst, r.src, r.bytes, staging);
  } catch (...) {
    error = std::current_exception();
  }
  // Every issued request is waited on, even after an error, so no buffer is freed under it.
  for (const auto& t : pending) {
    try {
      tiers.disk().wait(t);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

// ---- Asynchronous lanes -----------------------------------------------------------------

struct CopyJobState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
};

bool CopyTicket::done() const {
  if (!state_) return true;
  std::lock_guard lock(state_->mu);
  return state_->done;
}

void CopyTicket::wait() const {
  if (!state_) return;
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
}

struct CopyEngine::Lane {
  struct Job {
    std::function<void(Staging&)> fn;
    std::shared_ptr<const kernels::Fence> after;  // the backend's fence at submission
    std::shared_ptr<CopyJobState> state;
    CopyLabel label;
    std::int64_t bytes;
  };
  explicit Lane(std::string n, kernels::Backend* pin_with) : name(std::move(n)), staging(pin_with) {}
  std::string name;
  Staging staging;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> queue;
  bool stopping = false;
  std::thread worker;
};

CopyEngine::CopyEngine(Tiers& tiers, CopyOptions opts, Trace* trace) : tiers_(tiers), opts_(opts), trace_(trace) {}

CopyEngine::~CopyEngine() {
  for (auto& l : lanes_) {
    {
      std::lock_guard lock(l->mu);
      l->stopping = true;
    }
    l->cv.notify_all();
  }
  for (auto& l : lanes_) l->worker.join();
}

int CopyEngine::add_lane(const std::string& name) {
  lanes_.push_back(std::make_unique<Lane>(name, &tiers_.backend()));
  Lane& l = *lanes_.back();
  l.worker = std::thread([this, &l] { run_lane(l); });
  return static_cast<int>(lanes_.size()) - 1;
}

void CopyEngine::run_lane(Lane& l) {
  for (;;) {
    Lane::Job job;
    {
      std::unique_lock lock(l.mu);
      l.cv.wait(lock, [&] { return l.stopping || !l.queue.empty(); });
      if (l.queue.empty()) return;  // stopping and drained
      job = std::move(l.queue.front());
      l.queue.pop_front();
    }
    std::exception_ptr error;
    {
      ScopedSpan span(trace_, l.name, job.label.primitive, job.label.name.empty() ? job.label.primitive : job.label.name,
                      job.bytes);
      l.staging.after = job.after.get();
      try {
        job.fn(l.staging);
      } catch (...) {
        error = std::current_exception();
      }
      l.staging.after = nullptr;
    }
    {
      std::lock_guard lock(job.state->mu);
      job.state->done = true;
      job.state->error = error;
    }
    job.state->cv.notify_all();
  }
}

CopyTicket CopyEngine::submit(int lane, std::function<void(Staging&)> fn, CopyLabel label, std::int64_t bytes) {
  if (lane < 0 || lane >= static_cast<int>(lanes_.size())) throw std::out_of_range("no such copy lane");
  auto state = std::make_shared<CopyJobState>();
  Lane& l = *lanes_[static_cast<std::size_t>(lane)];
  // Taken now, on the submitting thread: the job waits for the ops issued so far, no later one.
  std::shared_ptr<const kernels::Fence> after = tiers_.backend().fence();
  {
    std::lock_guard lock(l.mu);
    l.queue.push_back({std::move(fn), std::move(after), state, std::move(label), bytes});
  }
  l.cv.notify_one();
  return CopyTicket(state);
}

CopyTicket CopyEngine::copy(int lane, std::vector<CopyPiece> pieces, CopyLabel label) {
  std::int64_t total = 0;
  for (const auto& p : pieces) total += p.total();
  return submit(
      lane, [this, pieces = std::move(pieces)](Staging& staging) { copy_pieces_now(tiers_, pieces, staging, opts_); },
      std::move(label), total);
}

CopyTicket CopyEngine::copy(int lane, Place dst, Place src, std::int64_t bytes, CopyLabel label) {
  return copy(lane, std::vector<CopyPiece>{{dst, src, bytes}}, std::move(label));
}

}  // namespace flexh2o::offload
