// LayerNorm and RMSNorm: one block per row, sums in double as norm_cpu.cc does, then the
// same fp32 formula per element. y may equal x: every thread reads its elements for the
// reductions before any thread writes (block_sum synchronises).
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_common.cuh"

namespace flexh2o::kernels::cuda {

namespace {

__global__ void layer_norm_kernel(const float* x, float* y, std::int64_t rows, std::int64_t cols, const float* weight,
                                  const float* bias, float eps, float offset) {
  __shared__ double scratch[32];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    double sum = 0.0;
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += xr[c];
    sum = block_sum(sum, scratch);
    const float mean = static_cast<float>(sum / static_cast<double>(cols));
    double var = 0.0;
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float d = xr[c] - mean;
      var += static_cast<double>(d) * d;
    }
    var = block_sum(var, scratch);
    const float inv = 1.0f / sqrtf(static_cast<float>(var / static_cast<double>(cols)) + eps);
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float v = (xr[c] - mean) * inv * (weight[c] + offset);
      yr[c] = bias ? v + bias[c] : v;
    }
  }
}

__global__ void rms_norm_kernel(const float* x, float* y, std::int64_t rows, std::int64_t cols, const float* weight,
                                float eps, float offset) {
  __shared__ double scratch[32];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    double ss = 0.0;
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) ss += static_cast<double>(xr[c]) * xr[c];
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(static_cast<float>(ss / static_cast<double>(cols)) + eps);
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = xr[c] * inv * (weight[c] + offset);
  }
}

}  // namespace

void CudaBackend::do_layer_norm(const NormArgs& a) {
  if (a.rows <= 0 || a.cols <= 0) return;
  layer_norm_kernel<<<blocks_for(a.rows, 1), kThreads, 0, stream_>>>(a.x, a.y, a.rows, a.cols, a.weight, a.bias,
                                                                      a.eps, a.weight_offset);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

void CudaBackend::do_rms_norm(const NormArgs& a) {
  if (a.rows <= 0 || a.cols <= 0) return;
  rms_norm_kernel<<<blocks_for(a.rows, 1), kThreads, 0, stream_>>>(a.x, a.y, a.rows, a.cols, a.weight, a.eps,
                                                                    a.weight_offset);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

}  // namespace flexh2o::kernels::cuda
