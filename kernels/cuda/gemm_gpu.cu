// GEMM on the GPU with cuBLAS. Row-major y[m, n] = x[m, k] @ w[n, k]^T is, in cuBLAS's
// column-major terms, y^T (n x m, ld n) = op_T(w as k x n, ld k) * x^T (k x m, ld k).
//   f32 weights:  cublasSgemm (default math mode: fp32, no TF32).
//   f16/bf16:     x converted to the weight's type in scratch, cublasGemmEx with fp32
//                 compute and fp32 output.
//   q4/q8:        weight rows dequantized to fp16 scratch a panel at a time, then as f16.
// Bias and beta follow gemm_cpu.cc: y = x w^T + beta * y (y not read when beta == 0), then
// y += bias.
#include <algorithm>
#include <climits>
#include <mutex>
#include <stdexcept>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_common.cuh"

namespace flexh2o::kernels::cuda {

namespace {

constexpr std::int64_t kPanelBytes = std::int64_t{64} << 20;  // dequantized fp16 weight rows per cuBLAS call

__global__ void to_f16_kernel(const float* x, __half* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2half_rn(x[i]);
}

__global__ void to_bf16_kernel(const float* x, __nv_bfloat16* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(x[i]);
}

// y[i, j] += bias[j] over an m x n row-major matrix.
__global__ void add_bias_kernel(float* y, const float* bias, std::int64_t m, std::int64_t n) {
  const std::int64_t total = m * n;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[e] += bias[e % n];
}

// k == 0: the product is empty, y = beta * y (0 when beta == 0, y not read).
__global__ void scale_kernel(float* y, float beta, std::int64_t total) {
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[e] = beta == 0.0f ? 0.0f : beta * y[e];
}

}  // namespace

void CudaBackend::gemm(const GemmArgs& a) {
  const std::int64_t m = a.m, n = a.w.rows, k = a.w.cols;
  if (m < 0 || n < 0 || k < 0) throw std::invalid_argument("gemm: negative dimension");
  if (m == 0 || n == 0) return;
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX)
    throw std::invalid_argument("gemm: a dimension exceeds 2^31 - 1 (cuBLAS's int sizes)");
  const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  const float one = 1.0f, beta = a.beta;

  if (k == 0) {
    scale_kernel<<<blocks_for(m * n), kThreads, 0, stream_>>>(a.y, beta, m * n);
    FLEXH2O_CUDA_CHECK_LAUNCH();
  } else if (a.w.dtype == DType::F32) {
    std::lock_guard lock(cublas_mu_);
    FLEXH2O_CUBLAS_CHECK(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one,
                                     static_cast<const float*>(a.w.data), K, a.x, K, &beta, a.y, N));
  } else {
    // Activations in the weight's 16-bit type (fp16 for the quantized types).
    const bool bf16 = a.w.dtype == DType::BF16;
    const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    DeviceBuffer x16(*this, static_cast<std::size_t>(m * k) * 2);
    if (bf16) {
      to_bf16_kernel<<<blocks_for(m * k), kThreads, 0, stream_>>>(a.x, x16.as<__nv_bfloat16>(), m * k);
    } else {
      to_f16_kernel<<<blocks_for(m * k), kThreads, 0, stream_>>>(a.x, x16.as<__half>(), m * k);
    }
    FLEXH2O_CUDA_CHECK_LAUNCH();
    if (!is_quantized(a.w.dtype)) {
      std::lock_guard lock(cublas_mu_);
      FLEXH2O_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, a.w.data, type, K,
                                        x16.data(), type, K, &beta, a.y, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
    } else {
      // Output columns [n0, n0 + rows) of y come from weight rows [n0, n0 + rows).
      const std::int64_t panel = std::clamp<std::int64_t>(kPanelBytes / (2 * k), 1, n);
      const std::int64_t wrow = row_bytes(a.w.dtype, k);
      DeviceBuffer w16(*this, static_cast<std::size_t>(panel * k) * 2);
      for (std::int64_t n0 = 0; n0 < n; n0 += panel) {
        const std::int64_t rows = std::min(panel, n - n0);
        launch_dequantize_rows_f16(static_cast<const std::uint8_t*>(a.w.data) + n0 * wrow, a.w.dtype,
                                   w16.as<__half>(), rows, k, stream_);
        std::lock_guard lock(cublas_mu_);
        FLEXH2O_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), M, K, &one,
                                          w16.data(), CUDA_R_16F, K, x16.data(), CUDA_R_16F, K, &beta, a.y + n0,
                                          CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
    }
  }
  if (a.bias) {
    add_bias_kernel<<<blocks_for(m * n), kThreads, 0, stream_>>>(a.y, a.bias, m, n);
    FLEXH2O_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace flexh2o::kernels::cuda
