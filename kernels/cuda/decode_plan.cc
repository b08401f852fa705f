#include "kernels/cuda/decode_plan.h"

#include <algorithm>
#include <bit>

namespace flexh2o::kernels::cuda {

std::int64_t decode_head_chunks(const AttentionShape& s) {
  const std::int64_t group = s.n_heads / s.n_kv_heads;
  const std::int64_t most_heads = s.head_dim > kDecodeWideHeadDim ? 1 : kDecodeMaxHeadsPerBlock;
  return (group + most_heads - 1) / most_heads;
}

std::int64_t decode_splits_bound(const AttentionShape& s, std::int64_t batch, std::int64_t max_len, int sm_count) {
  const std::int64_t blocks = std::max<std::int64_t>(batch * s.n_kv_heads * decode_head_chunks(s), 1);
  const std::int64_t target = kDecodeBlocksPerSm * static_cast<std::int64_t>(std::max(sm_count, 1));
  const std::int64_t most = (std::max<std::int64_t>(max_len, 1) + kDecodeMinKeys - 1) / kDecodeMinKeys;
  return std::clamp<std::int64_t>((target + blocks - 1) / blocks, 1, most);
}

DecodePlan plan_decode(const AttentionShape& s, std::int64_t batch, std::int64_t max_len, int sm_count) {
  DecodePlan p;
  const std::int64_t group = s.n_heads / s.n_kv_heads;
  p.head_chunks = decode_head_chunks(s);
  p.heads_per_block = (group + p.head_chunks - 1) / p.head_chunks;  // chunks of even size
  max_len = std::max<std::int64_t>(max_len, 1);
  const std::int64_t splits = decode_splits_bound(s, batch, max_len, sm_count);
  const std::int64_t per = (max_len + splits - 1) / splits;
  p.keys_per_split = (per + kDecodeKeyTile - 1) / kDecodeKeyTile * kDecodeKeyTile;
  p.splits = (max_len + p.keys_per_split - 1) / p.keys_per_split;  // none empty for max_len keys
  return p;
}

std::int64_t decode_planned_keys(std::int64_t max_len, std::int64_t capacity) {
  if (max_len <= kDecodeKeyTile) return std::max<std::int64_t>(max_len, 1);
  const auto octave = static_cast<std::int64_t>(std::bit_floor(static_cast<std::uint64_t>(max_len)));
  const std::int64_t step = std::max(octave / kDecodeBucketsPerOctave, kDecodeKeyTile);
  const std::int64_t bucket = (max_len + step - 1) / step * step;
  return std::max(max_len, std::min(bucket, capacity));
}

DecodePlan plan_decode(const AttentionDecodeArgs& a, int sm_count) {
  std::int64_t max_len = 0;  // the most keys a sequence sees
  for (const std::int64_t n : a.lens) max_len = std::max(max_len, n - first_visible(n - 1, a.shape.window));
  return plan_decode(a.shape, static_cast<std::int64_t>(a.lens.size()), decode_planned_keys(max_len, a.capacity),
                     sm_count);
}

OpSignature decode_signature(const AttentionDecodeArgs& a, int sm_count) {
  OpSignature s = signature(a);
  const DecodePlan p = plan_decode(a, sm_count);
  return s.add(p.heads_per_block).add(p.head_chunks).add(p.splits).add(p.keys_per_split);
}

}  // namespace flexh2o::kernels::cuda
