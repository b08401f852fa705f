// The CUDA backend's decode plans (kernels/cuda/decode_plan.h), host code tested without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <set>
#include <vector>

#include "kernels/cuda/decode_plan.h"

namespace flexh2o::kernels {
namespace {

// Flash-decoding's plan: the splits cover the longest sequence with no empty one, each at
// least kDecodeMinKeys keys (tile-aligned), and fill the GPU when the keys allow; head chunks
// of at most kDecodeMaxHeadsPerBlock (one above kDecodeWideHeadDim), of even size, cover the
// group.
TEST(CudaDecodePlan, SplitsFillTheGpu) {
  for (const auto& [H, Hkv, D, B, len] : std::vector<std::array<std::int64_t, 5>>{
           {32, 8, 128, 1, 2048}, {32, 8, 128, 1, 1}, {32, 8, 128, 64, 2048}, {96, 96, 128, 32, 544},
           {24, 1, 128, 2, 400}, {12, 1, 128, 1, 257}, {64, 8, 128, 1, 100000}, {32, 32, 64, 16, 520},
           {32, 32, 64, 256, 4096}, {8, 2, 512, 3, 1000}})
    for (int sms : {1, 132}) {
      SCOPED_TRACE(::testing::Message() << "H=" << H << " Hkv=" << Hkv << " D=" << D << " B=" << B << " len=" << len
                                        << " sms=" << sms);
      const AttentionShape s{H, Hkv, D, 1.0f};
      const cuda::DecodePlan p = cuda::plan_decode(s, B, len, sms);
      const std::int64_t group = H / Hkv;
      EXPECT_LE(p.heads_per_block, D > cuda::kDecodeWideHeadDim ? 1 : cuda::kDecodeMaxHeadsPerBlock);
      EXPECT_GE(p.heads_per_block * p.head_chunks, group);
      EXPECT_LT((p.head_chunks - 1) * p.heads_per_block, group);
      EXPECT_EQ(p.keys_per_split % cuda::kDecodeKeyTile, 0);
      EXPECT_GE(p.splits * p.keys_per_split, len);
      EXPECT_LT((p.splits - 1) * p.keys_per_split, len);
      if (p.splits > 1) {
        EXPECT_GE(p.keys_per_split, cuda::kDecodeMinKeys);
      }
      // Splits for kDecodeBlocksPerSm blocks per SM, as far as kDecodeMinKeys keys each allow
      // (the rounding of a split to whole tiles may take up to a third of them away).
      const std::int64_t base = B * Hkv * p.head_chunks, target = cuda::kDecodeBlocksPerSm * sms;
      const std::int64_t wanted =
          std::min((target + base - 1) / base, (len + cuda::kDecodeMinKeys - 1) / cuda::kDecodeMinKeys);
      EXPECT_GE(3 * p.splits, 2 * wanted);
    }
  // LLaMA-3-8B at batch 1 over 2048 keys on 132 SMs: 8 x 32 blocks of 64 keys.
  EXPECT_EQ(cuda::plan_decode({32, 8, 128, 1.0f}, 1, 2048, 132).splits, 32);
  // OPT-1.3B, 16 sequences of 520 keys (issue 43's step): 512 (sequence, head) pairs in 3 splits.
  EXPECT_EQ(cuda::plan_decode({32, 32, 64, 1.0f}, 16, 520, 132).splits, 3);
  // 256 sequences fill the GPU without splitting.
  EXPECT_EQ(cuda::plan_decode({32, 32, 64, 1.0f}, 256, 4096, 132).splits, 1);
}

// A 1,000-token generation after a 512-token prompt (OPT-1.3B's heads at batch 16, and
// Llama-3-8B's at batch 1, on 132 SMs): the decode call's graph signature (its plan included,
// which the step's CUDA graph bakes in) is the same from step to step except where the planned
// keys cross a bucket edge, a handful of times; the plan always covers the call's keys within
// 1 / 8 more.
TEST(CudaDecodePlan, AGenerationSharesPlansBetweenBucketEdges) {
  for (const auto& [H, Hkv, D, B] : std::vector<std::array<std::int64_t, 4>>{{32, 32, 64, 16}, {32, 8, 128, 1}}) {
    SCOPED_TRACE(::testing::Message() << "H=" << H << " Hkv=" << Hkv << " B=" << B);
    const std::int64_t capacity = 512 + 1000;
    const AttentionShape s{H, Hkv, D, 1.0f};
    std::set<std::int64_t> planned;
    int changes = 0;
    cuda::OpSignature last(cuda::GraphOp::Gemm);
    std::vector<std::int64_t> lens(static_cast<std::size_t>(B));
    for (std::int64_t len = 513; len <= capacity; ++len) {
      std::ranges::fill(lens, len);
      if (B > 1) lens.front() = len - 7;  // sequences of other lengths: the longest decides
      const AttentionDecodeArgs a{.shape = s, .capacity = capacity, .lens = lens};
      const cuda::DecodePlan p = cuda::plan_decode(a, 132);
      const std::int64_t keys = cuda::decode_planned_keys(len, capacity);
      EXPECT_GE(keys, len);
      EXPECT_LE(keys, std::min(capacity, len + len / cuda::kDecodeBucketsPerOctave + cuda::kDecodeKeyTile));
      EXPECT_EQ(p, cuda::plan_decode(s, B, keys, 132));
      EXPECT_GE(p.splits * p.keys_per_split, len);
      const cuda::OpSignature sig = cuda::decode_signature(a, 132);
      if (len > 513 && !(sig == last)) ++changes;
      if (len > 513 && cuda::decode_planned_keys(len - 1, capacity) == keys) {
        EXPECT_TRUE(sig == last) << len;
      }
      last = sig;
      planned.insert(keys);
    }
    // 513-1024 in steps of 64, 1025-1512 in steps of 128 up to the capacity.
    EXPECT_EQ(planned.size(), 12u);
    EXPECT_LE(changes, 11);
  }
}

TEST(CudaDecodePlan, PlannedKeysStayWithinTheCapacity) {
  EXPECT_EQ(cuda::decode_planned_keys(1, 100), 1);
  EXPECT_EQ(cuda::decode_planned_keys(32, 100), 32);
  EXPECT_EQ(cuda::decode_planned_keys(33, 100), 64);
  EXPECT_EQ(cuda::decode_planned_keys(520, 4096), 576);
  EXPECT_EQ(cuda::decode_planned_keys(520, 530), 530);
  EXPECT_EQ(cuda::decode_planned_keys(4097, 1 << 20), 4608);
}

}  // namespace
}  // namespace flexh2o::kernels
