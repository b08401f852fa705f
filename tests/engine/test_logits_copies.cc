// A step's logits cross from the device to the host once per GPU batch, however its sequences
// sample (one call for a fixed block, one per slot under continuous batching, forks), and the
// tokens and logits are those of the plain CPU run. A CPU stand-in plays the device: it counts
// Backend::logits_on_host calls and any sample call that would copy the logits itself. The
// head multiplies only the sequences that predict a token: an idle slot (continuous batching's
// tail, a slot waiting for a newcomer) adds no row to its GEMM nor to the copy.
#include <gtest/gtest.h>

#include <vector>

#include "engine/loaders/dummy_weights.h"
#include "engine/runtime/block_executor.h"
#include "engine/runtime/generator.h"
#include "engine/serving/generate.h"
#include "offload/tiers.h"
#include "tests/support/forwarding_backend.h"
#include "tests/support/test_models.h"
#include "tests/support/tiered_run.h"

namespace flexh2o {
namespace {

using engine::GenerationRequest;
using engine::GenerationResult;

class CountingLogitsBackend final : public testing::ForwardingBackend {
 public:
  const float* logits_on_host(const float* logits, std::int64_t rows, std::int64_t vocab) override {
    ++copies;
    rows_copied += rows;
    staged.assign(logits, logits + rows * vocab);  // the device keeps its buffer until the next call
    return staged.data();
  }
  void do_sample(const kernels::SampleArgs& a) override {
    if (!a.logits_on_host) ++samples_from_device;
    ForwardingBackend::do_sample(a);
  }
  void do_gemm(const kernels::GemmArgs& a) override {
    if (a.w.rows == vocab) head_rows += a.m;
    ForwardingBackend::do_gemm(a);
  }
  std::int64_t vocab = 0;  // the head's output rows
  int copies = 0;
  std::int64_t rows_copied = 0, head_rows = 0;
  int samples_from_device = 0;
  std::vector<float> staged;
};

GenerationRequest request(const engine::ModelConfig& cfg, std::int64_t prompts, std::int64_t slots) {
  GenerationRequest req;
  for (std::int64_t p = 0; p < prompts; ++p) {
    engine::Sequence s{.prompt = {1, static_cast<std::int32_t>((5 * p + 2) % cfg.vocab_size)}};
    s.max_new_tokens = 3 + p % 4;  // sequences end at different steps: slots refill
    req.sequences.push_back(s);
  }
  req.max_new_tokens = 6;
  req.slots = slots;
  req.sampling.temperature = 0.8f;
  req.sampling.seed = 7;
  return req;
}

struct Run {
  GenerationResult result;
  std::vector<std::vector<float>> logits;  // per sampled row, in the order they came
};

Run run(kernels::Backend& be, const engine::ModelConfig& cfg, GenerationRequest req, std::int64_t gbs) {
  Run r;
  engine::GenerationHooks hooks;
  if (req.slots > 0)
    hooks.on_sequence_logits = [&](std::size_t, std::int64_t, std::span<const float> l) { r.logits.emplace_back(l.begin(), l.end()); };
  else
    hooks.on_logits = [&](std::int64_t, std::span<const float> l) { r.logits.emplace_back(l.begin(), l.end()); };
  const engine::DummyWeights src(cfg, 41);
  testing::TempDir dir;
  offload::TierOptions to;
  to.offload_dir = dir.path();
  offload::Tiers tiers(be, to);
  engine::BlockExecutor sched(be, tiers, cfg, src, testing::spread_policy(gbs, 1, {1.0, 0.0, 0.0}), nullptr, {true});
  r.result = serving::generate(sched, req, hooks);
  return r;
}

void expect_one_copy_per_step(std::int64_t prompts, std::int64_t slots, std::int64_t gbs) {
  const engine::ModelConfig cfg = testing::tiny_llama_config();
  auto cpu = kernels::make_cpu_backend();
  CountingLogitsBackend device;
  device.vocab = cfg.vocab_size;
  const Run want = run(*cpu, cfg, request(cfg, prompts, slots), gbs);
  const Run got = run(device, cfg, request(cfg, prompts, slots), gbs);
  EXPECT_EQ(got.result.tokens, want.result.tokens);
  EXPECT_EQ(got.logits, want.logits);
  EXPECT_EQ(device.samples_from_device, 0);
  const std::int64_t steps = got.result.prefill_steps + got.result.decode_steps;
  EXPECT_EQ(device.copies, steps);
  // One head row per sequence that sampled (no forks here), fewer than the slots' steps when
  // some ran idle.
  EXPECT_EQ(device.rows_copied, got.result.sequence_steps);
  EXPECT_EQ(device.head_rows, got.result.sequence_steps);
  if (slots > 0) {
    EXPECT_LT(got.result.sequence_steps, steps * slots) << "no slot ran idle: the test shows nothing";
  }
}

TEST(LogitsCopies, OnePerStepUnderContinuousBatching) { expect_one_copy_per_step(7, 3, 3); }

TEST(LogitsCopies, OnePerStepForAFixedBlock) { expect_one_copy_per_step(4, 0, 4); }

TEST(LogitsCopies, OnePerStepInTheInMemoryGenerator) {
  const engine::ModelConfig cfg = testing::tiny_llama_config();
  const engine::DummyWeights src(cfg, 42);
  CountingLogitsBackend device;
  const GenerationRequest req = request(cfg, 3, 0);
  auto cpu = kernels::make_cpu_backend();
  const auto want = engine::Generator(*cpu, cfg, engine::load_weights(cfg, src)).generate(req).tokens;
  const GenerationResult got = engine::Generator(device, cfg, engine::load_weights(cfg, src)).generate(req);
  EXPECT_EQ(got.tokens, want);
  EXPECT_EQ(device.samples_from_device, 0);
  EXPECT_EQ(device.copies, got.prefill_steps + got.decode_steps);
}

}  // namespace
}  // namespace flexh2o
