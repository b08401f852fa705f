// How the CUDA backend's gemm (gemm_gpu.cu) runs a product, decided on the host: the dtype cuBLAS
// multiplies, the panels converted before it does, and the device scratch that takes (which
// callers' budgets count through Backend::gemm_scratch_bytes). Host code only, so the CPU build
// tests it.
#pragma once
#include <cstdint>

#include "kernels/dtype.h"

namespace flexh2o::kernels::cuda {

// Device workspace a biased GEMM may use (the most cuBLASLt's algorithms are offered; 32 MiB is
// what cuBLAS itself keeps on Hopper).
constexpr std::int64_t kGemmLtWorkspaceBytes = std::int64_t{32} << 20;
constexpr std::int64_t kGemmXPanelBytes = std::int64_t{32} << 20;  // converted x per cuBLAS call, at most
constexpr std::int64_t kGemmWPanelBytes = std::int64_t{64} << 20;  // converted weight per cuBLAS call, at most

// y[m, n] = x[m, k] @ w[n, k]^T for a weight dtype and a compute dtype: cuBLAS multiplies
// `inputs`, the compute dtype (F32: cublasSgemm; BF16/F16: GemmEx with fp32 accumulation); x is
// converted to them x_rows rows at a time where it is not in them already; a weight not stored
// as `inputs` is converted (dequantized) w_rows rows at a time (0: read in place); with a bias,
// cuBLASLt's workspace (gemm_lt.h) too.
struct GemmPlan {
  DType inputs = DType::F32;
  std::int64_t x_rows = 0, w_rows = 0;
  std::int64_t workspace_bytes = 0;
  std::int64_t scratch_bytes = 0;
};
GemmPlan plan_gemm(std::int64_t m, std::int64_t k, std::int64_t n, DType w, DType compute);

}  // namespace flexh2o::kernels::cuda
