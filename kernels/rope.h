// Rotary position embedding, applied in place to query or key rows.
#pragma once
#include <cstdint>
#include <span>
#include <stdexcept>

namespace flexh2o::kernels {

// Which elements of a head form a rotated pair.
enum class RopeLayout : std::uint8_t {
  RotateHalf,   // (x[i], x[i + d/2]) over the rotated dims d: Hugging Face checkpoints
  Interleaved,  // (x[2i], x[2i+1]): llama2.c and Meta checkpoints
};

// For token t at position p, pair i of every head rotates by the angle p * inv_freq[i]
// (computed in fp32, as transformers does), with cos and sin scaled by attention_factor.
// Only the first rotary_dim elements of a head rotate; the rest pass through (partial rotary).
struct RopeArgs {
  float* x = nullptr;  // [tokens, heads * head_dim]
  std::int64_t tokens = 0;
  std::int64_t heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t rotary_dim = 0;               // even, <= head_dim
  std::span<const std::int32_t> positions;  // host, [tokens]
  std::span<const float> inv_freq;          // host, [rotary_dim / 2]
  float attention_factor = 1.0f;
  RopeLayout layout = RopeLayout::RotateHalf;
};

// Throws std::invalid_argument when the arguments do not describe a valid rotation.
inline void check_rope_args(const RopeArgs& a) {
  if (a.rotary_dim <= 0 || a.rotary_dim % 2 != 0 || a.rotary_dim > a.head_dim)
    throw std::invalid_argument("rope: rotary_dim must be even, positive and at most head_dim");
  if (static_cast<std::int64_t>(a.positions.size()) != a.tokens)
    throw std::invalid_argument("rope: positions must have one entry per token");
  if (static_cast<std::int64_t>(a.inv_freq.size()) != a.rotary_dim / 2)
    throw std::invalid_argument("rope: inv_freq must have rotary_dim / 2 entries");
}

}  // namespace flexh2o::kernels
