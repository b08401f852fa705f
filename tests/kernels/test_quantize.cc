// The 4/8-bit group format (kernels/quantize.h) and the ops that read and write it: exact
// byte sizes, the per-group round-trip bound on fresh random rows, the nibble layout, and
// GEMM, embedding and KV-cache ops on compressed storage against the fp32 references run on
// the dequantized values (so only the kernel's own error is measured).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/quantize.h"
#include "kernels/quantize_code.h"
#include "tests/kernels/reference_ops.h"
#include "tests/kernels/seeded_test.h"
#include "tests/support/fp_tolerance.h"

namespace flexh2o::kernels {
namespace {

constexpr DType kQuantized[] = {DType::Q4, DType::Q8, DType::Q4G32, DType::Q8G32};
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Rows of `cols` values stored as `t`, and the values that storage decodes to.
struct Stored {
  std::vector<std::uint8_t> bytes;
  std::vector<float> values;
};
Stored store(const std::vector<float>& x, std::int64_t rows, std::int64_t cols, DType t) {
  Stored s{stored_rows(x, t, rows, cols), std::vector<float>(x.size())};
  convert_rows(s.bytes.data(), t, s.values.data(), DType::F32, rows, cols);
  return s;
}

using Quantize = SeededTest;

std::vector<float> magnitudes(std::vector<float> v) {
  for (float& e : v) e = std::abs(e);
  return v;
}

TEST(QuantizeFormat, ExactByteSizes) {
  // Codes (two per byte at 4 bits), then 4 bytes (fp16 scale + fp16 min) per group of 64.
  EXPECT_EQ(row_bytes(DType::Q4, 64), 32 + 4);
  EXPECT_EQ(row_bytes(DType::Q4, 128), 64 + 8);
  EXPECT_EQ(row_bytes(DType::Q4, 65), 33 + 8);  // a short last group
  EXPECT_EQ(row_bytes(DType::Q4, 1), 1 + 4);
  EXPECT_EQ(row_bytes(DType::Q4, 8), 4 + 4);  // stories260K's head_dim: one group per head
  EXPECT_EQ(row_bytes(DType::Q4, 12288), 6144 + 192 * 4);
  EXPECT_EQ(row_bytes(DType::Q8, 64), 64 + 4);
  EXPECT_EQ(row_bytes(DType::Q8, 129), 129 + 12);
  EXPECT_EQ(row_bytes(DType::F16, 10), 20);
  // fp16 of a 128-wide head vs 4-bit: 256 / 72 bytes, the 3.56x FlexGen's format gives.
  EXPECT_NEAR(static_cast<double>(row_bytes(DType::F16, 128)) / static_cast<double>(row_bytes(DType::Q4, 128)), 3.56, 0.01);
  // Groups of 32: the bytes of GGUF's Q4_1 (20 per 32 values) and Q8_0 (34, here 36: fp16 min too).
  EXPECT_EQ(row_bytes(DType::Q4G32, 64), 32 + 8);
  EXPECT_EQ(row_bytes(DType::Q4G32, 33), 17 + 8);
  EXPECT_EQ(row_bytes(DType::Q8G32, 576), 576 + 18 * 4);
  EXPECT_EQ(quant_groups(DType::Q4G32, 576), 18);
  EXPECT_EQ(quant_groups(DType::Q4, 576), 9);
}

TEST(QuantizeFormat, NibbleLayoutAndParams) {
  // 0..15 in one group: min 0, scale 1, codes = values, element 2i in the low nibble.
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[static_cast<std::size_t>(i)] = static_cast<float>(i);
  std::vector<std::uint8_t> row(static_cast<std::size_t>(row_bytes(DType::Q4, 16)));
  quantize_row(x.data(), 16, DType::Q4, row.data());
  EXPECT_EQ(row[0], 0x10);  // elements 0 (low) and 1 (high)
  EXPECT_EQ(row[7], 0xfe);  // elements 14 and 15
  const auto p = quant_group_params(row.data(), 16, DType::Q4, 0);
  EXPECT_EQ(p.scale, 1.0f);
  EXPECT_EQ(p.min, 0.0f);
  std::vector<float> back(16);
  dequantize_row(row.data(), 16, DType::Q4, back.data());
  EXPECT_EQ(back, x);
}

// The code arithmetic the CPU and the CUDA kernels share (kernels/quantize_code.h): every
// position converts in range, clamped first, so +inf and values beyond int's range take the
// top code (truncating first would give INT_MIN, then 0), -inf and NaN code 0.
TEST(QuantizeFormat, CodesOfNonFiniteAndHugePositions) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (int levels : {15, 255}) {
    EXPECT_EQ(quant_code(kInf, levels), levels);
    EXPECT_EQ(quant_code(3e38f, levels), levels);
    EXPECT_EQ(quant_code(2147483648.0f, levels), levels);
    EXPECT_EQ(quant_code(static_cast<float>(levels) + 0.25f, levels), levels);
    EXPECT_EQ(quant_code(static_cast<float>(levels) - 0.25f, levels), levels - 1);
    EXPECT_EQ(quant_code(0.75f, levels), 0);
    EXPECT_EQ(quant_code(1.5f, levels), 1);
    EXPECT_EQ(quant_code(-kInf, levels), 0);
    EXPECT_EQ(quant_code(-3e38f, levels), 0);
    EXPECT_EQ(quant_code(kNaN, levels), 0);
  }
  // The group range is one sequential scan: first smallest, last largest.
  const float x[] = {2.0f, -1.0f, 5.0f, -1.0f, 5.0f};
  float lo = 0, hi = 0;
  quant_group_range(x, 5, lo, hi);
  EXPECT_EQ(lo, -1.0f);
  EXPECT_EQ(hi, 5.0f);
  // A row with +inf and huge values: the largest codes go to them, finite small values stay
  // in range, and the group's parameters are fp16's extremes.
  for (DType t : kQuantized) {
    const int levels = (1 << quant_bits(t)) - 1;
    const std::vector<float> row = {kInf, 1.0f, -2.0f, 1e30f, -kInf, 0.5f};
    std::vector<std::uint8_t> q(static_cast<std::size_t>(row_bytes(t, 6)));
    quantize_row(row.data(), 6, t, q.data());
    auto code = [&](int i) { return quant_bits(t) == 8 ? q[static_cast<std::size_t>(i)] : (q[static_cast<std::size_t>(i / 2)] >> (4 * (i % 2))) & 0xf; };
    EXPECT_EQ(code(0), levels) << dtype_name(t);
    EXPECT_EQ(code(3), levels) << dtype_name(t);
    EXPECT_EQ(code(4), 0) << dtype_name(t);
    const auto p = quant_group_params(q.data(), 6, t, 0);
    EXPECT_EQ(p.min, -65504.0f);
    EXPECT_EQ(p.scale, 65504.0f);
  }
}

TEST_F(Quantize, RoundTripWithinHalfAStepPerGroup) {
  std::uniform_int_distribution<std::int64_t> len(1, 300);
  std::uniform_real_distribution<float> spread(1e-3f, 50.0f), center(-100.0f, 100.0f);
  for (const DType t : kQuantized)
    for (int trial = 0; trial < 400; ++trial) {
      const std::int64_t n = len(rng_);
      const float c = center(rng_), r = spread(rng_);
      std::vector<float> x = random_floats(n, c - r, c + r);
      if (trial % 7 == 0) std::fill(x.begin(), x.begin() + std::min<std::int64_t>(n, 70), c);  // a constant group
      std::vector<std::byte> row(static_cast<std::size_t>(row_bytes(t, n)));
      quantize_row(x.data(), n, t, row.data());
      std::vector<float> back(x.size());
      dequantize_row(row.data(), n, t, back.data());
      const int levels = (1 << quant_bits(t)) - 1;
      const std::int64_t group = quant_group_size(t);
      for (std::int64_t g = 0; g < quant_groups(t, n); ++g) {
        const auto p = quant_group_params(row.data(), n, t, g);
        const auto first = x.begin() + g * group, last = x.begin() + std::min(n, (g + 1) * group);
        const auto [lo, hi] = std::minmax_element(first, last);
        // The stored range covers the group: min rounded down, scale rounded up.
        ASSERT_LE(p.min, *lo);
        ASSERT_GE(static_cast<double>(p.min) + levels * static_cast<double>(p.scale),
                  static_cast<double>(*hi) - 1e-6 * (std::abs(*hi) + 1));
        // No wider than needed: one fp16 rounding step on each.
        ASSERT_LE(static_cast<double>(p.scale), (static_cast<double>(*hi) - p.min) / levels * (1 + 1e-3) + 1e-7);
        for (auto it = first; it != last; ++it) {
          const std::size_t i = static_cast<std::size_t>(it - x.begin());
          const double err = std::abs(static_cast<double>(back[i]) - x[i]);
          // Half a step, plus fp32 rounding of q * s + m.
          const double bound = p.scale / 2 + 1e-6 * (std::abs(x[i]) + 1) + (p.scale == 0 ? *lo - p.min : 0);
          ASSERT_LE(err, bound) << dtype_name(t) << " n=" << n << " group " << g << " element " << i;
        }
      }
    }
}

// The 4-bit expansion (AVX2 where the CPU has it) equals q * scale + min computed one value at
// a time from the stored nibbles and parameters, bit for bit, in groups of 64 and of 32.
TEST_F(Quantize, Q4ExpansionIsBitExact) {
  for (const DType t : {DType::Q4, DType::Q4G32})
    for (const std::int64_t n : {1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 128, 200, 1000}) {
      const std::vector<float> x = random_floats(n, -3, 5);
      std::vector<std::uint8_t> row(static_cast<std::size_t>(row_bytes(t, n)));
      quantize_row(x.data(), n, t, row.data());
      std::vector<float> got(static_cast<std::size_t>(n));
      dequantize_row(row.data(), n, t, got.data());
      for (std::int64_t i = 0; i < n; ++i) {
        const auto p = quant_group_params(row.data(), n, t, i / quant_group_size(t));
        const int q = (row[static_cast<std::size_t>(i / 2)] >> (4 * (i % 2))) & 0xf;
        volatile float prod = static_cast<float>(q) * p.scale;  // no fused multiply-add
        const float want = prod + p.min;
        ASSERT_EQ(std::memcmp(&got[static_cast<std::size_t>(i)], &want, 4), 0)
            << dtype_name(t) << " n=" << n << " i=" << i;
      }
    }
}

TEST_F(Quantize, ConvertRowsBetweenAllDtypes) {
  const std::int64_t rows = 5, cols = 97;
  const std::vector<float> x = random_floats(rows * cols, -2, 2);
  for (const DType t : {DType::F16, DType::BF16, DType::Q4, DType::Q8, DType::Q4G32, DType::Q8G32}) {
    const Stored s = store(x, rows, cols, t);
    // Rows are independent: row 3 alone converts to the same bytes.
    std::vector<std::byte> one(static_cast<std::size_t>(row_bytes(t, cols)));
    convert_rows(x.data() + 3 * cols, DType::F32, one.data(), t, 1, cols);
    EXPECT_EQ(0, std::memcmp(one.data(), s.bytes.data() + 3 * row_bytes(t, cols), one.size())) << dtype_name(t);
    // Quantized -> f16 -> f32 equals quantized -> f32 up to fp16 rounding.
    std::vector<std::uint16_t> h(x.size());
    convert_rows(s.bytes.data(), t, h.data(), DType::F16, rows, cols);
    // One fp16 rounding: half an ulp, 2^-11 relative (2^-25 absolute below fp16's normals).
    for (std::size_t i = 0; i < x.size(); ++i)
      ASSERT_NEAR(f16_to_f32(h[i]), s.values[i], flexh2o::testing::kF16Eps * std::abs(s.values[i]) + 0x1p-25);
  }
  EXPECT_THROW(convert_to_f32(x.data(), DType::Q4, nullptr, 0), std::logic_error);
}

TEST_F(Quantize, GemmOnCompressedWeights) {
  for (const DType t : kQuantized)
    for (const std::int64_t m : {1, 5, 33})
      for (const std::int64_t k : {63, 64, 200})
        for (const std::int64_t n : {7, 300}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(t) << " m=" << m << " k=" << k << " n=" << n);
          const std::vector<float> x = random_floats(m * k, -1, 1), w = random_floats(n * k, -1, 1);
          const std::vector<float> bias = random_floats(n, -1, 1);
          const Stored sw = store(w, n, k, t);
          std::vector<float> y(static_cast<std::size_t>(m * n), kNaN);
          // The weight-only paths: the stored values' exact products (the int8 default rounds x;
          // test_gemm_cpu_paths bounds that).
          const GemmArgs a{x.data(), m, {sw.bytes.data(), t, n, k}, bias.data(), y.data(), 0.0f, DType::F32};
          run_cpu_gemm_path(choose_cpu_gemm_path(a, CpuGemmMode::WeightOnly), a);
          const auto ref = ref::gemm(x, m, sw.values, n, k, bias, 0.0f, {});
          // fp32 sums of k + 1 terms in any order, at the size of their terms (sum |x w| + |bias|).
          const auto terms = ref::gemm(magnitudes(x), m, magnitudes(sw.values), n, k, magnitudes(bias), 0.0f, {});
          for (std::size_t i = 0; i < y.size(); ++i)
            ASSERT_NEAR(y[i], ref[i], flexh2o::testing::sum_tolerance(flexh2o::testing::kF32Eps, k + 1, terms[i])) << i;
        }
}

TEST_F(Quantize, EmbeddingOfCompressedRows) {
  auto be = make_cpu_backend();
  const std::int64_t rows = 50, cols = 130;
  const std::vector<float> table = random_floats(rows * cols, -1, 1);
  const std::vector<std::int32_t> ids = {3, 0, 47, 3, 12};
  for (const DType t : kQuantized) {
    const Stored s = store(table, rows, cols, t);
    std::vector<float> out(ids.size() * cols, kNaN);
    be->embedding({ids, 2, {s.bytes.data(), t, rows, cols}, out.data(), false});
    const auto ref = ref::embedding(ids, 2, s.values, cols, false, {});
    for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], static_cast<float>(ref[i])) << dtype_name(t) << " " << i;
  }
}

// kv_write converts into the cache's slots; attention_decode reads them back dequantized;
// kv_move moves whole slots. Checked against the reference on the decoded cache.
TEST_F(Quantize, KvCacheOpsOnCompressedSlots) {
  auto be = make_cpu_backend();
  // head_dim 40: one short group; 128: two groups per slot (OPT-30B/LLaMA heads).
  for (const std::int64_t head_dim : {40, 128})
  for (const DType t : {DType::F16, DType::Q4, DType::Q8}) {
    const AttentionShape shape{6, 2, head_dim, 1.0f / std::sqrt(static_cast<float>(head_dim))};
    const std::int64_t B = 3, cap = 24, H = shape.n_kv_heads, D = shape.head_dim;
    const std::vector<std::int64_t> lens = {1, 13, 24};
    SCOPED_TRACE(::testing::Message() << dtype_name(t) << " head_dim " << head_dim);
    const std::int64_t slot = kv_slot_bytes(t, D);
    std::vector<std::byte> kc(static_cast<std::size_t>(B * H * cap * slot)), vc(kc.size());
    // Fill every valid slot with rows written one token at a time, as decode does.
    std::vector<float> k_ref(static_cast<std::size_t>(B * H * cap * D), 0.0f), v_ref(k_ref.size(), 0.0f);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t s = 0; s < lens[static_cast<std::size_t>(b)]; ++s) {
        const std::vector<float> k = random_floats(H * D, -2, 2), v = random_floats(H * D, -2, 2);
        const std::vector<std::int64_t> seq = {b}, sl = {s};
        be->kv_write({k.data(), kc.data(), H, D, cap, seq, sl, {}, t});
        be->kv_write({v.data(), vc.data(), H, D, cap, seq, sl, {}, t});
        for (std::int64_t g = 0; g < H; ++g) {
          const std::size_t at = static_cast<std::size_t>(((b * H + g) * cap + s) * D);
          std::vector<std::byte> one(static_cast<std::size_t>(slot));
          convert_rows(k.data() + g * D, DType::F32, one.data(), t, 1, D);
          convert_rows(one.data(), t, k_ref.data() + at, DType::F32, 1, D);
          convert_rows(v.data() + g * D, DType::F32, one.data(), t, 1, D);
          convert_rows(one.data(), t, v_ref.data() + at, DType::F32, 1, D);
        }
      }
    const std::vector<float> q = random_floats(B * shape.n_heads * D, -1, 1);
    std::vector<float> out(q.size(), kNaN), probs(static_cast<std::size_t>(B * H * cap), -7.0f);
    be->attention_decode({shape, q.data(), kc.data(), vc.data(), cap, lens, out.data(), probs.data(), t});
    const auto ref = ref::attention_decode(shape, q, k_ref, v_ref, cap, lens,
                                                 std::vector<float>(probs.size(), -7.0f));
    // A score is an fp32 dot product over head_dim of |q| <= 1 and |k| <= 2, scaled: at most
    // 2 sqrt(D) in size; its rounding moves each probability by that much relative (exp), and an
    // output (|v| <= 2) or a group's probability sum by that times 2 or the group's 3 heads,
    // plus the rounding of the sum over up to `cap` keys.
    const double score_tol = flexh2o::testing::sum_tolerance(flexh2o::testing::kF32Eps, D, 2 * std::sqrt(static_cast<double>(D)));
    const double out_tol = 2 * score_tol + flexh2o::testing::sum_tolerance(flexh2o::testing::kF32Eps, cap, 2);
    const double probs_tol = 3 * (score_tol + flexh2o::testing::sum_tolerance(flexh2o::testing::kF32Eps, cap, 1));
    for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref.out[i], out_tol) << i;
    for (std::size_t i = 0; i < probs.size(); ++i) ASSERT_NEAR(probs[i], ref.probs[i], probs_tol) << i;

    // Move slot 5 of (sequence 1, head 1) to slot 0: exactly those bytes travel, nothing else changes.
    const std::vector<KvMove> moves = {{1, 1, 5, 0}};
    const std::size_t head = static_cast<std::size_t>((1 * H + 1) * cap * slot);
    std::vector<std::byte> want(kc);
    std::memcpy(want.data() + head, kc.data() + head + 5 * slot, static_cast<std::size_t>(slot));
    be->kv_move({kc.data(), H, D, cap, moves, t});
    EXPECT_TRUE(kc == want);

    // Merge slot 7 of (sequence 2, head 0) into slot 3 and compare its keys with slot 3's:
    // decoded, the merged row is the blend of the decoded rows up to one rounding of the
    // cache's dtype (a quantization step of the group, or an f16 rounding).
    const std::int64_t at3 = ((2 * H + 0) * cap + 3) * D, at7 = ((2 * H + 0) * cap + 7) * D;
    const std::vector<KvMerge> merges = {{2, 0, 7, 3, 0.3f}};
    be->kv_merge({vc.data(), H, D, cap, merges, t});
    std::vector<float> merged(static_cast<std::size_t>(D));
    convert_rows(vc.data() + ((2 * H + 0) * cap + 3) * slot, t, merged.data(), DType::F32, 1, D);
    std::vector<double> blend(static_cast<std::size_t>(D));
    double lo = INFINITY, hi = -INFINITY;
    for (std::int64_t d = 0; d < D; ++d) {
      const auto u = static_cast<std::size_t>(d);
      blend[u] = 0.7 * v_ref[static_cast<std::size_t>(at3 + d)] + 0.3 * v_ref[static_cast<std::size_t>(at7 + d)];
      lo = std::min(lo, blend[u]);
      hi = std::max(hi, blend[u]);
    }
    const double step = t == DType::F16 ? 2.0 * flexh2o::testing::kF16Eps * std::max(std::abs(lo), std::abs(hi))
                                        : (hi - lo) / (t == DType::Q4 ? 15.0 : 255.0);
    for (std::int64_t d = 0; d < D; ++d) ASSERT_NEAR(merged[static_cast<std::size_t>(d)], blend[static_cast<std::size_t>(d)], step) << d;
    const std::vector<KvSimilarityQuery> queries = {{2, 0, 3, 24}};
    std::vector<float> sim(static_cast<std::size_t>(cap), -7.0f);
    be->kv_similarity({kc.data(), H, D, cap, queries, sim.data(), t});
    const auto want_sim = ref::kv_similarity(k_ref, H, D, cap, queries, std::vector<float>(sim.size(), -7.0f));
    for (std::size_t j = 0; j < sim.size(); ++j)
      ASSERT_NEAR(sim[j], want_sim[j], 3 * flexh2o::testing::sum_tolerance(flexh2o::testing::kF32Eps, D, 1.0)) << j;
  }
}

}  // namespace
}  // namespace flexh2o::kernels
