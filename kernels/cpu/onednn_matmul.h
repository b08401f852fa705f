// One GEMM panel through oneDNN's matmul primitive, on the calling thread: the CPU backend
// parallelises over panels with oneTBB, so each oneDNN call runs single-threaded (oneDNN's
// OpenMP team is set to one thread in every worker) and the two runtimes never oversubscribe
// the cores. Primitives are created once per shape and kept per thread.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace flexh2o::kernels {

struct PanelShape {
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t ldy = 0;      // row stride of y (the full GEMM's n)
  DType inputs = DType::F32;  // x and w: both F32 or both BF16; the product accumulates in fp32
  bool bias = false;
  bool accumulate = false;  // y += x w^T (+ bias) instead of y =
};

// y[m, n] (row stride ldy) (+)= x[m, k] @ w[n, k]^T (+ bias[n]); x and w row-major in
// shape.inputs, y and bias fp32.
void onednn_matmul(const PanelShape& shape, const void* x, const void* w, const float* bias, float* y);

// Whether oneDNN multiplies bf16 natively here (AVX-512 BF16 or AMX), honouring
// ONEDNN_MAX_CPU_ISA.
bool onednn_native_bf16();
// oneDNN's effective ISA on this machine (ONEDNN_MAX_CPU_ISA applied), e.g. "avx512_core_bf16".
std::string onednn_isa_name();
// The implementations (impl_info_str, e.g. "brg:avx512_core") of the matmul primitives made so
// far in this process, sorted.
std::vector<std::string> onednn_impls_used();

}  // namespace flexh2o::kernels
