// Activations and element-wise arithmetic, with the formulas of elementwise_cpu.cc.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_common.cuh"

namespace flexh2o::kernels::cuda {

namespace {

__global__ void relu_kernel(float* x, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ void gelu_kernel(float* x, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void add_kernel(float* x, const float* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

}  // namespace

void CudaBackend::activation(Activation act, float* x, std::int64_t n) {
  if (n <= 0) return;
  switch (act) {
    case Activation::Relu:
      relu_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(x, n);
      break;
    case Activation::Gelu:
      gelu_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(x, n);
      break;
  }
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

void CudaBackend::silu_mul(const float* gate, const float* up, float* out, std::int64_t n) {
  if (n <= 0) return;
  silu_mul_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(gate, up, out, n);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

void CudaBackend::add(float* x, const float* y, std::int64_t n) {
  if (n <= 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(x, y, n);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

}  // namespace flexh2o::kernels::cuda
