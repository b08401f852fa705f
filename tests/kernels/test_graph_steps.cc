// The host-side logic of CUDA-graph decode steps (kernels/cuda/graph_steps.h), without a GPU:
// every field an op's launch depends on is in its signature (its host arrays by size only), a
// key's steps go record -> capture -> replay, a miss captures again, keys that never replay
// are given up, and arena offsets keep the pool's alignment.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/cuda/graph_steps.h"

namespace flexh2o::kernels::cuda {
namespace {

template <class Args>
void expect_each_change_differs(const Args& base, const std::vector<std::function<void(Args&)>>& changes) {
  for (std::size_t i = 0; i < changes.size(); ++i) {
    Args changed = base;
    changes[i](changed);
    EXPECT_FALSE(signature(changed) == signature(base)) << "change " << i << " left the signature as it was";
  }
  EXPECT_TRUE(signature(Args(base)) == signature(base));
}

float* fake(std::uintptr_t address) { return reinterpret_cast<float*>(address); }

TEST(KernelGraphSteps, GemmSignatureHasEveryField) {
  const GemmArgs base{.x = fake(0x1000), .m = 4, .w = {fake(0x2000), DType::F16, 8, 16}, .bias = fake(0x3000),
                      .y = fake(0x4000), .beta = 0.0f, .compute = DType::BF16, .x_bf16 = nullptr, .x_stride = 0};
  expect_each_change_differs<GemmArgs>(
      base, {[](GemmArgs& a) { a.x = fake(0x1100); }, [](GemmArgs& a) { a.m = 5; },
             [](GemmArgs& a) { a.w.data = fake(0x2100); }, [](GemmArgs& a) { a.w.dtype = DType::BF16; },
             [](GemmArgs& a) { a.w.rows = 9; }, [](GemmArgs& a) { a.w.cols = 17; },
             [](GemmArgs& a) { a.bias = nullptr; }, [](GemmArgs& a) { a.y = fake(0x4100); },
             [](GemmArgs& a) { a.beta = 1.0f; }, [](GemmArgs& a) { a.beta = -0.0f; },
             [](GemmArgs& a) { a.compute = DType::F32; },
             [](GemmArgs& a) { a.x_bf16 = reinterpret_cast<const std::uint16_t*>(0x5000); },
             [](GemmArgs& a) { a.x_stride = 32; }});
}

TEST(KernelGraphSteps, NormSignaturesTellTheKindsApart) {
  const NormArgs a{.x = fake(0x1000), .y = fake(0x2000), .rows = 4, .cols = 64, .weight = fake(0x3000)};
  EXPECT_FALSE(signature(GraphOp::LayerNorm, a) == signature(GraphOp::RmsNorm, a));
  NormArgs b = a;
  b.eps = 1e-6f;
  EXPECT_FALSE(signature(GraphOp::RmsNorm, a) == signature(GraphOp::RmsNorm, b));
  b = a;
  b.accumulate = true;
  EXPECT_FALSE(signature(GraphOp::RmsNorm, a) == signature(GraphOp::RmsNorm, b));
  b = a;
  b.y_bf16 = reinterpret_cast<std::uint16_t*>(0x4000);
  EXPECT_FALSE(signature(GraphOp::RmsNorm, a) == signature(GraphOp::RmsNorm, b));
}

TEST(KernelGraphSteps, HostArraysCountByTheirSizesOnly) {
  // A replay uploads each call's own arrays: their contents may change, their sizes may not.
  const std::vector<std::int64_t> lens_a{5, 6, 7}, lens_b{50, 60, 70}, lens_c{5, 6};
  AttentionDecodeArgs a{.shape = {4, 2, 64, 0.125f}, .q = fake(0x1000), .k_cache = fake(0x2000),
                        .v_cache = fake(0x3000), .capacity = 128, .lens = lens_a, .out = fake(0x4000)};
  AttentionDecodeArgs b = a;
  b.lens = lens_b;
  EXPECT_TRUE(signature(a) == signature(b));
  b.lens = lens_c;
  EXPECT_FALSE(signature(a) == signature(b));
  expect_each_change_differs<AttentionDecodeArgs>(
      a, {[](AttentionDecodeArgs& d) { d.shape.n_heads = 8; }, [](AttentionDecodeArgs& d) { d.shape.n_kv_heads = 4; },
          [](AttentionDecodeArgs& d) { d.shape.head_dim = 128; }, [](AttentionDecodeArgs& d) { d.shape.scale = 0.5f; },
          [](AttentionDecodeArgs& d) { d.shape.softcap = 30.0f; }, [](AttentionDecodeArgs& d) { d.shape.window = 64; },
          [](AttentionDecodeArgs& d) { d.q = fake(0x1100); }, [](AttentionDecodeArgs& d) { d.k_cache = fake(0x2100); },
          [](AttentionDecodeArgs& d) { d.v_cache = fake(0x3100); }, [](AttentionDecodeArgs& d) { d.capacity = 256; },
          [](AttentionDecodeArgs& d) { d.out = fake(0x4100); }, [](AttentionDecodeArgs& d) { d.probs = fake(0x5000); },
          [](AttentionDecodeArgs& d) { d.cache_dtype = DType::F16; },
          [](AttentionDecodeArgs& d) { d.slot_bias = fake(0x6000); },
          [&](AttentionDecodeArgs& d) { d.cache_rows = lens_a; },
          [](AttentionDecodeArgs& d) { d.compute = DType::BF16; }});

  const std::vector<std::int32_t> ids_a{1, 2}, ids_b{3, 4};
  const EmbeddingArgs e{.ids = ids_a, .table = {fake(0x1000), DType::F32, 10, 8}, .out = fake(0x2000)};
  EmbeddingArgs f = e;
  f.ids = ids_b;
  EXPECT_TRUE(signature(e) == signature(f));
  expect_each_change_differs<EmbeddingArgs>(
      e, {[](EmbeddingArgs& x) { x.offset = 2; }, [](EmbeddingArgs& x) { x.table.data = fake(0x1100); },
          [](EmbeddingArgs& x) { x.out = fake(0x2100); }, [](EmbeddingArgs& x) { x.accumulate = true; },
          [](EmbeddingArgs& x) { x.scale = 2.0f; }, [&](EmbeddingArgs& x) { x.ids = std::span(ids_a).first(1); }});
}

TEST(KernelGraphSteps, KvWriteAndRopeSignatures) {
  const std::vector<std::int64_t> rows{0, 1}, slots{4, 9}, heads{4, 9, 4, 9};
  const KvWriteArgs w{.src = fake(0x1000), .cache = fake(0x2000), .n_kv_heads = 2, .head_dim = 64, .capacity = 32,
                      .seq = rows, .slot = slots};
  expect_each_change_differs<KvWriteArgs>(
      w, {[](KvWriteArgs& a) { a.src = fake(0x1100); }, [](KvWriteArgs& a) { a.cache = fake(0x2100); },
          [](KvWriteArgs& a) { a.n_kv_heads = 1; }, [](KvWriteArgs& a) { a.head_dim = 32; },
          [](KvWriteArgs& a) { a.capacity = 64; }, [&](KvWriteArgs& a) { a.head_slot = heads; },
          [](KvWriteArgs& a) { a.cache_dtype = DType::Q8; }});
  const std::vector<std::int32_t> pos{3, 7};
  const std::vector<float> freq(16, 1.0f);
  const RopeArgs r{.x = fake(0x1000), .tokens = 2, .heads = 4, .head_dim = 64, .rotary_dim = 32, .positions = pos,
                   .inv_freq = freq};
  expect_each_change_differs<RopeArgs>(
      r, {[](RopeArgs& a) { a.x = fake(0x1100); }, [](RopeArgs& a) { a.tokens = 1; }, [](RopeArgs& a) { a.heads = 2; },
          [](RopeArgs& a) { a.head_dim = 128; }, [](RopeArgs& a) { a.rotary_dim = 64; },
          [](RopeArgs& a) { a.attention_factor = 1.5f; }, [](RopeArgs& a) { a.layout = RopeLayout::Interleaved; }});
}

TEST(KernelGraphSteps, SmallOpSignatures) {
  EXPECT_FALSE(signature(AddCall{fake(0x10), fake(0x20), 8}) == signature(AddCall{fake(0x10), fake(0x20), 9}));
  EXPECT_FALSE(signature(AddCall{fake(0x10), fake(0x20), 8}) == signature(AddCall{fake(0x10), fake(0x30), 8}));
  EXPECT_FALSE(signature(SoftcapCall{fake(0x10), 8, 30.0f}) == signature(SoftcapCall{fake(0x10), 8, 50.0f}));
  EXPECT_FALSE(signature(ActivationCall{Activation::Relu, fake(0x10), 8}) ==
               signature(ActivationCall{Activation::Gelu, fake(0x10), 8}));
  EXPECT_FALSE(signature(GluCall{Activation::Silu, fake(0x10), fake(0x20), fake(0x30), 8}) ==
               signature(GluCall{Activation::Silu, fake(0x10), fake(0x20), fake(0x40), 8}));
  EXPECT_FALSE(signature(CopyCall{fake(0x10), fake(0x20), 64}) == signature(CopyCall{fake(0x10), fake(0x20), 128}));
  // Two ops with the same numbers are still two ops.
  EXPECT_FALSE(signature(ActivationCall{Activation::Relu, fake(0x10), 8}) == signature(SoftcapCall{fake(0x10), 8, 0.0f}));
  const BiasActArgs b{.act = Activation::Relu, .x = fake(0x10), .rows = 2, .cols = 8, .out = fake(0x10)};
  expect_each_change_differs<BiasActArgs>(
      b, {[](BiasActArgs& a) { a.act = Activation::Gelu; }, [](BiasActArgs& a) { a.x = fake(0x20); },
          [](BiasActArgs& a) { a.bias = fake(0x30); }, [](BiasActArgs& a) { a.up = fake(0x40); },
          [](BiasActArgs& a) { a.rows = 3; }, [](BiasActArgs& a) { a.cols = 16; },
          [](BiasActArgs& a) { a.out = fake(0x50); },
          [](BiasActArgs& a) { a.out_bf16 = reinterpret_cast<std::uint16_t*>(0x60); },
          [](BiasActArgs& a) { a.out_stride = 16; }});
}

TEST(KernelGraphSteps, KeysRecordCaptureThenReplay) {
  GraphKeys keys;
  EXPECT_EQ(keys.begin(1), GraphMode::Record);
  EXPECT_EQ(keys.begin(1), GraphMode::Record);  // until a Record step ends
  keys.recorded(1);
  EXPECT_EQ(keys.begin(1), GraphMode::Capture);
  keys.captured(1);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(keys.begin(1), GraphMode::Replay);
    keys.replayed(1);
  }
  EXPECT_EQ(keys.begin(2), GraphMode::Record);  // another shape: its own steps
  EXPECT_EQ(keys.next(1), GraphMode::Replay);
  // A miss ran eagerly and recorded: the next step captures anew.
  keys.missed(1);
  EXPECT_EQ(keys.begin(1), GraphMode::Capture);
  keys.captured(1);
  // Dropped graphs (the arenas grew): replaying keys capture again.
  keys.dropped_graphs();
  EXPECT_EQ(keys.next(1), GraphMode::Capture);
  EXPECT_EQ(keys.next(2), GraphMode::Record);
}

TEST(KernelGraphSteps, KeysThatNeverReplayAreGivenUp) {
  GraphKeys keys;
  keys.begin(5);
  keys.recorded(5);
  for (int i = 0; i < GraphKeys::kMaxMisses; ++i) {
    ASSERT_EQ(keys.begin(5), GraphMode::Capture) << "capture " << i;
    keys.captured(5);
    ASSERT_EQ(keys.begin(5), GraphMode::Replay);
    keys.missed(5);  // the first replay already differs
  }
  EXPECT_EQ(keys.begin(5), GraphMode::None);
  keys.recorded(5);
  keys.captured(5);
  EXPECT_EQ(keys.next(5), GraphMode::None);  // stays given up

  // Misses between used graphs (a split plan that changes every few dozen steps) are fine.
  for (int i = 0; i < 3 * GraphKeys::kMaxMisses; ++i) {
    keys.recorded(6);
    ASSERT_EQ(keys.begin(6), GraphMode::Capture);
    keys.captured(6);
    keys.replayed(6);
    keys.missed(6);
  }
  EXPECT_EQ(keys.next(6), GraphMode::Capture);

  // A step that could not be captured (an op needing the host, a failed capture) is tried again
  // from a record, kMaxFailures times in all.
  for (int i = 1; i < GraphKeys::kMaxFailures; ++i) {
    keys.give_up(7);
    ASSERT_EQ(keys.begin(7), GraphMode::Record);
  }
  keys.give_up(7);
  EXPECT_EQ(keys.begin(7), GraphMode::None);
}

TEST(KernelGraphSteps, KeysAreBounded) {
  GraphKeys keys;
  for (std::uint64_t k = 0; k < GraphKeys::kMaxKeys; ++k) ASSERT_EQ(keys.begin(k), GraphMode::Record);
  EXPECT_EQ(keys.begin(GraphKeys::kMaxKeys), GraphMode::None);
  EXPECT_EQ(keys.begin(0), GraphMode::Record);  // known keys go on
}

TEST(KernelGraphSteps, ArenaOffsetsKeepThePoolAlignment) {
  std::size_t used = 0;
  EXPECT_EQ(bump_offset(used, 256), 0u);
  EXPECT_EQ(bump_offset(used, 300), 256u);
  EXPECT_EQ(used, 556u);
  EXPECT_EQ(bump_offset(used, 8), 768u);
  EXPECT_EQ(bump_offset(used, 1), 1024u);
  EXPECT_EQ(used, 1025u);
  for (std::size_t i = 0; i < 20; ++i) EXPECT_EQ(bump_offset(used, 7 * i + 1) % kArenaAlignment, 0u);
}

}  // namespace
}  // namespace flexh2o::kernels::cuda
