// CUDA implementation of Backend: cuBLAS for GEMM, own kernels for everything else.
// Each op family lives in its own *_gpu.cu next to this header; the CPU backend
// (kernels/cpu) is the reference whose semantics every op follows.
//
// Streams: all ops run in order on one compute stream, asynchronously to the host. Copies
// are synchronous calls made from several host threads (the offload copy lanes): each
// calling thread gets its own non-blocking stream, which first waits for everything
// issued to the compute stream before the call, so a copy sees the results of all ops
// launched before it, and an op launched after a copy returned sees the copied data.
//
// Memory: alloc/free and per-op scratch come from a stream-ordered memory pool on the
// compute stream that keeps freed memory (release threshold: unlimited), so the decode
// loop does not call cudaMalloc. Small host index arrays (positions, ids, lens, slots) are
// uploaded into pool scratch with cudaMemcpyAsync on the compute stream.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <thread>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_check.h"

namespace flexh2o::kernels::cuda {

// Thrown by CudaBackend::alloc when the device is out of memory.
class CudaOutOfMemory : public std::bad_alloc {
 public:
  explicit CudaOutOfMemory(std::string what) : what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  DeviceKind kind() const override { return DeviceKind::Cuda; }
  std::string name() const override { return name_; }
  std::int64_t memory_capacity() const override;

  void* alloc(std::size_t bytes) override;
  void free(void* p) noexcept override;
  void copy_to_device(void* dst, const void* host_src, std::size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override;
  void copy_on_device(void* dst, const void* src, std::size_t bytes) override;
  void synchronize() override;
  bool native_bf16() const override { return true; }  // tensor cores (sm_80+)
  bool pin_host(void* p, std::size_t bytes) override;
  void unpin_host(void* p) noexcept override;

  void gemm(const GemmArgs& a) override;
  void layer_norm(const NormArgs& a) override;
  void rms_norm(const NormArgs& a) override;
  void rope(const RopeArgs& a) override;
  void activation(Activation act, float* x, std::int64_t n) override;
  void glu(Activation act, const float* gate, const float* up, float* out, std::int64_t n) override;
  void softcap(float* x, std::int64_t n, float cap) override;
  void add(float* x, const float* y, std::int64_t n) override;
  void embedding(const EmbeddingArgs& a) override;
  void attention_prefill(const AttentionPrefillArgs& a) override;
  void attention_decode(const AttentionDecodeArgs& a) override;
  void kv_write(const KvWriteArgs& a) override;
  void kv_move(const KvMoveArgs& a) override;
  // Copies the logits to the host and runs CpuBackend::sample on them: sampling is a small
  // part of a step, and this keeps every backend's draws identical bit for bit.
  void sample(const SampleArgs& a) override;
  void route(const RouteArgs& a) override;
  void moe_experts(const MoeArgs& a) override;

  // Group-wise quantization of `rows` rows of n fp32 values (device memory) into Q4/Q8
  // rows of row_bytes(t, n) bytes, and back; bit for bit what kernels/quantize.cc does.
  void quantize_rows(const float* x, void* out, DType t, std::int64_t rows, std::int64_t n);
  void dequantize_rows(const void* in, DType t, float* x, std::int64_t rows, std::int64_t n);

  cudaStream_t stream() const { return stream_; }

 private:
  struct CopyLane {
    cudaStream_t stream = nullptr;
    cudaEvent_t compute_done = nullptr;  // recorded on the compute stream at each copy
  };
  CopyLane& lane();
  void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind);
  // Pool scratch holding a copy of a host array (enqueued on the compute stream).
  template <class T>
  DeviceBuffer upload(std::span<const T> host);
  // Small host arrays (positions, slots, lens) go to the device through pinned staging
  // buffers, so the caller may reuse its array as soon as the op returns: a copy from
  // pageable memory is not guaranteed to have read it by then. Callers hold stage_mu_.
  struct Stage {
    void* host = nullptr;
    std::size_t capacity = 0;
    cudaEvent_t done = nullptr;  // recorded after the upload that read it
  };
  void* stage_for_upload(const void* host, std::size_t bytes);
  void staged_upload_queued();
  std::array<Stage, 16> stages_{};
  std::size_t next_stage_ = 0;
  std::mutex stage_mu_;

  int device_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::mutex cublas_mu_;  // a cuBLAS handle must not be used by two threads at once
  std::mutex lanes_mu_;
  std::map<std::thread::id, CopyLane> lanes_;
  std::once_flag pin_warning_;
  CpuBackend cpu_;  // for sample
};

template <class T>
DeviceBuffer CudaBackend::upload(std::span<const T> host) {
  DeviceBuffer buf(*this, host.size_bytes());
  if (host.empty()) return buf;
  std::lock_guard lock(stage_mu_);
  const void* staged = stage_for_upload(host.data(), host.size_bytes());
  FLEXH2O_CUDA_CHECK(cudaMemcpyAsync(buf.data(), staged, host.size_bytes(), cudaMemcpyHostToDevice, stream_));
  staged_upload_queued();
  return buf;
}

}  // namespace flexh2o::kernels::cuda
