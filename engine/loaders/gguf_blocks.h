// GGUF tensor data (ggml's block formats) in the forms the engine stores weights in:
// - dequantized to fp32, each type exactly as gguf-py's numpy reference
//   (gguf.quants.dequantize) computes it: the same fp32 products and sums in the same order,
//   so the values are bit for bit those of the reference, except that an exact zero may come
//   out as +0 where the reference has -0;
// - Q4_0, Q4_1 and Q8_0, which are the engine's own group format with groups of 32 (a code
//   per value, an fp16 scale and minimum per block), repacked into DType::Q4G32 / Q8G32
//   without loss: the repacked row dequantizes to those same values.
#pragma once
#include <cstdint>
#include <optional>

#include "engine/loaders/gguf_file.h"
#include "kernels/dtype.h"

namespace flexh2o::engine {

// F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q2_K..Q6_K.
bool ggml_dequantizable(const GgmlTypeInfo& t);
// n values (a whole number of blocks) stored as `t` at src -> fp32 at dst.
void dequantize_ggml(const GgmlTypeInfo& t, const void* src, std::int64_t n, float* dst);

// The engine format `t` repacks into without loss: Q4_0 and Q4_1 -> q4g32, Q8_0 -> q8g32.
std::optional<kernels::DType> ggml_group_format(const GgmlTypeInfo& t);
// One row of n values (whole blocks) stored as `t` -> one row of *ggml_group_format(t).
// Q4_0's value (q - 8) d and Q8_0's q d become q' d + m with m = -8 d / -128 d, exact in fp16
// for any sane scale; a block whose m is not (|d| above 8188 / 511.75, or not finite) throws
// std::range_error naming the block.
void repack_ggml_row(const GgmlTypeInfo& t, const void* src, std::int64_t n, void* dst);

}  // namespace flexh2o::engine
