#include "offload/copy_engine.h"

#include <algorithm>
#include <cstring>
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

void copy_in_memory(kernels::Backend& be, Place dst, Place src, std::int64_t bytes) {
  const auto n = static_cast<std::size_t>(bytes);
  if (src.tier == Tier::Gpu && dst.tier == Tier::Gpu)
    be.copy_on_device(dst.ptr, src.ptr, n);
  else if (dst.tier == Tier::Gpu)
    be.copy_to_device(dst.ptr, src.ptr, n);
  else if (src.tier == Tier::Gpu)
    be.copy_to_host(dst.ptr, src.ptr, n);
  else
    std::memcpy(dst.ptr, src.ptr, n);
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
      copy_in_memory(be, Place::cpu(buf), from, size_of(c));
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
        copy_in_memory(be, to, Place::cpu(buf), size_of(c));
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

}  // namespace

void copy_now(Tiers& tiers, Place dst, Place src, std::int64_t bytes, Staging& staging, CopyOptions opts) {
  if (bytes < 0) throw std::invalid_argument("copy of a negative byte count");
  if (bytes == 0) return;
  if (src.tier != Tier::Disk && dst.tier != Tier::Disk) return copy_in_memory(tiers.backend(), dst, src, bytes);
  DiskStore& disk = tiers.disk();
  if (src.tier == Tier::Disk && host_addressable(tiers, dst.tier, opts)) return disk.wait(disk.read(src.extent, src.offset, dst.ptr, bytes));
  if (dst.tier == Tier::Disk && host_addressable(tiers, src.tier, opts)) return disk.wait(disk.write(dst.extent, dst.offset, src.ptr, bytes));
  copy_staged(tiers, dst, src, bytes, staging);
}

void copy_pieces_now(Tiers& tiers, const std::vector<CopyPiece>& pieces, Staging& staging, CopyOptions opts) {
  // Direct disk transfers are issued first and waited last; the rest run in turn meanwhile.
  std::vector<Ticket> pending;
  std::exception_ptr error;
  try {
    for (const auto& p : pieces) {
      if (p.bytes == 0 || !direct_disk(tiers, p, opts)) continue;
      if (p.src.tier == Tier::Disk)
        pending.push_back(tiers.disk().read(p.src.extent, p.src.offset, p.dst.ptr, p.bytes));
      else
        pending.push_back(tiers.disk().write(p.dst.extent, p.dst.offset, p.src.ptr, p.bytes));
    }
    for (const auto& p : pieces)
      if (!direct_disk(tiers, p, opts)) copy_now(tiers, p.dst, p.src, p.bytes, staging, opts);
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
      try {
        job.fn(l.staging);
      } catch (...) {
        error = std::current_exception();
      }
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
  {
    std::lock_guard lock(l.mu);
    l.queue.push_back({std::move(fn), state, std::move(label), bytes});
  }
  l.cv.notify_one();
  return CopyTicket(state);
}

CopyTicket CopyEngine::copy(int lane, std::vector<CopyPiece> pieces, CopyLabel label) {
  std::int64_t total = 0;
  for (const auto& p : pieces) total += p.bytes;
  return submit(
      lane, [this, pieces = std::move(pieces)](Staging& staging) { copy_pieces_now(tiers_, pieces, staging, opts_); },
      std::move(label), total);
}

CopyTicket CopyEngine::copy(int lane, Place dst, Place src, std::int64_t bytes, CopyLabel label) {
  return copy(lane, std::vector<CopyPiece>{{dst, src, bytes}}, std::move(label));
}

}  // namespace flexh2o::offload
