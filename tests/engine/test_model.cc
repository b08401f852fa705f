// The engine's forward pass and generation against independent references.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>

#include "engine/runtime/generator.h"
#include "engine/loaders/dummy_weights.h"
#include "engine/loaders/hf_checkpoint.h"
#include "engine/loaders/llama2c_checkpoint.h"
#include "engine/loaders/model_source.h"
#include "tests/support/fp_tolerance.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

using engine::GenerationRequest;
using engine::Generator;
using engine::HostWeights;
using engine::ModelConfig;

// Logits of every step of a greedy generation, flattened per step [batch * vocab].
std::vector<std::vector<float>> step_logits(Generator& gen, const std::vector<std::vector<std::int32_t>>& prompts,
                                            std::int64_t new_tokens, std::vector<std::vector<std::int32_t>>* out = nullptr) {
  std::vector<std::vector<float>> logits;
  GenerationRequest req;
  req.sequences = engine::sequences_of(prompts);
  req.max_new_tokens = new_tokens;
  engine::GenerationHooks hooks;
  hooks.on_logits = [&](std::int64_t, std::span<const float> l) { logits.emplace_back(l.begin(), l.end()); };
  auto r = gen.generate(req, hooks);
  if (out) *out = r.tokens;
  return logits;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

TEST(Stories260k, GreedyMatchesPublishedSample) {
  auto m = engine::open_model({});
  auto be = kernels::make_cpu_backend();
  const HostWeights w = engine::load_weights(m.config, *m.weights);
  Generator gen(*be, m.config, w);
  GenerationRequest req;
  req.sequences = engine::sequences_of({m.tokenizer->encode("", true)});
  req.max_new_tokens = 256;
  auto r = gen.generate(req);
  ASSERT_EQ(r.tokens[0].size(), 256u);
  std::vector<std::int32_t> all = req.sequences[0].prompt;
  all.insert(all.end(), r.tokens[0].begin(), r.tokens[0].end());
  const std::string text = m.tokenizer->decode(all);
  const std::string published =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a "
      "big, red ball. She wanted to play with it, but it was too high.\nLily's mom said, \"Lily, let's go to the "
      "park.\" Lily was sad and didn't know what to do.";
  EXPECT_EQ(text.substr(0, published.size()), published) << text;
}

TEST(Stories260k, SafetensorsExportGivesTheSameLogits) {
  auto m = engine::open_model({});
  const HostWeights w = engine::load_weights(m.config, *m.weights);
  auto be = kernels::make_cpu_backend();
  const std::vector<std::vector<std::int32_t>> prompts = {m.tokenizer->encode("Once upon a time", true),
                                                          m.tokenizer->encode("Lily and Ben went to the park.", true)};
  Generator native(*be, m.config, w);
  std::vector<std::vector<std::int32_t>> native_tokens, hf_tokens;
  const auto expected = step_logits(native, prompts, 12, &native_tokens);
  const std::int64_t tokens = static_cast<std::int64_t>(std::max(prompts[0].size(), prompts[1].size())) + 12;

  for (int shards : {1, 3}) {
    SCOPED_TRACE("shards " + std::to_string(shards));
    testing::TempDir dir;
    testing::export_hf_checkpoint(dir.path(), m.config, w, kernels::DType::F32, /*from_interleaved=*/true, shards);
    engine::HfCheckpoint hf(dir.path());
    EXPECT_EQ(hf.config().rope.layout, kernels::RopeLayout::RotateHalf);
    const HostWeights hw = engine::load_weights(hf.config(), hf);
    Generator gen(*be, hf.config(), hw);
    const auto got = step_logits(gen, prompts, 12, &hf_tokens);
    ASSERT_EQ(got.size(), expected.size());
    // The export reorders RoPE (rotate-half) and the sums run in another order: fp32 rounding.
    for (std::size_t s = 0; s < got.size(); ++s)
      EXPECT_LE(max_abs_diff(got[s], expected[s]), testing::forward_tolerance(m.config, tokens, expected[s])) << "step " << s;
    EXPECT_EQ(hf_tokens, native_tokens);
  }
}

TEST(Stories260k, HalfPrecisionCheckpointsStayClose) {
  auto m = engine::open_model({});
  const HostWeights w = engine::load_weights(m.config, *m.weights);
  auto be = kernels::make_cpu_backend();
  const std::vector<std::vector<std::int32_t>> prompts = {m.tokenizer->encode("The cat sat", true)};
  Generator native(*be, m.config, w);
  const auto expected = step_logits(native, prompts, 4);
  for (auto dt : {kernels::DType::F16, kernels::DType::BF16}) {
    SCOPED_TRACE(std::string(kernels::dtype_name(dt)));
    testing::TempDir dir;
    testing::export_hf_checkpoint(dir.path(), m.config, w, dt, true);
    engine::HfCheckpoint hf(dir.path());
    EXPECT_EQ(hf.config().dtype, dt);
    const HostWeights hw = engine::load_weights(hf.config(), hf);
    Generator gen(*be, hf.config(), hw);
    const auto got = step_logits(gen, prompts, 4);
    // Rounded weights move logits by a little, not by a lot.
    const double u_w = dt == kernels::DType::F16 ? testing::kF16Eps : testing::kBF16Eps;
    EXPECT_LE(max_abs_diff(got[0], expected[0]), testing::rounded_weights_tolerance(m.config, u_w, expected[0]));
  }
}

// Checks every step's logits of a greedy generation against the reference forward pass over
// the whole sequence so far (no KV cache), for a ragged batch.
void expect_matches_reference(const ModelConfig& cfg, const HostWeights& w) {
  auto be = kernels::make_cpu_backend();
  Generator gen(*be, cfg, w);
  std::mt19937 rng(::testing::UnitTest::GetInstance()->random_seed());
  std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(cfg.vocab_size - 1));
  std::vector<std::vector<std::int32_t>> prompts;
  for (int len : {1, 5, 13}) {
    prompts.emplace_back();
    for (int i = 0; i < len; ++i) prompts.back().push_back(tok(rng));
  }
  std::vector<std::vector<std::int32_t>> generated;
  const std::int64_t steps = 6;
  const auto logits = step_logits(gen, prompts, steps, &generated);
  ASSERT_EQ(static_cast<std::int64_t>(logits.size()), steps);
  for (std::size_t b = 0; b < prompts.size(); ++b) {
    std::vector<std::int32_t> seq = prompts[b];
    seq.insert(seq.end(), generated[b].begin(), generated[b].end() - 1);
    const auto ref = testing::reference_logits(cfg, w, seq);
    for (std::int64_t s = 0; s < steps; ++s) {
      const auto& want = ref[prompts[b].size() - 1 + static_cast<std::size_t>(s)];
      double worst = 0;
      std::size_t argmax = 0;
      for (std::int64_t v = 0; v < cfg.vocab_size; ++v) {
        const double got = logits[s][b * cfg.vocab_size + v];
        worst = std::max(worst, std::abs(got - want[v]));
        if (want[v] > want[argmax]) argmax = static_cast<std::size_t>(v);
      }
      const std::span<const float> row(logits[s].data() + b * cfg.vocab_size, static_cast<std::size_t>(cfg.vocab_size));
      const double tol = testing::forward_tolerance(cfg, static_cast<std::int64_t>(seq.size()), row);
      EXPECT_LE(worst, tol) << "sequence " << b << " step " << s;
      // Greedy picks the reference's argmax, or a token tied with it within the rounding of both.
      EXPECT_GE(want[static_cast<std::size_t>(generated[b][s])], want[argmax] - 2 * tol)
          << "sequence " << b << " step " << s << ": picked " << generated[b][s] << ", argmax " << argmax;
    }
  }
}

// fp32 weights of the config's shape; matrices drawn from N(0, stddev) with the test's seed,
// larger than the dummy default so that attention is far from uniform.
HostWeights random_fp32_weights(const ModelConfig& cfg, float stddev) {
  engine::DummyWeights src(cfg, 7);
  HostWeights w = engine::load_weights(cfg, src);
  std::mt19937 rng(::testing::UnitTest::GetInstance()->random_seed());
  std::normal_distribution<float> nd(0.0f, stddev);
  for (auto& [name, t] : w)
    if (t.cols > 1)
      for (std::int64_t i = 0; i < t.rows * t.cols; ++i) reinterpret_cast<float*>(t.data.get())[i] = nd(rng);
  return w;
}

// --compute-dtype is settled once per job from its GPU batch, never per step. Tested on made-up
// backends' figures, so every machine checks the bf16 branches too.
TEST(ComputeDtype, AutoSettlesOncePerJobFromItsGpuBatch) {
  using kernels::DType;
  const engine::Bf16Speed native{.native = true, .faster_from_rows = 64}, emulated{.native = false, .faster_from_rows = 1};
  const auto settle = [](const char* flag, DType weights, const engine::Bf16Speed& b, std::int64_t rows) {
    return engine::job_compute_dtype(flag, weights, b, rows).dtype;
  };
  // auto: bf16 for 16-bit or quantized weights on native bf16, from the crossover on.
  EXPECT_EQ(settle("auto", DType::F16, native, 64), DType::BF16);
  EXPECT_EQ(settle("auto", DType::BF16, native, 256), DType::BF16);
  EXPECT_EQ(settle("auto", DType::Q4G32, native, 64), DType::BF16);
  EXPECT_EQ(settle("auto", DType::F16, native, 63), DType::F32);
  EXPECT_EQ(settle("auto", DType::F16, native, 1), DType::F32);
  EXPECT_EQ(settle("auto", DType::F16, {.native = true, .faster_from_rows = 1}, 1), DType::BF16);
  EXPECT_EQ(settle("auto", DType::F16, emulated, 4096), DType::F32);
  EXPECT_EQ(settle("auto", DType::F32, native, 4096), DType::F32);  // fp32 weights keep fp32
  EXPECT_FALSE(engine::job_compute_dtype("auto", DType::F16, native, 32).why.empty());
  // A named dtype is that dtype at every batch.
  for (const std::int64_t rows : {1, 63, 64, 4096}) {
    EXPECT_EQ(settle("bf16", DType::F16, emulated, rows), DType::BF16);
    EXPECT_EQ(settle("f32", DType::F16, native, rows), DType::F32);
    EXPECT_TRUE(engine::job_compute_dtype("f32", DType::F16, native, rows).why.empty());
  }
  EXPECT_THROW(settle("fp16", DType::F16, native, 64), std::invalid_argument);
  // This backend's figures are the ones a run weighs.
  auto be = kernels::make_backend("cpu");
  const engine::Bf16Speed here = engine::bf16_speed(*be, DType::F16);
  EXPECT_EQ(here.native, be->native_bf16());
  EXPECT_EQ(here.faster_from_rows, be->bf16_faster_from_rows(DType::F16));
  // Matrices whose own kernels beat bf16 at every size (the CPU's int8 path for q4) keep f32.
  const engine::Bf16Speed never{.native = true, .faster_from_rows = std::nullopt};
  EXPECT_EQ(settle("auto", DType::Q4, never, 1 << 20), DType::F32);
  EXPECT_FALSE(engine::job_compute_dtype("auto", DType::Q4, never, 64).why.empty());
}

TEST(RandomOpt, SafetensorsModelMatchesStraightforwardImplementation) {
  const ModelConfig cfg = testing::tiny_opt_config();
  const HostWeights w = random_fp32_weights(cfg, 0.15f);
  testing::TempDir dir;
  testing::export_hf_checkpoint(dir.path(), cfg, w, kernels::DType::F32, false);
  engine::HfCheckpoint hf(dir.path());
  ASSERT_EQ(hf.config().family, "opt");
  const HostWeights loaded = engine::load_weights(hf.config(), hf);
  expect_matches_reference(hf.config(), loaded);
}

TEST(RandomLlama, GqaModelMatchesStraightforwardImplementation) {
  ModelConfig cfg = testing::tiny_llama_config();
  const HostWeights w = random_fp32_weights(cfg, 0.2f);
  expect_matches_reference(cfg, w);
  cfg.rope.layout = kernels::RopeLayout::Interleaved;
  expect_matches_reference(cfg, w);
}

TEST(Generation, RaggedBatchEqualsEachPromptAlone) {
  auto m = engine::open_model({});
  const HostWeights w = engine::load_weights(m.config, *m.weights);
  auto be = kernels::make_cpu_backend();
  Generator gen(*be, m.config, w);
  const std::vector<std::vector<std::int32_t>> prompts = {
      m.tokenizer->encode("Tom had a red ball.", true), m.tokenizer->encode("", true),
      m.tokenizer->encode("The sun was shining and the birds were singing in the tall trees.", true)};
  GenerationRequest batch;
  batch.sequences = engine::sequences_of(prompts);
  batch.max_new_tokens = 40;
  batch.sampling = {.temperature = 0.8f, .top_p = 0.9f, .seed = 42};
  const auto together = gen.generate(batch).tokens;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest one;
    one.sequences = {{.prompt = prompts[i], .stream = i}};  // the same sampling stream as in the batch
    one.max_new_tokens = 40;
    one.sampling = batch.sampling;
    EXPECT_EQ(gen.generate(one).tokens[0], together[i]) << "prompt " << i;
  }
}

TEST(Generation, StopsAtStopTokenAndRejectsBadPrompts) {
  ModelConfig cfg = testing::tiny_llama_config();
  engine::DummyWeights src(cfg, 3);
  const HostWeights w = engine::load_weights(cfg, src);
  auto be = kernels::make_cpu_backend();
  {
    Generator probe(*be, cfg, w);
    GenerationRequest req;
    req.sequences = engine::sequences_of({{1, 2, 3}});
    req.max_new_tokens = 5;
    const auto first = probe.generate(req).tokens[0];
    cfg.stop_ids = {first[2]};  // make the third generated token a stop token
  }
  Generator gen(*be, cfg, w);
  GenerationRequest req;
  req.sequences = engine::sequences_of({{1, 2, 3}});
  req.max_new_tokens = 5;
  const auto r = gen.generate(req);
  ASSERT_LE(r.tokens[0].size(), 3u);
  EXPECT_EQ(r.tokens[0].back(), cfg.stop_ids[0]);

  req.sequences = engine::sequences_of({{}});
  EXPECT_THROW(gen.generate(req), std::invalid_argument);
  req.sequences = engine::sequences_of({{1, 500}});
  EXPECT_THROW(gen.generate(req), std::invalid_argument);
  req.sequences = engine::sequences_of({std::vector<std::int32_t>(60, 1)});
  try {
    gen.generate(req);
    FAIL() << "a prompt beyond max positions must be rejected";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("positions"), std::string::npos) << e.what();
  }
}

// A sequence that leaves its limit, sampling or stream unset takes the request's limit and
// sampling and its own index as its stream: the tokens of a request that sets them so.
TEST(Generation, UnsetSequenceFieldsTakeTheRequestsOrTheirIndex) {
  const ModelConfig cfg = testing::tiny_llama_config();
  engine::DummyWeights src(cfg, 11);
  const HostWeights w = engine::load_weights(cfg, src);
  auto be = kernels::make_cpu_backend();
  Generator gen(*be, cfg, w);
  GenerationRequest unset;
  unset.sequences = engine::sequences_of({{1, 2, 3}, {4, 5}, {6}});
  unset.max_new_tokens = 6;
  unset.sampling = {.temperature = 0.9f, .top_p = 0.9f, .seed = 17, .ignore_eos = true};
  GenerationRequest set = unset;
  for (std::size_t b = 0; b < set.sequences.size(); ++b) {
    set.sequences[b].max_new_tokens = set.max_new_tokens;
    set.sequences[b].sampling = set.sampling;
    set.sequences[b].stream = b;
  }
  const auto want = gen.generate(set).tokens;
  EXPECT_EQ(gen.generate(unset).tokens, want);
  // Each field tells: another limit, sampling or stream gives other tokens.
  set.sequences[0].max_new_tokens = 2;
  set.sequences[1].sampling = kernels::SamplingParams{.ignore_eos = true};
  set.sequences[2].stream = 5;
  const auto other = gen.generate(set).tokens;
  for (std::size_t b = 0; b < want.size(); ++b) EXPECT_NE(other[b], want[b]) << "sequence " << b;
}

// on_finished hands each sequence, as it ends, its own result: what the run's result says of it.
TEST(Generation, EachEndingSequenceIsHandedItsOwnResult) {
  const ModelConfig cfg = testing::tiny_llama_config();
  engine::DummyWeights src(cfg, 5);
  const HostWeights w = engine::load_weights(cfg, src);
  auto be = kernels::make_cpu_backend();
  Generator gen(*be, cfg, w);
  GenerationRequest req;
  req.sequences = engine::sequences_of({{1, 2, 3}, {4, 5}, {6}});
  req.max_new_tokens = 6;
  req.sampling = {.temperature = 0.9f, .seed = 3, .ignore_eos = true};
  req.sequences[0].max_new_tokens = 2;
  req.sequences[2].max_new_tokens = 4;
  req.sequences[1].sampling = kernels::SamplingParams{.temperature = 0.9f, .seed = 3, .ignore_eos = true, .logprobs = 2};
  std::vector<std::size_t> order;
  std::vector<engine::GenerationResult> own(req.sequences.size());
  engine::GenerationHooks hooks;
  hooks.on_finished = [&](std::size_t b, const engine::GenerationResult& r) {
    order.push_back(b);
    own[b] = r;
  };
  const engine::GenerationResult all = gen.generate(req, hooks);
  EXPECT_EQ(order, (std::vector<std::size_t>{0, 2, 1})) << "in the order their limits end them";
  for (std::size_t b = 0; b < own.size(); ++b) {
    const engine::GenerationResult want = all.sequence(b);
    EXPECT_EQ(own[b].sequences, 1) << "sequence " << b;
    EXPECT_EQ(own[b].generated_tokens, want.generated_tokens) << "sequence " << b;
    EXPECT_EQ(own[b].tokens, want.tokens) << "sequence " << b;
    EXPECT_EQ(own[b].finish_reasons, want.finish_reasons) << "sequence " << b;
    EXPECT_EQ(own[b].logprobs, want.logprobs) << "sequence " << b;
    ASSERT_EQ(own[b].top_logprobs.size(), want.top_logprobs.size()) << "sequence " << b;
  }
  ASSERT_EQ(own[1].top_logprobs[0].size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) {
    ASSERT_EQ(own[1].top_logprobs[0][i].size(), 2u) << "token " << i;
    for (std::size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(own[1].top_logprobs[0][i][k].token, all.top_logprobs[1][i][k].token) << "token " << i;
      EXPECT_EQ(own[1].top_logprobs[0][i][k].logprob, all.top_logprobs[1][i][k].logprob) << "token " << i;
    }
  }
  EXPECT_TRUE(own[0].logprobs[0].empty()) << "sequence 0 asked for none";
}

}  // namespace
}  // namespace flexh2o
