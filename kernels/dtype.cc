#include "kernels/dtype.h"

#include "kernels/quantize.h"
#include "kernels/option_error.h"

#include <cpuid.h>
#include <immintrin.h>

#include <stdexcept>
#include <algorithm>
#include <vector>

namespace flexh2o::kernels {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::Q4: return "q4";
    case DType::Q8: return "q8";
    case DType::Q4G32: return "q4g32";
    case DType::Q8G32: return "q8g32";
  }
  return "?";
}

DType parse_float_dtype(std::string_view s) {
  const DType t = parse_dtype(s);
  if (is_quantized(t))
    throw OptionError{"'" + std::string(s) + "' is a compression, not a model dtype (expected f32, f16 or bf16; use ",
                      Option::CompressWeight, " for 4-bit weights)"};
  return t;
}

std::int64_t row_bytes(DType t, std::int64_t cols) {
  return is_quantized(t) ? quantized_row_bytes(t, cols) : cols * static_cast<std::int64_t>(dtype_size(t));
}

DType parse_dtype(std::string_view s) {
  if (s == "f32" || s == "fp32" || s == "float32" || s == "F32") return DType::F32;
  if (s == "f16" || s == "fp16" || s == "float16" || s == "F16") return DType::F16;
  if (s == "bf16" || s == "bfloat16" || s == "BF16") return DType::BF16;
  if (s == "q4" || s == "Q4") return DType::Q4;
  if (s == "q8" || s == "Q8") return DType::Q8;
  if (s == "q4g32") return DType::Q4G32;
  if (s == "q8g32") return DType::Q8G32;
  throw std::invalid_argument("unknown dtype '" + std::string(s) + "' (expected f32, f16, bf16, q4, q8, q4g32 or q8g32)");
}

namespace {

// F16C turns 8 halves into 8 floats per instruction; chosen at run time so the
// binary still runs on CPUs without it.
__attribute__((target("avx,f16c"))) void f16_to_f32_f16c(const std::uint16_t* s, float* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) d[i] = f16_to_f32(s[i]);
}

__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* s, std::uint16_t* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
  }
  for (; i < n; ++i) d[i] = f32_to_f16(s[i]);
}

// bf16 is the top half of an fp32: widen 8 values and shift them into place.
__attribute__((target("avx2"))) void bf16_to_f32_avx2(const std::uint16_t* s, float* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    _mm256_storeu_ps(d + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  }
  for (; i < n; ++i) d[i] = bf16_to_f32(s[i]);
}

bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  return (c & bit_F16C) && (c & bit_AVX) && (c & bit_OSXSAVE);
}
bool cpu_has_avx2() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!cpu_has_f16c() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return b & bit_AVX2;
}
const bool kHaveF16c = cpu_has_f16c();
const bool kHaveAvx2 = cpu_has_avx2();

void require_float(DType t) {
  if (is_quantized(t))
    throw std::logic_error("element-wise conversion of a quantized dtype; use convert_rows");
}

}  // namespace

void convert_to_f32(const void* src, DType from, float* dst, std::size_t n) {
  require_float(from);
  switch (from) {
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::F16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      if (kHaveF16c) {
        f16_to_f32_f16c(s, dst, n);
      } else {
        for (std::size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      }
      return;
    }
    case DType::BF16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      if (kHaveAvx2) {
        bf16_to_f32_avx2(s, dst, n);
      } else {
        for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      }
      return;
    }
    case DType::Q4:
    case DType::Q8:
    case DType::Q4G32:
    case DType::Q8G32:
      break;
  }
}

void convert_from_f32(const float* src, DType to, void* dst, std::size_t n) {
  require_float(to);
  switch (to) {
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::F16: {
      auto* d = static_cast<std::uint16_t*>(dst);
      if (kHaveF16c) {
        f32_to_f16_f16c(src, d, n);
      } else {
        for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      }
      return;
    }
    case DType::BF16: {
      auto* d = static_cast<std::uint16_t*>(dst);
      for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::Q4:
    case DType::Q8:
    case DType::Q4G32:
    case DType::Q8G32:
      break;
  }
}

void convert(const void* src, DType from, void* dst, DType to, std::size_t n) {
  require_float(from);
  require_float(to);
  if (from == to) {
    std::memcpy(dst, src, n * dtype_size(from));
    return;
  }
  if (from == DType::F32) return convert_from_f32(static_cast<const float*>(src), to, dst, n);
  if (to == DType::F32) return convert_to_f32(src, from, static_cast<float*>(dst), n);
  // f16 <-> bf16 through fp32, a chunk at a time.
  constexpr std::size_t kChunk = 4096;
  float tmp[kChunk];
  for (std::size_t i = 0; i < n; i += kChunk) {
    const std::size_t c = std::min(kChunk, n - i);
    convert_to_f32(static_cast<const char*>(src) + i * 2, from, tmp, c);
    convert_from_f32(tmp, to, static_cast<char*>(dst) + i * 2, c);
  }
}

void convert_rows(const void* src, DType from, void* dst, DType to, std::int64_t rows, std::int64_t cols) {
  if (!is_quantized(from) && !is_quantized(to))
    return convert(src, from, dst, to, static_cast<std::size_t>(rows * cols));
  const std::int64_t in_bytes = row_bytes(from, cols), out_bytes = row_bytes(to, cols);
  if (from == to) {
    std::memcpy(dst, src, static_cast<std::size_t>(rows * in_bytes));
    return;
  }
  auto to_f32 = [&](const void* in, float* x) {
    if (is_quantized(from))
      dequantize_row(in, cols, from, x);
    else
      convert_to_f32(in, from, x, static_cast<std::size_t>(cols));
  };
  auto from_f32 = [&](const float* x, void* out) {
    if (is_quantized(to))
      quantize_row(x, cols, to, out);
    else
      convert_from_f32(x, to, out, static_cast<std::size_t>(cols));
  };
  std::vector<float> row(from != DType::F32 && to != DType::F32 ? static_cast<std::size_t>(cols) : 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto* in = static_cast<const std::byte*>(src) + r * in_bytes;
    auto* out = static_cast<std::byte*>(dst) + r * out_bytes;
    if (to == DType::F32) {
      to_f32(in, reinterpret_cast<float*>(out));
    } else if (from == DType::F32) {
      from_f32(reinterpret_cast<const float*>(in), out);
    } else {
      to_f32(in, row.data());
      from_f32(row.data(), out);
    }
  }
}

}  // namespace flexh2o::kernels
