// Rotary position embedding, applied in place to query or key rows.
#pragma once
#include <cstdint>
#include <span>

namespace flexh2o::kernels {

// Which elements of a head form a rotated pair.
enum class RopeLayout : std::uint8_t {
  RotateHalf,   // (x[i], x[i + d/2]): Hugging Face checkpoints
  Interleaved,  // (x[2i], x[2i+1]): llama2.c and Meta checkpoints
};

// For token t at position p, pair i of every head rotates by p * theta^(-2i/head_dim).
struct RopeArgs {
  float* x = nullptr;  // [tokens, heads * head_dim]
  std::int64_t tokens = 0;
  std::int64_t heads = 0;
  std::int64_t head_dim = 0;  // even
  std::span<const std::int32_t> positions;  // host, [tokens]
  float theta = 10000.0f;
  RopeLayout layout = RopeLayout::RotateHalf;
};

}  // namespace flexh2o::kernels
