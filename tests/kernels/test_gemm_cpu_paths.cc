// Every CPU GEMM path (kernels/cpu/gemm_cpu.h) on fresh random data against a double-precision
// reference on the weights' stored values, shapes chosen to cross each kernel's edges: rows of
// activations by threes, fours and the remainders, weight rows past a 4-row tile and a 64-row
// task, k past a chunk and off the 8-wide vectors. Tolerances follow from the arithmetic:
//   weight-only paths: an fp32 sum of k products in any order, u (k + 16) sum |x| (|w| + |m|),
//     where |m| covers q * s + m formed in one FMA instead of the stored value's two roundings;
//   bf16 compute: the same sum of the exact products of x and w rounded to bf16 (the reference
//     rounds them too);
//   the int8 path: that, plus the activations' rounding to codes, at most dx / 2 per value
//     (dx = max |x| / 127 of its block of 32), times the part of the weight the codes carry,
//     (q - centre) * s (the kernel centres the codes on their range).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cpu/gemm_int8_cpu.h"
#include "kernels/quantize.h"
#include "tests/kernels/seeded_test.h"
#include "tests/support/fp_tolerance.h"

namespace flexh2o::kernels {
namespace {

constexpr DType kAll[] = {DType::F32, DType::F16, DType::BF16, DType::Q4, DType::Q8, DType::Q4G32, DType::Q8G32};
constexpr DType kQuantized[] = {DType::Q4, DType::Q8, DType::Q4G32, DType::Q8G32};
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double u = flexh2o::testing::kF32Eps;

struct Problem {
  std::int64_t m, n, k;
  DType t;
  std::vector<float> x, bias, y0;
  std::vector<std::uint8_t> w;  // stored
  std::vector<float> value;     // the stored weights' values
  std::vector<float> min;       // each weight's group minimum (0 for float weights)
  std::vector<double> centre;   // the middle of its group's codes: m + 8 s (4 bits), m + 128 s (8 bits)
};

class CpuGemmPaths : public SeededTest {
 protected:
  Problem make(DType t, std::int64_t m, std::int64_t n, std::int64_t k, bool bias, float beta) {
    Problem p{m, n, k, t, random_floats(m * k), bias ? random_floats(n) : std::vector<float>{}, {}, {}, {}, {}, {}};
    p.y0 = beta == 0.0f ? std::vector<float>(static_cast<std::size_t>(m * n), kNaN) : random_floats(m * n);
    const std::vector<float> w = random_floats(n * k);
    p.w = stored_rows(w, t, n, k);
    p.value.resize(w.size());
    convert_rows(p.w.data(), t, p.value.data(), DType::F32, n, k);
    p.min.assign(w.size(), 0.0f);
    p.centre.assign(w.size(), 0.0);
    if (is_quantized(t))
      for (std::int64_t j = 0; j < n; ++j)
        for (std::int64_t c = 0; c < k; ++c) {
          const auto g = quant_group_params(p.w.data() + j * row_bytes(t, k), k, t, c / quant_group_size(t));
          const std::size_t at = static_cast<std::size_t>(j * k + c);
          p.min[at] = g.min;
          p.centre[at] = g.min + (quant_bits(t) == 4 ? 8.0 : 128.0) * g.scale;
        }
    return p;
  }

  // Runs path `path` and checks every output; `int8` adds the activation-rounding bound.
  // `kernel` runs that int8 kernel (over all rows at once) instead of the path.
  // `compute` BF16 runs the path under bf16 compute, against a reference on bf16-rounded x and w.
  void check(CpuGemmPath path, const Problem& p, float beta, bool int8, std::optional<Int8Kernel> kernel = {},
             DType compute = DType::F32) {
    SCOPED_TRACE(::testing::Message() << cpu_gemm_path_name(path) << " " << dtype_name(p.t) << " m=" << p.m
                                      << " n=" << p.n << " k=" << p.k << (p.bias.empty() ? "" : " bias")
                                      << " beta=" << beta << " int8 kernel " << (kernel ? static_cast<int>(*kernel) : -1)
                                      << " compute " << dtype_name(compute));
    std::vector<float> y = p.y0;
    const GemmArgs a{p.x.data(), p.m, {p.w.data(), p.t, p.n, p.k}, p.bias.empty() ? nullptr : p.bias.data(),
                     y.data(), beta, compute};
    ASSERT_TRUE(cpu_gemm_path_supported(path, a));
    if (kernel) {
      run_cpu_gemm_int8(a, *kernel);
    } else {
      run_cpu_gemm_path(path, a);
    }
    for (std::int64_t i = 0; i < p.m; ++i)
      for (std::int64_t j = 0; j < p.n; ++j) {
        double want = 0, terms = 0, rounding = 0;
        for (std::int64_t c = 0; c < p.k; ++c) {
          const double x = round_to(compute, p.x[i * p.k + c]), w = round_to(compute, p.value[j * p.k + c]);
          const double mn = p.min[j * p.k + c];
          want += x * w;
          terms += std::abs(x) * (std::abs(w) + std::abs(mn));
        }
        if (int8)
          for (std::int64_t b0 = 0; b0 < p.k; b0 += kInt8Block) {
            double amax = 0, code_part = 0;
            for (std::int64_t c = b0; c < b0 + kInt8Block; ++c) {
              amax = std::max(amax, std::abs(static_cast<double>(p.x[i * p.k + c])));
              code_part += std::abs(static_cast<double>(p.value[j * p.k + c]) - p.centre[j * p.k + c]);
            }
            rounding += (0.5 + 0x1p-14) * amax / 127.0 * code_part;
          }
        const std::size_t at = static_cast<std::size_t>(i * p.n + j);
        if (!p.bias.empty()) want += p.bias[static_cast<std::size_t>(j)];
        if (beta != 0.0f) want += p.y0[at];
        terms += (p.bias.empty() ? 0.0 : std::abs(p.bias[static_cast<std::size_t>(j)])) +
                 (beta != 0.0f ? std::abs(p.y0[at]) : 0.0);
        const double tol = u * static_cast<double>(p.k + 16) * (terms + rounding) + rounding;
        ASSERT_NEAR(y[at], want, tol) << "y[" << i << ", " << j << "]";
      }
  }
};

TEST_F(CpuGemmPaths, WeightOnlyPathsMatchReference) {
  for (const CpuGemmPath path : {CpuGemmPath::FewRows, CpuGemmPath::Tiled, CpuGemmPath::OnednnPanels})
    for (const DType t : kAll)
      for (const std::int64_t m : {1, 2, 3, 4, 5, 16, 17, 64})
        for (const std::int64_t k : {7, 64, 200, 1100})
          for (const std::int64_t n : {5, 70}) {
            const bool bias = (m + k) % 2 == 0;
            const float beta = (m + n) % 2 == 0 ? 1.0f : 0.0f;
            const Problem p = make(t, m, n, k, bias, beta);
            const GemmArgs a{p.x.data(), m, {p.w.data(), t, n, k}, nullptr, nullptr, beta, DType::F32};
            if (!cpu_gemm_path_supported(path, a)) continue;
            check(path, p, beta, false);
            if (HasFatalFailure()) return;
          }
}

// The bf16 tiled kernel: f32, f16 and bf16 weights, rows by sixes and their remainders and past a
// 128-row block, k off the 32-wide vectors (masked tails) and past a 2048-column chunk, weight
// rows past a tile and a task.
TEST_F(CpuGemmPaths, TiledBf16MatchesBf16Reference) {
  if (!cpu_gemm_path_supported(CpuGemmPath::TiledBf16,
                               GemmArgs{nullptr, 1, {nullptr, DType::F16, 1, 1}, nullptr, nullptr, 0.0f, DType::BF16}))
    GTEST_SKIP() << "no AVX-512 BF16 here";
  for (const DType t : {DType::F32, DType::F16, DType::BF16})
    for (const std::int64_t m : {1, 5, 6, 7, 13, 16, 64, 131})
      for (const std::int64_t k : {7, 64, 200, 2100})
        for (const std::int64_t n : {5, 70}) {
          if (m > 64 && k > 200) continue;  // the reference is O(m n k) in doubles
          const bool bias = (m + k) % 2 == 0;
          const float beta = (m + n) % 2 == 0 ? 1.0f : 0.0f;
          check(CpuGemmPath::TiledBf16, make(t, m, n, k, bias, beta), beta, false, {}, DType::BF16);
          if (HasFatalFailure()) return;
        }
}

// One path for every row count under bf16 compute, so that a row's bits never follow the rows
// beside it (rounding the next layer's input to bf16 would magnify a last-bit difference).
TEST_F(CpuGemmPaths, Bf16ComputeTakesTiledBf16AtEveryRowCount) {
  GemmArgs a{nullptr, 16, {nullptr, DType::F16, 8, 64}, nullptr, nullptr, 0.0f, DType::BF16};
  if (!cpu_gemm_path_supported(CpuGemmPath::TiledBf16, a)) GTEST_SKIP() << "no AVX-512 BF16 here";
  for (const std::int64_t m : {1, 16, 129, 4096}) {
    a.m = m;
    EXPECT_EQ(choose_cpu_gemm_path(a), CpuGemmPath::TiledBf16) << m;
  }
  a.m = 16;
  a.w.dtype = DType::Q8G32;
  EXPECT_FALSE(cpu_gemm_path_supported(CpuGemmPath::TiledBf16, a));
  a.w.dtype = DType::F16;
  a.compute = DType::F32;
  EXPECT_FALSE(cpu_gemm_path_supported(CpuGemmPath::TiledBf16, a));
}

// Continuous batching puts any mix of sequences in one GEMM: the tiled paths must give each
// activation row the same bits alone as beside any number of others (their chunks of k and each
// output's summation order depend on k only), across the row counts they take (9..128 for the
// fp32 kernel, past 64 where the chunks once shrank with m; every count for the bf16 one, past
// its 128-row blocks) and k past one chunk.
TEST_F(CpuGemmPaths, TiledRowsIndependentOfOtherRows) {
  struct Case {
    CpuGemmPath path;
    DType compute;
    std::vector<DType> weights;
  };
  const Case cases[] = {{CpuGemmPath::Tiled, DType::F32, {DType::F16, DType::Q4G32}},
                        {CpuGemmPath::TiledBf16, DType::BF16, {DType::F32, DType::F16, DType::BF16}}};
  for (const Case& c : cases)
    for (const DType t : c.weights)
      for (const std::int64_t k : {200, 1536, 2100, 4200})
        for (const std::int64_t m : {9, 33, 64, 65, 100, 128, 300}) {
          SCOPED_TRACE(::testing::Message() << cpu_gemm_path_name(c.path) << " " << dtype_name(t) << " m=" << m << " k=" << k);
          const std::int64_t n = 37;
          const Problem p = make(t, m, n, k, true, 0.0f);
          std::vector<float> y(static_cast<std::size_t>(m * n));
          const GemmArgs all{p.x.data(), m, {p.w.data(), t, n, k}, p.bias.data(), y.data(), 0.0f, c.compute};
          if (!cpu_gemm_path_supported(c.path, all)) break;  // not on this CPU
          run_cpu_gemm_path(c.path, all);
          for (std::int64_t i = 0; i < m; i += 7) {
            std::vector<float> alone(static_cast<std::size_t>(n));
            const GemmArgs one{p.x.data() + i * k, 1, {p.w.data(), t, n, k}, p.bias.data(), alone.data(), 0.0f, c.compute};
            run_cpu_gemm_path(c.path, one);
            for (std::int64_t j = 0; j < n; ++j) ASSERT_EQ(alone[j], y[i * n + j]) << "y[" << i << ", " << j << "]";
          }
        }
}

TEST_F(CpuGemmPaths, Int8PathWithinActivationRounding) {
  if (!cpu_gemm_path_supported(CpuGemmPath::Tiled, GemmArgs{nullptr, 1, {}, nullptr, nullptr, 0.0f, DType::F32}))
    GTEST_SKIP() << "no AVX2/FMA/F16C here";
  // n: within one 16-row vector, past a 32-row tile of the AVX-512 kernel and off its edges.
  for (const DType t : kQuantized)
    for (const std::int64_t m : {1, 3, 4, 6, 17, 64})
      for (const std::int64_t k : {32, 96, 2080})  // 2080: past one 2048-column chunk
        for (const std::int64_t n : {3, 70, 97}) {
          if (m * n * k > 64 * 97 * 96 && m > 6) continue;  // the reference is O(m n k) in doubles
          const bool bias = (m + n) % 2 == 1;
          const float beta = (m + k) % 2 == 0 ? 1.0f : 0.0f;
          const Problem p = make(t, m, n, k, bias, beta);
          check(CpuGemmPath::TiledInt8, p, beta, true);
          for (const Int8Kernel kernel : {Int8Kernel::Avx2, Int8Kernel::Vnni256, Int8Kernel::Avx512Vnni})
            if (int8_kernel_available(kernel)) check(CpuGemmPath::TiledInt8, p, beta, true, kernel);
          if (HasFatalFailure()) return;
        }
}

TEST_F(CpuGemmPaths, Int8PathOnlyForGroupWeightsAndWholeBlocks) {
  std::vector<float> x(64 * 40);
  const GemmArgs q4{x.data(), 2, {nullptr, DType::Q4G32, 8, 64}, nullptr, nullptr, 0.0f, DType::F32};
  GemmArgs f16 = q4, odd_k = q4, bf16 = q4;
  f16.w.dtype = DType::F16;
  odd_k.w.cols = 40;
  bf16.compute = DType::BF16;
  EXPECT_FALSE(gemm_int8_supported(f16));
  EXPECT_FALSE(gemm_int8_supported(odd_k));
  EXPECT_FALSE(gemm_int8_supported(bf16));
  if (!cpu_gemm_path_supported(CpuGemmPath::Tiled, q4)) GTEST_SKIP() << "no AVX2/FMA/F16C here";
  EXPECT_TRUE(gemm_int8_supported(q4));
  EXPECT_THROW(run_cpu_gemm_path(CpuGemmPath::TiledInt8, odd_k), std::invalid_argument);
  // The modes: only int8 quantizes x; previous takes only the older paths.
  EXPECT_EQ(choose_cpu_gemm_path(q4, CpuGemmMode::Int8), CpuGemmPath::TiledInt8);
  EXPECT_NE(choose_cpu_gemm_path(q4, CpuGemmMode::WeightOnly), CpuGemmPath::TiledInt8);
  GemmArgs many = f16;
  many.m = 64;
  EXPECT_EQ(choose_cpu_gemm_path(many, CpuGemmMode::Previous), CpuGemmPath::OnednnPanels);
}

TEST_F(CpuGemmPaths, ActivationCodesRoundEachBlock) {
  if (!cpu_gemm_path_supported(CpuGemmPath::Tiled, GemmArgs{nullptr, 1, {}, nullptr, nullptr, 0.0f, DType::F32}))
    GTEST_SKIP() << "no AVX2/FMA/F16C here";
  const std::int64_t m = 3, k = 96;
  std::vector<float> x = random_floats(m * k, -3.0f, 3.0f);
  std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // an all-zero block: scale 0, codes 0
  Int8Rows q;
  resize_int8_rows(m, k, q, Int8Kernel::Avx2, DType::Q8G32);
  quantize_int8_rows(x.data(), 0, m, q);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t b = 0; b < k / kInt8Block; ++b) {
      const std::size_t at = static_cast<std::size_t>(i * (k / kInt8Block) + b);
      float amax = 0;
      double sum = 0, sum_abs = 0;
      for (std::int64_t c = b * kInt8Block; c < (b + 1) * kInt8Block; ++c) {
        amax = std::max(amax, std::abs(x[i * k + c]));
        sum += x[i * k + c];
        sum_abs += std::abs(x[i * k + c]);
      }
      ASSERT_EQ(q.scale[at], amax / 127.0f);
      ASSERT_NEAR(q.sum[at], sum, u * 40 * sum_abs);
      std::int32_t code_sum = 0;
      for (std::int64_t c = b * kInt8Block; c < (b + 1) * kInt8Block; ++c) {
        const int code = q.codes[static_cast<std::size_t>(i * k + c)];
        code_sum += code;
        ASSERT_LE(std::abs(code), 127);
        ASSERT_LE(std::abs(x[i * k + c] - q.scale[at] * code), (0.5 + 0x1p-14) * q.scale[at] + 1e-30) << c;
      }
      ASSERT_EQ(q.code_sum[at], code_sum);
    }
  // For the AVX-512 kernel with 4-bit weights: the same codes, each block's even-indexed ones first.
  Int8Rows even_odd;
  resize_int8_rows(m, k, even_odd, Int8Kernel::Avx512Vnni, DType::Q4G32);
  ASSERT_TRUE(even_odd.even_odd);
  quantize_int8_rows(x.data(), 0, m, even_odd);
  EXPECT_EQ(even_odd.scale, q.scale);
  EXPECT_EQ(even_odd.code_sum, q.code_sum);
  for (std::int64_t at = 0; at < m * k; ++at) {
    const std::int64_t t = at % kInt8Block, from = at - t + (t < 16 ? 2 * t : 2 * (t - 16) + 1);
    ASSERT_EQ(even_odd.codes[static_cast<std::size_t>(at)], q.codes[static_cast<std::size_t>(from)]) << at;
  }
}

}  // namespace
}  // namespace flexh2o::kernels
