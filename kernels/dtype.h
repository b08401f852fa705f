// Element types of stored tensors and conversions between them.
// Compute is fp32 everywhere; weights may be stored as fp32, fp16 or bf16, or group-wise
// quantized to 4 or 8 bits (kernels/quantize.h), where a row is the unit of storage.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace flexh2o::kernels {

// Q4/Q8: group-wise asymmetric min-max quantization in groups of 64 (kernels/quantize.h), the
// format flexh2o quantizes to; Q4G32/Q8G32: the same format in groups of 32, which GGUF files'
// Q4_0/Q4_1/Q8_0 blocks repack into without loss (engine/loaders/gguf_blocks.h).
enum class DType : std::uint8_t { F32, F16, BF16, Q4, Q8, Q4G32, Q8G32 };

constexpr bool is_quantized(DType t) {
  return t == DType::Q4 || t == DType::Q8 || t == DType::Q4G32 || t == DType::Q8G32;
}
// Bytes per element of the float types (quantized types have no per-element size: use row_bytes).
constexpr std::size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
// Bytes of one row of `cols` elements, the quantized types' group scales included.
std::int64_t row_bytes(DType t, std::int64_t cols);
std::string_view dtype_name(DType t);
// Parses "f32"/"fp32"/"float32", "f16"/"fp16"/"float16", "bf16"/"bfloat16", "q4", "q8",
// "q4g32", "q8g32"; throws on others.
DType parse_dtype(std::string_view s);
// parse_dtype for the float types only: a model's or checkpoint's dtype (the quantized types
// are a compression the policy chooses, not a stored model dtype).
DType parse_float_dtype(std::string_view s);

inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, overflow to inf, NaN stays NaN.
inline std::uint16_t f32_to_f16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return sign | (absx > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (absx >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (absx < 0x38800000u) {                        // below the smallest normal half
    if (absx < 0x33000000u) return sign;           // < 2^-25 rounds to zero
    const std::uint32_t e = absx >> 23;
    const std::uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - e;  // 14 + (113 - e) - 1
    std::uint32_t h = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return sign | static_cast<std::uint16_t>(h);
  }
  std::uint32_t h = ((absx >> 13) - ((127u - 15u) << 10));
  const std::uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<std::uint16_t>(h);
}

inline float bf16_to_f32(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

// f rounded to a float type and back (the value a tensor of that type would hold).
inline float round_to(DType t, float f) {
  switch (t) {
    case DType::F16: return f16_to_f32(f32_to_f16(f));
    case DType::BF16: return bf16_to_f32(f32_to_bf16(f));
    default: return f;
  }
}

// Element-wise conversions between the float types (not the quantized ones):
// dst[i] = float(src[i]) for n elements of type `from`.
void convert_to_f32(const void* src, DType from, float* dst, std::size_t n);
// dst[i] = to(src[i]) for n fp32 elements.
void convert_from_f32(const float* src, DType to, void* dst, std::size_t n);
// Converts between any two float types (memcpy when they are equal).
void convert(const void* src, DType from, void* dst, DType to, std::size_t n);
// Converts `rows` rows of `cols` elements between any two dtypes, quantized ones included
// (rows of row_bytes(t, cols) bytes each).
void convert_rows(const void* src, DType from, void* dst, DType to, std::int64_t rows, std::int64_t cols);

}  // namespace flexh2o::kernels
