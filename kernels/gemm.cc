// Backend::gemm: the argument checks every device shares, then the device's do_gemm.
#include <stdexcept>

#include "kernels/backend.h"

namespace flexh2o::kernels {

void Backend::gemm(const GemmArgs& a) {
  if (a.m < 0 || a.w.rows < 0 || a.w.cols < 0) throw std::invalid_argument("gemm: negative dimension");
  if (a.beta != 0.0f && a.beta != 1.0f) throw std::invalid_argument("gemm: beta must be 0 or 1");
  if (a.compute != DType::F32 && a.compute != DType::BF16 && a.compute != DType::F16)
    throw std::invalid_argument("gemm: compute must be f32, bf16 or f16");
  if (a.compute == DType::F16 && a.w.dtype != DType::F16) throw std::invalid_argument("gemm: f16 compute needs f16 weights");
  if (a.x_bf16) {
    if (a.x) throw std::invalid_argument("gemm: x and x_bf16 both given");
    if (a.compute != DType::BF16) throw std::invalid_argument("gemm: x_bf16 needs bf16 compute");
    if (a.x_stride != 0 && a.x_stride < a.w.cols) throw std::invalid_argument("gemm: x_stride below k");
  } else if (a.x_stride != 0) {
    throw std::invalid_argument("gemm: x_stride is for x_bf16 only");
  }
  do_gemm(a);
}

}  // namespace flexh2o::kernels
