// Activations and element-wise arithmetic, with the formulas of elementwise_cpu.cc.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_common.cuh"

namespace flexh2o::kernels::cuda {

namespace {

// One activation of x, as elementwise_cpu.cc computes it.
__device__ float activate(Activation act, float x) {
  switch (act) {
    case Activation::Relu: return x > 0.0f ? x : 0.0f;
    case Activation::Gelu: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case Activation::GeluTanh: return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case Activation::Silu: return x / (1.0f + expf(-x));
  }
  return x;
}

__global__ void activation_kernel(Activation act, float* x, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    x[i] = activate(act, x[i]);
}

__global__ void glu_kernel(Activation act, const float* gate, const float* up, float* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[i] = activate(act, gate[i]) * up[i];
}

__global__ void softcap_kernel(float* x, std::int64_t n, float cap) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    x[i] = cap * tanhf(x[i] / cap);
}

__global__ void add_kernel(float* x, const float* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

}  // namespace

void CudaBackend::do_activation(Activation act, float* x, std::int64_t n) {
  if (n <= 0) return;
  activation_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(act, x, n);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

void CudaBackend::do_glu(Activation act, const float* gate, const float* up, float* out, std::int64_t n) {
  if (n <= 0) return;
  glu_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(act, gate, up, out, n);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

void CudaBackend::do_softcap(float* x, std::int64_t n, float cap) {
  if (n <= 0) return;
  softcap_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(x, n, cap);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

void CudaBackend::do_add(float* x, const float* y, std::int64_t n) {
  if (n <= 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(x, y, n);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

}  // namespace flexh2o::kernels::cuda
