// GEMMs with the bias added in cuBLASLt's epilogue (CUBLASLT_EPILOGUE_BIAS): y = x w^T + beta y
// + bias in one kernel, instead of a cuBLAS GEMM followed by a pass of its own over y. In
// cuBLAS's column-major terms (as gemm_gpu.cu): D = y^T (n x m, ld ldy) = op_T(w as k x n, ld k)
// * x^T (k x m, ld k) + beta C (C = D) + bias[n], broadcast over D's columns; fp32 accumulation
// (CUBLAS_COMPUTE_32F: no TF32), fp32 output and bias.
//
// cuBLASLt needs a descriptor per shape and an algorithm from its heuristic, which costs host
// time: both are kept per shape, input dtype and pointer alignment, so the repeated shapes of a
// decode loop query once. Where cuBLASLt has no algorithm for a shape, or the shape is one it
// handles poorly (a dimension of 1, beyond 65535 * 32), run() says so and the caller runs the
// GEMM and the bias on its own.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "kernels/cuda/cublas_api.h"
#include "kernels/cuda/gemm_plan.h"
#include "kernels/dtype.h"

namespace flexh2o::kernels::cuda {

struct LtBiasGemm {
  DType inputs = DType::BF16;  // of w and x: BF16, F16 or F32
  std::int64_t m = 0, n = 0, k = 0, ldx = 0, ldy = 0;
  const void* w = nullptr;  // n rows of k
  const void* x = nullptr;  // m rows of k, row stride ldx
  float* y = nullptr;       // m rows of n, row stride ldy
  const float* bias = nullptr;
  float beta = 0.0f;  // 0: y is not read
};

class LtGemms {
 public:
  explicit LtGemms(const CublasApi& api);
  ~LtGemms();
  LtGemms(const LtGemms&) = delete;
  LtGemms& operator=(const LtGemms&) = delete;

  // Enqueues `g` on `stream` with `workspace` (kGemmLtWorkspaceBytes); false, with nothing
  // enqueued, where cuBLASLt does not take it. Not thread-safe: the caller serialises.
  bool run(const LtBiasGemm& g, void* workspace, cudaStream_t stream);

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t w = nullptr, x = nullptr, y = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool usable = false;
  };
  // inputs, m, n, k, ldx, ldy and the alignments of w, x and y.
  using Key = std::tuple<DType, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::uint32_t,
                         std::uint32_t, std::uint32_t>;
  Plan make_plan(const Key& key);
  void destroy(Plan& p) noexcept;

  const CublasApi& api_;
  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, Plan> plans_;
};

}  // namespace flexh2o::kernels::cuda
