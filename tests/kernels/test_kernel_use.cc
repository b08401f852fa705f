// What the CPU backend reports of its kernels (Backend::kernel_use): every GEMM counted under the
// path it took, with its FLOPs; an f16 or bf16 GEMM under bf16 compute on a CPU with AVX-512 BF16
// (AMX included) takes the tiled bf16 kernel, which reads the weight in place (no conversion per
// call); the oneDNN matmuls of the panel path use no reference ("ref") implementation.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/gemm_cpu.h"

namespace flexh2o::kernels {
namespace {

std::int64_t calls_of(const KernelUse& u, CpuGemmPath p) {
  for (const auto& path : u.gemm)
    if (path.name == cpu_gemm_path_name(p)) return path.calls;
  return 0;
}

void gemm(Backend& be, DType w_dtype, DType compute, std::int64_t m, std::int64_t n, std::int64_t k) {
  const std::vector<std::uint8_t> w(static_cast<std::size_t>(row_bytes(w_dtype, k) * n), 0);
  const std::vector<float> x(static_cast<std::size_t>(m * k), 0.5f);
  std::vector<float> y(static_cast<std::size_t>(m * n));
  be.gemm({x.data(), m, {w.data(), w_dtype, n, k}, nullptr, y.data(), 0.0f, compute});
}

TEST(KernelUse, CountsEachGemmUnderItsPathWithItsFlops) {
  auto be = make_cpu_backend();
  EXPECT_TRUE(be->kernel_use().gemm.empty());
  gemm(*be, DType::F32, DType::F32, 3, 40, 64);
  gemm(*be, DType::F32, DType::F32, 3, 40, 64);
  const KernelUse u = be->kernel_use();
  EXPECT_FALSE(u.isa.empty());
  ASSERT_EQ(u.gemm.size(), 1u);
  EXPECT_EQ(u.gemm[0].calls, 2);
  EXPECT_EQ(u.gemm[0].flops, 2 * 2 * 3 * 40 * 64);
  const GemmArgs a{nullptr, 3, {nullptr, DType::F32, 40, 64}, nullptr, nullptr, 0.0f, DType::F32};
  EXPECT_EQ(u.gemm[0].name, cpu_gemm_path_name(choose_cpu_gemm_path(a)));
}

TEST(KernelUse, HalfWeightsUnderBf16TakeTheInPlaceBf16Kernel) {
  const GemmArgs probe{nullptr, 16, {nullptr, DType::F16, 64, 128}, nullptr, nullptr, 0.0f, DType::BF16};
  if (!cpu_gemm_path_supported(CpuGemmPath::TiledBf16, probe)) GTEST_SKIP() << "no AVX-512 BF16 here";
  auto be = make_cpu_backend();
  int calls = 0;
  for (const DType w : {DType::F16, DType::BF16})
    for (const std::int64_t m : {1, 16, 64, 512}) {
      gemm(*be, w, DType::BF16, m, 64, 128);
      ++calls;
    }
  const KernelUse u = be->kernel_use();
  EXPECT_EQ(calls_of(u, CpuGemmPath::TiledBf16), calls);
  EXPECT_EQ(u.gemm.size(), 1u) << "a bf16 GEMM took another path (a conversion per call)";
}

TEST(KernelUse, OnednnMatmulsAreNotReferenceImplementations) {
  const std::int64_t m = 512, n = 256, k = 256;
  const std::vector<float> x(static_cast<std::size_t>(m * k), 0.25f), w(static_cast<std::size_t>(n * k), 0.5f);
  std::vector<float> y(static_cast<std::size_t>(m * n));
  for (const DType compute : {DType::F32, DType::BF16})
    run_cpu_gemm_path(CpuGemmPath::OnednnPanels,
                      {x.data(), m, {w.data(), DType::F32, n, k}, nullptr, y.data(), 0.0f, compute});
  const KernelUse u = make_cpu_backend()->kernel_use();
  ASSERT_FALSE(u.primitives.empty());
  for (const std::string& impl : u.primitives) EXPECT_NE(impl.rfind("ref", 0), 0u) << impl << " on " << u.isa;
}

}  // namespace
}  // namespace flexh2o::kernels
