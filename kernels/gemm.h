// Matrix multiply of activations by a weight matrix (the Linear layer).
#pragma once
#include <cstdint>

#include "kernels/dtype.h"

namespace flexh2o::kernels {

// A row-major matrix [rows, cols] in device memory, in any storage dtype.
struct MatrixRef {
  const void* data = nullptr;
  DType dtype = DType::F32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
};

// y[m, n] = x[m, k] @ w[n, k]^T + bias[n] + beta * y   (PyTorch Linear layout). `compute`
// F32 multiplies in fp32; BF16 rounds x and w to bf16 and accumulates their (exact) products in
// fp32, as bf16 matrix units do; F16 (f16 weights only) rounds x to fp16 likewise (beyond
// 65504: inf), for an f16 matrix a backend would otherwise convert at every call under bf16
// compute (a head tied to the f16 token table: Backend::gemm_weight_dtype).
struct GemmArgs {
  const float* x = nullptr;
  std::int64_t m = 0;
  MatrixRef w;                  // n = w.rows, k = w.cols
  const float* bias = nullptr;  // optional, [n]
  float* y = nullptr;
  float beta = 0.0f;  // 1 adds the product into y (residual connections); with 0, y is not read
  DType compute = DType::F32;
  // Instead of x, under bf16 compute: x already rounded to bf16 (the rounding the GEMM would
  // do, done by the op that wrote it), row i at x_bf16 + i * x_stride (0: k). The same result
  // as the fp32 x, except on the CPU's int8 path for q4/q8 weights, which quantizes x itself.
  const std::uint16_t* x_bf16 = nullptr;
  std::int64_t x_stride = 0;
};

}  // namespace flexh2o::kernels
