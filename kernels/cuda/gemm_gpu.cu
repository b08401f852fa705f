// GEMM on the GPU with cuBLAS. Row-major y[m, n] = x[m, k] @ w[n, k]^T is, in cuBLAS's
// column-major terms, y^T (n x m, ld n) = op_T(w as k x n, ld k) * x^T (k x m, ld k).
// The compute dtype (GemmArgs::compute) decides the arithmetic, as in gemm_cpu.cc:
//   f32:   fp32 throughout, cublasSgemm (default math mode, no TF32); f16/bf16/q4/q8 weights
//          are converted (dequantized) to fp32 a panel of rows at a time. Activations are
//          never rounded: no inf beyond fp16's 65504, quantized weights multiply fp32.
//   bf16:  x rounded to bf16 (a panel of rows at a time) and the weight too; cublasGemmEx with
//          bf16 inputs and fp32 accumulation and output, as bf16 matrix units do. bf16 weights
//          are read in place: the engine holds f16 matrices as bf16 under bf16 compute
//          (CudaBackend::gemm_weight_dtype), rounded once at load; q4/q8 codes are converted a
//          panel at a time. x is rounded in a pass of its own unless the op before wrote it
//          in bf16 (GemmArgs::x_bf16, read in place at its row stride): cuBLAS multiplies bf16
//          only by bf16.
//   f16:   f16 weights (a tied head under bf16 compute) read in place, x rounded to f16.
// The panels bound the device scratch (plan_gemm), which the caller's budget counts.
// Bias and beta follow gemm_cpu.cc: y = x w^T + beta * y (y not read when beta == 0), then
// y += bias; the bias is added in cuBLASLt's epilogue where it takes the shape (gemm_lt.h),
// else by a pass over y.
#include <algorithm>
#include <climits>
#include <functional>
#include <string>
#include <mutex>
#include <stdexcept>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_common.cuh"

namespace flexh2o::kernels::cuda {

namespace {

// rows x n values of a matrix stored as `t` (row stride rbytes) -> `to` (F32, BF16 or F16),
// rounded as kernels::f32_to_bf16 / f32_to_f16 do.
__global__ void convert_kernel(const std::uint8_t* in, DType t, std::int64_t rbytes, std::int64_t rows,
                               std::int64_t n, void* out, DType to) {
  const std::int64_t total = rows * n;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const QuotRem rc = div_rem(e, n);
    const float v = load_elem(in + rc.quot * rbytes, t, n, rc.rem);
    if (to == DType::BF16)
      static_cast<std::uint16_t*>(out)[e] = f32_to_bf16_bits(v);
    else if (to == DType::F16)
      static_cast<std::uint16_t*>(out)[e] = f32_to_f16_bits(v);
    else
      static_cast<float*>(out)[e] = v;
  }
}

// y[i, j] += bias[j] over m rows of n (row stride ldy).
__global__ void add_bias_kernel(float* y, std::int64_t ldy, const float* bias, std::int64_t m, std::int64_t n) {
  const std::int64_t total = m * n;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const QuotRem rc = div_rem(e, n);
    y[rc.quot * ldy + rc.rem] += bias[rc.rem];
  }
}

// k == 0: the product is empty, y = beta * y (0 when beta == 0, y not read).
__global__ void scale_kernel(float* y, float beta, std::int64_t total) {
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[e] = beta == 0.0f ? 0.0f : beta * y[e];
}

// `rows` rows of n values stored as `t` at row stride rbytes -> `to`, packed.
void convert(const void* in, DType t, std::int64_t rbytes, std::int64_t rows, std::int64_t n, void* out, DType to,
             cudaStream_t stream) {
  convert_kernel<<<blocks_for(rows * n), kThreads, 0, stream>>>(static_cast<const std::uint8_t*>(in), t, rbytes,
                                                                rows, n, out, to);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

cudaDataType_t cuda_type(DType t) { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F; }

}  // namespace

// One cuBLAS call: rows [m0, m0 + mr) of y from x (as the plan's inputs), columns [n0, n0 + nr)
// from w (likewise), the bias of those columns (if any) in the epilogue or by a pass after.
void CudaBackend::gemm_panel(const GemmArgs& a, const GemmPlan& plan, const GemmPanel& p) {
  const std::int64_t n = a.w.rows, k = a.w.cols;
  const float one = 1.0f, beta = a.beta;
  float* y = a.y + p.m0 * n + p.n0;
  const float* bias = a.bias ? a.bias + p.n0 : nullptr;
  std::lock_guard lock(cublas_mu_);
  if (bias && lt_->run({plan.inputs, p.mr, p.nr, k, p.ldx, n, p.w, p.x, y, bias, beta}, p.workspace, stream_)) return;
  const int N = static_cast<int>(n), K = static_cast<int>(k), nr = static_cast<int>(p.nr), mr = static_cast<int>(p.mr);
  const int ldx = static_cast<int>(p.ldx);
  if (plan.inputs != DType::F32)
    FLEXH2O_CUBLAS_CHECK(blas_->gemm_ex(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, nr, mr, K, &one, p.w, cuda_type(plan.inputs),
                                        K, p.x, cuda_type(plan.inputs), ldx, &beta, y, CUDA_R_32F, N,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  else
    FLEXH2O_CUBLAS_CHECK(blas_->sgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, nr, mr, K, &one, static_cast<const float*>(p.w),
                                      K, static_cast<const float*>(p.x), ldx, &beta, y, N));
  if (bias) {
    add_bias_kernel<<<blocks_for(p.mr * p.nr), kThreads, 0, stream_>>>(y, n, bias, p.mr, p.nr);
    FLEXH2O_CUDA_CHECK_LAUNCH();
  }
}

void CudaBackend::do_gemm(const GemmArgs& a) {
  if (graph_active() && graph_op(signature(a), a, [this](const GemmArgs& g) { do_gemm(g); })) return;
  const std::int64_t m = a.m, n = a.w.rows, k = a.w.cols;
  if (m == 0 || n == 0) return;
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX || a.x_stride > INT_MAX)
    throw std::invalid_argument("gemm: a dimension exceeds 2^31 - 1 (cuBLAS's int sizes)");
  if (k == 0) {
    scale_kernel<<<blocks_for(m * n), kThreads, 0, stream_>>>(a.y, a.beta, m * n);
    FLEXH2O_CUDA_CHECK_LAUNCH();
    if (a.bias) {
      add_bias_kernel<<<blocks_for(m * n), kThreads, 0, stream_>>>(a.y, n, a.bias, m, n);
      FLEXH2O_CUDA_CHECK_LAUNCH();
    }
    return;
  }
  const GemmPlan plan = plan_gemm(m, k, n, a.w.dtype, a.compute);
  {
    const std::size_t in = plan.inputs == DType::F32 ? 0 : plan.inputs == DType::BF16 ? 1 : 2, conv = plan.w_rows > 0;
    ++gemm_calls_[in][conv];
    gemm_flops_[in][conv] += 2 * m * n * k;
  }
  const bool half = plan.inputs != DType::F32, convert_x = half && !a.x_bf16;
  const std::int64_t elem = half ? 2 : 4;
  // cuBLASLt's workspace (for a bias) first, at the pool's alignment, then the panels.
  const std::int64_t workspace = a.bias ? plan.workspace_bytes : 0;
  const std::int64_t x_panel_bytes = convert_x ? plan.x_rows * k * elem : 0;
  DeviceBuffer scratch(*this, static_cast<std::size_t>(plan.scratch_bytes - plan.workspace_bytes + workspace -
                                                       plan.x_rows * k * elem + x_panel_bytes));
  GemmPanel p;
  p.workspace = scratch.data();
  auto* x_panel = scratch.as<std::byte>() + workspace;  // plan.x_rows rows of x as the plan's inputs
  auto* w_panel = x_panel + x_panel_bytes;              // plan.w_rows converted weight rows
  const std::int64_t x_step = convert_x ? plan.x_rows : m, w_step = plan.w_rows > 0 ? plan.w_rows : n;
  const std::int64_t wrow = row_bytes(a.w.dtype, k);
  p.ldx = a.x_bf16 && a.x_stride ? a.x_stride : k;
  for (p.m0 = 0; p.m0 < m; p.m0 += x_step) {
    p.mr = std::min(x_step, m - p.m0);
    if (a.x_bf16) {
      p.x = a.x_bf16 + p.m0 * p.ldx;
    } else if (convert_x) {
      convert(a.x + p.m0 * k, DType::F32, k * 4, p.mr, k, x_panel, plan.inputs, stream_);
      p.x = x_panel;
    } else {
      p.x = a.x + p.m0 * k;
    }
    for (p.n0 = 0; p.n0 < n; p.n0 += w_step) {  // (re-converted per x panel: O(nk) beside O(mr nk))
      p.nr = std::min(w_step, n - p.n0);
      p.w = static_cast<const std::uint8_t*>(a.w.data) + p.n0 * wrow;
      if (plan.w_rows > 0) {
        convert(p.w, a.w.dtype, wrow, p.nr, k, w_panel, plan.inputs, stream_);
        p.w = w_panel;
      }
      gemm_panel(a, plan, p);
    }
  }
}

KernelUse CudaBackend::kernel_use() const {
  KernelUse u{.isa = name_ + ", " + std::to_string(sm_count_) + " SMs", .gemm = {}, .primitives = {}};
  constexpr const char* kInputs[] = {"cuBLAS f32", "cuBLAS bf16", "cuBLAS f16"};
  for (std::size_t in = 0; in < 3; ++in)
    for (std::size_t conv = 0; conv < 2; ++conv)
      if (gemm_calls_[in][conv] > 0)
        u.gemm.push_back({std::string(kInputs[in]) + (conv ? ", weight converted per call" : ""), gemm_calls_[in][conv],
                          gemm_flops_[in][conv]});
  std::ranges::sort(u.gemm, std::greater{}, &KernelUse::Path::flops);
  return u;
}

}  // namespace flexh2o::kernels::cuda
