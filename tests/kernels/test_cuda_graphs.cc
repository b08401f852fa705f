// Decode steps as CUDA graphs (kernels/cuda/cuda_graphs.cu) against the same steps run op by op
// on the same backend: a small transformer layer's decode (embedding with learned positions,
// norms, GEMMs with and without bias and residual, RoPE, KV writes, split decode attention, an
// activation, the head's copy and softcap) on fresh random data, step after step as contexts
// grow. A replay runs the captured kernels on the same data, so every logit and every cache
// byte must be equal. Also: a step whose op differs from the captured one (another output
// buffer; later a decode split plan that grew) runs eagerly and the next captures again; a step
// with a host copy inside, or a decode call with tensor-core runs (chunked prefill), runs
// eagerly and its key is given up. Skips without a usable GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/kernels/seeded_test.h"

#if defined(FLEXH2O_HAVE_CUDA) && FLEXH2O_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace flexh2o::kernels {
namespace {

#if defined(FLEXH2O_HAVE_CUDA) && FLEXH2O_HAVE_CUDA

constexpr std::int64_t kB = 4, kC = 256, kH = 4, kHkv = 2, kD = 64, kFfn = 512, kVocab = 1000, kCap = 192;
constexpr std::int64_t kPositions = 512;
std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class CudaGraphsTest : public SeededTest {
 protected:
  void SetUp() override {
    if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
    be_ = make_backend("cuda");
    cuda_ = dynamic_cast<cuda::CudaBackend*>(be_.get());
    ASSERT_NE(cuda_, nullptr);
    tokens_ = random_buffer(kVocab * kC);
    positions_ = random_buffer(kPositions * kC);
    ln_w_ = random_buffer(kC);
    ln_b_ = random_buffer(kC);
    rms_w_ = random_buffer(kC);
    wq_ = f16_buffer(kH * kD * kC);
    bq_ = random_buffer(kH * kD);
    wk_ = f16_buffer(kHkv * kD * kC);
    wv_ = f16_buffer(kHkv * kD * kC);
    wo_ = f16_buffer(kC * kH * kD);
    wup_ = f16_buffer(kFfn * kC);
    bup_ = random_buffer(kFfn);
    wdown_ = f16_buffer(kC * kFfn);
    head_ = f16_buffer(kVocab * kC);
    for (std::int64_t i = 0; i < kD / 2; ++i) inv_freq_.push_back(1.0f / static_cast<float>(1 + i));
  }

  DeviceBuffer random_buffer(std::int64_t n, float lo = -1.0f, float hi = 1.0f) {
    const std::vector<float> host = random_floats(n, lo, hi);
    DeviceBuffer d(*be_, host.size() * sizeof(float));
    be_->copy_to_device(d.data(), host.data(), d.bytes());
    return d;
  }
  DeviceBuffer f16_buffer(std::int64_t n) {
    const std::vector<std::uint8_t> host = stored_rows(random_floats(n, -0.1f, 0.1f), DType::F16, 1, n);
    DeviceBuffer d(*be_, host.size());
    be_->copy_to_device(d.data(), host.data(), d.bytes());
    return d;
  }

  // One run's activations and KV cache (the weights are shared).
  struct Run {
    DeviceBuffer h, normed, q, k, v, o, a, last, logits, other_logits, k_cache, v_cache;
  };
  Run make_run(const std::vector<float>& k_init, const std::vector<float>& v_init) {
    auto floats = [&](std::int64_t n) { return DeviceBuffer(*be_, sz(n) * sizeof(float)); };
    Run r{floats(kB * kC),     floats(kB * kC),     floats(kB * kH * kD), floats(kB * kHkv * kD),
          floats(kB * kHkv * kD), floats(kB * kH * kD), floats(kB * kFfn),  floats(kB * kC),
          floats(kB * kVocab), floats(kB * kVocab), floats(static_cast<std::int64_t>(k_init.size())),
          floats(static_cast<std::int64_t>(v_init.size()))};
    be_->copy_to_device(r.k_cache.data(), k_init.data(), r.k_cache.bytes());
    be_->copy_to_device(r.v_cache.data(), v_init.data(), r.v_cache.bytes());
    return r;
  }

  struct Step {
    std::vector<std::int32_t> ids, positions;
    std::vector<std::int64_t> seq, slot, lens;
  };
  // Step s: sequence b holds first_len + b + s tokens after it (the first a decode split
  // boundary away from crossing it).
  Step make_step(std::int64_t s, std::int64_t first_len) {
    Step st;
    for (std::int64_t b = 0; b < kB; ++b) {
      const std::int64_t len = first_len - b + s;
      st.ids.push_back(static_cast<std::int32_t>(random_int(0, kVocab - 1)));
      st.positions.push_back(static_cast<std::int32_t>(len - 1));
      st.seq.push_back(b);
      st.slot.push_back(len - 1);
      st.lens.push_back(len);
    }
    return st;
  }

  // The layer's decode and the head; `host_copy` (the interruption check) reads o mid-step.
  void forward(Run& r, const Step& s, bool other_logits = false, std::vector<float>* host_copy = nullptr) {
    float *h = r.h.as<float>(), *normed = r.normed.as<float>(), *q = r.q.as<float>(), *k = r.k.as<float>();
    float *v = r.v.as<float>(), *o = r.o.as<float>(), *a = r.a.as<float>();
    be_->embedding({.ids = s.ids, .table = {tokens_.data(), DType::F32, kVocab, kC}, .out = h});
    be_->embedding({.ids = s.positions, .offset = 0, .table = {positions_.data(), DType::F32, kPositions, kC},
                    .out = h, .accumulate = true});
    be_->layer_norm({.x = h, .y = normed, .rows = kB, .cols = kC, .weight = ln_w_.as<float>(), .bias = ln_b_.as<float>()});
    be_->gemm({.x = normed, .m = kB, .w = {wq_.data(), DType::F16, kH * kD, kC}, .bias = bq_.as<float>(), .y = q,
               .compute = DType::BF16});
    be_->gemm({.x = normed, .m = kB, .w = {wk_.data(), DType::F16, kHkv * kD, kC}, .y = k, .compute = DType::BF16});
    be_->gemm({.x = normed, .m = kB, .w = {wv_.data(), DType::F16, kHkv * kD, kC}, .y = v, .compute = DType::F32});
    for (auto [x, heads] : {std::pair{q, kH}, std::pair{k, kHkv}})
      be_->rope({.x = x, .tokens = kB, .heads = heads, .head_dim = kD, .rotary_dim = kD, .positions = s.positions,
                 .inv_freq = inv_freq_});
    for (auto [src, cache] : {std::pair{k, r.k_cache.data()}, std::pair{v, r.v_cache.data()}})
      be_->kv_write({.src = src, .cache = cache, .n_kv_heads = kHkv, .head_dim = kD, .capacity = kCap, .seq = s.seq,
                     .slot = s.slot});
    be_->attention_decode({.shape = {kH, kHkv, kD, 0.125f}, .q = q, .k_cache = r.k_cache.data(),
                           .v_cache = r.v_cache.data(), .capacity = kCap, .lens = s.lens, .out = o});
    if (host_copy) {
      host_copy->resize(sz(kB * kH * kD));
      be_->copy_to_host(host_copy->data(), o, host_copy->size() * sizeof(float));
    }
    be_->gemm({.x = o, .m = kB, .w = {wo_.data(), DType::F16, kC, kH * kD}, .y = h, .beta = 1.0f,
               .compute = DType::BF16});
    be_->rms_norm({.x = h, .y = normed, .rows = kB, .cols = kC, .weight = rms_w_.as<float>()});
    be_->gemm({.x = normed, .m = kB, .w = {wup_.data(), DType::F16, kFfn, kC}, .y = a, .compute = DType::BF16});
    be_->bias_act({.act = Activation::Gelu, .x = a, .bias = bup_.as<float>(), .rows = kB, .cols = kFfn, .out = a});
    be_->activation(Activation::Relu, a, kB * kFfn);
    be_->gemm({.x = a, .m = kB, .w = {wdown_.data(), DType::F16, kC, kFfn}, .y = h, .beta = 1.0f,
               .compute = DType::BF16});
    be_->add(h, normed, kB * kC);
    be_->copy_on_device(r.last.data(), h, sz(kB * kC) * sizeof(float));
    float* logits = other_logits ? r.other_logits.as<float>() : r.logits.as<float>();
    be_->gemm({.x = r.last.as<float>(), .m = kB, .w = {head_.data(), DType::F16, kVocab, kC}, .y = logits,
               .compute = DType::BF16});
    be_->softcap(logits, kB * kVocab, 20.0f);
  }

  std::vector<float> download(const DeviceBuffer& d) {
    std::vector<float> host(d.bytes() / sizeof(float));
    be_->copy_to_host(host.data(), d.data(), d.bytes());
    return host;
  }

  std::unique_ptr<Backend> be_;
  cuda::CudaBackend* cuda_ = nullptr;
  DeviceBuffer tokens_, positions_, ln_w_, ln_b_, rms_w_, wq_, bq_, wk_, wv_, wo_, wup_, bup_, wdown_, head_;
  std::vector<float> inv_freq_;
};

TEST_F(CudaGraphsTest, DecodeStepsReplayBitForBit) {
  // first_len - b + s: max_len runs 120 ... 132, so attention_decode's split plan changes once
  // (2 splits of 64 keys up to 128 keys, then 3; cuda::plan_decode) at step 9.
  const std::int64_t first_len = 120, steps = 13, forced = 5;
  const std::vector<float> k_init = random_floats(kB * kHkv * kCap * kD), v_init = random_floats(kB * kHkv * kCap * kD);
  Run eager = make_run(k_init, v_init), graphed = make_run(k_init, v_init);
  const cuda::CudaBackend::GraphCounts before = cuda_->graph_counts();
  std::int64_t plan_changes = 0;
  cuda::DecodePlan last_plan{};
  for (std::int64_t s = 0; s < steps; ++s) {
    SCOPED_TRACE(::testing::Message() << "step " << s);
    const Step step = make_step(s, first_len);
    const cuda::DecodePlan plan = cuda::plan_decode(AttentionDecodeArgs{.shape = {kH, kHkv, kD, 0.125f}, .lens = step.lens},
                                                    [] {
                                                      int sms = 0;
                                                      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
                                                      return sms;
                                                    }());
    if (s > 0 && (plan.splits != last_plan.splits || plan.keys_per_split != last_plan.keys_per_split)) ++plan_changes;
    last_plan = plan;
    forward(eager, step);
    be_->graph_step_begin(7);
    forward(graphed, step, s == forced);  // another logits buffer: the replay misses
    be_->graph_step_end();
    const auto& logits = s == forced ? graphed.other_logits : graphed.logits;
    ASSERT_TRUE(same_bytes(download(eager.logits), download(logits)));
  }
  EXPECT_TRUE(same_bytes(download(eager.k_cache), download(graphed.k_cache)));
  EXPECT_TRUE(same_bytes(download(eager.v_cache), download(graphed.v_cache)));
  ASSERT_EQ(plan_changes, 1) << "the steps are meant to cross one split-plan change";
  // 0 records, 1 captures, 2-4 replay, 5 misses (records), 6 captures, 7-8 replay, 9 misses
  // (the plan), 10 captures, 11-12 replay.
  const cuda::CudaBackend::GraphCounts c = cuda_->graph_counts();
  EXPECT_EQ(c.recorded - before.recorded, 3);
  EXPECT_EQ(c.captured - before.captured, 3);
  EXPECT_EQ(c.replayed - before.replayed, 7);
  EXPECT_EQ(c.missed - before.missed, 2);
  EXPECT_EQ(c.interrupted - before.interrupted, 0);
}

TEST_F(CudaGraphsTest, HostCopyInsideAStepRunsItEagerly) {
  const std::vector<float> k_init = random_floats(kB * kHkv * kCap * kD), v_init = random_floats(kB * kHkv * kCap * kD);
  Run eager = make_run(k_init, v_init), graphed = make_run(k_init, v_init);
  const cuda::CudaBackend::GraphCounts before = cuda_->graph_counts();
  for (std::int64_t s = 0; s < 4; ++s) {
    SCOPED_TRACE(::testing::Message() << "step " << s);
    const Step step = make_step(s, 80);
    std::vector<float> o_eager, o_graphed;
    forward(eager, step, false, &o_eager);
    be_->graph_step_begin(11);
    // Step 1 would capture: the copy ends the capture, its ops so far run, then the rest.
    forward(graphed, step, false, s == 1 ? &o_graphed : nullptr);
    be_->graph_step_end();
    if (s == 1) {
      EXPECT_TRUE(same_bytes(o_eager, o_graphed));
    }
    ASSERT_TRUE(same_bytes(download(eager.logits), download(graphed.logits)));
  }
  EXPECT_TRUE(same_bytes(download(eager.k_cache), download(graphed.k_cache)));
  const cuda::CudaBackend::GraphCounts c = cuda_->graph_counts();
  EXPECT_EQ(c.recorded - before.recorded, 1);
  EXPECT_EQ(c.interrupted - before.interrupted, 1);
  EXPECT_EQ(c.captured - before.captured, 0);  // the key was given up: steps 2-3 ran op by op
  EXPECT_EQ(c.replayed - before.replayed, 0);
}

// A decode call with a run of queries on one cache row under bf16 compute (tensor-core tiles,
// whose table follows the host's lens) inside a step: the step runs op by op from there and its
// key is given up; the output is the same call's outside a step, bit for bit.
TEST_F(CudaGraphsTest, TensorCoreRunsInsideAStepRunEagerly) {
  std::vector<std::int64_t> rows(20, 1), lens;
  for (std::int64_t i = 0; i < 20; ++i) lens.push_back(31 + i);
  rows.push_back(3);
  lens.push_back(7);
  const std::int64_t queries = static_cast<std::int64_t>(lens.size());
  const DeviceBuffer q = random_buffer(queries * kH * kD, -2.0f, 2.0f);
  const DeviceBuffer k_cache = f16_buffer(kB * kHkv * kCap * kD), v_cache = f16_buffer(kB * kHkv * kCap * kD);
  DeviceBuffer eager(*be_, sz(queries * kH * kD) * sizeof(float)), graphed(*be_, eager.bytes());
  auto decode = [&](DeviceBuffer& out) {
    be_->attention_decode({.shape = {kH, kHkv, kD, 0.125f}, .q = q.as<float>(), .k_cache = k_cache.data(),
                           .v_cache = v_cache.data(), .capacity = kCap, .lens = lens, .out = out.as<float>(),
                           .cache_dtype = DType::F16, .cache_rows = rows, .compute = DType::BF16});
  };
  decode(eager);
  const cuda::CudaBackend::GraphCounts before = cuda_->graph_counts();
  be_->graph_step_begin(17);
  decode(graphed);
  be_->graph_step_end();
  EXPECT_TRUE(same_bytes(download(eager), download(graphed)));
  const cuda::CudaBackend::GraphCounts c = cuda_->graph_counts();
  EXPECT_EQ(c.interrupted - before.interrupted, 1);
  EXPECT_EQ(c.captured - before.captured, 0);
}

TEST_F(CudaGraphsTest, CancelDropsAnOpenStep) {
  const std::vector<float> k_init = random_floats(kB * kHkv * kCap * kD), v_init = random_floats(kB * kHkv * kCap * kD);
  Run eager = make_run(k_init, v_init), graphed = make_run(k_init, v_init);
  for (std::int64_t s = 0; s < 3; ++s) {  // record, capture, replay
    const Step step = make_step(s, 70);
    forward(eager, step);
    be_->graph_step_begin(13);
    forward(graphed, step);
    be_->graph_step_end();
  }
  // A replay step dropped after its first op (an exception in the executor): the op, which
  // matched the captured one and was kept for the launch, never runs.
  const std::vector<float> h_before = download(graphed.h);
  const cuda::CudaBackend::GraphCounts before = cuda_->graph_counts();
  const Step dropped = make_step(3, 70);
  be_->graph_step_begin(13);
  be_->embedding({.ids = dropped.ids, .table = {tokens_.data(), DType::F32, kVocab, kC}, .out = graphed.h.as<float>()});
  be_->graph_step_cancel();
  EXPECT_TRUE(same_bytes(h_before, download(graphed.h)));
  const cuda::CudaBackend::GraphCounts after = cuda_->graph_counts();
  EXPECT_EQ(after.replayed, before.replayed);
  EXPECT_EQ(after.missed, before.missed);
  // The key replays on.
  const Step step = make_step(3, 70);
  forward(eager, step);
  be_->graph_step_begin(13);
  forward(graphed, step);
  be_->graph_step_end();
  EXPECT_EQ(cuda_->graph_counts().replayed, before.replayed + 1);
  EXPECT_TRUE(same_bytes(download(eager.logits), download(graphed.logits)));
  EXPECT_TRUE(same_bytes(download(eager.h), download(graphed.h)));
}

#endif

}  // namespace
}  // namespace flexh2o::kernels
