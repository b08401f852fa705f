// CudaBackend: device setup, memory, fences, copies and pinning; probe_device and make_cuda_backend.
#include <algorithm>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_entry.h"

namespace flexh2o::kernels::cuda {

namespace {

constexpr std::size_t kCopyChunk = std::size_t{64} << 20;  // large copies go in 64 MiB pieces
constexpr std::size_t kMinAlloc = 256;                      // alloc(0) still returns a pointer
constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20;  // what cuBLAS keeps on Hopper

// A do-nothing kernel: probe_device asks the runtime whether this binary has code for the GPU.
__global__ void probe_kernel() {}

std::string error_text(const std::string& what, cudaError_t e) {
  return what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

std::string cuda_version(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

std::string probe_once() {
  int driver = 0, runtime = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
  (void)cudaGetLastError();
  if (driver == 0) return "no NVIDIA driver is installed (libcuda.so.1 cannot be loaded)";
  // Minor-version compatibility runs a newer 13.x runtime on any 13.x driver; only the major must match.
  if (runtime != 0 && driver / 1000 < runtime / 1000)
    return "the NVIDIA driver supports CUDA " + cuda_version(driver) + " but this build needs CUDA " +
           cuda_version(runtime) + "; update the driver";
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return error_text("cudaGetDeviceCount", e);
  }
  if (count <= 0) return "no CUDA device found";
  // Before anything creates the device's context: host threads waiting for the GPU (copy
  // lanes, the compute thread) block instead of spinning on a core each.
  // (Where something in this process already made the context, the flags cannot change: go on.)
  e = cudaInitDevice(0, cudaDeviceScheduleBlockingSync, cudaInitDeviceFlagsAreValid);
  if (e != cudaSuccess) (void)cudaGetLastError();
  if (e != cudaSuccess && e != cudaErrorSetOnActiveProcess) return error_text("cudaInitDevice(0)", e);
  if ((e = cudaSetDevice(0)) != cudaSuccess) {
    (void)cudaGetLastError();
    return error_text("cudaSetDevice(0)", e);
  }
  int major = 0, minor = 0, pools = 0;
  if ((e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, 0)) != cudaSuccess) {
    (void)cudaGetLastError();
    return error_text("cudaDeviceGetAttribute", e);
  }
  cudaFuncAttributes attr{};
  if ((e = cudaFuncGetAttributes(&attr, probe_kernel)) != cudaSuccess) {
    (void)cudaGetLastError();
    return error_text("the GPU (compute capability " + std::to_string(major) + "." + std::to_string(minor) +
                          ") cannot run this build's kernels; rebuild with -DCMAKE_CUDA_ARCHITECTURES=" +
                          std::to_string(major) + std::to_string(minor),
                      e);
  }
  if (!pools) return "the GPU does not support stream-ordered memory pools (cudaMallocAsync)";
  return cublas_unavailable_reason();
}

}  // namespace

std::string probe_device() {
  static const std::string reason = probe_once();
  return reason;
}

std::unique_ptr<Backend> make_cuda_backend() {
  const std::string why = probe_device();
  if (!why.empty()) throw std::runtime_error("no usable CUDA device: " + why);
  return std::make_unique<CudaBackend>(0);
}

CudaBackend::CudaBackend(int device) : device_(device), blas_(&cublas()) {
  FLEXH2O_CUDA_CHECK(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  FLEXH2O_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  name_ = std::string("cuda (") + prop.name + ")";
  sm_count_ = std::max(prop.multiProcessorCount, 1);
  shared_optin_ = std::max(prop.sharedMemPerBlockOptin, prop.sharedMemPerBlock);
  max_pitch_ = prop.memPitch;
  try {
    FLEXH2O_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device_;
    FLEXH2O_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
    // Keep freed memory in the pool instead of returning it to the driver at every
    // synchronisation: steady-state steps then allocate without cudaMalloc.
    std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
    FLEXH2O_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
    FLEXH2O_CUBLAS_CHECK(blas_->create(&cublas_));
    FLEXH2O_CUBLAS_CHECK(blas_->set_stream(cublas_, stream_));
    // Plain fp32 GEMMs stay fp32 (no TF32); fp16/bf16 GemmEx calls use tensor cores anyway.
    FLEXH2O_CUBLAS_CHECK(blas_->set_math_mode(cublas_, CUBLAS_DEFAULT_MATH));
    lt_ = std::make_unique<LtGemms>(*blas_);
    // A workspace of its own (the size cuBLAS keeps on Hopper) instead of one cuBLAS allocates
    // when it first needs it: a GEMM captured in a graph (cuda_graphs.cu) then allocates nothing.
    FLEXH2O_CUDA_CHECK(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes));
    FLEXH2O_CUBLAS_CHECK(blas_->set_workspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes));
  } catch (...) {
    if (cublas_workspace_) cudaFree(cublas_workspace_);
    if (cublas_) blas_->destroy(cublas_);
    if (pool_) cudaMemPoolDestroy(pool_);
    if (stream_) cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
    throw;
  }
}

CudaBackend::~CudaBackend() {
  // Errors cannot be reported from here; a failed call only leaks.
  (void)cudaSetDevice(device_);
  (void)cudaStreamSynchronize(stream_);
  for (auto& [id, l] : lanes_) {
    (void)cudaStreamSynchronize(l.stream);
    (void)cudaEventDestroy(l.compute_done);
    (void)cudaStreamDestroy(l.stream);
  }
  for (auto& s : stages_) {
    if (s.done) (void)cudaEventDestroy(s.done);
    if (s.host) (void)cudaFreeHost(s.host);
  }
  graph_.mode = GraphMode::None;
  release_graphs();
  if (graph_.uploads_read) (void)cudaEventDestroy(graph_.uploads_read);
  if (graph_.host_uploads) (void)cudaFreeHost(graph_.host_uploads);
  if (host_logits_) (void)cudaFreeHost(host_logits_);
  if (graph_.scratch) (void)cudaFreeAsync(graph_.scratch, stream_);
  if (graph_.uploads) (void)cudaFreeAsync(graph_.uploads, stream_);
  (void)cudaStreamSynchronize(stream_);
  lt_.reset();
  (void)blas_->destroy(cublas_);
  (void)cudaFree(cublas_workspace_);
  // Memory still allocated keeps the pool alive until it is freed (cudaMemPoolDestroy).
  (void)cudaMemPoolDestroy(pool_);
  (void)cudaStreamDestroy(stream_);
  (void)cudaGetLastError();
}

// Inside an open graph step an op's allocation is the graph's (cuda_graphs.cu); one between
// ops (not an op's scratch) ends the step's capture.
void* CudaBackend::alloc(std::size_t bytes) {
  if (graph_.mode != GraphMode::None && graph_.owner == std::this_thread::get_id()) {
    if (graph_.in_op) return graph_alloc(bytes);
    graph_interrupt();
  }
  return pool_alloc(bytes);
}

void* CudaBackend::pool_alloc(std::size_t bytes) {
  bytes = std::max(bytes, kMinAlloc);
  void* p = nullptr;
  cudaError_t e = cudaMallocFromPoolAsync(&p, bytes, pool_, stream_);
  if (e == cudaErrorMemoryAllocation) {
    // Frees still pending on the stream may make room, and the pool may hold memory it does
    // not use (kept for reuse, but in pieces too small for this): wait for the frees, hand the
    // unused memory back to the driver, and try once more.
    (void)cudaGetLastError();
    FLEXH2O_CUDA_CHECK(cudaStreamSynchronize(stream_));
    FLEXH2O_CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0));
    e = cudaMallocFromPoolAsync(&p, bytes, pool_, stream_);
  }
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    std::size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
    throw CudaOutOfMemory("CUDA out of memory: allocating " + std::to_string(bytes) + " bytes on " + name_ + " (" +
                          std::to_string(free_b >> 20) + " MiB free of " + std::to_string(total_b >> 20) + " MiB)");
  }
  FLEXH2O_CUDA_CHECK(e);
  return p;
}

std::int64_t CudaBackend::memory_capacity() const {
  FLEXH2O_CUDA_CHECK(cudaSetDevice(device_));
  std::size_t free_b = 0, total_b = 0;
  FLEXH2O_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<std::int64_t>(total_b);
}

void CudaBackend::free(void* p) noexcept {
  if (p == nullptr) return;
  if (graph_.mode != GraphMode::None && graph_.owner == std::this_thread::get_id()) {
    if (graph_.mode == GraphMode::Capture && in_arena(p)) return;  // the arena is the graph's
    if (!graph_.in_op) {
      try {
        graph_interrupt();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "flexh2o: a graph step's ops failed when a free ended it: %s\n", e.what());
      }
    }
  }
  const cudaError_t e = cudaFreeAsync(p, stream_);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    std::fprintf(stderr, "flexh2o: cudaFreeAsync failed: %s\n", cudaGetErrorString(e));
  }
}

CudaBackend::CopyLane& CudaBackend::lane() {
  std::lock_guard lock(lanes_mu_);
  auto it = lanes_.find(std::this_thread::get_id());
  if (it != lanes_.end()) return it->second;
  FLEXH2O_CUDA_CHECK(cudaSetDevice(device_));
  CopyLane l;
  FLEXH2O_CUDA_CHECK(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
  if (const cudaError_t e = cudaEventCreateWithFlags(&l.compute_done, cudaEventDisableTiming); e != cudaSuccess) {
    (void)cudaStreamDestroy(l.stream);
    throw_cuda_error(e, "cudaEventCreateWithFlags(&l.compute_done, cudaEventDisableTiming)", __FILE__, __LINE__);
  }
  return lanes_.emplace(std::this_thread::get_id(), l).first->second;
}

namespace {

// A compute-stream event recorded by the thread that took the fence; destroyed with it.
class CudaFence final : public Fence {
 public:
  explicit CudaFence(cudaStream_t compute) {
    FLEXH2O_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    if (const cudaError_t e = cudaEventRecord(event_, compute); e != cudaSuccess) {
      (void)cudaEventDestroy(event_);
      throw_cuda_error(e, "cudaEventRecord(event_, compute)", __FILE__, __LINE__);
    }
  }
  ~CudaFence() override { (void)cudaEventDestroy(event_); }
  CudaFence(const CudaFence&) = delete;
  CudaFence& operator=(const CudaFence&) = delete;
  cudaEvent_t event() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace

std::shared_ptr<const Fence> CudaBackend::fence() {
  graph_interrupt();
  FLEXH2O_CUDA_CHECK(cudaSetDevice(device_));
  return std::make_shared<CudaFence>(stream_);
}

void CudaBackend::copy_regions(CopyDirection dir, std::span<const CopyRegion> regions, const Fence* after) {
  if (regions.empty()) return;
  graph_interrupt();  // the copy waits for the step's ops so far: they run first
  CopyLane& l = lane();  // map nodes are stable, and only this thread uses its lane
  if (after != nullptr) {
    const auto* f = dynamic_cast<const CudaFence*>(after);
    if (f == nullptr) throw std::invalid_argument("copy_regions: the fence is not from this CUDA backend");
    FLEXH2O_CUDA_CHECK(cudaStreamWaitEvent(l.stream, f->event(), 0));
  } else {
    FLEXH2O_CUDA_CHECK(cudaEventRecord(l.compute_done, stream_));
    FLEXH2O_CUDA_CHECK(cudaStreamWaitEvent(l.stream, l.compute_done, 0));
  }
  const cudaMemcpyKind kind = dir == CopyDirection::ToDevice ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  auto linear = [&](void* dst, const void* src, std::size_t bytes) {
    const auto* s = static_cast<const std::byte*>(src);
    auto* d = static_cast<std::byte*>(dst);
    for (std::size_t off = 0; off < bytes; off += kCopyChunk)
      FLEXH2O_CUDA_CHECK(cudaMemcpyAsync(d + off, s + off, std::min(kCopyChunk, bytes - off), kind, l.stream));
  };
  for (const CopyRegion& r : regions) {
    if (r.width == 0 || r.rows == 0) continue;
    if (r.rows == 1 || (r.dst_pitch == r.width && r.src_pitch == r.width)) {
      linear(r.dst, r.src, r.width * r.rows);
    } else if (r.dst_pitch <= max_pitch_ && r.src_pitch <= max_pitch_) {
      // One strided copy for all rows (a KV row's heads), however many.
      FLEXH2O_CUDA_CHECK(cudaMemcpy2DAsync(r.dst, r.dst_pitch, r.src, r.src_pitch, r.width, r.rows, kind, l.stream));
    } else {
      for (std::size_t i = 0; i < r.rows; ++i)
        linear(static_cast<std::byte*>(r.dst) + i * r.dst_pitch, static_cast<const std::byte*>(r.src) + i * r.src_pitch,
               r.width);
    }
  }
  FLEXH2O_CUDA_CHECK(cudaStreamSynchronize(l.stream));  // one wait for the whole batch
}

void CudaBackend::copy_to_device(void* dst, const void* host_src, std::size_t bytes) {
  const CopyRegion r{dst, host_src, bytes};
  copy_regions(CopyDirection::ToDevice, std::span<const CopyRegion>(&r, 1), nullptr);
}

void CudaBackend::copy_to_host(void* host_dst, const void* src, std::size_t bytes) {
  const CopyRegion r{host_dst, src, bytes};
  copy_regions(CopyDirection::ToHost, std::span<const CopyRegion>(&r, 1), nullptr);
}

void CudaBackend::allow_shared(const void* kernel, std::size_t bytes, const char* op) {
  if (bytes > shared_optin_)
    throw std::invalid_argument(std::string(op) + ": head_dim too large for the CUDA kernel's shared memory (" +
                                std::to_string(bytes) + " bytes needed, " + std::to_string(shared_optin_) +
                                " available per block)");
  if (bytes > 48 * 1024)
    FLEXH2O_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// Device-to-device copies are queued on the compute stream, ordered with the ops like one: no
// host wait (the engine copies per sequence inside a step). Host copies queued later wait for
// them like for any op: through their fence, or the compute-stream event a copy without one takes.
void CudaBackend::copy_on_device(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src) return;
  const CopyCall call{dst, src, bytes};
  if (graph_active() &&
      graph_op(signature(call), call, [this](const CopyCall& c) { copy_on_device(c.dst, c.src, c.bytes); }))
    return;
  const auto d = reinterpret_cast<std::uintptr_t>(dst), s = reinterpret_cast<std::uintptr_t>(src);
  const bool overlap = d < s + bytes && s < d + bytes;
  if (!overlap) {
    FLEXH2O_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  // memmove semantics (as the CPU backend): overlapping ranges go through a temporary.
  DeviceBuffer tmp(*this, bytes);
  FLEXH2O_CUDA_CHECK(cudaMemcpyAsync(tmp.data(), src, bytes, cudaMemcpyDeviceToDevice, stream_));
  FLEXH2O_CUDA_CHECK(cudaMemcpyAsync(dst, tmp.data(), bytes, cudaMemcpyDeviceToDevice, stream_));
}

void* CudaBackend::stage_for_upload(const void* host, std::size_t bytes) {
  Stage& s = stages_[next_stage_++ % stages_.size()];
  if (s.done) FLEXH2O_CUDA_CHECK(cudaEventSynchronize(s.done));  // its previous upload has been read
  else FLEXH2O_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  if (s.capacity < bytes) {
    if (s.host) FLEXH2O_CUDA_CHECK(cudaFreeHost(s.host));
    s.host = nullptr;
    s.capacity = 0;
    FLEXH2O_CUDA_CHECK(cudaMallocHost(&s.host, bytes));
    s.capacity = bytes;
  }
  std::memcpy(s.host, host, bytes);
  return s.host;
}

void CudaBackend::staged_upload_queued() {
  Stage& s = stages_[(next_stage_ - 1) % stages_.size()];
  FLEXH2O_CUDA_CHECK(cudaEventRecord(s.done, stream_));
}

void CudaBackend::synchronize() {
  graph_interrupt();
  FLEXH2O_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

bool CudaBackend::pin_host(void* p, std::size_t bytes) {
  if (p == nullptr || bytes == 0) return false;
  graph_interrupt();
  const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
  if (e == cudaSuccess) return true;
  // Pinning is an optimisation: without it copies still work, only slower.
  (void)cudaGetLastError();
  std::call_once(pin_warning_, [&] {
    std::fprintf(stderr, "flexh2o: cannot pin %zu bytes of host memory (%s); copies use pageable memory\n", bytes,
                 cudaGetErrorString(e));
  });
  return false;
}

void CudaBackend::unpin_host(void* p) noexcept {
  if (p == nullptr) return;
  if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace flexh2o::kernels::cuda
