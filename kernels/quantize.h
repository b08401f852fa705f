// Group-wise asymmetric min-max quantization (FlexGen's --compress-weight/--compress-cache,
// docs/offloading.md), the storage format of DType::Q4 and DType::Q8, and of Q4G32 and
// Q8G32 (GGUF blocks kept as they are).
//
// A row of n values (a weight row, grouped along the input dimension, or one head's key or
// value, grouped along head_dim) is cut into groups of quant_group_size(t) consecutive values
// (64 for Q4/Q8, 32 for Q4G32/Q8G32, the block size of GGUF's Q4_0/Q4_1/Q8_0; the last group
// may be shorter). Each group stores an fp16 scale s and an fp16 minimum m, and every
// value x as a code q in [0, 2^bits - 1] with x ~ q * s + m. Layout of a row:
//   codes: ceil(n * bits / 8) bytes (4 bits: two codes per byte, the even element in the low nibble)
//   then per group: fp16 s, fp16 m (4 bytes)
// so a row is self-contained: rows split across tiers, copies and slot moves stay byte copies.
//
// m is the group minimum rounded down to fp16 and s the step rounded up, so every value lies
// in [m, m + (2^bits - 1) s] and |x - q s - m| <= s / 2 (plus fp32 rounding) for finite x of
// magnitude below 65504 (fp16's range). Any input, +-inf, huge and NaN included, gives valid
// codes (never UB) and the same bytes on every backend (kernels/quantize_code.h).
// Rows repacked from GGUF blocks carry the file's (s, m) as they are (s may be negative there);
// they expand by the same q * s + m.
// The 4-bit expansion has an AVX2 path, bit-identical to q * s + m computed value by value.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"

namespace flexh2o::kernels {

// The group of the format flexh2o quantizes to (FlexGen's).
constexpr std::int64_t kQuantGroup = 64;

constexpr int quant_bits(DType t) { return t == DType::Q4 || t == DType::Q4G32 ? 4 : 8; }
constexpr std::int64_t quant_group_size(DType t) { return t == DType::Q4G32 || t == DType::Q8G32 ? 32 : kQuantGroup; }
constexpr std::int64_t quant_groups(DType t, std::int64_t n) { return (n + quant_group_size(t) - 1) / quant_group_size(t); }
constexpr std::int64_t quant_code_bytes(DType t, std::int64_t n) { return (n * quant_bits(t) + 7) / 8; }
constexpr std::int64_t quantized_row_bytes(DType t, std::int64_t n) { return quant_code_bytes(t, n) + 4 * quant_groups(t, n); }

// One row: x[n] -> row_bytes(t, n) bytes at out; and back.
void quantize_row(const float* x, std::int64_t n, DType t, void* out);
void dequantize_row(const void* in, std::int64_t n, DType t, float* x);

// The (scale, min) of group g of a quantized row, as stored (for tests and error bounds).
struct QuantGroupParams {
  float scale = 0, min = 0;
};
QuantGroupParams quant_group_params(const void* row, std::int64_t n, DType t, std::int64_t g);

}  // namespace flexh2o::kernels
