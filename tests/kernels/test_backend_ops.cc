// Device backends against the CPU backend, op by op (in the style of llama.cpp's
// test-backend-ops): every test makes fresh random inputs from a seed shown on failure
// (rerun with --gtest_random_seed=N), runs the op on the CPU backend and on the device
// backend from the same bytes, and compares. Outputs start as NaN (poison) so elements an
// op fails to write show up, and elements it must leave alone (probs past a sequence's
// length, cache slots not written) must keep their poison or bytes.
//
// Tolerances: element-wise fp32 ops |dev - cpu| <= 1e-5 * max(|cpu|, rms(cpu), 1); GEMM and
// attention from the arithmetic (tests/support/fp_tolerance.h): sums of k terms in fp32 in
// another order, plus for f16/bf16 weights the rounding of the activations to the weight's
// type (the model's dtype class; q4/q8 weights are dequantized to fp32 and multiply fp32
// activations); ops that are copies or single roundings (embedding, KV writes and moves,
// quantization, sampling) must match bit for bit.
//
// Every case skips, with the reason, where the device backend is not compiled in or no
// device is usable, so `ctest -L gpu` passes on machines without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/decode_runs.h"
#include "kernels/dtype.h"
#include "kernels/quantize.h"
#include "tests/kernels/seeded_test.h"
#include "tests/support/fp_tolerance.h"

#if defined(FLEXH2O_HAVE_CUDA) && FLEXH2O_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace flexh2o::kernels {
namespace {

// The CPU is the reference here, so its GEMMs multiply q4/q8 weights exactly: the CPU's int8
// default rounds the activations, which the GPU does not (read at the first CPU GEMM).
[[maybe_unused]] const int kExactCpuGemm = setenv("FLEXH2O_CPU_GEMM", "weight-only", 1);

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr DType kAllDTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q4, DType::Q8};
// Weights may also be in 32-value groups (GGUF blocks kept as they are); KV caches never are.
constexpr DType kWeightDTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q4, DType::Q8, DType::Q4G32, DType::Q8G32};
constexpr double kF32Tol = 1e-5;
using flexh2o::testing::kBF16Eps;
using flexh2o::testing::kF32Eps;
using flexh2o::testing::sum_tolerance;

std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

// Why the device backend `name` cannot run here; empty when it can.
std::string unavailable(const std::string& name) {
  if (name == "cuda") return cuda_unavailable_reason();
  return "unknown device backend '" + name + "'";
}

// |dev - cpu| <= tol * max(|cpu|, rms(cpu), 1) everywhere; NaN in cpu marks an element the
// op leaves alone (poison), which must be NaN on the device too.
::testing::AssertionResult close(const std::vector<float>& cpu, const std::vector<float>& dev, double tol) {
  if (cpu.size() != dev.size()) return ::testing::AssertionFailure() << "sizes " << cpu.size() << " vs " << dev.size();
  double ss = 0.0;
  std::size_t finite = 0;
  for (float v : cpu)
    if (std::isfinite(v)) ss += static_cast<double>(v) * v, ++finite;
  const double floor = std::max(1.0, finite ? std::sqrt(ss / static_cast<double>(finite)) : 0.0);
  std::size_t bad = 0, first = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const double bound = tol * std::max(floor, std::abs(static_cast<double>(cpu[i])));
    const bool ok = std::isnan(cpu[i]) ? std::isnan(dev[i]) : std::abs(static_cast<double>(dev[i]) - cpu[i]) <= bound;
    if (!ok && bad++ == 0) first = i;
    if (!std::isnan(cpu[i]) && !std::isnan(dev[i])) worst = std::max(worst, std::abs(static_cast<double>(dev[i]) - cpu[i]) / bound);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream msg;
  msg.precision(9);
  msg << bad << " of " << cpu.size() << " elements differ; first [" << first << "]: device " << dev[first] << ", cpu "
      << cpu[first] << "; worst error / tolerance " << worst;
  return ::testing::AssertionFailure() << msg.str();
}

// |dev - cpu| <= abs_tol + rel_tol * |cpu| everywhere; NaN in cpu (poison) must be NaN on
// the device too.
::testing::AssertionResult within(const std::vector<float>& cpu, const std::vector<float>& dev, double abs_tol,
                                  double rel_tol = 0.0) {
  if (cpu.size() != dev.size()) return ::testing::AssertionFailure() << "sizes " << cpu.size() << " vs " << dev.size();
  std::size_t bad = 0, first = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const double bound = abs_tol + rel_tol * std::abs(static_cast<double>(cpu[i]));
    const double err = std::abs(static_cast<double>(dev[i]) - cpu[i]);
    const bool ok = std::isnan(cpu[i]) ? std::isnan(dev[i]) : err <= bound;
    if (!ok && bad++ == 0) first = i;
    if (!std::isnan(cpu[i])) worst = std::max(worst, std::isnan(dev[i]) ? INFINITY : err / bound);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream msg;
  msg.precision(9);
  msg << bad << " of " << cpu.size() << " elements differ; first [" << first << "]: device " << dev[first] << ", cpu "
      << cpu[first] << "; worst error / tolerance " << worst << " (tolerance " << abs_tol << " + " << rel_tol
      << " |cpu|)";
  return ::testing::AssertionFailure() << msg.str();
}

double max_abs(const std::vector<float>& v) { return flexh2o::testing::max_abs(v); }

// GEMM y = x w^T + beta y + bias with |x| <= xmax, |w| <= wmax. Both backends multiply the
// same inputs (fp32, or under bf16/f16 compute x and w rounded the same way, whose
// products are exact in fp32), so they differ only in the order of the k-term fp32 sums
// (partial sums of random-walk size sqrt(k) xmax wmax, plus what beta y and the bias add).
// Matrix units may truncate instead of round when they accumulate: a unit error of 2u there.
double gemm_tolerance(DType compute, std::int64_t k, double xmax, double wmax, double ymax, double bmax) {
  const double partial = std::sqrt(static_cast<double>(std::max<std::int64_t>(k, 1))) * xmax * wmax + ymax + bmax;
  return sum_tolerance((compute == DType::F32 ? 1 : 2) * kF32Eps, k + 2, partial);
}

// Attention over n keys with |q| <= qmax, |k| <= kmax, |v| <= vmax: a score (a sum of D
// products, of random-walk size scale sqrt(D) qmax kmax) off by e changes its probability by
// a factor exp(e) and the softmax's other probabilities through the normaliser, so by at most
// 2e relative; the normaliser and the output are sums of n terms. Returns the relative error
// of a probability: outputs are off by that times vmax, probability sums by that times
// themselves.
double attention_rel_error(std::int64_t D, std::int64_t n, double scale, double qmax, double kmax) {
  const double score = scale * std::sqrt(static_cast<double>(D)) * qmax * kmax;
  return 2 * sum_tolerance(kF32Eps, D, score) + sum_tolerance(kF32Eps, n, 1.0);
}

template <class T>
::testing::AssertionResult identical(const std::vector<T>& cpu, const std::vector<T>& dev) {
  if (cpu.size() != dev.size()) return ::testing::AssertionFailure() << "sizes " << cpu.size() << " vs " << dev.size();
  const auto* a = reinterpret_cast<const unsigned char*>(cpu.data());
  const auto* b = reinterpret_cast<const unsigned char*>(dev.data());
  const std::size_t bytes = cpu.size() * sizeof(T);
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < bytes; ++i)
    if (a[i] != b[i] && bad++ == 0) first = i;
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << bytes << " bytes differ; first at byte " << first
                                       << " (element " << first / sizeof(T) << "): device " << int(b[first])
                                       << ", cpu " << int(a[first]);
}

// A piece of a decode call: `queries` consecutive queries on a cache row of its own after
// `prefix` cached slots, each seeing one slot more than the one before (a chunk of a prompt;
// one query: a decode row).
struct DecodePiece {
  std::int64_t prefix = 0, queries = 1;
};

// A decode call with shared prefixes: query i reads cache row rows[i] (as cache_rows when
// `cache_rows`, else rows[i] = i) with lens[i] slots, a member of prefixes[prefix_of[i]] or of
// none (-1). The test copies each prefix's slots from its row into its members' rows.
struct SharedPrefixCall {
  std::vector<SharedPrefix> prefixes;
  std::vector<std::int64_t> rows, lens, prefix_of;
  bool cache_rows = false;
  // Each prefix held in a prefix cache of its own (AttentionDecodeArgs::prefix_cache), every
  // member row starting after its prefix (row_base).
  bool held_apart = false;
  std::int64_t window = 0;  // the sliding window (0: none)
};

class BackendOpsTest : public SeededTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    const std::string why = unavailable(GetParam());
    if (!why.empty()) GTEST_SKIP() << "the " << GetParam() << " backend cannot run here: " << why;
    cpu_ = make_cpu_backend();
    dev_ = make_backend(GetParam());
  }

  // One host array on both backends.
  struct Twin {
    DeviceBuffer cpu, dev;
  };

  template <class T>
  Twin upload(const std::vector<T>& host) {
    Twin t{DeviceBuffer(*cpu_, host.size() * sizeof(T)), DeviceBuffer(*dev_, host.size() * sizeof(T))};
    cpu_->copy_to_device(t.cpu.data(), host.data(), t.cpu.bytes());
    dev_->copy_to_device(t.dev.data(), host.data(), t.dev.bytes());
    return t;
  }

  template <class T = float>
  std::vector<T> download(Backend& b, const DeviceBuffer& buf) {
    b.synchronize();
    std::vector<T> host(buf.bytes() / sizeof(T));
    b.copy_to_host(host.data(), buf.data(), host.size() * sizeof(T));
    return host;
  }
  template <class T = float>
  std::pair<std::vector<T>, std::vector<T>> download(const Twin& t) {
    return {download<T>(*cpu_, t.cpu), download<T>(*dev_, t.dev)};
  }

  void check_gemm(DType dtype, DType compute, std::int64_t m, std::int64_t k, std::int64_t n, bool bias,
                  float beta, float xmax = 1.0f);
  void check_prefill(std::int64_t H, std::int64_t Hkv, std::int64_t D, const std::vector<std::int64_t>& lens,
                     bool col_sums, bool weighted, float softcap = 0.0f, std::int64_t window = 0,
                     DType compute = DType::F32);
  void check_prefill_bf16(std::int64_t H, std::int64_t Hkv, std::int64_t D, const std::vector<std::int64_t>& lens,
                          float softcap = 0.0f, std::int64_t window = 0);
  void check_decode(DType cache, std::int64_t H, std::int64_t Hkv, std::int64_t D, std::int64_t capacity,
                    const std::vector<std::int64_t>& lens, bool probs, float softcap = 0.0f, std::int64_t window = 0,
                    bool slot_bias = false, std::int64_t cache_offset = 0);
  void check_decode_runs(DType cache, std::int64_t H, std::int64_t Hkv, std::int64_t D,
                         const std::vector<DecodePiece>& pieces, float softcap = 0.0f, std::int64_t window = 0,
                         DType compute = DType::BF16);
  void check_shared_prefixes(DType cache, std::int64_t H, std::int64_t Hkv, std::int64_t D,
                             const SharedPrefixCall& call, float softcap, DType compute);

  std::unique_ptr<Backend> cpu_, dev_;
};

INSTANTIATE_TEST_SUITE_P(Devices, BackendOpsTest, ::testing::Values(std::string("cuda")),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// ---------------------------------------------------------------------------- gemm

void BackendOpsTest::check_gemm(DType dtype, DType compute, std::int64_t m, std::int64_t k, std::int64_t n,
                                bool with_bias, float beta, float xmax) {
  SCOPED_TRACE(::testing::Message() << "gemm " << dtype_name(dtype) << " compute " << dtype_name(compute) << " m=" << m
                                    << " k=" << k << " n=" << n << " bias=" << with_bias << " beta=" << beta
                                    << " |x| <= " << xmax);
  const std::vector<float> xh = random_floats(m * k, -xmax, xmax);
  const Twin x = upload(xh);
  const Twin w = upload(stored_rows(random_floats(n * k), dtype, n, k));
  const Twin bias = upload(with_bias ? random_floats(n) : std::vector<float>{});
  const std::vector<float> y0 = beta == 0.0f ? std::vector<float>(sz(m * n), kNaN) : random_floats(m * n);
  const Twin y = upload(y0);
  auto args = [&](bool on_cpu) {
    GemmArgs a;
    a.x = (on_cpu ? x.cpu : x.dev).as<float>();
    a.m = m;
    a.w = MatrixRef{(on_cpu ? w.cpu : w.dev).data(), dtype, n, k};
    a.bias = with_bias ? (on_cpu ? bias.cpu : bias.dev).as<float>() : nullptr;
    a.y = (on_cpu ? y.cpu : y.dev).as<float>();
    a.beta = beta;
    a.compute = compute;
    return a;
  };
  cpu_->gemm(args(true));
  dev_->gemm(args(false));
  const auto [want, got] = download(y);
  // Stored weights decode to at most 1 in magnitude plus a quantization step; bf16 (f16) rounding
  // adds at most 2^-8 (2^-11) relative to x and w.
  const double round = compute == DType::BF16 ? 1.0 + kBF16Eps : compute == DType::F16 ? 1.0 + flexh2o::testing::kF16Eps : 1.0;
  const double wmax = (1.0 + (is_quantized(dtype) ? 2.0 / 15.0 : 0.0)) * round;
  EXPECT_TRUE(within(want, got, gemm_tolerance(compute, k, max_abs(xh) * round, wmax, beta == 0.0f ? 0.0 : 1.0,
                                               with_bias ? 1.0 : 0.0)));
}

TEST_P(BackendOpsTest, GemmAllWeightDtypes) {
  for (DType compute : {DType::F32, DType::BF16})
    for (DType t : kWeightDTypes)
      for (const auto& [m, k, n] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
               {1, 77, 131}, {37, 200, 65}, {5, 1, 3}})
        for (bool bias : {false, true})
          for (float beta : {0.0f, 1.0f}) check_gemm(t, compute, m, k, n, bias, beta);
}

// f16 compute (an f16 head under bf16 runs, gemm.h): x rounded to f16 on both, the weight read as
// stored; |x| <= 100 keeps x in fp16's range.
TEST_P(BackendOpsTest, GemmF16ComputeForF16Weights) {
  for (const auto& [m, k, n] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
           {1, 77, 131}, {37, 200, 65}, {256, 2048, 300}})
    for (bool bias : {false, true}) check_gemm(DType::F16, DType::F16, m, k, n, bias, 0.0f, 100.0f);
}

// Activations beyond fp16's range (65504), with every weight dtype: nothing is rounded to fp16
// (fp32 compute keeps x in fp32, q4/q8 weights included; bf16 compute keeps fp32's range), so
// nothing turns into inf.
TEST_P(BackendOpsTest, GemmKeepsActivationsBeyondFp16Range) {
  for (DType compute : {DType::F32, DType::BF16})
    for (DType t : kWeightDTypes)
      for (std::int64_t m : {1, 19}) check_gemm(t, compute, m, 300, 70, true, 0.0f, 2e5f);
}

// Shapes past one conversion panel (plan_gemm, k = 4096): under bf16 compute x in 4096-row
// panels and converted weights in 8192-row ones; under fp32 compute converted weights in
// 4096-row panels.
TEST_P(BackendOpsTest, GemmAcrossConversionPanels) {
  const std::int64_t k = 4096;
  for (DType t : {DType::F32, DType::F16, DType::BF16}) check_gemm(t, DType::BF16, 4100, k, 37, true, 1.0f);
  for (DType t : {DType::F16, DType::BF16, DType::Q4, DType::Q8}) check_gemm(t, DType::F32, 3, k, 4100, true, 1.0f);
  check_gemm(DType::Q8, DType::BF16, 3, k, 8200, true, 1.0f);
}

// x handed over in bf16 (GemmArgs::x_bf16, as the norms and bias_act write it for the next
// GEMM), at row strides k and 2k (bias_act's in-place rows), with and without a bias (cuBLASLt
// told x's stride, and the pass after): what the CPU computes from the fp32 x under bf16
// compute, to check_gemm's tolerance.
TEST_P(BackendOpsTest, GemmTakesBf16X) {
  for (DType t : {DType::F16, DType::BF16, DType::Q8})
    for (std::int64_t m : {1, 19, 64})
      for (bool with_bias : {false, true})
        for (std::int64_t stride_factor : {1, 2}) {
          const std::int64_t k = 256, n = 96, stride = stride_factor * k;
          SCOPED_TRACE(::testing::Message() << dtype_name(t) << " m=" << m << " bias=" << with_bias << " stride=" << stride);
          const std::vector<float> xh = random_floats(m * k);
          std::vector<std::uint16_t> x16(sz(m * stride), 0xffff);
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t c = 0; c < k; ++c) x16[sz(i * stride + c)] = f32_to_bf16(xh[sz(i * k + c)]);
          const Twin x = upload(xh), xb = upload(x16);
          const Twin w = upload(stored_rows(random_floats(n * k), t, n, k));
          const Twin bias = upload(random_floats(n));
          const Twin y = upload(random_floats(m * n));
          GemmArgs a{.m = m, .w = {w.cpu.data(), t, n, k}, .bias = with_bias ? bias.cpu.as<float>() : nullptr,
                     .y = y.cpu.as<float>(), .beta = 1.0f, .compute = DType::BF16};
          a.x = x.cpu.as<float>();
          cpu_->gemm(a);
          a = {.m = m, .w = {w.dev.data(), t, n, k}, .bias = with_bias ? bias.dev.as<float>() : nullptr,
               .y = y.dev.as<float>(), .beta = 1.0f, .compute = DType::BF16, .x_bf16 = xb.dev.as<std::uint16_t>(),
               .x_stride = stride};
          dev_->gemm(a);
          const auto [want, got] = download(y);
          const double round = 1.0 + kBF16Eps, wmax = (1.0 + (is_quantized(t) ? 2.0 / 15.0 : 0.0)) * round;
          EXPECT_TRUE(within(want, got, gemm_tolerance(DType::BF16, k, round, wmax, 1.0, with_bias ? 1.0 : 0.0)));
        }
}

// ---------------------------------------------------------------------------- gemm: bias epilogue

// Where x, w, y and the bias sit relative to their allocations, in elements: staged weights,
// activation views and bias vectors need not be aligned beyond their element size. The CUDA
// backend adds a bias in cuBLASLt's epilogue when the bias is 16-byte aligned (cuBLASLt told
// each operand's own alignment), else in a pass of its own: both are checked against the CPU.
struct GemmOffsets {
  std::int64_t x = 0, w = 0, y = 0, bias = 0;
};

TEST_P(BackendOpsTest, GemmBiasAtAnyAlignment) {
  const GemmOffsets offsets[] = {{0, 0, 0, 0}, {1, 1, 1, 4}, {0, 3, 2, 1}, {3, 0, 0, 4}};
  for (DType compute : {DType::F32, DType::BF16})
    for (DType t : {DType::F32, DType::F16, DType::BF16})
      for (const GemmOffsets& o : offsets)
        for (float beta : {0.0f, 1.0f}) {
          const std::int64_t m = 9, k = 70, n = 37;
          SCOPED_TRACE(::testing::Message() << dtype_name(t) << " compute " << dtype_name(compute) << " offsets x "
                                            << o.x << " w " << o.w << " y " << o.y << " bias " << o.bias
                                            << " beta " << beta);
          const std::vector<float> xh = random_floats(o.x + m * k);
          const Twin x = upload(xh);
          const Twin w = upload(stored_rows(random_floats(o.w + n * k), t, 1, o.w + n * k));
          const Twin bias = upload(random_floats(o.bias + n));
          const Twin y = upload(random_floats(o.y + m * n));
          auto args = [&](bool on_cpu) {
            auto at = [&](const Twin& b) { return static_cast<const std::byte*>((on_cpu ? b.cpu : b.dev).data()); };
            GemmArgs a;
            a.x = reinterpret_cast<const float*>(at(x)) + o.x;
            a.m = m;
            a.w = MatrixRef{at(w) + o.w * static_cast<std::int64_t>(dtype_size(t)), t, n, k};
            a.bias = reinterpret_cast<const float*>(at(bias)) + o.bias;
            a.y = (on_cpu ? y.cpu : y.dev).as<float>() + o.y;
            a.beta = beta;
            a.compute = compute;
            return a;
          };
          cpu_->gemm(args(true));
          dev_->gemm(args(false));
          const auto [want, got] = download(y);
          const double round = compute == DType::BF16 ? 1.0 + kBF16Eps : 1.0;
          EXPECT_TRUE(within(want, got, gemm_tolerance(compute, k, round, round, 1.0, 1.0)));
        }
}

// GEMMs of one shape with their own biases, queued back to back before anything waits: each
// gets its own bias (cuBLASLt's plan for the shape is reused; the bias is taken per call).
TEST_P(BackendOpsTest, GemmBiasPerCallOfOneShape) {
  const std::int64_t m = 16, k = 64, n = 48, calls = 3;
  for (DType compute : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(compute));
    const Twin x = upload(random_floats(m * k));
    const Twin w = upload(stored_rows(random_floats(n * k), DType::BF16, n, k));
    const Twin bias = upload(random_floats(calls * n, -4.0f, 4.0f));
    const Twin y = upload(std::vector<float>(sz(calls * m * n), kNaN));
    for (const bool on_cpu : {true, false})
      for (std::int64_t c = 0; c < calls; ++c) {
        GemmArgs a;
        a.x = (on_cpu ? x.cpu : x.dev).as<float>();
        a.m = m;
        a.w = MatrixRef{(on_cpu ? w.cpu : w.dev).data(), DType::BF16, n, k};
        a.bias = (on_cpu ? bias.cpu : bias.dev).as<float>() + c * n;
        a.y = (on_cpu ? y.cpu : y.dev).as<float>() + c * m * n;
        a.compute = compute;
        (on_cpu ? *cpu_ : *dev_).gemm(a);
      }
    const auto [want, got] = download(y);
    EXPECT_TRUE(within(want, got, gemm_tolerance(compute, k, 1.0 + kBF16Eps, 1.0, 0.0, 4.0)));
  }
}

#if defined(FLEXH2O_HAVE_CUDA) && FLEXH2O_HAVE_CUDA
// cuBLASLt's functions are looked up through libcublas, which depends on libcublasLt: where
// this host has cuBLAS, every one the bias epilogue calls is found.
TEST(CudaPlans, CublasLtComesWithCublas) {
  if (const std::string why = cuda::cublas_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const cuda::CublasApi& api = cuda::cublas();
  for (const void* fn : {reinterpret_cast<const void*>(api.lt_create), reinterpret_cast<const void*>(api.lt_matmul),
                         reinterpret_cast<const void*>(api.lt_heuristic), reinterpret_cast<const void*>(api.lt_desc_set)})
    EXPECT_NE(fn, nullptr);
}
#endif

// ---------------------------------------------------------------------------- norms

TEST_P(BackendOpsTest, Norms) {
  for (std::int64_t cols : {1, 97, 1000, 4099})
    for (bool layer : {true, false})
      for (bool bias : {false, true})
        for (bool in_place : {false, true}) {
          SCOPED_TRACE(::testing::Message() << (layer ? "layer_norm" : "rms_norm") << " cols=" << cols
                                            << " bias=" << bias << " in_place=" << in_place);
          const std::int64_t rows = 7;
          const Twin x = upload(random_floats(rows * cols, -3.0f, 2.0f));
          const Twin y = upload(std::vector<float>(sz(rows * cols), kNaN));
          const Twin weight = upload(random_floats(cols, 0.5f, 1.5f));
          const Twin b = upload(random_floats(cols));
          for (bool on_cpu : {true, false}) {
            NormArgs a;
            a.x = (on_cpu ? x.cpu : x.dev).as<float>();
            a.y = in_place ? (on_cpu ? x.cpu : x.dev).as<float>() : (on_cpu ? y.cpu : y.dev).as<float>();
            a.rows = rows;
            a.cols = cols;
            a.weight = (on_cpu ? weight.cpu : weight.dev).as<float>();
            a.bias = bias ? (on_cpu ? b.cpu : b.dev).as<float>() : nullptr;
            a.eps = 1e-5f;
            Backend& be = on_cpu ? *cpu_ : *dev_;
            layer ? be.layer_norm(a) : be.rms_norm(a);
          }
          const auto [want, got] = download(in_place ? x : y);
          EXPECT_TRUE(close(want, got, kF32Tol));
        }
}

// A bf16 output (the round of an fp32 value the two backends compute within kF32Tol) is the same
// bf16 value or its neighbour: within one bf16 unit, 2^-7 relative.
constexpr double kBf16Unit = 0x1p-7;

std::vector<float> widened(const std::vector<std::uint16_t>& bf16) {
  std::vector<float> out(bf16.size());
  for (std::size_t i = 0; i < bf16.size(); ++i) out[i] = bf16_to_f32(bf16[i]);
  return out;
}

// The norms' fused forms: added into y (accumulate), and rounded to bf16 (y_bf16); rows that
// take the 16-byte path (cols a multiple of 4) and rows that do not.
TEST_P(BackendOpsTest, NormsFusedForms) {
  for (std::int64_t cols : {97, 1024, 4100})
    for (bool layer : {true, false}) {
      SCOPED_TRACE(::testing::Message() << (layer ? "layer_norm" : "rms_norm") << " cols=" << cols);
      const std::int64_t rows = 9;
      const Twin x = upload(random_floats(rows * cols, -3.0f, 2.0f));
      const Twin weight = upload(random_floats(cols, 0.5f, 1.5f)), b = upload(random_floats(cols));
      const Twin summed = upload(random_floats(rows * cols, -2.0f, 2.0f));
      const Twin rounded = upload(std::vector<std::uint16_t>(sz(rows * cols), 0xffff));
      for (bool on_cpu : {true, false}) {
        auto at = [&](const Twin& t) { return (on_cpu ? t.cpu : t.dev).data(); };
        NormArgs a{.x = static_cast<const float*>(at(x)), .rows = rows, .cols = cols,
                   .weight = static_cast<const float*>(at(weight)), .bias = layer ? static_cast<const float*>(at(b)) : nullptr,
                   .weight_offset = layer ? 0.0f : 1.0f};
        Backend& be = on_cpu ? *cpu_ : *dev_;
        a.y = static_cast<float*>(at(summed));
        a.accumulate = true;
        layer ? be.layer_norm(a) : be.rms_norm(a);
        a.y = nullptr;
        a.accumulate = false;
        a.y_bf16 = static_cast<std::uint16_t*>(at(rounded));
        layer ? be.layer_norm(a) : be.rms_norm(a);
      }
      const auto [want, got] = download(summed);
      EXPECT_TRUE(close(want, got, kF32Tol));
      const auto [want16, got16] = download<std::uint16_t>(rounded);
      EXPECT_TRUE(within(widened(want16), widened(got16), kF32Tol, kBf16Unit));
    }
}

// ---------------------------------------------------------------------------- rope

TEST_P(BackendOpsTest, RopeBothLayouts) {
  for (RopeLayout layout : {RopeLayout::RotateHalf, RopeLayout::Interleaved})
    for (float theta : {10000.0f, 500000.0f})
      for (std::int64_t head_dim : {2, 64, 130})
      for (bool partial : {false, true}) {
        const std::int64_t rotary_dim = partial && head_dim % 4 == 0 ? head_dim / 2 : head_dim;
        SCOPED_TRACE(::testing::Message() << "layout " << static_cast<int>(layout) << " theta " << theta
                                          << " head_dim " << head_dim << " rotary_dim " << rotary_dim);
        std::vector<float> inv_freq(sz(rotary_dim / 2));
        for (std::int64_t i = 0; i < rotary_dim / 2; ++i)
          inv_freq[sz(i)] = static_cast<float>(std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim)));
        const std::int64_t tokens = 11, heads = 3;
        std::vector<std::int32_t> positions(sz(tokens));
        for (auto& p : positions) p = static_cast<std::int32_t>(random_int(0, 4096));
        const Twin x = upload(random_floats(tokens * heads * head_dim));
        for (bool on_cpu : {true, false}) {
          RopeArgs a;
          a.x = (on_cpu ? x.cpu : x.dev).as<float>();
          a.tokens = tokens;
          a.heads = heads;
          a.head_dim = head_dim;
          a.rotary_dim = rotary_dim;
          a.positions = positions;
          a.inv_freq = inv_freq;
          a.attention_factor = partial ? 1.19f : 1.0f;
          a.layout = layout;
          (on_cpu ? *cpu_ : *dev_).rope(a);
        }
        const auto [want, got] = download(x);
        EXPECT_TRUE(close(want, got, kF32Tol));
      }
}

// ---------------------------------------------------------------------------- element-wise

TEST_P(BackendOpsTest, Activations) {
  for (Activation act : {Activation::Relu, Activation::Gelu, Activation::GeluTanh, Activation::Silu}) {
    SCOPED_TRACE(static_cast<int>(act));
    const Twin x = upload(random_floats(10001, -6.0f, 6.0f));
    cpu_->activation(act, x.cpu.as<float>(), 10001);
    dev_->activation(act, x.dev.as<float>(), 10001);
    const auto [want, got] = download(x);
    EXPECT_TRUE(close(want, got, kF32Tol));
  }
}

TEST_P(BackendOpsTest, GatedActivationsSoftcapAndAdd) {
  const std::int64_t n = 70001;
  for (Activation act : {Activation::Silu, Activation::GeluTanh})
  for (int alias : {0, 1, 2}) {  // out separate, out == gate, out == up
    SCOPED_TRACE(::testing::Message() << "activation " << static_cast<int>(act) << " alias " << alias);
    const Twin gate = upload(random_floats(n, -8.0f, 8.0f)), up = upload(random_floats(n));
    const Twin out = upload(std::vector<float>(sz(n), kNaN));
    auto target = [&](bool on_cpu) -> float* {
      const Twin& t = alias == 0 ? out : alias == 1 ? gate : up;
      return (on_cpu ? t.cpu : t.dev).as<float>();
    };
    cpu_->glu(act, gate.cpu.as<float>(), up.cpu.as<float>(), target(true), n);
    dev_->glu(act, gate.dev.as<float>(), up.dev.as<float>(), target(false), n);
    const auto [want, got] = download(alias == 0 ? out : alias == 1 ? gate : up);
    EXPECT_TRUE(close(want, got, kF32Tol));
  }
  const Twin capped = upload(random_floats(n, -100.0f, 100.0f));
  cpu_->softcap(capped.cpu.as<float>(), n, 30.0f);
  dev_->softcap(capped.dev.as<float>(), n, 30.0f);
  const auto [want_capped, got_capped] = download(capped);
  EXPECT_TRUE(close(want_capped, got_capped, kF32Tol));
  const Twin x = upload(random_floats(n)), y = upload(random_floats(n));
  cpu_->add(x.cpu.as<float>(), y.cpu.as<float>(), n);
  dev_->add(x.dev.as<float>(), y.dev.as<float>(), n);
  const auto [want, got] = download(x);
  EXPECT_TRUE(identical(want, got));
}

// bias_act: every activation with and without the bias and the up factor, fp32 out, bf16 out
// into x's own memory (stride 2 cols), on rows that take the 16-byte path and rows that do not.
TEST_P(BackendOpsTest, BiasAct) {
  for (Activation act : {Activation::Relu, Activation::Gelu, Activation::GeluTanh, Activation::Silu})
    for (bool with_bias : {false, true})
      for (bool with_up : {false, true})
        for (std::int64_t cols : {37, 2048, 8196}) {
          SCOPED_TRACE(::testing::Message() << "activation " << static_cast<int>(act) << " bias " << with_bias << " up "
                                            << with_up << " cols " << cols);
          const std::int64_t rows = 5;
          const std::vector<float> xh = random_floats(rows * cols, -6.0f, 6.0f);
          const Twin x = upload(xh), in_place = upload(xh), bias = upload(random_floats(cols));
          const Twin up = upload(random_floats(rows * cols, -2.0f, 2.0f));
          const Twin out = upload(std::vector<float>(sz(rows * cols), kNaN));
          for (bool on_cpu : {true, false}) {
            auto at = [&](const Twin& t) { return (on_cpu ? t.cpu : t.dev).as<float>(); };
            Backend& be = on_cpu ? *cpu_ : *dev_;
            BiasActArgs a{.act = act, .x = at(x), .bias = with_bias ? at(bias) : nullptr, .up = with_up ? at(up) : nullptr,
                          .rows = rows, .cols = cols, .out = at(out)};
            be.bias_act(a);
            a.x = at(in_place);
            a.out = nullptr;
            a.out_bf16 = reinterpret_cast<std::uint16_t*>(at(in_place));
            a.out_stride = 2 * cols;
            be.bias_act(a);
          }
          const auto [want, got] = download(out);
          EXPECT_TRUE(close(want, got, kF32Tol));
          const auto [want16, got16] = download<std::uint16_t>(in_place);
          std::vector<std::uint16_t> rows_cpu, rows_dev;  // the first half of each row
          for (std::int64_t r = 0; r < rows; ++r) {
            rows_cpu.insert(rows_cpu.end(), want16.begin() + r * 2 * cols, want16.begin() + r * 2 * cols + cols);
            rows_dev.insert(rows_dev.end(), got16.begin() + r * 2 * cols, got16.begin() + r * 2 * cols + cols);
          }
          EXPECT_TRUE(within(widened(rows_cpu), widened(rows_dev), kF32Tol, kBf16Unit));
        }
}

// ---------------------------------------------------------------------------- mixture of experts

// Routed experts' MLPs (moe_experts), fp32 and bf16 compute (the gather and the GLU then write
// bf16 rows the GEMMs read in place), rows of a width that takes the 16-byte path and one that
// does not. Weights scaled by 1/sqrt(fan-in) keep g = W_gate x and u = W_up x of size ~1. The
// tolerance: each GEMM's sum order (check_gemm's bound, at the largest h = silu(g) u the host
// computes in double, with the first GEMMs' error carried through h), plus under bf16 one bf16
// unit (2^-7) of h wherever the two backends' fp32 h fall on either side of a rounding boundary
// (a random walk over at most I such terms), times the k routing weights (< 1 each) of a row.
TEST_P(BackendOpsTest, MoeExpertsMatchCpu) {
  for (DType compute : {DType::F32, DType::BF16})
    for (std::int64_t H : {33, 64}) {
      SCOPED_TRACE(::testing::Message() << "compute " << dtype_name(compute) << " hidden " << H);
      const std::int64_t rows = 9, I = 40, E = 4, k = 2;
      const float s1 = 1.0f / std::sqrt(static_cast<float>(H)), s2 = 1.0f / std::sqrt(static_cast<float>(I));
      const std::vector<float> xh = random_floats(rows * H);
      std::vector<std::vector<float>> gate, up;
      std::vector<Twin> mats;
      for (std::int64_t e = 0; e < E; ++e) {
        gate.push_back(random_floats(I * H, -s1, s1));
        up.push_back(random_floats(I * H, -s1, s1));
        mats.push_back(upload(stored_rows(gate.back(), DType::BF16, I, H)));
        mats.push_back(upload(stored_rows(up.back(), DType::BF16, I, H)));
        mats.push_back(upload(stored_rows(random_floats(H * I, -s2, s2), DType::BF16, H, I)));
      }
      std::vector<std::int32_t> expert_of;
      for (std::int64_t r = 0; r < rows; ++r) {
        std::vector<std::int32_t> pick = {0, 1, 2, 3};
        std::shuffle(pick.begin(), pick.end(), rng_);
        expert_of.insert(expert_of.end(), pick.begin(), pick.begin() + k);
      }
      const std::vector<float> weight_of = random_floats(rows * k, 0.1f, 1.0f);
      const Twin x = upload(xh), y = upload(random_floats(rows * H));
      for (bool on_cpu : {true, false}) {
        std::vector<ExpertMatrices> experts;
        for (std::int64_t e = 0; e < E; ++e) {
          auto at = [&](std::int64_t i) { return (on_cpu ? mats[sz(3 * e + i)].cpu : mats[sz(3 * e + i)].dev).data(); };
          experts.push_back({{at(0), DType::BF16, I, H}, {at(1), DType::BF16, I, H}, {at(2), DType::BF16, H, I}});
        }
        (on_cpu ? *cpu_ : *dev_)
            .moe_experts({.x = (on_cpu ? x.cpu : x.dev).as<float>(), .rows = rows, .hidden = H, .top_k = k,
                          .expert_of = expert_of, .weight_of = weight_of, .experts = experts, .act = Activation::Silu,
                          .compute = compute, .y = (on_cpu ? y.cpu : y.dev).as<float>()});
      }
      double hmax = 0.0;  // the largest |silu(g) u| over the routed rows, in double
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < k; ++j) {
          const auto e = sz(expert_of[sz(r * k + j)]);
          for (std::int64_t i = 0; i < I; ++i) {
            double g = 0.0, u = 0.0;
            for (std::int64_t c = 0; c < H; ++c) {
              g += static_cast<double>(gate[e][sz(i * H + c)]) * xh[sz(r * H + c)];
              u += static_cast<double>(up[e][sz(i * H + c)]) * xh[sz(r * H + c)];
            }
            hmax = std::max(hmax, std::abs(g / (1.0 + std::exp(-g)) * u));
          }
        }
      const double round = compute == DType::BF16 ? 1.0 + kBF16Eps : 1.0;
      // An error e in g or u moves h by at most ~e (|u| + |silu(g)|) <= 2 e max(1, hmax).
      const double h_error = 2 * gemm_tolerance(compute, H, round, s1 * round, 0.0, 0.0) * std::max(1.0, hmax);
      const double sums = std::sqrt(static_cast<double>(I)) * s2 * h_error +
                          gemm_tolerance(compute, I, hmax * round, s2 * round, 0.0, 0.0);
      const double flips = compute == DType::BF16 ? 0x1p-7 * std::sqrt(static_cast<double>(I)) * s2 * hmax : 0.0;
      const auto [want, got] = download(y);
      EXPECT_TRUE(within(want, got, k * (sums + flips)));
    }
}

// ---------------------------------------------------------------------------- embedding

TEST_P(BackendOpsTest, EmbeddingAllDtypes) {
  const std::int64_t rows = 50, cols = 130, offset = 2;
  for (DType t : kWeightDTypes)
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " accumulate=" << accumulate);
      const Twin table = upload(stored_rows(random_floats(rows * cols, -2.0f, 2.0f), t, rows, cols));
      std::vector<std::int32_t> ids(23);
      for (auto& id : ids) id = static_cast<std::int32_t>(random_int(-offset, rows - offset - 1));
      const std::int64_t n = static_cast<std::int64_t>(ids.size());
      const Twin out = upload(accumulate ? random_floats(n * cols) : std::vector<float>(sz(n * cols), kNaN));
      for (bool on_cpu : {true, false}) {
        EmbeddingArgs a;
        a.ids = ids;
        a.offset = offset;
        a.table = MatrixRef{(on_cpu ? table.cpu : table.dev).data(), t, rows, cols};
        a.out = (on_cpu ? out.cpu : out.dev).as<float>();
        a.accumulate = accumulate;
        (on_cpu ? *cpu_ : *dev_).embedding(a);
      }
      const auto [want, got] = download(out);
      EXPECT_TRUE(identical(want, got));
    }
}

TEST_P(BackendOpsTest, EmbeddingOutOfRangeThrows) {
  const Twin table = upload(random_floats(4 * 8));
  const Twin out = upload(std::vector<float>(8));
  const std::vector<std::int32_t> ids = {0, 4};
  EmbeddingArgs a;
  a.ids = ids;
  a.table = MatrixRef{table.dev.data(), DType::F32, 4, 8};
  a.out = out.dev.as<float>();
  EXPECT_THROW(dev_->embedding(a), std::out_of_range);
}

// ---------------------------------------------------------------------------- attention prefill

void BackendOpsTest::check_prefill(std::int64_t H, std::int64_t Hkv, std::int64_t D,
                                   const std::vector<std::int64_t>& lens, bool with_col_sums, bool weighted,
                                   float softcap, std::int64_t window, DType compute) {
  SCOPED_TRACE(::testing::Message() << "prefill H=" << H << " Hkv=" << Hkv << " D=" << D << " col_sums="
                                    << with_col_sums << " weighted=" << weighted << " softcap=" << softcap
                                    << " window=" << window << " compute " << dtype_name(compute));
  std::vector<std::int64_t> offsets{0};
  for (std::int64_t n : lens) offsets.push_back(offsets.back() + n);
  const std::int64_t T = offsets.back();
  const Twin q = upload(random_floats(T * H * D, -2.0f, 2.0f));
  const Twin k = upload(random_floats(T * Hkv * D, -2.0f, 2.0f));
  const Twin v = upload(random_floats(T * Hkv * D));
  const Twin out = upload(std::vector<float>(sz(T * H * D), kNaN));
  const Twin cols = upload(std::vector<float>(sz(T * Hkv), kNaN));
  const std::vector<float> weights = weighted ? random_floats(T, 0.0f, 2.0f) : std::vector<float>{};
  for (bool on_cpu : {true, false}) {
    AttentionPrefillArgs a;
    a.shape = AttentionShape{H, Hkv, D, 1.0f / std::sqrt(static_cast<float>(D)), softcap, window};
    a.q = (on_cpu ? q.cpu : q.dev).as<float>();
    a.k = (on_cpu ? k.cpu : k.dev).as<float>();
    a.v = (on_cpu ? v.cpu : v.dev).as<float>();
    a.out = (on_cpu ? out.cpu : out.dev).as<float>();
    a.seq_offsets = offsets;
    a.col_sums = with_col_sums ? (on_cpu ? cols.cpu : cols.dev).as<float>() : nullptr;
    a.query_weights = weights;
    a.compute = compute;
    (on_cpu ? *cpu_ : *dev_).attention_prefill(a);
  }
  const std::int64_t longest = *std::max_element(lens.begin(), lens.end());
  const double rel = attention_rel_error(D, longest, 1.0 / std::sqrt(static_cast<double>(D)), 2.0, 2.0);
  const auto [want, got] = download(out);
  EXPECT_TRUE(within(want, got, rel * 1.0));  // |v| <= 1
  const auto [want_cols, got_cols] = download(cols);
  // A column sum adds up to group * n probabilities (weights <= 2), each off by rel relative.
  const double wmax = weighted ? 2.0 : 1.0;
  const std::int64_t terms = H / Hkv * longest;
  EXPECT_TRUE(within(want_cols, got_cols, sum_tolerance(kF32Eps, terms, wmax), rel + sum_tolerance(kF32Eps, terms, 1.0)));
  // (all NaN on both when not requested)
  if (with_col_sums && !weighted) {
    // The probabilities of each query sum to 1, so a sequence's column sums add up to
    // group * n: the sums use each query's final softmax (m, l), whatever the tiling.
    for (std::size_t b = 0; b + 1 < offsets.size(); ++b)
      for (std::int64_t g = 0; g < Hkv; ++g) {
        const std::int64_t n = lens[b];
        double total = 0;
        for (std::int64_t j = 0; j < n; ++j) total += got_cols[sz(offsets[b] * Hkv + g * n + j)];
        const double want_total = static_cast<double>(H / Hkv * n);
        EXPECT_NEAR(total, want_total, (rel + sum_tolerance(kF32Eps, terms, 1.0)) * want_total)
            << "sequence " << b << " kv head " << g;
      }
  }
}

TEST_P(BackendOpsTest, AttentionPrefillRaggedGqa) {
  const std::vector<std::int64_t> lens = {5, 1, 70, 0, 33, 130};
  for (bool col_sums : {false, true}) check_prefill(6, 2, 40, lens, col_sums, false);
  check_prefill(6, 2, 40, lens, true, true);
  check_prefill(4, 4, 64, lens, true, false);   // MHA
  check_prefill(8, 1, 128, {17, 65}, true, true);  // MQA
  check_prefill(2, 1, 3, {9}, true, false);     // head_dim below a warp
  check_prefill(6, 2, 40, lens, true, true, 3.0f, 0);  // Gemma-2's soft-capped scores
  check_prefill(6, 2, 40, lens, true, true, 0.0f, 40);  // a sliding window
}

// Many query and key tiles per sequence (16 and 32 rows), odd lengths at tile edges, and a
// head_dim whose tiles need more than 48 KiB of shared memory (the kernels opt in).
TEST_P(BackendOpsTest, AttentionPrefillTiles) {
  check_prefill(8, 2, 64, {300, 16, 17, 32, 33, 1}, true, false);
  check_prefill(8, 2, 64, {129, 47}, true, true);
  check_prefill(4, 1, 256, {70, 33}, true, false);
  check_prefill(8, 2, 64, {300, 70, 5}, true, true, 30.0f, 100);  // a window across several key tiles
}

// ---------------------------------------------------------------------------- attention prefill, bf16 compute

// The values a bf16 matrix unit multiplies: x rounded to bf16 (to nearest even).
std::vector<float> rounded_to_bf16(std::vector<float> x) {
  for (float& f : x) f = bf16_to_f32(f32_to_bf16(f));
  return x;
}

// Under bf16 compute a device may run prefill on bf16 matrix units (the CUDA backend's
// tensor-core kernel, for head_dim 64, 80, 96, 128 and 256): q, k and v rounded to bf16 (to
// nearest even), scores and outputs accumulated in fp32, each unnormalised probability rounded
// to bf16 before P V. The reference is the CPU's fp32 attention on q, k and v rounded to bf16 on
// the host, so both sides start from the same numbers and the tolerance is that of the rest:
//  - a score is a sum of D products that are exact in fp32 (8-bit significands), summed in
//    another order, and the normaliser and the outputs sums of up to n terms: attention_rel_error
//    counts that for fp32, and it is doubled since matrix units may truncate when they
//    accumulate (gemm_tolerance);
//  - the kernel rounds p_j = exp(s_j - m) to bf16 for P V and keeps the normaliser
//    l = sum_j p_j unrounded: |bf16(p_j) - p_j| <= u p_j (u = kBF16Eps = 2^-8, twice the
//    round-to-nearest bound), so the output sum_j bf16(p_j) v_j / l is off by at most
//    u sum_j p_j |v_j| / l <= u vmax, however many keys.
// So |out - ref| <= (2 rel + u) vmax. Against the CPU on the unrounded inputs the device must
// differ by more than fp32 arithmetic allows (inputs rounded by 2^-9 relative move outputs by
// ~1e-3, the fp32 bound is ~1e-4): that shows the tensor cores ran, not the fp32 kernel.
void BackendOpsTest::check_prefill_bf16(std::int64_t H, std::int64_t Hkv, std::int64_t D,
                                        const std::vector<std::int64_t>& lens, float softcap, std::int64_t window) {
  SCOPED_TRACE(::testing::Message() << "bf16 prefill H=" << H << " Hkv=" << Hkv << " D=" << D << " lens "
                                    << ::testing::PrintToString(lens) << " softcap=" << softcap << " window=" << window);
  std::vector<std::int64_t> offsets{0};
  for (std::int64_t n : lens) offsets.push_back(offsets.back() + n);
  const std::int64_t T = offsets.back();
  // The device gets the values as they are and rounds them itself; the CPU the rounded values.
  auto upload_exact_and_rounded = [&](const std::vector<float>& exact) {
    const std::vector<float> rounded = rounded_to_bf16(exact);
    Twin t{DeviceBuffer(*cpu_, exact.size() * sizeof(float)), DeviceBuffer(*dev_, exact.size() * sizeof(float))};
    cpu_->copy_to_device(t.cpu.data(), rounded.data(), t.cpu.bytes());
    dev_->copy_to_device(t.dev.data(), exact.data(), t.dev.bytes());
    return t;
  };
  const std::vector<float> qh = random_floats(T * H * D, -2.0f, 2.0f), kh = random_floats(T * Hkv * D, -2.0f, 2.0f),
                           vh = random_floats(T * Hkv * D);
  const Twin q = upload_exact_and_rounded(qh), k = upload_exact_and_rounded(kh), v = upload_exact_and_rounded(vh);
  const Twin out = upload(std::vector<float>(sz(T * H * D), kNaN));
  const Twin exact_out = upload(std::vector<float>(sz(T * H * D), kNaN));  // the CPU on unrounded inputs
  const Twin exact_q = upload(qh), exact_k = upload(kh), exact_v = upload(vh);
  auto args = [&](const Twin& q_in, const Twin& k_in, const Twin& v_in, const Twin& o, bool on_cpu) {
    AttentionPrefillArgs a;
    a.shape = AttentionShape{H, Hkv, D, 1.0f / std::sqrt(static_cast<float>(D)), softcap, window};
    a.q = (on_cpu ? q_in.cpu : q_in.dev).as<float>();
    a.k = (on_cpu ? k_in.cpu : k_in.dev).as<float>();
    a.v = (on_cpu ? v_in.cpu : v_in.dev).as<float>();
    a.out = (on_cpu ? o.cpu : o.dev).as<float>();
    a.seq_offsets = offsets;
    a.compute = DType::BF16;
    return a;
  };
  cpu_->attention_prefill(args(q, k, v, out, true));
  dev_->attention_prefill(args(q, k, v, out, false));
  cpu_->attention_prefill(args(exact_q, exact_k, exact_v, exact_out, true));
  const std::int64_t longest = *std::max_element(lens.begin(), lens.end());
  const double rel = attention_rel_error(D, longest, 1.0 / std::sqrt(static_cast<double>(D)), 2.0, 2.0);
  const auto [want, got] = download(out);
  EXPECT_TRUE(within(want, got, (2.0 * rel + kBF16Eps) * 1.0));  // |v| <= 1
  EXPECT_FALSE(within(download(*cpu_, exact_out.cpu), got, rel * 1.0)) << "the device did not round to bf16";
}

// Every head dim of the kernel, GQA groups of 1, 2, 3, 4 and 8, sequence lengths on both sides
// of the 64-row query tiles and of the 64- and 32-key tiles, an empty sequence among them.
TEST_P(BackendOpsTest, AttentionPrefillBf16HeadDimsAndGroups) {
  check_prefill_bf16(8, 2, 64, {1, 15, 17, 63, 129, 520});
  check_prefill_bf16(4, 4, 80, {17, 129, 0, 63});
  check_prefill_bf16(6, 2, 96, {129, 1, 70});
  check_prefill_bf16(8, 1, 128, {520, 15});
  check_prefill_bf16(6, 2, 256, {129, 17, 63, 1});
}

TEST_P(BackendOpsTest, AttentionPrefillBf16WindowAndSoftcap) {
  check_prefill_bf16(8, 2, 64, {520, 129, 1}, 0.0f, 100);  // a window across several key tiles
  check_prefill_bf16(8, 2, 64, {63, 17}, 0.0f, 1);         // each query sees only itself
  check_prefill_bf16(4, 2, 128, {129, 15}, 30.0f, 0);      // soft-capped scores
  check_prefill_bf16(4, 2, 256, {520, 17}, 50.0f, 64);     // Gemma-2: both, head_dim 256
}

// Head dims the tensor-core kernel lacks, and the column sums of the eviction policies, keep the
// fp32 kernels under bf16 compute: the fp32 tolerance holds.
TEST_P(BackendOpsTest, AttentionPrefillBf16FallsBackToFp32) {
  check_prefill(6, 2, 40, {5, 1, 70, 33}, false, false, 0.0f, 0, DType::BF16);
  check_prefill(8, 2, 64, {129, 47}, true, true, 0.0f, 0, DType::BF16);
}

// ---------------------------------------------------------------------------- attention decode

// Decode of `lens` (slots [0, capacity) per sequence and kv head) on both backends from the
// same bytes; slot_bias adds a random bias in [-1, 1] per slot; cache_offset starts both caches
// that many bytes into their buffers (a slot then is not 16-byte aligned: the value-by-value
// loads). The device runs twice and must give the same bits (no atomics, no timing).
void BackendOpsTest::check_decode(DType cache, std::int64_t H, std::int64_t Hkv, std::int64_t D,
                                  std::int64_t capacity, const std::vector<std::int64_t>& lens, bool with_probs,
                                  float softcap, std::int64_t window, bool slot_bias, std::int64_t cache_offset) {
  SCOPED_TRACE(::testing::Message() << "decode " << dtype_name(cache) << " H=" << H << " Hkv=" << Hkv << " D=" << D
                                    << " capacity=" << capacity << " probs=" << with_probs << " softcap=" << softcap
                                    << " window=" << window << " slot_bias=" << slot_bias
                                    << " cache_offset=" << cache_offset);
  const std::int64_t B = static_cast<std::int64_t>(lens.size());
  const std::int64_t slots = B * Hkv * capacity;
  auto offset_rows = [&](std::vector<std::uint8_t> rows) {
    rows.insert(rows.begin(), sz(cache_offset), std::uint8_t{0});
    return rows;
  };
  const Twin q = upload(random_floats(B * H * D, -2.0f, 2.0f));
  const Twin kc = upload(offset_rows(stored_rows(random_floats(slots * D, -2.0f, 2.0f), cache, slots, D)));
  const Twin vc = upload(offset_rows(stored_rows(random_floats(slots * D), cache, slots, D)));
  const Twin bias = upload(random_floats(slots));
  const Twin out = upload(std::vector<float>(sz(B * H * D), kNaN));
  const Twin probs = upload(std::vector<float>(sz(slots), kNaN));
  const Twin again = upload(std::vector<float>(sz(B * H * D), kNaN));
  const Twin probs_again = upload(std::vector<float>(sz(slots), kNaN));
  for (int run = 0; run < 3; ++run) {
    const bool on_cpu = run == 0;
    AttentionDecodeArgs a;
    a.shape = AttentionShape{H, Hkv, D, 1.0f / std::sqrt(static_cast<float>(D)), softcap, window};
    a.q = (on_cpu ? q.cpu : q.dev).as<float>();
    a.k_cache = (on_cpu ? kc.cpu : kc.dev).as<std::uint8_t>() + cache_offset;
    a.v_cache = (on_cpu ? vc.cpu : vc.dev).as<std::uint8_t>() + cache_offset;
    a.capacity = capacity;
    a.lens = lens;
    const Twin& o = run == 2 ? again : out;
    const Twin& p = run == 2 ? probs_again : probs;
    a.out = (on_cpu ? o.cpu : o.dev).as<float>();
    a.probs = with_probs ? (on_cpu ? p.cpu : p.dev).as<float>() : nullptr;
    a.cache_dtype = cache;
    a.slot_bias = slot_bias ? (on_cpu ? bias.cpu : bias.dev).as<float>() : nullptr;
    (on_cpu ? *cpu_ : *dev_).attention_decode(a);
  }
  const std::int64_t longest = *std::max_element(lens.begin(), lens.end());
  // Stored keys and values decode to at most their fp32 range plus a quantization step.
  const double step = is_quantized(cache) ? 4.0 / 15.0 : 0.0;
  const double rel = attention_rel_error(D, longest, 1.0 / std::sqrt(static_cast<double>(D)), 2.0, 2.0 + step);
  const auto [want, got] = download(out);
  EXPECT_TRUE(within(want, got, rel * (1.0 + step)));
  EXPECT_TRUE(identical(got, download(*dev_, again.dev)));
  const auto [want_p, got_p] = download(probs);
  EXPECT_TRUE(identical(got_p, download(*dev_, probs_again.dev)));
  const double rel_p = rel + sum_tolerance(kF32Eps, H / Hkv, 1.0);  // a sum over the group's heads
  // (Below the smallest normal float the relative precision of a probability is gone.)
  EXPECT_TRUE(within(want_p, got_p, std::numeric_limits<float>::min(), rel_p));  // past lens: NaN
  if (with_probs) {
    // Each head's probabilities sum to 1, so the group's sum to group: the probabilities use
    // the softmax's final (m, l) over all of the key splits.
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t g = 0; g < Hkv; ++g) {
        double total = 0;
        for (std::int64_t j = 0; j < lens[sz(b)]; ++j) total += got_p[sz((b * Hkv + g) * capacity + j)];
        const double want_total = static_cast<double>(H / Hkv);
        EXPECT_NEAR(total, want_total, (rel_p + sum_tolerance(kF32Eps, lens[sz(b)], 1.0)) * want_total)
            << "sequence " << b << " kv head " << g;
      }
  }
}

TEST_P(BackendOpsTest, AttentionDecodeAllCacheDtypes) {
  for (DType t : kAllDTypes) {
    check_decode(t, 8, 2, 72, 150, {1, 64, 65, 150, 97}, true);
    check_decode(t, 4, 4, 64, 40, {40, 3}, false);
    check_decode(t, 8, 2, 72, 150, {1, 64, 65, 150, 97}, true, 5.0f, 70);
  }
  check_decode(DType::F32, 12, 3, 128, 300, {300, 129, 1}, true);
}

// What the decode kernel branches on: the cache dtype (16-byte loads of f32/f16/bf16, 4-byte
// loads of q8/q4 codes), head_dim (lanes per key: 8 at 64, 16 at 72/80/128 with idle lanes at
// 72 and 80), the group (1, 2, 4 and 8 heads in registers), sequences of very unequal length
// (empty splits beside full ones) and of one key, slot biases and the kept scores.
TEST_P(BackendOpsTest, AttentionDecodeKernelBranches) {
  const std::vector<std::int64_t> lens = {1, 700, 3, 129};
  for (DType t : kAllDTypes)
    for (const auto& [H, Hkv, D] : std::vector<std::array<std::int64_t, 3>>{
             {16, 16, 64}, {8, 4, 128}, {16, 4, 80}, {16, 2, 72}}) {
      check_decode(t, H, Hkv, D, 700, lens, true, 0.0f, 0, true);
    }
  // Sliding window, soft cap and slot biases together, the group's 8 heads in one block.
  check_decode(DType::F16, 16, 2, 64, 700, lens, true, 30.0f, 200, true);
  check_decode(DType::BF16, 16, 16, 128, 700, lens, true, 50.0f, 64, true);
  // Many short sequences: one split, the output written by the kernel itself.
  std::vector<std::int64_t> short_lens;
  for (std::int64_t b = 0; b < 128; ++b) short_lens.push_back(1 + (b * 37) % 64);
  check_decode(DType::F16, 16, 16, 64, 64, short_lens, true, 0.0f, 0, true);
  check_decode(DType::Q8, 32, 8, 128, 64, short_lens, true);
}

// head_dim not a multiple of 8, and caches that start off 16-byte alignment, read value by
// value; head_dim above 256 (32 values a lane, a head per block) and at the largest a model
// may have (1024).
TEST_P(BackendOpsTest, AttentionDecodeOddLayouts) {
  for (DType t : {DType::F32, DType::F16, DType::Q4}) {
    check_decode(t, 6, 2, 100, 300, {300, 1, 77}, true, 0.0f, 0, true);
    check_decode(t, 2, 1, 3, 90, {90, 2}, true);
  }
  check_decode(DType::F32, 8, 2, 64, 200, {200, 5}, true, 0.0f, 0, true, 4);
  check_decode(DType::F16, 8, 2, 64, 200, {200, 5}, true, 0.0f, 0, true, 2);
  check_decode(DType::BF16, 8, 8, 128, 200, {200, 5}, true, 0.0f, 0, false, 6);
  check_decode(DType::Q8, 8, 2, 64, 200, {200, 5}, true, 0.0f, 0, false, 2);
  check_decode(DType::F16, 4, 2, 512, 300, {300, 31}, true, 0.0f, 0, true);
  check_decode(DType::BF16, 4, 1, 320, 300, {300, 31}, true, 10.0f, 100);
  check_decode(DType::Q4, 2, 2, 1024, 130, {130, 64}, true);
}

// Flash-decoding: LLaMA-3-8B's shape at batch 1 (8 kv heads of 4 query heads) over 2048 keys
// splits them across many blocks; a short sequence beside long ones leaves splits empty;
// groups of more than 8 heads run in chunks; head_dim 256 holds 8 heads of 8 values a lane.
TEST_P(BackendOpsTest, AttentionDecodeSplitsAndHeadChunks) {
  check_decode(DType::F32, 32, 8, 128, 2048, {2048}, true);
  check_decode(DType::Q4, 32, 8, 128, 2048, {1999}, true);
  check_decode(DType::F16, 16, 2, 64, 1500, {1, 1500, 700, 65}, true);
  check_decode(DType::F32, 24, 1, 64, 400, {400, 3}, true);  // one group of 24 heads: chunks of 8
  check_decode(DType::BF16, 12, 1, 96, 257, {257, 256}, true);  // chunks of 6
  check_decode(DType::Q8, 8, 2, 256, 300, {300, 31}, true);
  check_decode(DType::F32, 16, 2, 256, 300, {300, 31}, true, 0.0f, 0, true);
  check_decode(DType::F32, 32, 8, 128, 2048, {2048, 1500, 90}, true, 50.0f, 700);  // splits of the window only
}

// Cascade attention on the device (each prefix read from its own row only, in batches of member
// heads, kernels/cuda/decode_cascade.h) against the CPU's (grouped as well, attention_cpu.cc):
// within the decode kernel's tolerance (check_decode), fp32 throughout, also under bf16
// compute, where members stay off the tensor cores (whose bf16 rounding would exceed it).
TEST_P(BackendOpsTest, AttentionDecodeWithSharedPrefixes) {
  EXPECT_TRUE(dev_->reads_shared_prefixes_once());
  // Two groups (one of members with no own slot, one beyond, several; one of a prefix longer
  // than a 64-slot tile and not a multiple of it), a prefix without slots, queries of no group.
  SharedPrefixCall two;
  two.prefixes = {{0, 300}, {6, 130}, {9, 0}};
  two.lens = {300, 301, 340, 377, 305, 200, 131, 200, 130, 1, 12};
  two.prefix_of = {0, 0, 0, 0, 0, -1, 1, 1, 1, 2, -1};
  for (std::int64_t i = 0; i < 11; ++i) two.rows.push_back(i);
  for (const DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8}) {
    check_shared_prefixes(t, 9, 3, 64, two, 0.0f, DType::F32);
    check_shared_prefixes(t, 8, 2, 128, two, 0.0f, DType::F32);  // 32-slot tiles
  }
  check_shared_prefixes(DType::F16, 4, 4, 80, two, 30.0f, DType::F32);  // one head per kv head
  check_shared_prefixes(DType::F16, 2, 1, 512, two, 0.0f, DType::F32);   // one head a block, 32 values a lane
  check_shared_prefixes(DType::BF16, 6, 2, 36, two, 0.0f, DType::F32);   // value by value (head_dim % 8 != 0)
  // SmolLM2-135M's shape in the shared-prefix recipe: 32 members of a 991-slot prefix, 96 member
  // heads a kv head in 12 batches of 8 (a member's heads split across two).
  SharedPrefixCall recipe;
  recipe.prefixes = {{0, 991}};
  for (std::int64_t i = 0; i < 32; ++i) {
    recipe.rows.push_back(i);
    recipe.lens.push_back(992 + i % 7);
    recipe.prefix_of.push_back(0);
  }
  check_shared_prefixes(DType::F16, 9, 3, 64, recipe, 0.0f, DType::F32);
  // cache_rows: a prompt's 12 rows after a shared prefix (a run the tensor cores would take) and
  // two decode rows on other rows, one of them a member.
  SharedPrefixCall chunk;
  chunk.cache_rows = true;
  chunk.prefixes = {{0, 200}};
  for (std::int64_t i = 0; i < 12; ++i) {
    chunk.rows.push_back(1);
    chunk.lens.push_back(201 + i);
    chunk.prefix_of.push_back(0);
  }
  chunk.rows.insert(chunk.rows.end(), {0, 2});
  chunk.lens.insert(chunk.lens.end(), {203, 90});
  chunk.prefix_of.insert(chunk.prefix_of.end(), {0, -1});
  for (const DType compute : {DType::F32, DType::BF16})
    check_shared_prefixes(DType::F16, 9, 3, 64, chunk, 0.0f, compute);
  // Under a sliding window (each member sees its prefix from its window's first slot): one that
  // starts within the first group's prefix for some members and past it for others, and one
  // past every prefix.
  auto windowed = [&](const SharedPrefixCall& call) {
    for (const std::int64_t window : {50, 8}) {
      SharedPrefixCall w = call;
      w.window = window;
      check_shared_prefixes(DType::F16, 9, 3, 64, w, 0.0f, DType::F32);
    }
  };
  windowed(two);
  windowed(chunk);
  // The same calls with each prefix held once apart and the member rows after it.
  for (SharedPrefixCall* call : {&two, &recipe, &chunk}) call->held_apart = true;
  for (const DType t : {DType::F16, DType::Q8}) check_shared_prefixes(t, 9, 3, 64, two, 0.0f, DType::F32);
  check_shared_prefixes(DType::BF16, 6, 2, 36, two, 0.0f, DType::F32);
  check_shared_prefixes(DType::F16, 9, 3, 64, recipe, 0.0f, DType::F32);
  check_shared_prefixes(DType::F16, 9, 3, 64, chunk, 0.0f, DType::BF16);
  windowed(two);
  windowed(chunk);
}

// A call's cache moved to where held_apart puts it: prefix i's slots into row i of `prefix` (the
// prefix cache, `prefix_cap` slots a row), each member row's slots after its prefix to its slot 0
// on (`bases`, per query), NaN bytes past what a query may read.
struct HeldApart {
  std::vector<std::uint8_t> k, v;
  std::int64_t capacity = 0;
  std::vector<SharedPrefix> prefixes;
  std::vector<std::int64_t> bases;
};
HeldApart hold_apart(const SharedPrefixCall& call, std::vector<std::uint8_t>& k, std::vector<std::uint8_t>& v,
                     std::int64_t Hkv, std::int64_t cap, std::int64_t slot_bytes) {
  HeldApart held;
  held.capacity = 1;
  for (const SharedPrefix& p : call.prefixes) held.capacity = std::max(held.capacity, p.len);
  const std::int64_t head = cap * slot_bytes, prefix_head = held.capacity * slot_bytes;
  const auto n_prefixes = static_cast<std::int64_t>(call.prefixes.size());
  held.k.assign(sz(n_prefixes * Hkv * prefix_head), 0xff);
  held.v = held.k;
  for (std::int64_t i = 0; i < n_prefixes; ++i) {
    const SharedPrefix& p = call.prefixes[sz(i)];
    held.prefixes.push_back({i, p.len});
    for (std::int64_t g = 0; g < Hkv; ++g) {
      std::copy_n(k.begin() + (p.row * Hkv + g) * head, p.len * slot_bytes, held.k.begin() + (i * Hkv + g) * prefix_head);
      std::copy_n(v.begin() + (p.row * Hkv + g) * head, p.len * slot_bytes, held.v.begin() + (i * Hkv + g) * prefix_head);
    }
  }
  std::vector<std::int64_t> base_of_row(k.size() / sz(Hkv * head), 0);
  for (std::size_t b = 0; b < call.lens.size(); ++b) {
    const std::int64_t P = call.prefix_of[b] < 0 ? 0 : call.prefixes[sz(call.prefix_of[b])].len;
    base_of_row[sz(call.rows[b])] = P;
    held.bases.push_back(P);
  }
  for (std::size_t r = 0; r < base_of_row.size(); ++r)
    for (std::int64_t g = 0; g < Hkv; ++g)
      for (auto* cache : {&k, &v}) {
        const auto row = cache->begin() + (static_cast<std::int64_t>(r) * Hkv + g) * head;
        std::copy(row + base_of_row[r] * slot_bytes, row + head, row);
        std::fill(row + head - base_of_row[r] * slot_bytes, row + head, std::uint8_t{0xff});
      }
  return held;
}

void BackendOpsTest::check_shared_prefixes(DType cache, std::int64_t H, std::int64_t Hkv, std::int64_t D,
                                           const SharedPrefixCall& call, float softcap, DType compute) {
  SCOPED_TRACE(::testing::Message() << "shared prefixes " << dtype_name(cache) << " H=" << H << " Hkv=" << Hkv
                                    << " D=" << D << " softcap=" << softcap << " compute " << dtype_name(compute)
                                    << " queries " << call.lens.size() << " window " << call.window);
  const std::int64_t B = static_cast<std::int64_t>(call.lens.size());
  const std::int64_t cap = *std::max_element(call.lens.begin(), call.lens.end());
  const std::int64_t n_rows = *std::max_element(call.rows.begin(), call.rows.end()) + 1, slots = n_rows * Hkv * cap;
  const std::int64_t slot_bytes = kv_slot_bytes(cache, D), head = cap * slot_bytes;
  std::vector<std::uint8_t> k = stored_rows(random_floats(slots * D, -2.0f, 2.0f), cache, slots, D);
  std::vector<std::uint8_t> v = stored_rows(random_floats(slots * D), cache, slots, D);
  for (std::int64_t b = 0; b < B; ++b) {
    if (call.prefix_of[sz(b)] < 0) continue;
    const SharedPrefix& p = call.prefixes[sz(call.prefix_of[sz(b)])];
    for (std::int64_t g = 0; g < Hkv; ++g) {
      const std::int64_t from = (p.row * Hkv + g) * head, to = (call.rows[sz(b)] * Hkv + g) * head;
      std::copy_n(k.begin() + from, p.len * slot_bytes, k.begin() + to);
      std::copy_n(v.begin() + from, p.len * slot_bytes, v.begin() + to);
    }
  }
  HeldApart held;
  Twin pk, pv;
  if (call.held_apart) {
    held = hold_apart(call, k, v, Hkv, cap, slot_bytes);
    pk = upload(held.k);
    pv = upload(held.v);
  }
  const Twin q = upload(random_floats(B * H * D, -2.0f, 2.0f));
  const Twin kc = upload(k), vc = upload(v);
  const Twin out = upload(std::vector<float>(sz(B * H * D), kNaN));
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (const bool on_cpu : {true, false}) {
    AttentionDecodeArgs a{.shape = {H, Hkv, D, scale, softcap, call.window},
                                .q = (on_cpu ? q.cpu : q.dev).as<float>(),
                                .k_cache = (on_cpu ? kc.cpu : kc.dev).data(),
                                .v_cache = (on_cpu ? vc.cpu : vc.dev).data(),
                                .capacity = cap,
                                .lens = call.lens,
                                .out = (on_cpu ? out.cpu : out.dev).as<float>(),
                                .cache_dtype = cache,
                                .cache_rows = call.cache_rows ? std::span<const std::int64_t>(call.rows)
                                                              : std::span<const std::int64_t>(),
                                .compute = compute,
                                .shared_prefixes = call.prefixes,
                                .prefix_of = call.prefix_of};
    if (call.held_apart) {
      a.shared_prefixes = held.prefixes;
      a.prefix_cache = {(on_cpu ? pk.cpu : pk.dev).data(), (on_cpu ? pv.cpu : pv.dev).data(), held.capacity};
      a.row_base = held.bases;
    }
    (on_cpu ? *cpu_ : *dev_).attention_decode(a);
  }
  // Stored keys and values decode to at most their fp32 range plus a quantization step.
  const double step = is_quantized(cache) ? 4.0 / 15.0 : 0.0;
  const double rel = attention_rel_error(D, cap, scale, 2.0, 2.0 + step);
  const auto [want, got] = download(out);
  EXPECT_TRUE(within(want, got, rel * (1.0 + step)));
}

// ---------------------------------------------------------------------------- attention decode, runs on tensor cores

// The rows of `queries` (each `width` values) of x.
std::vector<float> rows_of(const std::vector<float>& x, const std::vector<std::int64_t>& queries, std::int64_t width) {
  std::vector<float> out;
  for (const std::int64_t q : queries) out.insert(out.end(), x.begin() + q * width, x.begin() + (q + 1) * width);
  return out;
}

// One decode call of `pieces` (cache_rows, lens growing by one within a piece). Under bf16
// compute the CUDA backend runs the runs of at least kMinTensorCoreRun queries on tensor cores
// (kernels/cuda/decode_runs.h decides which, and this test asks it) and the rest on the decode
// kernel. Tensor-core queries: q and the unnormalised probabilities rounded to bf16, the cache's
// keys and values read as bf16 (exact for a bf16 cache, rounded for an f16 one), fp32
// accumulation: the reference is the CPU's fp32 decode on q rounded to bf16 and an f32 cache of
// the cache's values rounded to bf16, and the tolerance that of check_prefill_bf16, (2 rel + u)
// vmax. They must also differ from the CPU on the unrounded q and cache by more than fp32
// allows (rel vmax): a silent fallback to the decode kernel fails. Every other query is the
// decode kernel's: within rel vmax of the unrounded CPU decode. The device runs twice and must
// give the same bits.
void BackendOpsTest::check_decode_runs(DType cache, std::int64_t H, std::int64_t Hkv, std::int64_t D,
                                       const std::vector<DecodePiece>& pieces, float softcap, std::int64_t window,
                                       DType compute) {
  SCOPED_TRACE(::testing::Message() << "decode runs " << dtype_name(cache) << " H=" << H << " Hkv=" << Hkv
                                    << " D=" << D << " softcap=" << softcap << " window=" << window << " compute "
                                    << dtype_name(compute));
  std::vector<std::int64_t> cache_rows, lens;
  std::int64_t capacity = 1;
  for (std::size_t p = 0; p < pieces.size(); ++p) {
    for (std::int64_t i = 0; i < pieces[p].queries; ++i) {
      cache_rows.push_back(static_cast<std::int64_t>(p));
      lens.push_back(pieces[p].prefix + 1 + i);
    }
    capacity = std::max(capacity, pieces[p].prefix + pieces[p].queries);
  }
  const std::int64_t B = static_cast<std::int64_t>(lens.size()), width = H * D;
  const std::int64_t slots = static_cast<std::int64_t>(pieces.size()) * Hkv * capacity;
  const std::vector<float> qh = random_floats(B * width, -2.0f, 2.0f);
  const std::vector<std::uint8_t> k_bytes = stored_rows(random_floats(slots * D, -2.0f, 2.0f), cache, slots, D);
  const std::vector<std::uint8_t> v_bytes = stored_rows(random_floats(slots * D), cache, slots, D);
  // What the tensor cores multiply: the cache's values rounded to bf16, in an f32 cache.
  auto as_bf16_f32 = [&](const std::vector<std::uint8_t>& bytes) {
    std::vector<float> values(sz(slots * D));
    convert_rows(bytes.data(), cache, values.data(), DType::F32, slots, D);
    return rounded_to_bf16(values);
  };
  const Twin q = upload(qh), q_rounded = upload(rounded_to_bf16(qh));
  const Twin kc = upload(k_bytes), vc = upload(v_bytes);
  const Twin kr = upload(as_bf16_f32(k_bytes)), vr = upload(as_bf16_f32(v_bytes));
  const Twin out = upload(std::vector<float>(sz(B * width), kNaN)), again = upload(std::vector<float>(sz(B * width), kNaN));
  const Twin want_rounded = upload(std::vector<float>(sz(B * width), kNaN));
  auto args = [&](const Twin& q_in, const Twin& k_in, const Twin& v_in, DType dtype, const Twin& o, bool on_cpu) {
    return AttentionDecodeArgs{.shape = {H, Hkv, D, 1.0f / std::sqrt(static_cast<float>(D)), softcap, window},
                               .q = (on_cpu ? q_in.cpu : q_in.dev).as<float>(),
                               .k_cache = (on_cpu ? k_in.cpu : k_in.dev).data(),
                               .v_cache = (on_cpu ? v_in.cpu : v_in.dev).data(),
                               .capacity = capacity,
                               .lens = lens,
                               .out = (on_cpu ? o.cpu : o.dev).as<float>(),
                               .cache_dtype = dtype,
                               .cache_rows = cache_rows,
                               .compute = compute};
  };
  cpu_->attention_decode(args(q, kc, vc, cache, out, true));
  cpu_->attention_decode(args(q_rounded, kr, vr, DType::F32, want_rounded, true));
  const AttentionDecodeArgs on_device = args(q, kc, vc, cache, out, false);
  dev_->attention_decode(on_device);
  dev_->attention_decode(args(q, kc, vc, cache, again, false));
  // The device's split of the queries (the tile size does not change which queries are in tiles).
  std::vector<std::int64_t> tensor_core, decode_kernel;
  if (cuda::decode_runs_on_tensor_cores(on_device)) {
    const DecodeQuerySplit split = split_decode_queries(cache_rows, lens, cuda::kMinTensorCoreRun, 64);
    for (const RunTile& t : split.tiles)
      for (std::int64_t i = 0; i < t.rows; ++i) tensor_core.push_back(t.first + i);
    decode_kernel = split.singles;
  } else {
    for (std::int64_t b = 0; b < B; ++b) decode_kernel.push_back(b);
  }
  std::int64_t longest = 0;
  for (const std::int64_t n : lens) longest = std::max(longest, n);
  const double rel = attention_rel_error(D, longest, 1.0 / std::sqrt(static_cast<double>(D)), 2.0, 2.0);
  const auto [exact, got] = download(out);
  const std::vector<float> rounded = download(*cpu_, want_rounded.cpu);
  EXPECT_TRUE(identical(got, download(*dev_, again.dev)));
  EXPECT_TRUE(within(rows_of(exact, decode_kernel, width), rows_of(got, decode_kernel, width), rel * 1.0));  // |v| <= 1
  if (tensor_core.empty()) return;
  EXPECT_TRUE(within(rows_of(rounded, tensor_core, width), rows_of(got, tensor_core, width), (2.0 * rel + kBF16Eps) * 1.0));
  EXPECT_FALSE(within(rows_of(exact, tensor_core, width), rows_of(got, tensor_core, width), rel * 1.0))
      << "the runs did not round to bf16 (the decode kernel ran them)";
}

// Decode rows, chunks of 17, 64 and 200 queries after 31, 0 and 1000 cached slots, and a
// one-query piece (stays on the decode kernel) in one call: f16 and bf16 caches, GQA and MHA,
// head_dim 64 and 128.
const std::vector<DecodePiece> kChunkedPrefill = {{40, 1}, {31, 17}, {700, 1}, {0, 64}, {1000, 200}, {31, 1}, {5, 1}};

TEST_P(BackendOpsTest, AttentionDecodeRunsOnTensorCores) {
  for (DType cache : {DType::F16, DType::BF16})
    for (const auto& [H, Hkv] : std::vector<std::pair<std::int64_t, std::int64_t>>{{8, 2}, {4, 4}})
      for (std::int64_t D : {64, 128}) check_decode_runs(cache, H, Hkv, D, kChunkedPrefill);
}

// The sliding window and soft-cap, the other head dims of the kernel (their 16-byte loads of a
// cache row come in batches of 1 at 80 and 2 at 96, and 32-key tiles at 256), runs that end
// 7 (below kMinTensorCoreRun), 8 and 65 queries in.
TEST_P(BackendOpsTest, AttentionDecodeRunsWindowSoftcapHeadDims) {
  check_decode_runs(DType::F16, 8, 2, 64, kChunkedPrefill, 0.0f, 100);
  check_decode_runs(DType::BF16, 4, 2, 128, kChunkedPrefill, 30.0f, 0);
  check_decode_runs(DType::BF16, 8, 2, 256, kChunkedPrefill, 50.0f, 64);
  check_decode_runs(DType::BF16, 4, 4, 80, {{3, 7}, {90, 8}, {2, 1}, {129, 65}});
  // Each query sees only itself: an f16 cache, whose values the tensor cores round, tells the paths apart.
  check_decode_runs(DType::F16, 6, 2, 96, {{3, 7}, {90, 8}, {2, 1}, {129, 65}}, 0.0f, 1);
}

// f32 compute, an f32 cache, and a head dim the kernel lacks keep the decode kernel for every
// query: the fp32 tolerance holds (the other fallbacks: tests/kernels/test_decode_runs.cc).
TEST_P(BackendOpsTest, AttentionDecodeRunsFallBack) {
  check_decode_runs(DType::F16, 8, 2, 64, kChunkedPrefill, 0.0f, 0, DType::F32);
  check_decode_runs(DType::F32, 8, 2, 64, kChunkedPrefill);
  check_decode_runs(DType::BF16, 8, 2, 72, kChunkedPrefill);
}

TEST_P(BackendOpsTest, AttentionDecodeRejectsBadLengths) {
  const Twin q = upload(random_floats(2 * 8)), kc = upload(random_floats(2 * 4 * 8)), out = upload(random_floats(2 * 8));
  const std::vector<std::int64_t> lens = {0};
  AttentionDecodeArgs a;
  a.shape = AttentionShape{2, 2, 8, 1.0f};
  a.q = q.dev.as<float>();
  a.k_cache = kc.dev.data();
  a.v_cache = kc.dev.data();
  a.capacity = 4;
  a.lens = lens;
  a.out = out.dev.as<float>();
  EXPECT_THROW(dev_->attention_decode(a), std::invalid_argument);
}

// ---------------------------------------------------------------------------- kv cache

TEST_P(BackendOpsTest, KvWriteSlotsAndHeadSlots) {
  const std::int64_t B = 3, Hkv = 3, D = 72, capacity = 10, rows = 7;
  for (DType t : kAllDTypes)
    for (bool per_head : {false, true}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " per_head=" << per_head);
      const std::int64_t slot_bytes = kv_slot_bytes(t, D);
      const Twin cache = upload(random_bytes(B * Hkv * capacity * slot_bytes));
      const Twin src = upload(random_floats(rows * Hkv * D, -3.0f, 3.0f));
      // Distinct (sequence, slot) per row, so no two rows write the same place.
      std::vector<std::int64_t> places(sz(B * capacity));
      std::iota(places.begin(), places.end(), 0);
      std::shuffle(places.begin(), places.end(), rng_);
      std::vector<std::int64_t> seq(sz(rows)), slot, head_slot;
      for (std::int64_t r = 0; r < rows; ++r) seq[sz(r)] = places[sz(r)] / capacity;
      if (per_head) {
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t g = 0; g < Hkv; ++g)  // -1 drops; else the row's slot shifted by the head
            head_slot.push_back(random_int(0, 3) == 0 ? -1 : (places[sz(r)] % capacity + g) % capacity);
      } else {
        for (std::int64_t r = 0; r < rows; ++r) slot.push_back(places[sz(r)] % capacity);
      }
      for (bool on_cpu : {true, false}) {
        KvWriteArgs a;
        a.src = (on_cpu ? src.cpu : src.dev).as<float>();
        a.cache = (on_cpu ? cache.cpu : cache.dev).data();
        a.n_kv_heads = Hkv;
        a.head_dim = D;
        a.capacity = capacity;
        a.seq = seq;
        a.slot = slot;
        a.head_slot = head_slot;
        a.cache_dtype = t;
        (on_cpu ? *cpu_ : *dev_).kv_write(a);
      }
      const auto [want, got] = download<std::uint8_t>(cache);
      EXPECT_TRUE(identical(want, got));
    }
}

TEST_P(BackendOpsTest, KvMoveInOrder) {
  const std::int64_t B = 2, Hkv = 3, D = 70, capacity = 12;
  for (DType t : kAllDTypes) {
    SCOPED_TRACE(dtype_name(t));
    const Twin cache = upload(random_bytes(B * Hkv * capacity * kv_slot_bytes(t, D)));
    const std::vector<KvMove> moves = {
        {0, 0, 11, 2}, {0, 0, 9, 5}, {1, 2, 7, 0},  // compaction: holes filled from the end
        {1, 1, 4, 3},  {1, 1, 5, 4}, {1, 1, 6, 5},  // a shift: each move overwrites the slot the previous one read
        {0, 2, 3, 3},                               // a no-op
    };
    for (bool on_cpu : {true, false}) {
      KvMoveArgs a;
      a.cache = (on_cpu ? cache.cpu : cache.dev).data();
      a.n_kv_heads = Hkv;
      a.head_dim = D;
      a.capacity = capacity;
      a.moves = moves;
      a.cache_dtype = t;
      (on_cpu ? *cpu_ : *dev_).kv_move(a);
    }
    const auto [want, got] = download<std::uint8_t>(cache);
    EXPECT_TRUE(identical(want, got));
  }
}

// KV merging on every cache dtype: the blends are the same fp32 arithmetic and the same
// conversion on both backends (identical bytes); the cosines differ in the order of their
// head_dim-term sums.
TEST_P(BackendOpsTest, KvMergeAndSimilarityMatchCpu) {
  const std::int64_t B = 2, Hkv = 3, D = 70, capacity = 12;
  const std::vector<KvMerge> merges = {{0, 0, 11, 2, 0.25f}, {0, 0, 9, 5, 0.9f}, {1, 2, 7, 0, 0.5f}, {1, 1, 4, 3, 1.0f}};
  const std::vector<KvSimilarityQuery> queries = {{0, 0, 11, 12}, {1, 2, 7, 9}, {1, 1, 0, 1}};
  for (DType t : kAllDTypes) {
    SCOPED_TRACE(dtype_name(t));
    const Twin cache = upload(stored_rows(random_floats(B * Hkv * capacity * D, -2.0f, 2.0f), t, B * Hkv * capacity, D));
    const Twin sim = upload(std::vector<float>(queries.size() * capacity, -7.0f));
    for (bool on_cpu : {true, false}) {
      Backend& be = on_cpu ? *cpu_ : *dev_;
      void* c = (on_cpu ? cache.cpu : cache.dev).data();
      be.kv_similarity({c, Hkv, D, capacity, queries, (on_cpu ? sim.cpu : sim.dev).as<float>(), t});
      be.kv_merge({c, Hkv, D, capacity, merges, t});
    }
    const auto [want, got] = download<std::uint8_t>(cache);
    EXPECT_TRUE(identical(want, got));
    const auto [sim_cpu, sim_dev] = download(sim);
    EXPECT_TRUE(within(sim_cpu, sim_dev, 3 * sum_tolerance(kF32Eps, D, 1.0)));
  }
}

// ---------------------------------------------------------------------------- sampling

TEST_P(BackendOpsTest, SampleMatchesCpu) {
  const std::int64_t batch = 6, vocab = 1003;
  const Twin logits = upload(random_floats(batch * vocab, -4.0f, 4.0f));
  std::vector<std::uint64_t> streams(sz(batch));
  for (auto& s : streams) s = static_cast<std::uint64_t>(random_int(0, 1 << 30));
  for (const SamplingParams& p : {SamplingParams{.temperature = 0.0f, .seed = 1}, SamplingParams{.temperature = 0.8f, .seed = 7},
                                  SamplingParams{.temperature = 1.0f, .top_p = 0.9f, .seed = 42},
                                  SamplingParams{.temperature = 0.5f, .top_p = 0.01f, .seed = 3}})
    for (std::uint64_t step : {0u, 1u, 17u}) {
      std::vector<std::int32_t> want(sz(batch), -1), got(sz(batch), -2);
      const std::vector<SamplingParams> params(sz(batch), p);
      const std::vector<std::uint64_t> steps(sz(batch), step);
      for (bool on_cpu : {true, false}) {
        SampleArgs a;
        a.logits = (on_cpu ? logits.cpu : logits.dev).as<float>();
        a.batch = batch;
        a.vocab = vocab;
        a.params = params;
        a.streams = streams;
        a.steps = steps;
        a.out = on_cpu ? std::span<std::int32_t>(want) : std::span<std::int32_t>(got);
        (on_cpu ? *cpu_ : *dev_).sample(a);
      }
      EXPECT_EQ(want, got) << "temperature " << p.temperature << " top_p " << p.top_p << " step " << step;
    }
}

// ---------------------------------------------------------------------------- copies

// H2D, D2D at odd offsets and D2H from several threads at once, odd sizes, one above the
// 64 MiB chunk size; every byte must come back.
TEST_P(BackendOpsTest, CopiesFromSeveralThreads) {
  const std::vector<std::size_t> sizes = {1, 3, 4097, (std::size_t{1} << 20) + 13};
  std::vector<std::vector<std::uint8_t>> inputs;
  for (int t = 0; t < 4; ++t)
    for (std::size_t n : sizes) inputs.push_back(random_bytes(static_cast<std::int64_t>(n)));
  inputs.push_back(random_bytes((std::int64_t{64} << 20) + 7));
  std::vector<std::string> errors(inputs.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t i = static_cast<std::size_t>(t); i < inputs.size(); i += 4) {
        try {
          const std::vector<std::uint8_t>& in = inputs[i];
          DeviceBuffer a(*dev_, in.size() + 5), b(*dev_, in.size() + 9);
          dev_->copy_to_device(static_cast<char*>(a.data()) + 1, in.data(), in.size());
          dev_->copy_on_device(static_cast<char*>(b.data()) + 3, static_cast<char*>(a.data()) + 1, in.size());
          std::vector<std::uint8_t> back(in.size() + 2, 0xab);
          dev_->copy_to_host(back.data() + 1, static_cast<char*>(b.data()) + 3, in.size());
          if (back.front() != 0xab || back.back() != 0xab) errors[i] = "wrote outside the destination";
          else if (std::memcmp(back.data() + 1, in.data(), in.size()) != 0) errors[i] = "bytes differ";
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (std::size_t i = 0; i < inputs.size(); ++i) EXPECT_EQ(errors[i], "") << "copy of " << inputs[i].size() << " bytes";
}

TEST_P(BackendOpsTest, OverlappingCopyOnDeviceIsMemmove) {
  const std::vector<std::uint8_t> bytes = random_bytes(20011);  // room for every shift below
  for (std::ptrdiff_t shift : {-4093, -1, 1, 17, 5000}) {
    SCOPED_TRACE(shift);
    const Twin buf = upload(bytes);
    const std::size_t n = 4999, src = 5000;
    const std::size_t dst = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(src) + shift);
    cpu_->copy_on_device(buf.cpu.as<char>() + dst, buf.cpu.as<char>() + src, n);
    dev_->copy_on_device(buf.dev.as<char>() + dst, buf.dev.as<char>() + src, n);
    const auto [want, got] = download<std::uint8_t>(buf);
    EXPECT_TRUE(identical(want, got));
  }
}

// A copy from another thread, right after an op was launched without synchronize(), sees
// the op's result (copies wait for the compute issued before them).
TEST_P(BackendOpsTest, CopySeesComputeLaunchedBeforeIt) {
  const std::int64_t n = std::int64_t{1} << 24;
  const Twin x = upload(std::vector<float>(sz(n), 1.0f)), y = upload(std::vector<float>(sz(n), 2.0f));
  for (int i = 0; i < 8; ++i) dev_->add(x.dev.as<float>(), y.dev.as<float>(), n);
  std::vector<float> back(sz(n));
  std::thread([&] { dev_->copy_to_host(back.data(), x.dev.data(), back.size() * sizeof(float)); }).join();
  EXPECT_EQ(std::count(back.begin(), back.end(), 17.0f), n);
}

TEST_P(BackendOpsTest, PinHost) {
  std::vector<std::uint8_t> host(1 << 20);
  if (dev_->pin_host(host.data(), host.size())) dev_->unpin_host(host.data());
  EXPECT_FALSE(dev_->pin_host(nullptr, 0));
}

#if defined(FLEXH2O_HAVE_CUDA) && FLEXH2O_HAVE_CUDA
TEST_P(BackendOpsTest, AllocReportsOutOfMemory) {
  std::size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  EXPECT_THROW(dev_->alloc(2 * total_bytes), std::bad_alloc);
  DeviceBuffer still_works(*dev_, 1024);  // the backend goes on after a failed allocation
  const Twin x = upload(random_floats(1000)), y = upload(random_floats(1000));
  cpu_->add(x.cpu.as<float>(), y.cpu.as<float>(), 1000);
  dev_->add(x.dev.as<float>(), y.dev.as<float>(), 1000);
  const auto [want, got] = download(x);
  EXPECT_TRUE(identical(want, got));
}
#endif

// ---------------------------------------------------------------------------- quantize kernels

#if defined(FLEXH2O_HAVE_CUDA) && FLEXH2O_HAVE_CUDA
TEST_P(BackendOpsTest, QuantizeRowsBitExact) {
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(dev_.get());
  if (cuda == nullptr) GTEST_SKIP() << "not the CUDA backend";
  for (DType t : {DType::Q4, DType::Q8, DType::Q4G32, DType::Q8G32})
    for (std::int64_t n : {1, 31, 32, 33, 63, 64, 65, 130, 257}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " n=" << n);
      const std::int64_t rows = 9;
      std::vector<float> x = random_floats(rows * n, -5.0f, 5.0f);
      for (std::int64_t i = 0; i < n; ++i) x[sz(n + i)] = 0.25f;  // a constant row: scale 0
      for (std::int64_t i = 0; i < n; ++i) x[sz(2 * n + i)] = (i % 2 ? -0.0f : 0.0f);
      for (std::int64_t i = 0; i < n; ++i) x[sz(3 * n + i)] = (i % 3 ? 60000.0f : -65000.0f);
      for (std::int64_t i = 0; i < n; ++i) x[sz(4 * n + i)] = 1e-6f * static_cast<float>(i % 7);
      // Non-finite and huge values: the shared code expression (kernels/quantize_code.h) gives
      // the top code to +inf and to positions beyond int's range on both backends.
      constexpr float kInf = std::numeric_limits<float>::infinity();
      for (std::int64_t i = 0; i < n; i += 5) x[sz(5 * n + i)] = kInf;
      for (std::int64_t i = 0; i < n; i += 3) x[sz(6 * n + i)] = i % 2 ? 3e38f : -1e30f;
      for (std::int64_t i = 0; i < n; ++i) x[sz(7 * n + i)] = i % 4 == 1 ? -kInf : (i % 4 == 3 ? 1e20f : x[sz(7 * n + i)]);
      // NaN inside groups (not first or last of one, where it would become the group's range).
      for (std::int64_t i = 1; i + 1 < n; i += 7)
        if (i % kQuantGroup != 0 && i % kQuantGroup != kQuantGroup - 1) x[sz(8 * n + i)] = kNaN;
      const std::vector<std::uint8_t> want = stored_rows(x, t, rows, n);
      DeviceBuffer xd(*dev_, x.size() * 4), qd(*dev_, want.size()), back(*dev_, x.size() * 4);
      dev_->copy_to_device(xd.data(), x.data(), xd.bytes());
      cuda->quantize_rows(xd.as<float>(), qd.data(), t, rows, n);
      EXPECT_TRUE(identical(want, download<std::uint8_t>(*dev_, qd)));
      // Dequantize the CPU's bytes on the device.
      dev_->copy_to_device(qd.data(), want.data(), want.size());
      cuda->dequantize_rows(qd.data(), t, back.as<float>(), rows, n);
      std::vector<float> want_f(x.size());
      convert_rows(want.data(), t, want_f.data(), DType::F32, rows, n);
      EXPECT_TRUE(identical(want_f, download<float>(*dev_, back)));
    }
}
#endif

// ---------------------------------------------------------------------------- strided copies, fences

// copy_regions: strided 2-D regions both ways (a KV row's heads), plain ones, and rows that
// are contiguous on both sides; only the regions' bytes change.
TEST_P(BackendOpsTest, CopyRegionsStrided) {
  const std::size_t heads = 7, head = 4096 + 12, width = 1000;
  const std::vector<std::uint8_t> host = random_bytes(static_cast<std::int64_t>(heads * head));
  const std::vector<std::uint8_t> fill = random_bytes(static_cast<std::int64_t>(heads * head));
  DeviceBuffer dev(*dev_, heads * head);
  dev_->copy_to_device(dev.data(), fill.data(), fill.size());
  const CopyRegion to_dev[] = {
      {static_cast<char*>(dev.data()) + 16, host.data() + 16, width, heads, head, head},  // strided
      {static_cast<char*>(dev.data()) + 2000, host.data() + 2000, 50},                    // plain
  };
  dev_->copy_regions(CopyDirection::ToDevice, to_dev, nullptr);
  std::vector<std::uint8_t> want = fill;
  for (std::size_t h = 0; h < heads; ++h) std::memcpy(want.data() + h * head + 16, host.data() + h * head + 16, width);
  std::memcpy(want.data() + 2000, host.data() + 2000, 50);
  EXPECT_TRUE(identical(want, download<std::uint8_t>(*dev_, dev)));

  std::vector<std::uint8_t> back(heads * head, 0x5a), back_want(heads * head, 0x5a);
  const CopyRegion to_host[] = {
      {back.data() + 3, static_cast<char*>(dev.data()) + 3, width, heads, head, head},
      {back.data() + head * 2, static_cast<char*>(dev.data()) + head * 2, head, 3, head, head},  // contiguous rows
  };
  dev_->copy_regions(CopyDirection::ToHost, to_host, dev_->fence().get());
  for (std::size_t h = 0; h < heads; ++h) std::memcpy(back_want.data() + h * head + 3, want.data() + h * head + 3, width);
  std::memcpy(back_want.data() + head * 2, want.data() + head * 2, head * 3);
  EXPECT_TRUE(identical(back_want, back));
}

#if defined(FLEXH2O_HAVE_CUDA) && FLEXH2O_HAVE_CUDA
// A copy with a fence waits for the ops before the fence and for no later one: with the
// compute stream held by a host function queued after the fence (and an add behind it), a
// copy behind that fence finishes; one behind a fence taken after the add sees its result.
TEST_P(BackendOpsTest, CopyWaitsForItsFenceOnly) {
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(dev_.get());
  if (cuda == nullptr) GTEST_SKIP() << "not the CUDA backend";
  const std::int64_t n = 4096;
  const Twin x = upload(std::vector<float>(sz(n), 1.0f)), y = upload(std::vector<float>(sz(n), 2.0f));
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  struct Hold {
    std::shared_future<void> opened;
  } hold{opened};
  const auto before = dev_->fence();
  ASSERT_EQ(cudaLaunchHostFunc(cuda->stream(), [](void* h) { static_cast<Hold*>(h)->opened.wait(); }, &hold),
            cudaSuccess);
  dev_->add(x.dev.as<float>(), y.dev.as<float>(), n);
  const auto after = dev_->fence();
  std::vector<float> early(sz(n)), late(sz(n));
  auto read = [&](std::vector<float>& out, const Fence* f) {
    const CopyRegion r{out.data(), x.dev.data(), out.size() * sizeof(float)};
    return std::async(std::launch::async, [&, r, f] { dev_->copy_regions(CopyDirection::ToHost, {&r, 1}, f); });
  };
  auto early_copy = read(early, before.get());
  const bool early_done = early_copy.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  auto late_copy = read(late, after.get());
  const bool late_waited = late_copy.wait_for(std::chrono::milliseconds(50)) == std::future_status::timeout;
  gate.set_value();  // whatever happened, release the stream before the futures are joined
  early_copy.get();
  late_copy.get();
  EXPECT_TRUE(early_done) << "a copy waited for an op queued after its fence";
  EXPECT_TRUE(late_waited) << "a copy did not wait for an op queued before its fence";
  EXPECT_EQ(std::count(early.begin(), early.end(), 1.0f), n);
  EXPECT_EQ(std::count(late.begin(), late.end(), 3.0f), n);
}
#endif

#if defined(FLEXH2O_HAVE_CUDA) && FLEXH2O_HAVE_CUDA
// Host threads block in their waits instead of spinning.
TEST_P(BackendOpsTest, DeviceUsesBlockingSync) {
  unsigned flags = 0;
  ASSERT_EQ(cudaGetDeviceFlags(&flags), cudaSuccess);
  EXPECT_EQ(flags & cudaDeviceScheduleMask, static_cast<unsigned>(cudaDeviceScheduleBlockingSync));
}

// ---------------------------------------------------------------------------- CUDA plans (no GPU needed)

// The attention scratch bound covers the decode partials and kept scores it is made of, for
// every length up to the capacity (the splits' rounding to whole tiles makes them not grow
// monotonically with the length), and grows with the shape.
TEST(CudaPlans, AttentionScratchCoversTheDecodeBuffers) {
  const AttentionShape s{32, 8, 128, 1.0f};
  const cuda::DecodePlan p = cuda::plan_decode(s, 4, 1024, 132);
  const std::int64_t partials = 4 * 32 * p.splits * (128 + 2) * 4;
  EXPECT_GE(cuda::attention_scratch(s, 4, 4, 1024, false, 132), partials);
  EXPECT_GE(cuda::attention_scratch(s, 4, 4, 1024, true, 132), partials + 4 * 32 * 1024 * 4);
  EXPECT_GE(cuda::attention_scratch(s, 8192, 4, 1024, true, 132), 8192 * 32 * 8);  // prefill (m, l) per row and head
  EXPECT_LE(cuda::attention_scratch(s, 4, 4, 1024, false, 132), cuda::attention_scratch(s, 4, 4, 1024, true, 132));
  const std::int64_t capacity = 100000;
  const std::int64_t bound = cuda::attention_scratch(s, 1, 1, capacity, false, 132);
  std::int64_t most_splits = 0;
  for (std::int64_t len = 1; len <= capacity; ++len) {
    const std::int64_t splits = cuda::plan_decode(s, 1, len, 132).splits;
    most_splits = std::max(most_splits, splits);
    ASSERT_GE(bound, 8 + 32 * splits * (128 + 2) * 4) << "len " << len;
  }
  EXPECT_GT(most_splits, cuda::plan_decode(s, 1, capacity, 132).splits);  // the case the loop is for
}

// cuBLAS is loaded at run time: a missing library is a reason, not a failed start.
TEST(CudaPlans, MissingCublasIsAReason) {
  EXPECT_EQ(cuda::cublas_library_name(), "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR));
  std::string why;
  EXPECT_FALSE(cuda::load_cublas("libcublas-not-installed.so.0", &why).has_value());
  EXPECT_NE(why.find("libcublas-not-installed.so.0"), std::string::npos) << why;
  EXPECT_NE(why.find("cannot be loaded"), std::string::npos) << why;
  // Where this host has cuBLAS, every function the backend calls is found.
  if (cuda::cublas_unavailable_reason().empty()) {
    EXPECT_NE(cuda::cublas().gemm_ex, nullptr);
  }
}
#endif

// ---------------------------------------------------------------------------- make_backend

TEST(MakeBackend, NamesAndFallback) {
  EXPECT_EQ(make_backend("cpu")->kind(), DeviceKind::Cpu);
  EXPECT_THROW(make_backend("tpu"), std::invalid_argument);
  const std::string why = cuda_unavailable_reason();
  if (!cuda_compiled()) {
    EXPECT_FALSE(why.empty());
  }
  if (why.empty()) {
    EXPECT_EQ(make_backend("cuda")->kind(), DeviceKind::Cuda);
    EXPECT_EQ(make_backend("auto")->kind(), DeviceKind::Cuda);
    EXPECT_EQ(make_backend("cuda")->name().rfind("cuda (", 0), 0u);
    return;
  }
  try {
    make_backend("cuda");
    ADD_FAILURE() << "make_backend(\"cuda\") did not throw without a usable device";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cuda"), std::string::npos) << msg;
    EXPECT_NE(msg.find(why), std::string::npos) << msg;
  }
  const auto fallback = make_backend("auto");
  EXPECT_EQ(fallback->kind(), DeviceKind::Cpu);
  EXPECT_EQ(fallback->name(), "cpu");
}

}  // namespace
}  // namespace flexh2o::kernels
