#include "kernels/cuda/gemm_plan.h"

#include <algorithm>

namespace flexh2o::kernels::cuda {

GemmPlan plan_gemm(std::int64_t m, std::int64_t k, std::int64_t n, DType w, DType compute) {
  GemmPlan p;
  if (compute != DType::F32) p.inputs = compute;
  if (m <= 0 || n <= 0 || k <= 0) return p;
  const std::int64_t elem = p.inputs == DType::F32 ? 4 : 2;
  if (p.inputs != DType::F32) p.x_rows = std::clamp<std::int64_t>(kGemmXPanelBytes / (2 * k), 1, m);
  if (w != p.inputs) p.w_rows = std::clamp<std::int64_t>(kGemmWPanelBytes / (elem * k), 1, n);
  p.workspace_bytes = kGemmLtWorkspaceBytes;
  p.scratch_bytes = (p.x_rows + p.w_rows) * k * elem + p.workspace_bytes;
  return p;
}

}  // namespace flexh2o::kernels::cuda
