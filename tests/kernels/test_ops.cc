// Op tests of the compute backends against the double-precision references in
// reference_ops.h. Every test runs once per backend in backend_factories(), on fresh random
// data (mostly odd sizes, so that tile and vector widths leave remainders) from a seed that
// failure messages show; rerun a failure with --gtest_random_seed=N. Data moves through
// Backend::alloc and the copy calls only, so the same tests hold for a GPU backend.
// Outputs start as NaN wherever the op must write them, so unwritten elements fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "tests/kernels/reference_ops.h"
#include "tests/kernels/seeded_test.h"
#include "tests/support/fp_tolerance.h"

namespace flexh2o::kernels {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr DType kDTypes[] = {DType::F32, DType::F16, DType::BF16};
// Weight dtypes of the GEMM: the float ones and the group-quantized ones (kernels/quantize.h).
constexpr DType kWeightDTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q4, DType::Q8, DType::Q4G32, DType::Q8G32};

// A backend under test. `make` returns nullptr when the backend has no device on this
// machine (a CUDA build without a GPU): its instances skip.
struct BackendFactory {
  const char* name;
  std::unique_ptr<Backend> (*make)();
};

const std::vector<BackendFactory>& backend_factories() {
  static const std::vector<BackendFactory> factories = {{"cpu", &make_cpu_backend}};
  return factories;
}

void PrintTo(const BackendFactory& f, std::ostream* os) { *os << f.name; }

std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

std::vector<float> magnitudes(std::vector<float> v) {
  for (float& e : v) e = std::abs(e);
  return v;
}

// A weight matrix in its storage dtype, plus the fp32 values that storage holds. The
// reference reads the latter, so fp16/bf16 rounding is not counted as kernel error and
// the fp32 tolerances apply to every dtype.
struct StoredMatrix {
  std::vector<std::uint8_t> bytes;
  std::vector<float> values;
};

StoredMatrix store(std::span<const float> w, DType dtype) {
  StoredMatrix s{std::vector<std::uint8_t>(w.size() * dtype_size(dtype)), std::vector<float>(w.size())};
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (dtype == DType::F32) {
      s.values[i] = w[i];
      std::memcpy(s.bytes.data() + 4 * i, &w[i], 4);
      continue;
    }
    const std::uint16_t h = dtype == DType::F16 ? f32_to_f16(w[i]) : f32_to_bf16(w[i]);
    s.values[i] = dtype == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
    std::memcpy(s.bytes.data() + 2 * i, &h, 2);
  }
  return s;
}

// n rows of k values stored in any dtype, quantized ones included; values are what the rows
// decode to.
StoredMatrix store_rows(const std::vector<float>& w, DType dtype, std::int64_t n, std::int64_t k) {
  StoredMatrix s{stored_rows(w, dtype, n, k), std::vector<float>(w.size())};
  convert_rows(s.bytes.data(), dtype, s.values.data(), DType::F32, n, k);
  return s;
}

// Passes when |got[i] - ref[i]| <= tol(i) everywhere. A NaN reference marks an element the
// op must leave alone (it holds NaN poison), so the result must be NaN there too.
template <class Tol>
::testing::AssertionResult near_all(std::span<const float> got, std::span<const double> ref, Tol tol) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << "size " << got.size() << ", reference size " << ref.size();
  std::size_t bad = 0, first = 0;
  double worst = 0.0;  // largest error / tolerance, to show how far off it is
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::isnan(ref[i]) ? std::isnan(got[i]) : std::abs(got[i] - ref[i]) <= tol(i);
    if (ok) continue;
    if (bad++ == 0) first = i;
    if (!std::isnan(ref[i]) && tol(i) > 0.0) worst = std::max(worst, std::abs(got[i] - ref[i]) / tol(i));
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream msg;
  msg << std::setprecision(9) << bad << " of " << got.size() << " elements off; first [" << first << "]: got "
      << got[first] << ", want ";
  if (std::isnan(ref[first])) {
    msg << "NaN (left untouched)";
  } else {
    msg << ref[first] << " +- " << tol(first);
  }
  if (worst > 0.0) msg << "; worst error/tolerance " << worst;
  return ::testing::AssertionFailure() << msg.str();
}

// |got - ref| <= rel * max(1, |ref|): relative for large values, absolute near zero where
// relative error is meaningless after cancellation.
::testing::AssertionResult near_all(std::span<const float> got, std::span<const double> ref, double rel) {
  return near_all(got, ref, [&](std::size_t i) { return rel * std::max(1.0, std::abs(ref[i])); });
}

// For ops whose every output is one correctly rounded fp32 operation (or a copy): the
// result must be the reference rounded to fp32, bit for bit.
::testing::AssertionResult exact_all(std::span<const float> got, std::span<const double> ref) {
  std::vector<double> rounded(ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) rounded[i] = static_cast<float>(ref[i]);
  return near_all(got, rounded, [](std::size_t) { return 0.0; });
}

class OpsTest : public SeededTest, public ::testing::WithParamInterface<BackendFactory> {
 protected:
  void SetUp() override {
    backend_ = GetParam().make();
    if (!backend_) GTEST_SKIP() << GetParam().name << ": no device";
  }

  template <class T>
  DeviceBuffer upload(const std::vector<T>& host) {
    DeviceBuffer buf(*backend_, host.size() * sizeof(T));
    backend_->copy_to_device(buf.data(), host.data(), buf.bytes());
    return buf;
  }

  template <class T = float>
  std::vector<T> download(const DeviceBuffer& buf) {
    backend_->synchronize();
    std::vector<T> host(buf.bytes() / sizeof(T));
    backend_->copy_to_host(host.data(), buf.data(), buf.bytes());
    return host;
  }

  void check_gemm(DType dtype, std::int64_t m, std::int64_t k, std::int64_t n, bool with_bias, float beta,
                  DType compute = DType::F32);
  std::vector<std::int32_t> sample(const DeviceBuffer& logits, std::int64_t vocab, const SamplingParams& p,
                                   const std::vector<std::uint64_t>& streams, std::uint64_t step);
  std::vector<std::int32_t> draw_20000(const std::vector<float>& row, const SamplingParams& p);

  std::unique_ptr<Backend> backend_;
};

INSTANTIATE_TEST_SUITE_P(Backends, OpsTest, ::testing::ValuesIn(backend_factories()),
                         [](const ::testing::TestParamInfo<BackendFactory>& info) {
                           return std::string(info.param.name);
                         });

// ---------------------------------------------------------------------------- gemm

void OpsTest::check_gemm(DType dtype, std::int64_t m, std::int64_t k, std::int64_t n, bool with_bias, float beta,
                         DType compute) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " m=" << m << " k=" << k << " n=" << n
                                    << (with_bias ? " bias" : " no bias") << " beta=" << beta << " compute "
                                    << dtype_name(compute));
  const std::vector<float> x = random_floats(m * k);
  const StoredMatrix w = store_rows(random_floats(n * k), dtype, n, k);
  const std::vector<float> bias = with_bias ? random_floats(n) : std::vector<float>{};
  // beta = 0 must not read y (BLAS convention), so y starts as poison; beta = 1 adds to it.
  const std::vector<float> y0 = beta == 0.0f ? std::vector<float>(sz(m * n), kNaN) : random_floats(m * n);
  const DeviceBuffer dx = upload(x), dw = upload(w.bytes), dy = upload(y0);
  const DeviceBuffer db = with_bias ? upload(bias) : DeviceBuffer{};

  GemmArgs a;
  a.x = dx.as<float>();
  a.m = m;
  a.w = {dw.data(), dtype, n, k};
  a.bias = db.as<float>();
  a.y = dy.as<float>();
  a.beta = beta;
  a.compute = compute;
  backend_->gemm(a);

  // The rounding error of an fp32 dot product of length k grows like sqrt(k) * 2^-24 times
  // the size of its terms (random-walk rounding). With inputs in [-1, 1] that is about
  // 1e-7 * sqrt(k) * max(1, |y|); 1e-5 * sqrt(k) covers any summation order (blocked BLAS,
  // GPU split-k) and the bias and beta additions with a wide margin, while a wrong index
  // or a skipped term is off by O(1).
  // q8 weights on the few-row path expand in registers as one fused q * s + m, the stored
  // values as q * s then + m: each term differs by at most 2^-23 (|q s| + |m|) |x| <= 2^-21 |x|
  // (weights in [-1, 1]), inside the same bound.
  // bf16 compute multiplies bf16-rounded x and w exactly (8-bit significands) and sums in
  // fp32: the same sum of other terms, so the reference takes the rounded values.
  auto as_compute = [&](std::vector<float> v) {
    if (compute == DType::BF16)
      for (float& e : v) e = bf16_to_f32(f32_to_bf16(e));
    return v;
  };
  const std::vector<double> ref = ref::gemm(as_compute(x), m, as_compute(w.values), n, k, bias, beta, y0);
  EXPECT_TRUE(near_all(download(dy), ref, 1e-5 * std::sqrt(static_cast<double>(k))));
}

TEST_P(OpsTest, Gemm) {
  // On the CPU up to 8 rows take the few-row path where it applies, 4 rows at a time (6
  // leaves a remainder), more rows the tiled kernels (13, 17, 65: remainders of their 3-row
  // groups), q4 weights at few rows the tiled kernel and bf16 compute oneDNN (per path:
  // test_gemm_cpu_paths.cc).
  for (const DType dtype : kWeightDTypes)
    for (const std::int64_t m : {1, 3, 6, 13, 17, 65})
      for (const std::int64_t k : {7, 33, 129})
        for (const std::int64_t n : {5, 31, 257})
          for (const bool with_bias : {false, true})
            for (const float beta : {0.0f, 1.0f})
              for (const DType compute : {DType::F32, DType::BF16}) check_gemm(dtype, m, k, n, with_bias, beta, compute);
}

// x handed over already rounded to bf16 (GemmArgs::x_bf16, at a row stride past k) gives what
// bf16 compute gives from the fp32 x, bit for bit: the GEMM rounds x to the same values. Float
// weights (the CPU's int8 path for q4/q8 quantizes x itself, from the values it gets).
TEST_P(OpsTest, GemmTakesBf16X) {
  for (const DType dtype : kDTypes)
    for (const bool with_bias : {false, true})
      for (const std::int64_t m : {1, 5, 40}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " m=" << m << " bias " << with_bias);
        const std::int64_t k = 67, n = 45, stride = 2 * k;
        const std::vector<float> x = random_floats(m * k);
        std::vector<std::uint16_t> x16(sz(m * stride), 0xffff);  // NaN between the rows: never read
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t c = 0; c < k; ++c) x16[sz(i * stride + c)] = f32_to_bf16(x[sz(i * k + c)]);
        const StoredMatrix w = store_rows(random_floats(n * k), dtype, n, k);
        const DeviceBuffer dx = upload(x), dx16 = upload(x16), dw = upload(w.bytes), db = upload(random_floats(n));
        const std::vector<float> y0 = random_floats(m * n);
        const DeviceBuffer from_f32 = upload(y0), from_bf16 = upload(y0);
        GemmArgs a{.x = dx.as<float>(), .m = m, .w = {dw.data(), dtype, n, k}, .bias = with_bias ? db.as<float>() : nullptr,
                   .y = from_f32.as<float>(), .beta = 1.0f, .compute = DType::BF16};
        backend_->gemm(a);
        a.x = nullptr;
        a.x_bf16 = dx16.as<std::uint16_t>();
        a.x_stride = stride;
        a.y = from_bf16.as<float>();
        backend_->gemm(a);
        EXPECT_EQ(download(from_f32), download(from_bf16));
      }
}

TEST_P(OpsTest, GemmAcrossPanels) {
  // n = 1000 rows of k = 300 split into several weight panels whichever way the CPU sizes
  // them (from m: small panels for few rows, large ones for m > 16), so panel offsets into
  // w, y and bias are exercised.
  for (const DType dtype : kWeightDTypes)
    for (const std::int64_t m : {1, 4, 13, 33})
      for (const bool with_bias : {false, true})
        for (const float beta : {0.0f, 1.0f}) check_gemm(dtype, m, 300, 1000, with_bias, beta);
}

// ---------------------------------------------------------------------------- norms

// Each output is a few fp32 operations on the row statistics. Mean and variance reduce
// over at most 1000 elements, whose fp32 error (any order) stays below ~1e-6 relative, and
// the per-row offset in [-4, 4] costs at most 2^-24 * 4 / std(x) ~ 4e-7 in x - mean; hence
// 1e-5 relative.
constexpr double kNormTol = 1e-5;

TEST_P(OpsTest, LayerNorm) {
  for (const std::int64_t rows : {1, 3, 17})
    for (const std::int64_t cols : {7, 33, 257, 1000})
      for (const bool with_bias : {false, true})
        for (const bool in_place : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "rows=" << rows << " cols=" << cols << (with_bias ? " bias" : "")
                                            << (in_place ? " in place" : ""));
          std::vector<float> x = random_floats(rows * cols);
          std::uniform_real_distribution<float> offset(-4.0f, 4.0f);
          for (std::int64_t r = 0; r < rows; ++r) {
            const float o = offset(rng_);
            for (std::int64_t c = 0; c < cols; ++c) x[sz(r * cols + c)] += o;
          }
          const std::vector<float> weight = random_floats(cols, 0.5f, 1.5f);
          const std::vector<float> bias = with_bias ? random_floats(cols) : std::vector<float>{};
          const DeviceBuffer dx = upload(x), dw = upload(weight);
          const DeviceBuffer db = with_bias ? upload(bias) : DeviceBuffer{};
          const DeviceBuffer dy = in_place ? DeviceBuffer{} : upload(std::vector<float>(x.size(), kNaN));
          const DeviceBuffer& out = in_place ? dx : dy;

          NormArgs a;
          a.x = dx.as<float>();
          a.y = out.as<float>();
          a.rows = rows;
          a.cols = cols;
          a.weight = dw.as<float>();
          a.bias = db.as<float>();
          a.eps = 1e-5f;
          backend_->layer_norm(a);
          EXPECT_TRUE(near_all(download(out), ref::layer_norm(x, rows, cols, weight, bias, a.eps), kNormTol));
        }
}

TEST_P(OpsTest, RmsNorm) {
  for (const std::int64_t rows : {1, 3, 17})
    for (const std::int64_t cols : {7, 33, 257, 1000})
      for (const bool in_place : {false, true})
      for (const float offset : {0.0f, 1.0f}) {  // Gemma's (1 + w)
        SCOPED_TRACE(::testing::Message() << "rows=" << rows << " cols=" << cols << (in_place ? " in place" : "")
                                          << " weight offset " << offset);
        const std::vector<float> x = random_floats(rows * cols, -3.0f, 3.0f);
        const std::vector<float> weight = random_floats(cols, 0.5f, 1.5f);
        const DeviceBuffer dx = upload(x), dw = upload(weight);
        const DeviceBuffer dy = in_place ? DeviceBuffer{} : upload(std::vector<float>(x.size(), kNaN));
        const DeviceBuffer& out = in_place ? dx : dy;

        NormArgs a;
        a.x = dx.as<float>();
        a.y = out.as<float>();
        a.rows = rows;
        a.cols = cols;
        a.weight = dw.as<float>();
        a.eps = 1e-6f;
        a.weight_offset = offset;
        backend_->rms_norm(a);
        EXPECT_TRUE(near_all(download(out), ref::rms_norm(x, rows, cols, weight, a.eps, offset), kNormTol));
      }
}

// The fused forms of both norms (NormArgs): accumulate adds the normed row into y (a sandwich
// norm's residual add), y_bf16 takes it rounded to bf16. Each is the plain op's fp32 result
// added or rounded: accumulate within the plain op's tolerance plus one fp32 addition
// (2^-24 |sum|); bf16 out bit for bit the plain op's output rounded by f32_to_bf16, so a GEMM
// reading it gets what it would have rounded x to itself.
TEST_P(OpsTest, NormsFusedForms) {
  for (const bool layer : {true, false})
    for (const std::int64_t cols : {7, 256, 1000}) {
      SCOPED_TRACE(::testing::Message() << (layer ? "layer_norm" : "rms_norm") << " cols=" << cols);
      const std::int64_t rows = 5;
      const std::vector<float> x = random_floats(rows * cols, -3.0f, 2.0f);
      const std::vector<float> weight = random_floats(cols, 0.5f, 1.5f), bias = random_floats(cols);
      const std::vector<float> y0 = random_floats(rows * cols, -2.0f, 2.0f);
      const DeviceBuffer dx = upload(x), dw = upload(weight), db = upload(bias);
      const DeviceBuffer plain = upload(std::vector<float>(x.size(), kNaN)), summed = upload(y0);
      const DeviceBuffer rounded = upload(std::vector<std::uint16_t>(x.size(), 0xffff));
      auto run = [&](NormArgs a) {
        a.x = dx.as<float>();
        a.rows = rows;
        a.cols = cols;
        a.weight = dw.as<float>();
        a.bias = layer ? db.as<float>() : nullptr;
        a.weight_offset = layer ? 0.0f : 1.0f;
        layer ? backend_->layer_norm(a) : backend_->rms_norm(a);
      };
      run({.y = plain.as<float>()});
      run({.y = summed.as<float>(), .accumulate = true});
      run({.y_bf16 = rounded.as<std::uint16_t>()});
      const std::vector<float> normed = download(plain);
      const std::vector<double> ref = layer ? ref::layer_norm(x, rows, cols, weight, bias, 1e-5f)
                                            : ref::rms_norm(x, rows, cols, weight, 1e-5f, 1.0f);
      std::vector<double> ref_sum(ref.size());
      for (std::size_t i = 0; i < ref.size(); ++i) ref_sum[i] = y0[i] + ref[i];
      EXPECT_TRUE(near_all(download(summed), ref_sum, [&](std::size_t i) {
        return kNormTol * std::max(1.0, std::abs(ref[i])) + 0x1p-24 * std::abs(ref_sum[i]);
      }));
      const std::vector<std::uint16_t> got = download<std::uint16_t>(rounded);
      std::size_t mismatches = 0;
      for (std::size_t i = 0; i < got.size(); ++i) mismatches += got[i] != f32_to_bf16(normed[i]);
      EXPECT_EQ(mismatches, 0u) << "bf16 outputs that are not the fp32 output rounded";
    }
}

// ---------------------------------------------------------------------------- rope

TEST_P(OpsTest, Rope) {
  for (const RopeLayout layout : {RopeLayout::RotateHalf, RopeLayout::Interleaved})
    for (const std::int64_t tokens : {1, 5, 33})
      for (const std::int64_t heads : {1, 3})
        for (const std::int64_t head_dim : {8, 16, 64})
          for (const bool partial : {false, true})  // Phi-3 rotates the first half of a head
            for (const float attention_factor : {1.0f, 1.19f}) {  // YaRN / LongRoPE scale cos and sin
              const std::int64_t rotary_dim = partial ? head_dim / 2 : head_dim;
              SCOPED_TRACE(::testing::Message()
                           << (layout == RopeLayout::Interleaved ? "interleaved" : "rotate-half") << " tokens=" << tokens
                           << " heads=" << heads << " head_dim=" << head_dim << " rotary_dim=" << rotary_dim
                           << " attention_factor=" << attention_factor);
              const std::vector<float> x = random_floats(tokens * heads * head_dim);
              std::uniform_int_distribution<std::int32_t> pos(0, 4095);
              std::vector<std::int32_t> positions(sz(tokens));
              for (std::int32_t& p : positions) p = pos(rng_);
              positions[0] = 0;  // the identity rotation (scaled)
              // Frequencies of theta 10000 .. 500000, each scaled at random as the RoPE variants do.
              const double theta = random_floats(1, 1e4f, 5e5f)[0];
              std::vector<float> inv_freq(sz(rotary_dim / 2));
              for (std::int64_t i = 0; i < rotary_dim / 2; ++i)
                inv_freq[sz(i)] = static_cast<float>(std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim)) /
                                                     random_floats(1, 1.0f, 8.0f)[0]);
              const DeviceBuffer dx = upload(x);

              RopeArgs a;
              a.x = dx.as<float>();
              a.tokens = tokens;
              a.heads = heads;
              a.head_dim = head_dim;
              a.rotary_dim = rotary_dim;
              a.positions = positions;
              a.inv_freq = inv_freq;
              a.attention_factor = attention_factor;
              a.layout = layout;
              backend_->rope(a);

              // The fp32 angle p * inv_freq is off by up to 2^-24 relative (one rounded product),
              // i.e. p * 6e-8 rad, which moves an element by up to |pair| <= sqrt(2) times that
              // (and the factor): allow p * 4e-7 on top of 1e-5 relative.
              const std::vector<double> ref =
                  ref::rope(x, tokens, heads, head_dim, rotary_dim, positions, inv_freq, attention_factor, layout);
              EXPECT_TRUE(near_all(download(dx), ref, [&](std::size_t i) {
                return 1e-5 * std::max(1.0, std::abs(ref[i])) + 4e-7 * positions[i / sz(heads * head_dim)];
              }));
            }
}

TEST_P(OpsTest, RopeRejectsBadShapes) {
  std::vector<float> x(8, 0.0f);
  const std::vector<std::int32_t> positions = {0};
  const std::vector<float> inv_freq = {1.0f, 0.5f};
  const DeviceBuffer dx = upload(x);
  RopeArgs a;
  a.x = dx.as<float>();
  a.tokens = 1;
  a.heads = 1;
  a.head_dim = 8;
  a.positions = positions;
  a.inv_freq = inv_freq;
  for (const std::int64_t rotary_dim : {3, 10, 0, 6}) {  // odd, past head_dim, none, 3 pairs for 2 freqs
    a.rotary_dim = rotary_dim;
    EXPECT_THROW(backend_->rope(a), std::invalid_argument) << rotary_dim;
  }
}

// ---------------------------------------------------------------------------- element-wise

// Sizes around the CPU's 16384-element chunks and a GPU's block widths.
constexpr std::int64_t kElementwiseSizes[] = {1, 7, 1000, 2 * 16384 + 5};

constexpr Activation kSmoothActivations[] = {Activation::Gelu, Activation::GeluTanh, Activation::Silu};

TEST_P(OpsTest, Activations) {
  for (const std::int64_t n : kElementwiseSizes) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const std::vector<float> x = random_floats(n, -6.0f, 6.0f);
    const DeviceBuffer relu = upload(x);
    backend_->activation(Activation::Relu, relu.as<float>(), n);
    EXPECT_TRUE(exact_all(download(relu), ref::activation(Activation::Relu, x)));
    for (const Activation act : kSmoothActivations) {
      SCOPED_TRACE(::testing::Message() << "activation " << static_cast<int>(act));
      const DeviceBuffer d = upload(x);
      backend_->activation(act, d.as<float>(), n);
      // A few fp32 operations and one erf/tanh/exp (accurate to a few ulp): 1e-5 relative.
      EXPECT_TRUE(near_all(download(d), ref::activation(act, x), 1e-5));
    }
  }
}

TEST_P(OpsTest, Softcap) {
  for (const std::int64_t n : kElementwiseSizes) {
    const std::vector<float> x = random_floats(n, -100.0f, 100.0f);
    const DeviceBuffer d = upload(x);
    backend_->softcap(d.as<float>(), n, 30.0f);
    // A division, tanh and a product: a few ulp of results below 30, 1e-5 relative.
    EXPECT_TRUE(near_all(download(d), ref::softcap(x, 30.0), 1e-5)) << "n=" << n;
  }
}

TEST_P(OpsTest, GatedActivations) {
  enum class Alias { None, Gate, Up };
  constexpr const char* kAliasNames[] = {"nothing", "gate", "up"};
  for (const std::int64_t n : kElementwiseSizes)
    for (const Alias alias : {Alias::None, Alias::Gate, Alias::Up}) {
      for (const Activation act : {Activation::Silu, Activation::GeluTanh}) {  // SwiGLU, GeGLU
      SCOPED_TRACE(::testing::Message() << "n=" << n << " out aliases " << kAliasNames[static_cast<int>(alias)]
                                        << " activation " << static_cast<int>(act));
      const std::vector<float> gate = random_floats(n, -8.0f, 8.0f), up = random_floats(n, -2.0f, 2.0f);
      const DeviceBuffer dg = upload(gate), du = upload(up);
      const DeviceBuffer dout = alias == Alias::None ? upload(std::vector<float>(sz(n), kNaN)) : DeviceBuffer{};
      const DeviceBuffer& out = alias == Alias::Gate ? dg : alias == Alias::Up ? du : dout;
      backend_->glu(act, dg.as<float>(), du.as<float>(), out.as<float>(), n);
      // exp or tanh, a division and a product, each within a few ulp: 1e-5 relative.
      EXPECT_TRUE(near_all(download(out), ref::glu(act, gate, up), 1e-5));
      }
    }
}

// bias_act: act(x + bias) * up over rows of cols, every activation, with and without the bias
// and the up factor. fp32 out against the double reference (one rounded addition, the
// activation and a product: 1e-5 relative as above); bf16 out, into a buffer of its own with a
// row stride past cols (the gap untouched) and into x's own memory (stride 2 cols), bit for
// bit the fp32 output rounded by f32_to_bf16.
TEST_P(OpsTest, BiasAct) {
  for (const Activation act : {Activation::Relu, Activation::Gelu, Activation::GeluTanh, Activation::Silu})
    for (const bool with_bias : {false, true})
      for (const bool with_up : {false, true})
        for (const std::int64_t cols : {1, 37, 1024}) {
          SCOPED_TRACE(::testing::Message() << "activation " << static_cast<int>(act) << " bias " << with_bias
                                            << " up " << with_up << " cols " << cols);
          const std::int64_t rows = 3, stride = cols + 5;
          const std::vector<float> x = random_floats(rows * cols, -6.0f, 6.0f), bias = random_floats(cols);
          const std::vector<float> up = random_floats(rows * cols, -2.0f, 2.0f);
          const DeviceBuffer dx = upload(x), db = upload(bias), du = upload(up);
          const DeviceBuffer out = upload(std::vector<float>(x.size(), kNaN));
          const DeviceBuffer out16 = upload(std::vector<std::uint16_t>(sz(rows * stride), 0xffff));
          const DeviceBuffer in_place = upload(x);
          BiasActArgs a{.act = act, .x = dx.as<float>(), .bias = with_bias ? db.as<float>() : nullptr,
                        .up = with_up ? du.as<float>() : nullptr, .rows = rows, .cols = cols, .out = out.as<float>()};
          backend_->bias_act(a);
          a.out = nullptr;
          a.out_bf16 = out16.as<std::uint16_t>();
          a.out_stride = stride;
          backend_->bias_act(a);
          a.x = in_place.as<float>();
          a.out_bf16 = in_place.as<std::uint16_t>();
          a.out_stride = 2 * cols;
          backend_->bias_act(a);

          std::vector<double> ref(x.size());
          for (std::size_t i = 0; i < x.size(); ++i) {
            const float in = with_bias ? x[i] + bias[i % sz(cols)] : x[i];
            ref[i] = ref::activate(act, in) * (with_up ? up[i] : 1.0);
          }
          const std::vector<float> got = download(out);
          EXPECT_TRUE(near_all(got, ref, 1e-5));
          const std::vector<std::uint16_t> got16 = download<std::uint16_t>(out16), got_in_place = download<std::uint16_t>(in_place);
          std::size_t off_separate = 0, off_in_place = 0, gap_written = 0;
          for (std::int64_t r = 0; r < rows; ++r) {
            for (std::int64_t c = 0; c < cols; ++c) {
              const std::uint16_t want = f32_to_bf16(got[sz(r * cols + c)]);
              off_separate += got16[sz(r * stride + c)] != want;
              off_in_place += got_in_place[sz(r * 2 * cols + c)] != want;
            }
            for (std::int64_t c = cols; c < stride; ++c) gap_written += got16[sz(r * stride + c)] != 0xffff;
          }
          EXPECT_EQ(off_separate, 0u);
          EXPECT_EQ(off_in_place, 0u);
          EXPECT_EQ(gap_written, 0u);
        }
}

TEST_P(OpsTest, Add) {
  for (const std::int64_t n : kElementwiseSizes) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const std::vector<float> x = random_floats(n, -4.0f, 4.0f), y = random_floats(n, -4.0f, 4.0f);
    const DeviceBuffer dx = upload(x), dy = upload(y);
    backend_->add(dx.as<float>(), dy.as<float>(), n);
    // One fp32 addition: the exact double sum rounded to fp32.
    EXPECT_TRUE(exact_all(download(dx), ref::add(x, y)));
  }
}

// K/V rows rounded to a 16-bit cache's dtype: exactly the scalar conversion (DtypeTest checks
// it against every half and bf16 value), over magnitudes from f16's subnormals to past its
// overflow; other dtypes are refused.
TEST_P(OpsTest, RoundToDtype) {
  for (const DType t : {DType::F16, DType::BF16})
    for (const std::int64_t n : kElementwiseSizes) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " n=" << n);
      std::vector<float> x = random_floats(n);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(x[i], static_cast<int>(i % 53) - 32);
      const DeviceBuffer d = upload(x);
      backend_->round_to_dtype(t, d.as<float>(), n);
      const std::vector<float> got = download(d);
      std::size_t off = 0;  // bit for bit, infinities included
      for (std::size_t i = 0; i < x.size(); ++i)
        off += std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(round_to(t, x[i]));
      EXPECT_EQ(off, 0u);
    }
  float one = 1.0f;
  EXPECT_THROW(backend_->round_to_dtype(DType::Q8, &one, 1), std::invalid_argument);
  EXPECT_THROW(backend_->round_to_dtype(DType::F32, &one, 1), std::invalid_argument);
}

// ---------------------------------------------------------------------------- embedding

TEST_P(OpsTest, Embedding) {
  constexpr std::int64_t kRows = 50, kOffset = 2;  // OPT's learned positions start at row 2
  for (const DType dtype : kDTypes)
    for (const std::int64_t cols : {7, 64, 129})
      for (const bool accumulate : {false, true})
      for (const float scale : {1.0f, 48.0f}) {  // Gemma scales by sqrt(hidden): a power of two is exact
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dtype) << " cols=" << cols << (accumulate ? " accumulate" : "") << " scale " << scale);
        const StoredMatrix table = store(random_floats(kRows * cols), dtype);
        // Both ends of the valid range, a repeat, and random ids.
        std::vector<std::int32_t> ids = {0, kRows - kOffset - 1, 5, 5};
        std::uniform_int_distribution<std::int32_t> id(0, kRows - kOffset - 1);
        for (int i = 0; i < 5; ++i) ids.push_back(id(rng_));
        const std::int64_t n = static_cast<std::int64_t>(ids.size());
        const std::vector<float> out0 =
            accumulate ? random_floats(n * cols) : std::vector<float>(sz(n * cols), kNaN);
        const DeviceBuffer dt = upload(table.bytes), dout = upload(out0);

        EmbeddingArgs a;
        a.ids = ids;
        a.offset = kOffset;
        a.table = {dt.data(), dtype, kRows, cols};
        a.out = dout.as<float>();
        a.accumulate = accumulate;
        a.scale = scale;
        backend_->embedding(a);
        // A copy and one fp32 product, plus one fp32 addition: within a rounding of each.
        const auto want = ref::embedding(ids, kOffset, table.values, cols, accumulate, out0, scale);
        // Each rounding is at most 2^-24 of the size of the terms it combines.
        const auto size = ref::embedding(ids, kOffset, magnitudes(table.values), cols, accumulate, magnitudes(out0), scale);
        if (scale == 1.0f)
          EXPECT_TRUE(exact_all(download(dout), want));
        else
          EXPECT_TRUE(near_all(download(dout), want, [&](std::size_t i) { return 2 * testing::kF32Eps * size[i]; }));
      }
}

TEST_P(OpsTest, EmbeddingOutOfRangeThrows) {
  constexpr std::int64_t kRows = 10, kCols = 4;
  const StoredMatrix table = store(random_floats(kRows * kCols), DType::F32);
  const DeviceBuffer dt = upload(table.bytes), dout = upload(std::vector<float>(2 * kCols, kNaN));
  // Row ids[i] + offset: 8 + 2 is one past the end, -3 + 2 is before the start.
  for (const std::int32_t bad : {8, -3}) {
    SCOPED_TRACE(::testing::Message() << "id " << bad);
    const std::vector<std::int32_t> ids = {0, bad};
    EmbeddingArgs a;
    a.ids = ids;
    a.offset = 2;
    a.table = {dt.data(), DType::F32, kRows, kCols};
    a.out = dout.as<float>();
    EXPECT_THROW(backend_->embedding(a), std::out_of_range);
  }
}

// ---------------------------------------------------------------------------- attention

struct AttentionConfig {
  std::int64_t n_heads, n_kv_heads, head_dim;
};
// GQA groups of 1, 2 and 4 query heads per kv head, and a single kv head (MQA).
constexpr AttentionConfig kAttentionConfigs[] = {{2, 2, 8}, {4, 2, 16}, {8, 2, 64}, {4, 1, 16}};

// Plain attention, Gemma-2's soft-capped scores, and a sliding window shorter than most
// sequences (and crossing the CPU's 64-query tiles).
struct AttentionVariant {
  float softcap;
  std::int64_t window;
};
constexpr AttentionVariant kAttentionVariants[] = {{0.0f, 0}, {3.0f, 0}, {0.0f, 40}, {5.0f, 70}};

AttentionShape shape_of(const AttentionConfig& c, const AttentionVariant& v = {}) {
  return {c.n_heads, c.n_kv_heads, c.head_dim, static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim))),
          v.softcap, v.window};
}

// Scores are fp32 dot products over head_dim <= 64, outputs fp32 sums of p * v over up to
// 150 keys (|v| <= 1, sum p = 1), column sums fp32 sums of up to group * 150 probabilities.
// Their rounding grows like sqrt(reduction length) * 2^-24, a few 1e-6 at most;
// 1e-5 * sqrt(64) relative also leaves room for a GPU's fast exp and summation order.
constexpr double kAttentionTol = 8e-5;

TEST_P(OpsTest, AttentionPrefill) {
  // Ragged lengths, incl. length 1 and sequences across the CPU's 64-query tiles.
  const std::vector<std::int64_t> lens = {1, 150, 5, 64, 65, 1};
  std::vector<std::int64_t> offsets = {0};
  for (const std::int64_t n : lens) offsets.push_back(offsets.back() + n);
  const std::int64_t T = offsets.back();

  for (const AttentionConfig& c : kAttentionConfigs)
    for (const int col_mode : {0, 1, 2})  // no column sums, plain, weighted by query
    for (const AttentionVariant& variant : kAttentionVariants) {
      const bool with_col_sums = col_mode > 0;
      SCOPED_TRACE(::testing::Message() << "heads=" << c.n_heads << " kv_heads=" << c.n_kv_heads
                                        << " head_dim=" << c.head_dim << " col_mode " << col_mode << " softcap "
                                        << variant.softcap << " window " << variant.window);
      const AttentionShape s = shape_of(c, variant);
      // q in [-3, 3] gives peaked as well as flat softmax rows.
      const std::vector<float> q = random_floats(T * c.n_heads * c.head_dim, -3.0f, 3.0f);
      const std::vector<float> k = random_floats(T * c.n_kv_heads * c.head_dim);
      const std::vector<float> v = random_floats(T * c.n_kv_heads * c.head_dim);
      const DeviceBuffer dq = upload(q), dk = upload(k), dv = upload(v);
      const DeviceBuffer dout = upload(std::vector<float>(q.size(), kNaN));
      const DeviceBuffer dcol = with_col_sums ? upload(std::vector<float>(sz(T * c.n_kv_heads), kNaN)) : DeviceBuffer{};

      AttentionPrefillArgs a;
      a.shape = s;
      a.q = dq.as<float>();
      a.k = dk.as<float>();
      a.v = dv.as<float>();
      a.out = dout.as<float>();
      a.seq_offsets = offsets;
      a.col_sums = dcol.as<float>();
      // Observer weights as eviction policies use them: zeros among a random ramp.
      std::vector<float> weights;
      if (col_mode == 2) weights = random_floats(T, 0.0f, 1.2f);
      for (std::size_t i = 0; i < weights.size(); i += 3) weights[i] = 0.0f;
      a.query_weights = weights;
      backend_->attention_prefill(a);

      const ref::PrefillResult ref = ref::attention_prefill(s, q, k, v, offsets, weights);
      EXPECT_TRUE(near_all(download(dout), ref.out, kAttentionTol));
      if (with_col_sums) {
        EXPECT_TRUE(near_all(download(dcol), ref.col_sums, kAttentionTol));
      }
    }
}

TEST_P(OpsTest, AttentionDecode) {
  const std::vector<std::int64_t> lens = {1, 17, 64, 100, 150};
  constexpr std::int64_t kCapacity = 160;
  const std::int64_t B = static_cast<std::int64_t>(lens.size());

  for (const AttentionConfig& c : kAttentionConfigs)
    for (const bool with_probs : {false, true})
    for (const bool with_bias : {false, true})
    for (const AttentionVariant& variant : kAttentionVariants) {
      SCOPED_TRACE(::testing::Message() << "heads=" << c.n_heads << " kv_heads=" << c.n_kv_heads
                                        << " head_dim=" << c.head_dim << (with_probs ? " probs" : "")
                                        << (with_bias ? " slot bias" : "") << " softcap " << variant.softcap
                                        << " window " << variant.window);
      const AttentionShape s = shape_of(c, variant);
      const std::int64_t D = c.head_dim, cache_size = B * c.n_kv_heads * kCapacity * D;
      const std::vector<float> q = random_floats(B * c.n_heads * D, -3.0f, 3.0f);
      std::vector<float> k = random_floats(cache_size), v = random_floats(cache_size);
      // Slots >= len hold no token (old or uninitialised data): NaN there must not leak.
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t g = 0; g < c.n_kv_heads; ++g) {
          const std::int64_t begin = ((b * c.n_kv_heads + g) * kCapacity + lens[sz(b)]) * D;
          const std::int64_t end = (b * c.n_kv_heads + g + 1) * kCapacity * D;
          std::fill(k.begin() + begin, k.begin() + end, kNaN);
          std::fill(v.begin() + begin, v.begin() + end, kNaN);
        }
      // All NaN: slots < len must be written, slots >= len left untouched.
      const std::vector<float> probs0(sz(B * c.n_kv_heads * kCapacity), kNaN);
      const DeviceBuffer dq = upload(q), dk = upload(k), dv = upload(v);
      const DeviceBuffer dout = upload(std::vector<float>(q.size(), kNaN));
      const DeviceBuffer dprobs = with_probs ? upload(probs0) : DeviceBuffer{};
      // Merged slots' log-masses (0 .. log 2); NaN beyond lens[b], which must not be read.
      std::vector<float> bias = with_bias ? random_floats(sz(B * c.n_kv_heads * kCapacity), 0.0f, 0.7f)
                                          : std::vector<float>{};
      if (with_bias)
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t g = 0; g < c.n_kv_heads; ++g)
            std::fill(bias.begin() + (b * c.n_kv_heads + g) * kCapacity + lens[sz(b)],
                      bias.begin() + (b * c.n_kv_heads + g + 1) * kCapacity, kNaN);
      const DeviceBuffer dbias = with_bias ? upload(bias) : DeviceBuffer{};

      AttentionDecodeArgs a;
      a.shape = s;
      a.q = dq.as<float>();
      a.k_cache = dk.as<float>();
      a.v_cache = dv.as<float>();
      a.capacity = kCapacity;
      a.lens = lens;
      a.out = dout.as<float>();
      a.probs = dprobs.as<float>();
      a.slot_bias = dbias.as<float>();
      backend_->attention_decode(a);

      const ref::DecodeResult ref = ref::attention_decode(s, q, k, v, kCapacity, lens, probs0, bias);
      EXPECT_TRUE(near_all(download(dout), ref.out, kAttentionTol));
      if (with_probs) {
        EXPECT_TRUE(near_all(download(dprobs), ref.probs, kAttentionTol));
      }
    }
}

// Several queries reading one cache row (cache_rows), each with its own length: a prompt's rows
// appended to a cached prefix. Against the reference on the rows gathered per query.
TEST_P(OpsTest, AttentionDecodeCacheRows) {
  constexpr std::int64_t kRows = 3, kCapacity = 90;
  const std::vector<std::int64_t> cache_rows = {2, 2, 2, 0, 2, 1, 0};
  const std::vector<std::int64_t> lens = {40, 41, 42, 1, 90, 17, 2};
  const std::int64_t B = static_cast<std::int64_t>(lens.size());
  for (const AttentionConfig& c : kAttentionConfigs)
    for (const AttentionVariant& variant : kAttentionVariants) {
      SCOPED_TRACE(::testing::Message() << "heads=" << c.n_heads << " kv_heads=" << c.n_kv_heads
                                        << " head_dim=" << c.head_dim << " window " << variant.window);
      const AttentionShape s = shape_of(c, variant);
      const std::int64_t row_size = c.n_kv_heads * kCapacity * c.head_dim;
      const std::vector<float> q = random_floats(B * c.n_heads * c.head_dim, -3.0f, 3.0f);
      const std::vector<float> k = random_floats(kRows * row_size), v = random_floats(kRows * row_size);
      std::vector<float> k_per_query, v_per_query;
      for (const std::int64_t r : cache_rows) {
        k_per_query.insert(k_per_query.end(), k.begin() + r * row_size, k.begin() + (r + 1) * row_size);
        v_per_query.insert(v_per_query.end(), v.begin() + r * row_size, v.begin() + (r + 1) * row_size);
      }
      const DeviceBuffer dq = upload(q), dk = upload(k), dv = upload(v);
      const DeviceBuffer dout = upload(std::vector<float>(q.size(), kNaN));
      backend_->attention_decode({.shape = s, .q = dq.as<float>(), .k_cache = dk.as<float>(), .v_cache = dv.as<float>(),
                                  .capacity = kCapacity, .lens = lens, .out = dout.as<float>(),
                                  .cache_rows = cache_rows});
      const std::vector<float> no_probs(sz(B * c.n_kv_heads * kCapacity), 0.0f);
      const ref::DecodeResult ref = ref::attention_decode(s, q, k_per_query, v_per_query, kCapacity, lens, no_probs);
      EXPECT_TRUE(near_all(download(dout), ref.out, kAttentionTol));
    }
  const AttentionShape s{.n_heads = 2, .n_kv_heads = 1, .head_dim = 8, .scale = 0.5f};
  const std::vector<std::int64_t> one_len = {1}, two_rows = {0, 0}, negative = {-1};
  float probs[8];
  EXPECT_THROW(backend_->attention_decode({.shape = s, .capacity = 4, .lens = one_len, .cache_rows = two_rows}),
               std::invalid_argument);
  EXPECT_THROW(backend_->attention_decode({.shape = s, .capacity = 4, .lens = one_len, .cache_rows = negative}),
               std::out_of_range);
  const std::vector<std::int64_t> row0 = {0};
  EXPECT_THROW(
      backend_->attention_decode({.shape = s, .capacity = 4, .lens = one_len, .probs = probs, .cache_rows = row0}),
      std::invalid_argument);
  EXPECT_THROW(backend_->attention_decode({.shape = s, .capacity = 4, .lens = one_len, .compute = DType::F16}),
               std::invalid_argument);
}

TEST_P(OpsTest, KvWrite) {
  constexpr std::int64_t kSeqs = 3, kCapacity = 13, kRows = 10;
  for (const std::int64_t n_kv_heads : {1, 2})
    for (const std::int64_t head_dim : {8, 64}) {
      SCOPED_TRACE(::testing::Message() << "kv_heads=" << n_kv_heads << " head_dim=" << head_dim);
      // Distinct random (sequence, slot) targets.
      std::vector<std::int64_t> targets(sz(kSeqs * kCapacity));
      std::iota(targets.begin(), targets.end(), 0);
      std::shuffle(targets.begin(), targets.end(), rng_);
      std::vector<std::int64_t> seq, slot;
      for (std::int64_t r = 0; r < kRows; ++r) {
        seq.push_back(targets[sz(r)] / kCapacity);
        slot.push_back(targets[sz(r)] % kCapacity);
      }
      const std::vector<float> src = random_floats(kRows * n_kv_heads * head_dim);
      const std::vector<float> cache0 = random_floats(kSeqs * n_kv_heads * kCapacity * head_dim);
      const DeviceBuffer dsrc = upload(src), dcache = upload(cache0);

      KvWriteArgs a;
      a.src = dsrc.as<float>();
      a.cache = dcache.as<float>();
      a.n_kv_heads = n_kv_heads;
      a.head_dim = head_dim;
      a.capacity = kCapacity;
      a.seq = seq;
      a.slot = slot;
      backend_->kv_write(a);
      EXPECT_TRUE(exact_all(download(dcache), ref::kv_write(src, cache0, n_kv_heads, head_dim, kCapacity, seq, slot)));

      // A slot per (row, kv head), some dropped: what an eviction policy keeps at prefill.
      // Shifting the distinct targets by the head keeps them distinct within every head.
      std::vector<std::int64_t> head_slot;
      for (std::int64_t r = 0; r < kRows; ++r)
        for (std::int64_t g = 0; g < n_kv_heads; ++g)
          head_slot.push_back(rng_() % 4 == 0 ? -1 : static_cast<std::int64_t>((slot[sz(r)] + g) % kCapacity));
      const DeviceBuffer dcache2 = upload(cache0);
      a.cache = dcache2.as<float>();
      a.head_slot = head_slot;
      backend_->kv_write(a);
      EXPECT_TRUE(exact_all(download(dcache2),
                            ref::kv_write_per_head(src, cache0, n_kv_heads, head_dim, kCapacity, seq, head_slot)));
    }
}

TEST_P(OpsTest, KvMove) {
  constexpr std::int64_t kSeqs = 2, kHeads = 3, kCapacity = 9, kDim = 16;
  const std::vector<float> cache0 = random_floats(kSeqs * kHeads * kCapacity * kDim);
  // Every (seq, head) moves its last slot into a random lower one, as compaction does.
  std::vector<KvMove> moves;
  std::vector<double> want(cache0.begin(), cache0.end());
  for (std::int64_t b = 0; b < kSeqs; ++b)
    for (std::int64_t g = 0; g < kHeads; ++g) {
      const std::int64_t to = static_cast<std::int64_t>(rng_() % (kCapacity - 1));
      moves.push_back({b, g, kCapacity - 1, to});
      const std::int64_t base = (b * kHeads + g) * kCapacity;
      for (std::int64_t d = 0; d < kDim; ++d)
        want[sz((base + to) * kDim + d)] = cache0[sz((base + kCapacity - 1) * kDim + d)];
    }
  const DeviceBuffer dcache = upload(cache0);
  backend_->kv_move({dcache.as<float>(), kHeads, kDim, kCapacity, moves});
  EXPECT_TRUE(exact_all(download(dcache), want));
  moves[0].to = kCapacity;
  EXPECT_THROW(backend_->kv_move({dcache.as<float>(), kHeads, kDim, kCapacity, moves}), std::out_of_range);
}

// Cosines of random keys, zero keys (0) included; slots >= len keep their prior content.
// head_dim 13 leaves a tail beyond the 8-wide vector loop.
TEST_P(OpsTest, KvSimilarity) {
  constexpr std::int64_t kSeqs = 2, kHeads = 3, kCapacity = 11;
  for (const std::int64_t D : {8, 13, 64}) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << D);
    std::vector<float> cache = random_floats(kSeqs * kHeads * kCapacity * D);
    std::fill_n(cache.begin() + ((1 * kHeads + 2) * kCapacity + 4) * D, D, 0.0f);  // a zero key
    const std::vector<KvSimilarityQuery> queries = {{0, 0, 3, 11}, {0, 2, 0, 5}, {1, 2, 6, 9}, {1, 2, 4, 7}};
    const std::vector<float> out0(queries.size() * kCapacity, -7.0f);
    const DeviceBuffer dcache = upload(cache), dout = upload(out0);
    backend_->kv_similarity({dcache.as<float>(), kHeads, D, kCapacity, queries, dout.as<float>()});
    // Two dot products of D terms of |x| <= 1 (norms up to sqrt(D)), a square root and a
    // division: each relative error a few roundings of sqrt(D) terms.
    const double tol = 3 * flexh2o::testing::sum_tolerance(flexh2o::testing::kF32Eps, D, 1.0);
    EXPECT_TRUE(near_all(download(dout), ref::kv_similarity(cache, kHeads, D, kCapacity, queries, out0),
                         [&](std::size_t) { return tol; }));
    const std::vector<KvSimilarityQuery> bad = {{0, 0, 3, kCapacity + 1}};
    EXPECT_THROW(backend_->kv_similarity({dcache.as<float>(), kHeads, D, kCapacity, bad, dout.as<float>()}),
                 std::out_of_range);
  }
}

// Blends of random rows into other slots of their heads; other slots and the sources unchanged.
TEST_P(OpsTest, KvMerge) {
  constexpr std::int64_t kSeqs = 2, kHeads = 3, kCapacity = 9, kDim = 40;
  const std::vector<float> cache0 = random_floats(kSeqs * kHeads * kCapacity * kDim, -2.0f, 2.0f);
  std::vector<KvMerge> merges;
  for (std::int64_t b = 0; b < kSeqs; ++b)
    for (std::int64_t g = 0; g < kHeads; ++g) {
      const auto to = static_cast<std::int64_t>(rng_() % (kCapacity - 1));
      merges.push_back({b, g, kCapacity - 1, to, random_floats(1, 0.0f, 1.0f)[0]});
    }
  const DeviceBuffer dcache = upload(cache0);
  backend_->kv_merge({dcache.as<float>(), kHeads, kDim, kCapacity, merges});
  // (1 - w), two products and a sum, each rounding at most 2^-24 of a value <= 2; twice that.
  const double tol = 2 * 4 * 2 * flexh2o::testing::kF32Eps;
  EXPECT_TRUE(near_all(download(dcache), ref::kv_merge(cache0, kHeads, kDim, kCapacity, merges),
                       [&](std::size_t) { return tol; }));
  // Order-free: two merges into one slot, or out of a slot another writes, are refused.
  std::vector<KvMerge> twice = {{0, 0, 8, 1, 0.5f}, {0, 0, 7, 1, 0.5f}}, chained = {{0, 0, 8, 1, 0.5f}, {0, 0, 1, 2, 0.5f}};
  EXPECT_THROW(backend_->kv_merge({dcache.as<float>(), kHeads, kDim, kCapacity, twice}), std::invalid_argument);
  EXPECT_THROW(backend_->kv_merge({dcache.as<float>(), kHeads, kDim, kCapacity, chained}), std::invalid_argument);
  const std::vector<KvMerge> outside = {{0, 0, 8, kCapacity, 0.5f}};
  EXPECT_THROW(backend_->kv_merge({dcache.as<float>(), kHeads, kDim, kCapacity, outside}), std::out_of_range);
}

// ---------------------------------------------------------------------------- sampling

std::vector<std::int32_t> OpsTest::sample(const DeviceBuffer& logits, std::int64_t vocab, const SamplingParams& p,
                                          const std::vector<std::uint64_t>& streams, std::uint64_t step) {
  std::vector<std::int32_t> out(streams.size(), -1);
  const std::vector<SamplingParams> params(streams.size(), p);
  const std::vector<std::uint64_t> steps(streams.size(), step);
  SampleArgs a;
  a.logits = logits.as<float>();
  a.batch = static_cast<std::int64_t>(streams.size());
  a.vocab = vocab;
  a.params = params;
  a.streams = streams;
  a.steps = steps;
  a.out = out;
  backend_->sample(a);
  return out;
}

std::vector<std::uint64_t> iota_streams(std::size_t n) {
  std::vector<std::uint64_t> s(n);
  std::iota(s.begin(), s.end(), std::uint64_t{0});
  return s;
}

std::int32_t argmax(std::span<const float> row) {
  return static_cast<std::int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

TEST_P(OpsTest, SampleGreedy) {
  constexpr std::int64_t kVocab = 1000;
  std::vector<float> logits = random_floats(4 * kVocab);
  logits[kVocab + 17] = logits[kVocab + 500] = 5.0f;                           // row 1: tie, lowest id wins
  std::fill(logits.begin() + 2 * kVocab, logits.begin() + 3 * kVocab, 0.25f);  // row 2: all tied
  logits[4 * kVocab - 1] = 5.0f;                                               // row 3: maximum at the end
  const std::vector<std::int32_t> want = {argmax(std::span(logits).first(kVocab)), 17, 0, kVocab - 1};
  const DeviceBuffer d = upload(logits);
  for (const float temperature : {0.0f, -1.0f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.seed = rng_();
    EXPECT_EQ(sample(d, kVocab, p, iota_streams(4), 3), want) << "temperature " << temperature;
  }
}

TEST_P(OpsTest, SampleIsCounterBased) {
  // 64 rows of the same nearly flat distribution over 1000 tokens: two independent draws
  // coincide with probability ~1e-3, so rows of different streams, steps or seeds differ.
  constexpr std::int64_t kVocab = 1000, kBatch = 64;
  const std::vector<float> row = random_floats(kVocab, 0.0f, 1.0f);
  std::vector<float> logits;
  for (std::int64_t r = 0; r < kBatch; ++r) logits.insert(logits.end(), row.begin(), row.end());
  const DeviceBuffer d = upload(logits);
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = rng_();
  std::vector<std::uint64_t> streams(kBatch);
  for (std::uint64_t& s : streams) s = (std::uint64_t{rng_()} << 32) | rng_();

  const std::vector<std::int32_t> first = sample(d, kVocab, p, streams, 7);
  EXPECT_EQ(sample(d, kVocab, p, streams, 7), first) << "same (seed, stream, step), same token";
  // A stream's token does not depend on its row in the batch.
  std::vector<std::uint64_t> reversed(streams.rbegin(), streams.rend());
  std::vector<std::int32_t> back = sample(d, kVocab, p, reversed, 7);
  std::reverse(back.begin(), back.end());
  EXPECT_EQ(back, first) << "batch position changed the tokens";

  const auto count_differing = [&](const std::vector<std::int32_t>& other) {
    std::int64_t n = 0;
    for (std::size_t i = 0; i < first.size(); ++i) n += other[i] != first[i];
    return n;
  };
  EXPECT_GE(std::set<std::int32_t>(first.begin(), first.end()).size(), 48u) << "streams should draw independently";
  EXPECT_GE(count_differing(sample(d, kVocab, p, streams, 8)), 56) << "steps should draw independently";
  SamplingParams other_seed = p;
  other_seed.seed = p.seed + 1;
  EXPECT_GE(count_differing(sample(d, kVocab, other_seed, streams, 7)), 56) << "seeds should draw independently";
}

TEST_P(OpsTest, SampleTinyTopPIsArgmax) {
  constexpr std::int64_t kVocab = 257, kBatch = 32;
  const std::vector<float> logits = random_floats(kBatch * kVocab, -3.0f, 3.0f);
  std::vector<std::int32_t> want;
  for (std::int64_t r = 0; r < kBatch; ++r) want.push_back(argmax(std::span(logits).subspan(sz(r * kVocab), kVocab)));
  const DeviceBuffer d = upload(logits);
  for (const float temperature : {0.5f, 1.0f, 2.0f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.top_p = 1e-6f;  // the nucleus is the most likely token alone
    p.seed = rng_();
    for (std::uint64_t step = 0; step < 10; ++step)
      EXPECT_EQ(sample(d, kVocab, p, iota_streams(kBatch), step), want)
          << "temperature " << temperature << " step " << step;
  }
}

// How often each token came up in `draws`.
std::vector<double> token_frequencies(const std::vector<std::int32_t>& draws, std::int64_t vocab) {
  std::vector<double> freq(sz(vocab), 0.0);
  for (const std::int32_t t : draws) {
    if (t < 0 || t >= vocab) {
      ADD_FAILURE() << "token " << t << " outside the vocabulary";
      continue;
    }
    freq[sz(t)] += 1.0 / static_cast<double>(draws.size());
  }
  return freq;
}

// 20000 draws from one logits row: 100 copies of it (streams 0..99) at steps 0..199. A
// frequency over 20000 draws has standard deviation <= 0.0036, so 0.02 is > 5 sigma.
std::vector<std::int32_t> OpsTest::draw_20000(const std::vector<float>& row, const SamplingParams& p) {
  constexpr std::int64_t kBatch = 100, kSteps = 200;
  std::vector<float> logits;
  for (std::int64_t r = 0; r < kBatch; ++r) logits.insert(logits.end(), row.begin(), row.end());
  const DeviceBuffer d = upload(logits);
  std::vector<std::int32_t> draws;
  for (std::uint64_t step = 0; step < kSteps; ++step) {
    const std::vector<std::int32_t> out =
        sample(d, static_cast<std::int64_t>(row.size()), p, iota_streams(kBatch), step);
    draws.insert(draws.end(), out.begin(), out.end());
  }
  return draws;
}

// Over 5.6 standard deviations of a frequency of 20000 draws (at most sqrt(0.25 / 20000)).
constexpr double kFrequencyTol = 0.02;

TEST_P(OpsTest, SampleFrequencies) {
  const std::vector<float> row = random_floats(5, -1.5f, 1.5f);
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = rng_();
  const std::vector<double> freq = token_frequencies(draw_20000(row, p), 5);
  const std::vector<double> want = ref::sampling_distribution(row, 1.0f, 1.0f);
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(freq[i], want[i], kFrequencyTol) << "token " << i;
}

TEST_P(OpsTest, SampleNucleus) {
  // Probabilities {0.4, 0.3, 0.2, 0.1} at top_p 0.5: the nucleus is {0, 1} (0.4 < 0.5 <= 0.7),
  // renormalised to {4/7, 3/7}.
  const std::vector<float> row = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.5f;
  p.seed = rng_();
  const std::vector<double> freq = token_frequencies(draw_20000(row, p), 4);
  EXPECT_EQ(freq[2], 0.0);
  EXPECT_EQ(freq[3], 0.0);
  EXPECT_NEAR(freq[0], 4.0 / 7.0, kFrequencyTol);
  EXPECT_NEAR(freq[1], 3.0 / 7.0, kFrequencyTol);
}

TEST_P(OpsTest, SampleMatchesReference) {
  // Tokens must not depend on the backend: every backend maps the draw
  // sampling_uniform(seed, stream, step) to a token as the reference does.
  constexpr std::int64_t kVocab = 300, kBatch = 64;
  const std::vector<float> logits = random_floats(kBatch * kVocab, -4.0f, 4.0f);
  const DeviceBuffer d = upload(logits);
  std::vector<std::uint64_t> streams(kBatch);
  for (std::uint64_t& s : streams) s = (std::uint64_t{rng_()} << 32) | rng_();
  const std::pair<float, float> settings[] = {{0.0f, 1.0f}, {0.7f, 0.9f}, {1.0f, 1.0f}, {1.5f, 0.3f}};
  for (const auto& [temperature, top_p] : settings) {
    SamplingParams p;
    p.temperature = temperature;
    p.top_p = top_p;
    p.seed = rng_();
    const std::uint64_t step = rng_();
    const std::vector<std::int32_t> got = sample(d, kVocab, p, streams, step);
    for (std::int64_t r = 0; r < kBatch; ++r) {
      const double u = sampling_uniform(p.seed, streams[sz(r)], step);
      EXPECT_EQ(got[sz(r)], ref::sample_token(std::span(logits).subspan(sz(r * kVocab), kVocab), p, u))
          << "row " << r << " temperature " << temperature << " top_p " << top_p;
    }
  }
}

// ---------------------------------------------------------------------------- mixture of experts

// moe_experts against a double-precision reference, then in ascending chunks of experts as a
// scheduler whose staging slot holds only some of them runs it: each call reads only its
// chunk's experts (the others are not loaded) and the chunks add up to the one call bit for bit.
TEST_P(OpsTest, MoeExpertsInChunksAddUpToOneCall) {
  const std::int64_t rows = 7, H = 33, I = 19, E = 6, k = 2;
  const std::vector<float> x = random_floats(rows * H), y0 = random_floats(rows * H);
  std::vector<std::vector<float>> gate, up, down;
  std::vector<DeviceBuffer> dev;
  std::vector<ExpertMatrices> experts;
  for (std::int64_t e = 0; e < E; ++e) {
    gate.push_back(random_floats(I * H));
    up.push_back(random_floats(I * H));
    down.push_back(random_floats(H * I));
    dev.push_back(upload(gate.back()));
    dev.push_back(upload(up.back()));
    dev.push_back(upload(down.back()));
    const auto n = dev.size();
    experts.push_back({{dev[n - 3].data(), DType::F32, I, H}, {dev[n - 2].data(), DType::F32, I, H},
                       {dev[n - 1].data(), DType::F32, H, I}});
  }
  // Each row to k distinct experts (never expert 4: a chunk may hold no routed expert).
  std::vector<std::int32_t> expert_of;
  std::vector<float> weight_of = random_floats(rows * k, 0.1f, 1.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    std::vector<std::int32_t> pick = {0, 1, 2, 3, 5};
    std::shuffle(pick.begin(), pick.end(), rng_);
    expert_of.insert(expert_of.end(), pick.begin(), pick.begin() + k);
  }
  const DeviceBuffer dx = upload(x), dy = upload(y0);
  MoeArgs a{dx.as<float>(), rows, H, k, expert_of, weight_of, experts, Activation::Silu, DType::F32, dy.as<float>()};
  backend_->moe_experts(a);
  const std::vector<float> whole = download(dy);

  std::vector<double> ref(y0.begin(), y0.end());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < k; ++j) {
      const auto e = static_cast<std::size_t>(expert_of[sz(r * k + j)]);
      std::vector<double> h(sz(I));
      for (std::int64_t i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (std::int64_t c = 0; c < H; ++c) {
          g += static_cast<double>(gate[e][sz(i * H + c)]) * x[sz(r * H + c)];
          u += static_cast<double>(up[e][sz(i * H + c)]) * x[sz(r * H + c)];
        }
        h[sz(i)] = g / (1 + std::exp(-g)) * u;
      }
      for (std::int64_t c = 0; c < H; ++c) {
        double o = 0;
        for (std::int64_t i = 0; i < I; ++i) o += static_cast<double>(down[e][sz(c * I + i)]) * h[sz(i)];
        ref[sz(r * H + c)] += weight_of[sz(r * k + j)] * o;
      }
    }
  // fp32 dot products of length H then I over inputs of magnitude ~1 (the GEMM's bound), and
  // k weighted terms added to y.
  EXPECT_TRUE(near_all(whole, ref, 1e-5 * std::sqrt(static_cast<double>(H * I))));

  backend_->copy_to_device(dy.data(), y0.data(), dy.bytes());
  const std::int64_t bounds[] = {0, 2, 3, 4, 5, E};
  for (std::size_t c = 0; c + 1 < std::size(bounds); ++c) {
    std::vector<ExpertMatrices> loaded(sz(E));
    for (std::int64_t e = bounds[c]; e < bounds[c + 1]; ++e) loaded[sz(e)] = experts[sz(e)];
    MoeArgs chunk = a;
    chunk.experts = loaded;
    chunk.expert_begin = bounds[c];
    chunk.expert_end = bounds[c + 1];
    backend_->moe_experts(chunk);
  }
  const std::vector<float> chunked = download(dy);
  EXPECT_EQ(std::memcmp(chunked.data(), whole.data(), whole.size() * sizeof(float)), 0);
  // Outside a chunk an expert routed to but not loaded is fine; inside it is an error.
  MoeArgs missing = a;
  std::vector<ExpertMatrices> none(sz(E));
  missing.experts = none;
  EXPECT_THROW(backend_->moe_experts(missing), std::logic_error);
}

// ---------------------------------------------------------------------------- dtype.h

using DtypeTest = SeededTest;

// The value of half-precision bits per IEEE 754 binary16, independent of f16_to_f32.
double half_value(std::uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double mag = e == 0 ? std::ldexp(m, -24)
                     : e == 31
                         ? (m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity())
                         : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -mag : mag;
}

// Whether `bits` (f16 or bf16, given by value() and the bits of +inf) is x rounded to
// nearest, ties to even. Rounding past the largest finite value gives inf exactly where
// rounding with an unbounded exponent would reach 2^(emax+1), so +inf takes that value.
template <class Value>
::testing::AssertionResult rounds_to_nearest_even(float x, std::uint16_t bits, std::uint16_t inf_bits,
                                                  double overflow_value, Value value) {
  const auto fail = [&] {
    return ::testing::AssertionFailure() << std::hexfloat << x << " gave 0x" << std::hex << bits;
  };
  if (((bits & 0x8000) != 0) != std::signbit(x)) return fail() << " (sign)";
  const std::uint16_t mag = bits & 0x7fff;
  if (mag > inf_bits) return fail() << " (NaN)";
  const auto val = [&](int b) { return b == inf_bits ? overflow_value : value(static_cast<std::uint16_t>(b)); };
  const double a = std::abs(static_cast<double>(x)), d = std::abs(a - val(mag));
  for (const int nb : {mag - 1, mag + 1}) {
    if (nb < 0 || nb > inf_bits) continue;
    const double dn = std::abs(a - val(nb));
    if (dn < d || (dn == d && (mag & 1))) return fail() << " (0x" << nb << " is nearer or even)";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult f16_ok(float x) {
  return rounds_to_nearest_even(x, f32_to_f16(x), 0x7c00, 65536.0, half_value);
}
::testing::AssertionResult bf16_ok(float x) {
  return rounds_to_nearest_even(x, f32_to_bf16(x), 0x7f80, std::ldexp(1.0, 128),
                                [](std::uint16_t b) { return static_cast<double>(bf16_to_f32(b)); });
}

// The values where rounding is hardest: every midpoint between two adjacent finite
// positive values of a 16-bit type (value(b), value(b+1)) and the floats either side of
// it, both signs. Midpoints have one more significant bit than the type, so fp32 holds them.
template <class Value>
std::vector<float> midpoints(std::uint16_t inf_bits, double overflow_value, Value value) {
  std::vector<float> xs;
  for (int b = 0; b < inf_bits; ++b) {
    const double next = b + 1 == inf_bits ? overflow_value : value(static_cast<std::uint16_t>(b + 1));
    const float mid = static_cast<float>((value(static_cast<std::uint16_t>(b)) + next) / 2);
    for (const float x :
         {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, std::numeric_limits<float>::infinity())}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  return xs;
}

// Random floats with exponents in [lo, hi], random mantissas and signs.
std::vector<float> random_floats_by_exponent(std::mt19937& rng, std::size_t n, int lo, int hi) {
  std::uniform_int_distribution<int> exp(lo, hi);
  std::vector<float> xs(n);
  for (float& x : xs) {
    const std::uint32_t bits = (rng() & 0x807fffffu) | (static_cast<std::uint32_t>(exp(rng) + 127) << 23);
    x = std::bit_cast<float>(bits);
  }
  return xs;
}

TEST_F(DtypeTest, F16RoundTripsEveryHalf) {
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    const float f = f16_to_f32(h);
    if (std::isnan(half_value(h))) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << i;
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f)))) << "NaN 0x" << std::hex << i << " did not stay NaN";
      continue;
    }
    EXPECT_EQ(f, half_value(h)) << "0x" << std::hex << i;
    EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << "0x" << std::hex << i;
    EXPECT_EQ(f32_to_f16(f), h) << "0x" << std::hex << i;
  }
}

TEST_F(DtypeTest, F16RoundingHandPicked) {
  const std::pair<float, std::uint16_t> cases[] = {
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {0.1f, 0x2e66},
      {0x1.002p0f, 0x3c00},     // 1 + half an ulp: tie, to even (down)
      {0x1.006p0f, 0x3c02},     // 1 + 3 half ulps: tie, to even (up)
      {0x1.00201p0f, 0x3c01},   // just above the tie
      {0x1.001ffep0f, 0x3c00},  // just below the tie
      {65504.0f, 0x7bff},       // largest half
      {65519.0f, 0x7bff},
      {std::nextafter(65520.0f, 0.0f), 0x7bff},
      {65520.0f, 0x7c00},  // tie between 65504 and 2^16: to even, i.e. overflow to inf
      {-65520.0f, 0xfc00},
      {1e10f, 0x7c00},
      {std::numeric_limits<float>::infinity(), 0x7c00},
      {-std::numeric_limits<float>::infinity(), 0xfc00},
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {0x1p-14f, 0x0400},      // smallest normal
      {0x1.ffcp-15f, 0x0400},  // tie between the largest subnormal and it: to even
      {0x1.ff8p-15f, 0x03ff},  // largest subnormal
      {0x1p-24f, 0x0001},      // smallest subnormal
      {0x1.8p-24f, 0x0002},    // 1.5 ulp: tie, to even (up)
      {0x1.4p-23f, 0x0002},    // 2.5 ulp: tie, to even (down)
      {0x1p-25f, 0x0000},      // half the smallest subnormal: tie, to even (zero)
      {-0x1p-25f, 0x8000},
      {std::nextafter(0x1p-25f, 1.0f), 0x0001},
      {std::numeric_limits<float>::denorm_min(), 0x0000},
  };
  for (const auto& [x, want] : cases)
    EXPECT_EQ(f32_to_f16(x), want) << std::hexfloat << x << ": got 0x" << std::hex << f32_to_f16(x);
  const std::uint16_t nan = f32_to_f16(kNaN);
  EXPECT_TRUE((nan & 0x7c00) == 0x7c00 && (nan & 0x3ff) != 0) << std::hex << nan;
}

TEST_F(DtypeTest, F16RoundsToNearestEven) {
  for (const float x : midpoints(0x7c00, 65536.0, half_value)) EXPECT_TRUE(f16_ok(x));
  // Exponents from below half's subnormals (2^-26) to beyond its range (2^17).
  for (const float x : random_floats_by_exponent(rng_, 1 << 18, -26, 17)) EXPECT_TRUE(f16_ok(x));
}

TEST_F(DtypeTest, Bf16Rounding) {
  const auto bf16_value = [](std::uint16_t b) { return static_cast<double>(bf16_to_f32(b)); };
  const std::pair<float, std::uint16_t> cases[] = {
      {1.0f, 0x3f80},
      {-2.0f, 0xc000},
      {0x1.01p0f, 0x3f80},                          // tie, to even (down)
      {0x1.03p0f, 0x3f82},                          // tie, to even (up)
      {0x1.01001p0f, 0x3f81},                       // just above the tie
      {std::bit_cast<float>(0x7f7f7fffu), 0x7f7f},  // just below the tie with overflow
      {std::bit_cast<float>(0x7f7f8000u), 0x7f80},  // tie between the largest bf16 and 2^128: inf
      {std::numeric_limits<float>::max(), 0x7f80},
      {std::numeric_limits<float>::infinity(), 0x7f80},
      {-std::numeric_limits<float>::infinity(), 0xff80},
      {-0.0f, 0x8000},
      {std::bit_cast<float>(0x00008000u), 0x0000},  // subnormal tie, to even (zero)
      {std::bit_cast<float>(0x00018000u), 0x0002},  // subnormal tie, to even (up)
  };
  for (const auto& [x, want] : cases)
    EXPECT_EQ(f32_to_bf16(x), want) << std::hexfloat << x << ": got 0x" << std::hex << f32_to_bf16(x);
  const std::uint16_t nan = f32_to_bf16(kNaN);
  EXPECT_TRUE((nan & 0x7f80) == 0x7f80 && (nan & 0x7f) != 0) << std::hex << nan;
  // A signalling NaN whose payload lies only in the low 16 bits must not become inf.
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::bit_cast<float>(0x7f800001u)))));

  // Round trip of a random sample of bf16 values (every bf16 is an fp32 value).
  for (int i = 0; i < 4096; ++i) {
    const auto b = static_cast<std::uint16_t>(rng_());
    if (std::isnan(bf16_to_f32(b))) continue;
    EXPECT_EQ(f32_to_bf16(bf16_to_f32(b)), b) << std::hex << b;
  }
  for (const float x : midpoints(0x7f80, std::ldexp(1.0, 128), bf16_value)) EXPECT_TRUE(bf16_ok(x));
  for (const float x : random_floats_by_exponent(rng_, 1 << 18, -127, 127)) EXPECT_TRUE(bf16_ok(x));
}

// Bit-equal, or both NaN (the F16C path may quieten signalling NaNs).
::testing::AssertionResult same_float(float got, float want) {
  if (std::bit_cast<std::uint32_t>(got) == std::bit_cast<std::uint32_t>(want) || (std::isnan(got) && std::isnan(want)))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << std::hexfloat << got << " != " << want;
}

TEST_F(DtypeTest, ConvertToF32MatchesScalar) {
  // 7 is all tail, 1000 all 8-wide vectors, 1001 both.
  for (const std::size_t n : {7u, 1000u, 1001u}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    std::vector<std::uint16_t> bits(n);  // every kind of value: zeros, subnormals, inf, NaN
    for (std::uint16_t& b : bits) b = static_cast<std::uint16_t>(rng_());
    std::vector<float> got(n);
    convert_to_f32(bits.data(), DType::F16, got.data(), n);
    for (std::size_t i = 0; i < n; ++i) EXPECT_TRUE(same_float(got[i], f16_to_f32(bits[i]))) << "f16 [" << i << "]";
    convert_to_f32(bits.data(), DType::BF16, got.data(), n);
    for (std::size_t i = 0; i < n; ++i) EXPECT_TRUE(same_float(got[i], bf16_to_f32(bits[i]))) << "bf16 [" << i << "]";
    const std::vector<float> xs = random_floats(static_cast<std::int64_t>(n));
    convert_to_f32(xs.data(), DType::F32, got.data(), n);
    EXPECT_EQ(got, xs);
  }
}

TEST_F(DtypeTest, ConvertFromF32MatchesScalar) {
  // Values over half's whole range incl. subnormals, overflow and rounding ties.
  std::vector<float> pool = random_floats_by_exponent(rng_, 2000, -26, 17);
  const std::vector<float> ties = midpoints(0x7c00, 65536.0, half_value);
  std::sample(ties.begin(), ties.end(), std::back_inserter(pool), 2000, rng_);
  pool.insert(pool.end(), {0.0f, -0.0f, 65520.0f, std::numeric_limits<float>::infinity(), kNaN});
  std::shuffle(pool.begin(), pool.end(), rng_);
  for (const std::size_t n : {7u, 1000u, 1001u}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const std::vector<float> xs(pool.end() - static_cast<std::ptrdiff_t>(n), pool.end());
    std::vector<std::uint16_t> got(n);
    convert_from_f32(xs.data(), DType::F16, got.data(), n);
    for (std::size_t i = 0; i < n; ++i)
      EXPECT_TRUE(same_float(f16_to_f32(got[i]), f16_to_f32(f32_to_f16(xs[i])))) << "f16 of " << xs[i];
    convert_from_f32(xs.data(), DType::BF16, got.data(), n);
    for (std::size_t i = 0; i < n; ++i)
      EXPECT_TRUE(same_float(bf16_to_f32(got[i]), bf16_to_f32(f32_to_bf16(xs[i])))) << "bf16 of " << xs[i];
  }
}

TEST_F(DtypeTest, ConvertBetweenHalfTypes) {
  // f16 -> bf16 goes through fp32 in chunks of 4096: 5000 elements cross a chunk.
  constexpr std::size_t kN = 5000;
  std::vector<std::uint16_t> f16(kN), bf16(kN), back(kN);
  for (std::uint16_t& b : f16) b = static_cast<std::uint16_t>(rng_());
  convert(f16.data(), DType::F16, bf16.data(), DType::BF16, kN);
  for (std::size_t i = 0; i < kN; ++i)
    EXPECT_TRUE(same_float(bf16_to_f32(bf16[i]), bf16_to_f32(f32_to_bf16(f16_to_f32(f16[i]))))) << i;
  convert(bf16.data(), DType::BF16, back.data(), DType::F16, kN);
  for (std::size_t i = 0; i < kN; ++i)
    EXPECT_TRUE(same_float(f16_to_f32(back[i]), f16_to_f32(f32_to_f16(bf16_to_f32(bf16[i]))))) << i;
}

// ---------------------------------------------------------------------------- argument checks

// Backend checks every op's arguments once above the devices, so each backend refuses the same
// bad calls before any device work (the pointers are never read). The CPU backend used to
// accept decreasing seq_offsets, and the CUDA backend a gemm beta other than 0 or 1.
TEST_P(OpsTest, RefusesBadArgumentsAlike) {
  Backend& be = *backend_;
  const AttentionShape shape{.n_heads = 2, .n_kv_heads = 1, .head_dim = 4, .scale = 0.5f};
  EXPECT_THROW(be.gemm({.m = 1, .w = {nullptr, DType::F32, 2, 2}, .beta = 0.5f}), std::invalid_argument);
  std::uint16_t x16[4] = {};
  float x32[4] = {}, y32[4] = {};
  EXPECT_THROW(be.gemm({.m = 1, .w = {nullptr, DType::F32, 2, 2}, .x_bf16 = x16}), std::invalid_argument);  // f32 compute
  EXPECT_THROW(be.gemm({.x = x32, .m = 1, .w = {nullptr, DType::F32, 2, 2}, .compute = DType::BF16, .x_bf16 = x16}),
               std::invalid_argument);  // both
  EXPECT_THROW(be.gemm({.m = 1, .w = {nullptr, DType::F32, 2, 2}, .compute = DType::BF16, .x_bf16 = x16, .x_stride = 1}),
               std::invalid_argument);  // stride below k
  EXPECT_THROW(be.rms_norm({.x = x32, .y = x32, .rows = 1, .cols = 4, .weight = x32, .accumulate = true}),
               std::invalid_argument);  // accumulate into x
  EXPECT_THROW(be.rms_norm({.x = x32, .y = y32, .rows = 1, .cols = 4, .weight = x32, .y_bf16 = x16}),
               std::invalid_argument);  // two outputs
  EXPECT_THROW(be.bias_act({.x = x32, .rows = 1, .cols = 2, .out_bf16 = reinterpret_cast<std::uint16_t*>(x32)}),
               std::invalid_argument);  // in x's memory at the wrong stride
  EXPECT_THROW(be.bias_act({.x = x32, .rows = 1, .cols = 2}), std::invalid_argument);  // no output
  const std::vector<std::int64_t> decreasing = {0, 3, 2}, not_from_zero = {1, 3};
  EXPECT_THROW(be.attention_prefill({.shape = shape, .seq_offsets = decreasing}), std::invalid_argument);
  EXPECT_THROW(be.attention_prefill({.shape = shape, .seq_offsets = not_from_zero}), std::invalid_argument);
  const AttentionShape uneven{.n_heads = 3, .n_kv_heads = 2, .head_dim = 4};
  const std::vector<std::int64_t> one = {0, 1};
  EXPECT_THROW(be.attention_prefill({.shape = uneven, .seq_offsets = one}), std::invalid_argument);
  EXPECT_THROW(be.attention_prefill({.shape = shape, .seq_offsets = one, .compute = DType::F16}), std::invalid_argument);
  const std::vector<std::int64_t> lens = {0};
  EXPECT_THROW(be.attention_decode({.shape = shape, .capacity = 4, .lens = lens}), std::invalid_argument);
  const std::vector<std::int64_t> seq = {0}, slot = {4};
  EXPECT_THROW(be.kv_write({.n_kv_heads = 1, .head_dim = 4, .capacity = 4, .seq = seq, .slot = slot}),
               std::out_of_range);
  const std::vector<std::int32_t> ids = {3};
  EXPECT_THROW(be.embedding({.ids = ids, .table = {nullptr, DType::F32, 3, 4}}), std::out_of_range);
  std::vector<std::int32_t> out(1);
  const std::vector<std::uint64_t> streams = {0, 1}, steps = {0};
  const std::vector<SamplingParams> params(1);
  EXPECT_THROW(be.sample({.batch = 1, .vocab = 4, .params = params, .streams = streams, .steps = steps, .out = out}),
               std::invalid_argument);
}

}  // namespace
}  // namespace flexh2o::kernels
