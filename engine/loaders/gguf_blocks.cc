// Compiled with -ffp-contract=off: the reference rounds every product and sum on its own.
#include "engine/loaders/gguf_blocks.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/quantize.h"

namespace flexh2o::engine {

namespace {

// ggml type ids (ggml.h).
enum : std::uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kBF16 = 30,
};

using Byte = std::uint8_t;

float half(const Byte* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return kernels::f16_to_f32(h);
}

// Q4_0 / Q4_1 / Q5_x: value e of a 32-value block is nibble (e % 16) of byte qs[e % 16],
// the low nibble for e < 16.
int nibble(const Byte* qs, int e) { return e < 16 ? qs[e] & 0xf : qs[e - 16] >> 4; }

void q4_0(const Byte* b, float* y) {  // d, qs[16]
  const float d = half(b);
  for (int e = 0; e < 32; ++e) y[e] = d * static_cast<float>(nibble(b + 2, e) - 8);
}

void q4_1(const Byte* b, float* y) {  // d, m, qs[16]
  const float d = half(b), m = half(b + 2);
  for (int e = 0; e < 32; ++e) y[e] = d * static_cast<float>(nibble(b + 4, e)) + m;
}

// The fifth bit of value e: bit e of the little-endian u32 qh.
int high_bit(const Byte* qh, int e) { return (qh[e / 8] >> (e % 8)) & 1; }

void q5_0(const Byte* b, float* y) {  // d, qh[4], qs[16]
  const float d = half(b);
  for (int e = 0; e < 32; ++e) y[e] = d * static_cast<float>((nibble(b + 6, e) | high_bit(b + 2, e) << 4) - 16);
}

void q5_1(const Byte* b, float* y) {  // d, m, qh[4], qs[16]
  const float d = half(b), m = half(b + 2);
  for (int e = 0; e < 32; ++e) y[e] = d * static_cast<float>(nibble(b + 8, e) | high_bit(b + 4, e) << 4) + m;
}

void q8_0(const Byte* b, float* y) {  // d, qs[32] (int8)
  const float d = half(b);
  for (int e = 0; e < 32; ++e) y[e] = static_cast<float>(static_cast<std::int8_t>(b[2 + e])) * d;
}

// K-quants: superblocks of 256 values. Their 2-bit codes (Q2_K, the low bits of Q3_K) sit in
// 32-byte chunks: value e reads byte qs[32 * (e / 128) + e % 32], bits 2 * ((e % 128) / 32).
int crumb(const Byte* qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3; }

void q2_k(const Byte* b, float* y) {  // scales[16], qs[64], d, dmin
  const Byte* scales = b;
  const Byte* qs = b + 16;
  const float d = half(b + 80), dmin = half(b + 82);
  for (int e = 0; e < 256; ++e) {
    const Byte sc = scales[e / 16];
    const float dl = d * static_cast<float>(sc & 0xf), ml = dmin * static_cast<float>(sc >> 4);
    y[e] = dl * static_cast<float>(crumb(qs, e)) - ml;
  }
}

void q3_k(const Byte* b, float* y) {  // hmask[32], qs[64], scales[12], d
  const Byte* hmask = b;
  const Byte* qs = b + 32;
  const Byte* sc = b + 96;
  const float d = half(b + 108);
  for (int e = 0; e < 256; ++e) {
    // 16 six-bit scales: low 4 bits from sc[0..7] (nibble j / 8), high 2 bits from sc[8..11].
    const int j = e / 16;
    const int low = (sc[j % 8] >> (4 * (j / 8))) & 0xf, high = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
    const float dl = d * static_cast<float>((low | high << 4) - 32);
    // The high bit of value e is bit e / 32 of hmask[e % 32]; a clear bit subtracts 4.
    const int hbit = (hmask[e % 32] >> (e / 32)) & 1;
    y[e] = dl * static_cast<float>(crumb(qs, e) - (hbit ? 0 : 4));
  }
}

// Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins packed into 12 bytes.
void k_scale_min(const Byte* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 2) & 0x30);
    m = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
  }
}

// Value e of Q4_K / Q5_K: 4-bit code from byte qs[32 * (e / 64) + e % 32], the low nibble in
// the first half of each 64.
int k_nibble(const Byte* qs, int e) { return (qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 0xf; }

void q4_k(const Byte* b, float* y) {  // d, dmin, scales[12], qs[128]
  const float d = half(b), dmin = half(b + 2);
  for (int e = 0; e < 256; ++e) {
    int sc = 0, m = 0;
    k_scale_min(b + 4, e / 32, sc, m);
    const float dd = d * static_cast<float>(sc), dm = dmin * static_cast<float>(m);
    y[e] = dd * static_cast<float>(k_nibble(b + 16, e)) - dm;
  }
}

void q5_k(const Byte* b, float* y) {  // d, dmin, scales[12], qh[32], qs[128]
  const float d = half(b), dmin = half(b + 2);
  const Byte* qh = b + 16;
  for (int e = 0; e < 256; ++e) {
    int sc = 0, m = 0;
    k_scale_min(b + 4, e / 32, sc, m);
    const float dd = d * static_cast<float>(sc), dm = dmin * static_cast<float>(m);
    const int q = k_nibble(b + 48, e) | ((qh[e % 32] >> (e / 32)) & 1) << 4;
    y[e] = dd * static_cast<float>(q) - dm;
  }
}

void q6_k(const Byte* b, float* y) {  // ql[128], qh[64], scales[16] (int8), d
  const Byte* ql = b;
  const Byte* qh = b + 128;
  const Byte* scales = b + 192;
  const float d = half(b + 208);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, r = e % 128;
    const int low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xf;
    const int high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
    const float dd = d * static_cast<float>(static_cast<std::int8_t>(scales[e / 16]));
    y[e] = dd * static_cast<float>((low | high << 4) - 32);
  }
}

using BlockFn = void (*)(const Byte*, float*);

BlockFn block_fn(std::uint32_t id) {
  switch (id) {
    case kQ4_0: return q4_0;
    case kQ4_1: return q4_1;
    case kQ5_0: return q5_0;
    case kQ5_1: return q5_1;
    case kQ8_0: return q8_0;
    case kQ2_K: return q2_k;
    case kQ3_K: return q3_k;
    case kQ4_K: return q4_k;
    case kQ5_K: return q5_k;
    case kQ6_K: return q6_k;
    default: return nullptr;
  }
}

std::uint16_t half_bits(const Byte* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// -k d as fp16, when that is exact.
std::uint16_t exact_negative_multiple(const Byte* d_bits, float k, std::int64_t block) {
  const float m = -k * half(d_bits);
  const std::uint16_t h = kernels::f32_to_f16(m);
  if (kernels::f16_to_f32(h) != m)
    throw std::range_error("block " + std::to_string(block) + " has scale " + std::to_string(half(d_bits)) +
                           ", whose minimum " + std::to_string(-k) + " * scale is not an fp16 number");
  return h;
}

}  // namespace

bool ggml_dequantizable(const GgmlTypeInfo& t) {
  return t.id == kF32 || t.id == kF16 || t.id == kBF16 || block_fn(t.id) != nullptr;
}

void dequantize_ggml(const GgmlTypeInfo& t, const void* src, std::int64_t n, float* dst) {
  const auto* in = static_cast<const Byte*>(src);
  switch (t.id) {
    case kF32:
      std::memcpy(dst, src, static_cast<std::size_t>(n) * 4);
      return;
    case kF16:
      kernels::convert_to_f32(src, kernels::DType::F16, dst, static_cast<std::size_t>(n));
      return;
    case kBF16:
      kernels::convert_to_f32(src, kernels::DType::BF16, dst, static_cast<std::size_t>(n));
      return;
    default:
      break;
  }
  const BlockFn fn = block_fn(t.id);
  if (fn == nullptr) throw std::invalid_argument("ggml type " + std::string(t.name) + " cannot be dequantized");
  for (std::int64_t b = 0; b < n / t.block_size; ++b) fn(in + b * t.type_size, dst + b * t.block_size);
}

std::optional<kernels::DType> ggml_group_format(const GgmlTypeInfo& t) {
  if (t.id == kQ4_0 || t.id == kQ4_1) return kernels::DType::Q4G32;
  if (t.id == kQ8_0) return kernels::DType::Q8G32;
  return std::nullopt;
}

void repack_ggml_row(const GgmlTypeInfo& t, const void* src, std::int64_t n, void* dst) {
  const auto to = ggml_group_format(t);
  if (!to) throw std::invalid_argument("ggml type " + std::string(t.name) + " has no lossless engine format");
  const auto* in = static_cast<const Byte*>(src);
  auto* codes = static_cast<Byte*>(dst);
  Byte* params = codes + kernels::quant_code_bytes(*to, n);
  for (std::int64_t b = 0; b < n / 32; ++b) {
    const Byte* blk = in + b * t.type_size;
    std::uint16_t scale = half_bits(blk), min = 0;
    if (t.id == kQ8_0) {
      min = exact_negative_multiple(blk, 128, b);
      // int8 q -> q + 128: flipping the sign bit.
      for (int e = 0; e < 32; ++e) codes[32 * b + e] = static_cast<Byte>(blk[2 + e] ^ 0x80);
    } else {
      const Byte* qs = blk + (t.id == kQ4_1 ? 4 : 2);
      min = t.id == kQ4_1 ? half_bits(blk + 2) : exact_negative_multiple(blk, 8, b);
      // The engine keeps values 2k and 2k + 1 in one byte (low nibble first).
      for (int k = 0; k < 16; ++k)
        codes[16 * b + k] = static_cast<Byte>(nibble(qs, 2 * k) | nibble(qs, 2 * k + 1) << 4);
    }
    std::memcpy(params + 4 * b, &scale, 2);
    std::memcpy(params + 4 * b + 2, &min, 2);
  }
}

}  // namespace flexh2o::engine
