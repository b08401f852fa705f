// Group-wise Q4/Q8 rows on the GPU (format: kernels/quantize.h), bit for bit as
// kernels/quantize.cc: dequantize element-wise, quantize one block per (row, group).
#include <stdexcept>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_common.cuh"

namespace flexh2o::kernels::cuda {

namespace {

void require_quantized(DType t, const char* op) {
  if (!is_quantized(t)) throw std::invalid_argument(std::string(op) + ": dtype must be q4 or q8");
}

__global__ void dequantize_f32_kernel(const std::uint8_t* in, std::int64_t rbytes, bool q4, float* out,
                                      std::int64_t rows, std::int64_t n) {
  const std::int64_t total = rows * n;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = e / n, i = e % n;
    out[e] = dequant_at(in + r * rbytes, n, q4, i);
  }
}

// Block (kQuantThreads threads) per (row, group).
__global__ void quantize_kernel(const float* x, std::uint8_t* out, std::int64_t rbytes, bool q4, std::int64_t rows,
                                std::int64_t n) {
  __shared__ float xs[kQuantGroupSize];
  __shared__ int qs[kQuantGroupSize];
  __shared__ float params[2];
  const std::int64_t groups = (n + kQuantGroupSize - 1) / kQuantGroupSize;
  for (std::int64_t task = blockIdx.x; task < rows * groups; task += gridDim.x) {
    const std::int64_t r = task / groups, g = task % groups;
    quantize_group(x + r * n, n, q4, g, out + r * rbytes, xs, qs, params);
  }
}

}  // namespace

void CudaBackend::dequantize_rows(const void* in, DType t, float* x, std::int64_t rows, std::int64_t n) {
  require_quantized(t, "dequantize_rows");
  if (rows <= 0 || n <= 0) return;
  dequantize_f32_kernel<<<blocks_for(rows * n), kThreads, 0, stream_>>>(static_cast<const std::uint8_t*>(in),
                                                                          row_bytes(t, n), t == DType::Q4, x, rows, n);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

void CudaBackend::quantize_rows(const float* x, void* out, DType t, std::int64_t rows, std::int64_t n) {
  require_quantized(t, "quantize_rows");
  if (rows <= 0 || n <= 0) return;
  const std::int64_t groups = (n + kQuantGroupSize - 1) / kQuantGroupSize;
  quantize_kernel<<<blocks_for(rows * groups, 1), kQuantThreads, 0, stream_>>>(
      x, static_cast<std::uint8_t*>(out), row_bytes(t, n), t == DType::Q4, rows, n);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

}  // namespace flexh2o::kernels::cuda
