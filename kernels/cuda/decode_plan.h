// How the CUDA backend's flash-decoding kernel (attention_gpu.cu) splits a decode call, decided
// on the host (without CUDA, so every machine tests it). A block per (sequence, kv head, chunk of
// the group's query heads, split of the keys) reads each key and value once for the chunk's
// heads; enough splits for kDecodeBlocksPerSm blocks per SM, each of at least kDecodeMinKeys keys
// (in whole kDecodeKeyTile tiles). Chunks hold at most kDecodeMaxHeadsPerBlock heads, one above
// kDecodeWideHeadDim (the per-lane registers grow with head_dim); head_dim up to
// kDecodeMaxHeadDim.
//
// A decode step's plan is part of its CUDA graph (cuda_graphs.cu): a call plans for its longest
// sequence's keys rounded up to a bucket (decode_planned_keys), so the steps of a generation
// share a plan, and replay one graph, between bucket edges. The splits past a sequence's keys
// are empty and weigh nothing in the combine.
#pragma once
#include <cstdint>

#include "kernels/attention.h"
#include "kernels/cuda/graph_steps.h"

namespace flexh2o::kernels::cuda {

struct DecodePlan {
  std::int64_t heads_per_block = 1, head_chunks = 1;
  std::int64_t splits = 1, keys_per_split = 1;
  bool operator==(const DecodePlan&) const = default;
};
constexpr std::int64_t kDecodeMaxHeadsPerBlock = 8;
constexpr std::int64_t kDecodeKeyTile = 32;
constexpr std::int64_t kDecodeMinKeys = 64;
constexpr std::int64_t kDecodeBlocksPerSm = 8;
constexpr std::int64_t kDecodeWideHeadDim = 256;
constexpr std::int64_t kDecodeMaxHeadDim = 1024;
// Buckets per doubling of the keys: a plan covers at most 1 / 8 more keys than the call has.
constexpr std::int64_t kDecodeBucketsPerOctave = 8;

// Chunks of at most kDecodeMaxHeadsPerBlock query heads (one above kDecodeWideHeadDim) a
// group is read in.
std::int64_t decode_head_chunks(const AttentionShape& s);
// The splits plan_decode asks for before rounding them to whole tiles (which never adds one):
// enough for kDecodeBlocksPerSm blocks per SM, each of at least kDecodeMinKeys keys. It grows
// with max_len, so the bound at a cache's capacity covers every shorter decode.
std::int64_t decode_splits_bound(const AttentionShape& s, std::int64_t batch, std::int64_t max_len, int sm_count);
// The plan for `batch` sequences of at most max_len keys each.
DecodePlan plan_decode(const AttentionShape& s, std::int64_t batch, std::int64_t max_len, int sm_count);
// The keys a call whose longest sequence sees `max_len` plans for: rounded up to the next of
// kDecodeBucketsPerOctave steps per doubling (steps of whole kDecodeKeyTile tiles), at most the
// cache's capacity (which the scratch bound covers).
std::int64_t decode_planned_keys(std::int64_t max_len, std::int64_t capacity);
// The plan attention_decode runs `a` with (from its lens: the most keys a sequence sees, bucketed).
DecodePlan plan_decode(const AttentionDecodeArgs& a, int sm_count);
// What a CUDA graph step keys attention_decode's call on: its signature and its plan.
OpSignature decode_signature(const AttentionDecodeArgs& a, int sm_count);

}  // namespace flexh2o::kernels::cuda
