// Device backends against the CPU backend, op by op (in the style of llama.cpp's
// test-backend-ops): every test makes fresh random inputs from a seed shown on failure
// (rerun with --gtest_random_seed=N), runs the op on the CPU backend and on the device
// backend from the same bytes, and compares. Outputs start as NaN (poison) so elements an
// op fails to write show up, and elements it must leave alone (probs past a sequence's
// length, cache slots not written) must keep their poison or bytes.
//
// Tolerances: fp32 paths |dev - cpu| <= 1e-5 * max(|cpu|, rms(cpu), 1); GEMM with
// f16/bf16/q4/q8 weights 1e-2 (the GPU multiplies activations rounded to the weight's
// 16-bit type); ops that are copies or single roundings (embedding, KV writes and moves,
// quantization, sampling) must match bit for bit.
//
// Every case skips, with the reason, where the device backend is not compiled in or no
// device is usable, so `ctest -L gpu` passes on machines without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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
#include "kernels/dtype.h"
#include "kernels/quantize.h"
#include "tests/kernels/seeded_test.h"

#if defined(FLEXH2O_HAVE_CUDA) && FLEXH2O_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace flexh2o::kernels {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr DType kAllDTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q4, DType::Q8};
// Weights may also be in 32-value groups (GGUF blocks kept as they are); KV caches never are.
constexpr DType kWeightDTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q4, DType::Q8, DType::Q4G32, DType::Q8G32};
constexpr double kF32Tol = 1e-5;
constexpr double kLowPrecisionTol = 1e-2;

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

  void check_gemm(DType dtype, std::int64_t m, std::int64_t k, std::int64_t n, bool bias, float beta);
  void check_prefill(std::int64_t H, std::int64_t Hkv, std::int64_t D, const std::vector<std::int64_t>& lens,
                     bool col_sums, bool weighted, float softcap = 0.0f, std::int64_t window = 0);
  void check_decode(DType cache, std::int64_t H, std::int64_t Hkv, std::int64_t D, std::int64_t capacity,
                    const std::vector<std::int64_t>& lens, bool probs, float softcap = 0.0f, std::int64_t window = 0);

  std::unique_ptr<Backend> cpu_, dev_;
};

INSTANTIATE_TEST_SUITE_P(Devices, BackendOpsTest, ::testing::Values(std::string("cuda")),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// ---------------------------------------------------------------------------- gemm

void BackendOpsTest::check_gemm(DType dtype, std::int64_t m, std::int64_t k, std::int64_t n, bool with_bias,
                                float beta) {
  SCOPED_TRACE(::testing::Message() << "gemm " << dtype_name(dtype) << " m=" << m << " k=" << k << " n=" << n
                                    << " bias=" << with_bias << " beta=" << beta);
  const Twin x = upload(random_floats(m * k));
  const Twin w = upload(stored_rows(random_floats(n * k), dtype, n, k));
  const Twin bias = upload(with_bias ? random_floats(n) : std::vector<float>{});
  const Twin y = upload(beta == 0.0f ? std::vector<float>(sz(m * n), kNaN) : random_floats(m * n));
  auto args = [&](bool on_cpu) {
    GemmArgs a;
    a.x = (on_cpu ? x.cpu : x.dev).as<float>();
    a.m = m;
    a.w = MatrixRef{(on_cpu ? w.cpu : w.dev).data(), dtype, n, k};
    a.bias = with_bias ? (on_cpu ? bias.cpu : bias.dev).as<float>() : nullptr;
    a.y = (on_cpu ? y.cpu : y.dev).as<float>();
    a.beta = beta;
    return a;
  };
  cpu_->gemm(args(true));
  dev_->gemm(args(false));
  const auto [want, got] = download(y);
  EXPECT_TRUE(close(want, got, dtype == DType::F32 ? kF32Tol : kLowPrecisionTol));
}

TEST_P(BackendOpsTest, GemmAllWeightDtypes) {
  for (DType t : kWeightDTypes)
    for (const auto& [m, k, n] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
             {1, 77, 131}, {37, 200, 65}, {5, 1, 3}})
      for (bool bias : {false, true})
        for (float beta : {0.0f, 1.0f}) check_gemm(t, m, k, n, bias, beta);
}

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
                                   float softcap, std::int64_t window) {
  SCOPED_TRACE(::testing::Message() << "prefill H=" << H << " Hkv=" << Hkv << " D=" << D << " col_sums="
                                    << with_col_sums << " weighted=" << weighted << " softcap=" << softcap
                                    << " window=" << window);
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
    (on_cpu ? *cpu_ : *dev_).attention_prefill(a);
  }
  const auto [want, got] = download(out);
  EXPECT_TRUE(close(want, got, kF32Tol));
  const auto [want_cols, got_cols] = download(cols);
  EXPECT_TRUE(close(want_cols, got_cols, kF32Tol));  // all NaN on both when not requested
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

// ---------------------------------------------------------------------------- attention decode

void BackendOpsTest::check_decode(DType cache, std::int64_t H, std::int64_t Hkv, std::int64_t D,
                                  std::int64_t capacity, const std::vector<std::int64_t>& lens, bool with_probs,
                                  float softcap, std::int64_t window) {
  SCOPED_TRACE(::testing::Message() << "decode " << dtype_name(cache) << " H=" << H << " Hkv=" << Hkv << " D=" << D
                                    << " capacity=" << capacity << " probs=" << with_probs << " softcap=" << softcap
                                    << " window=" << window);
  const std::int64_t B = static_cast<std::int64_t>(lens.size());
  const std::int64_t slots = B * Hkv * capacity;
  const Twin q = upload(random_floats(B * H * D, -2.0f, 2.0f));
  const Twin kc = upload(stored_rows(random_floats(slots * D, -2.0f, 2.0f), cache, slots, D));
  const Twin vc = upload(stored_rows(random_floats(slots * D), cache, slots, D));
  const Twin out = upload(std::vector<float>(sz(B * H * D), kNaN));
  const Twin probs = upload(std::vector<float>(sz(slots), kNaN));
  for (bool on_cpu : {true, false}) {
    AttentionDecodeArgs a;
    a.shape = AttentionShape{H, Hkv, D, 1.0f / std::sqrt(static_cast<float>(D)), softcap, window};
    a.q = (on_cpu ? q.cpu : q.dev).as<float>();
    a.k_cache = (on_cpu ? kc.cpu : kc.dev).data();
    a.v_cache = (on_cpu ? vc.cpu : vc.dev).data();
    a.capacity = capacity;
    a.lens = lens;
    a.out = (on_cpu ? out.cpu : out.dev).as<float>();
    a.probs = with_probs ? (on_cpu ? probs.cpu : probs.dev).as<float>() : nullptr;
    a.cache_dtype = cache;
    (on_cpu ? *cpu_ : *dev_).attention_decode(a);
  }
  const auto [want, got] = download(out);
  EXPECT_TRUE(close(want, got, kF32Tol));
  const auto [want_p, got_p] = download(probs);
  EXPECT_TRUE(close(want_p, got_p, kF32Tol));  // slots past lens keep their NaN
}

TEST_P(BackendOpsTest, AttentionDecodeAllCacheDtypes) {
  for (DType t : kAllDTypes) {
    check_decode(t, 8, 2, 72, 150, {1, 64, 65, 150, 97}, true);
    check_decode(t, 4, 4, 64, 40, {40, 3}, false);
    check_decode(t, 8, 2, 72, 150, {1, 64, 65, 150, 97}, true, 5.0f, 70);
  }
  check_decode(DType::F32, 12, 3, 128, 300, {300, 129, 1}, true);
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

// ---------------------------------------------------------------------------- sampling

TEST_P(BackendOpsTest, SampleMatchesCpu) {
  const std::int64_t batch = 6, vocab = 1003;
  const Twin logits = upload(random_floats(batch * vocab, -4.0f, 4.0f));
  std::vector<std::uint64_t> streams(sz(batch));
  for (auto& s : streams) s = static_cast<std::uint64_t>(random_int(0, 1 << 30));
  for (const SamplingParams& p : {SamplingParams{0.0f, 1.0f, 1}, SamplingParams{0.8f, 1.0f, 7},
                                  SamplingParams{1.0f, 0.9f, 42}, SamplingParams{0.5f, 0.01f, 3}})
    for (std::uint64_t step : {0u, 1u, 17u}) {
      std::vector<std::int32_t> want(sz(batch), -1), got(sz(batch), -2);
      for (bool on_cpu : {true, false}) {
        SampleArgs a;
        a.logits = (on_cpu ? logits.cpu : logits.dev).as<float>();
        a.batch = batch;
        a.vocab = vocab;
        a.params = p;
        a.streams = streams;
        a.step = step;
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
