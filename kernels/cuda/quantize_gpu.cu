// Group-wise quantized rows (Q4/Q8 and their 32-value-group forms) on the GPU (format:
// kernels/quantize.h), bit for bit as kernels/quantize.cc: dequantize element-wise, quantize
// one block per (row, group).
#include <stdexcept>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/quantize.h"

namespace flexh2o::kernels::cuda {

namespace {

void require_quantized(DType t, const char* op) {
  if (!is_quantized(t)) throw std::invalid_argument(std::string(op) + ": dtype must be a quantized one");
}

bool is_q4(DType t) { return quant_bits(t) == 4; }
int group_of(DType t) { return static_cast<int>(quant_group_size(t)); }

__global__ void dequantize_f32_kernel(const std::uint8_t* in, std::int64_t rbytes, bool q4, int group, float* out,
                                      std::int64_t rows, std::int64_t n) {
  const std::int64_t total = rows * n;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = e / n, i = e % n;
    out[e] = dequant_at(in + r * rbytes, n, q4, group, i);
  }
}

// Block (kQuantThreads threads) per (row, group).
__global__ void quantize_kernel(const float* x, std::uint8_t* out, std::int64_t rbytes, bool q4, int group,
                                std::int64_t rows, std::int64_t n) {
  __shared__ float xs[kQuantGroupSize];
  __shared__ int qs[kQuantGroupSize];
  __shared__ float params[2];
  const std::int64_t groups = (n + group - 1) / group;
  for (std::int64_t task = blockIdx.x; task < rows * groups; task += gridDim.x) {
    const std::int64_t r = task / groups, g = task % groups;
    quantize_group(x + r * n, n, q4, g, out + r * rbytes, xs, qs, params, group);
  }
}

}  // namespace

void CudaBackend::dequantize_rows(const void* in, DType t, float* x, std::int64_t rows, std::int64_t n) {
  graph_interrupt();
  require_quantized(t, "dequantize_rows");
  if (rows <= 0 || n <= 0) return;
  dequantize_f32_kernel<<<blocks_for(rows * n), kThreads, 0, stream_>>>(
      static_cast<const std::uint8_t*>(in), row_bytes(t, n), is_q4(t), group_of(t), x, rows, n);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

void CudaBackend::quantize_rows(const float* x, void* out, DType t, std::int64_t rows, std::int64_t n) {
  graph_interrupt();
  require_quantized(t, "quantize_rows");
  if (rows <= 0 || n <= 0) return;
  const std::int64_t groups = quant_groups(t, n);
  quantize_kernel<<<blocks_for(rows * groups, 1), kQuantThreads, 0, stream_>>>(
      x, static_cast<std::uint8_t*>(out), row_bytes(t, n), is_q4(t), group_of(t), rows, n);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

}  // namespace flexh2o::kernels::cuda
