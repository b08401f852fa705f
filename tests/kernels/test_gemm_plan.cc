// The CUDA backend's GEMM plans (kernels/cuda/gemm_plan.h), host code tested without a GPU:
// scratch is one conversion panel of x and of the weight, bounded whatever the shape, and the
// panels cover it; nothing is converted that cuBLAS can read as it is.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <tuple>
#include <vector>

#include "kernels/cuda/gemm_plan.h"

namespace flexh2o::kernels {
namespace {

TEST(CudaGemmPlan, ScratchIsBoundedPanels) {
  for (const auto& [m, k, n] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
           {1, 4096, 4096}, {16384, 12288, 49152}, {3, 1, 5}, {100000, 3, 7}, {7, 1 << 26, 2}})
    for (DType compute : {DType::F32, DType::BF16, DType::F16})
      for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8, DType::Q4}) {
        if (compute == DType::F16 && t != DType::F16) continue;  // f16 compute is for f16 weights (gemm.h)
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " compute " << dtype_name(compute) << " m=" << m
                                          << " k=" << k << " n=" << n);
        const cuda::GemmPlan p = cuda::plan_gemm(m, k, n, t, compute);
        const std::int64_t elem = compute == DType::F32 ? 4 : 2;
        EXPECT_EQ(p.inputs, compute);
        EXPECT_EQ(p.x_rows, compute != DType::F32 ? std::clamp<std::int64_t>(cuda::kGemmXPanelBytes / (2 * k), 1, m) : 0);
        if (t == p.inputs) {
          EXPECT_EQ(p.w_rows, 0);  // read in place
        } else {
          EXPECT_GE(p.w_rows, 1);
          EXPECT_LE(p.w_rows, n);
          EXPECT_TRUE(p.w_rows * k * elem <= cuda::kGemmWPanelBytes || p.w_rows == 1);
        }
        EXPECT_TRUE(p.x_rows * k * 2 <= cuda::kGemmXPanelBytes || p.x_rows == 1);
        EXPECT_EQ(p.workspace_bytes, cuda::kGemmLtWorkspaceBytes);  // cuBLASLt's, for a bias
        EXPECT_EQ(p.scratch_bytes, (p.x_rows + p.w_rows) * k * elem + p.workspace_bytes);
      }
  // OPT-175B's prefill at gbs 32 x 512 tokens under bf16: x alone would be 400 MB in 16 bits.
  EXPECT_EQ(cuda::plan_gemm(16384, 12288, 49152, DType::BF16, DType::BF16).scratch_bytes,
            (32 << 20) / (2 * 12288) * 12288 * 2 + cuda::kGemmLtWorkspaceBytes);
}

// OPT-1.3B's tied head (50,272 x 2,048, the f16 token table) at a decode step of 256 under
// f16 compute (what the engine asks for it under bf16, engine/model/layers.cc): read in place,
// only x converted.
TEST(CudaGemmPlan, AnF16HeadIsReadInPlace) {
  const cuda::GemmPlan p = cuda::plan_gemm(256, 2048, 50272, DType::F16, DType::F16);
  EXPECT_EQ(p.inputs, DType::F16);
  EXPECT_EQ(p.w_rows, 0);
  EXPECT_EQ(p.x_rows, 256);
}

}  // namespace
}  // namespace flexh2o::kernels
