// bf16 GEMM inputs written by the ops before the GEMMs (Backend::takes_bf16_gemm_inputs, as the
// CUDA backend declares): the norms and bias_act write the projections' inputs rounded to bf16
// instead of the GEMMs rounding them, which gives the same values. Here the CPU backend takes
// that route (a forwarding backend declaring it): every model shape generates what the plain
// CPU generates, logits bit for bit, and the GEMMs that read a norm's or an activation's output
// got it in bf16.
#include <gtest/gtest.h>

#include <vector>

#include "engine/families/family.h"
#include "engine/loaders/dummy_weights.h"
#include "engine/model/weights.h"
#include "engine/runtime/generator.h"
#include "tests/support/forwarding_backend.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

using engine::ModelConfig;
using kernels::DType;

// The CPU backend, taking bf16 GEMM inputs, counting the GEMMs by the dtype of their input.
class Bf16InputBackend final : public testing::ForwardingBackend {
 public:
  bool takes_bf16_gemm_inputs() const override { return true; }
  void do_gemm(const kernels::GemmArgs& a) override {
    const bool head = a.w.rows == vocab;
    (head ? head_calls : a.x_bf16 ? bf16_calls : f32_calls) += 1;
    if (head && a.x_bf16) ++bf16_head_calls;
    ForwardingBackend::do_gemm(a);
  }
  std::int64_t vocab = 0;
  int head_calls = 0, bf16_head_calls = 0, bf16_calls = 0, f32_calls = 0;
};

struct Generated {
  std::vector<std::vector<std::int32_t>> tokens;
  std::vector<std::vector<float>> logits;  // per step
};

Generated run(kernels::Backend& be, const ModelConfig& cfg) {
  const engine::DummyWeights src(cfg, 41);
  engine::GenerationRequest req;
  for (std::int32_t p = 0; p < 3; ++p) req.sequences.push_back({.prompt = {1, 7 * p + 3, 11 * p + 5, 2}});
  req.max_new_tokens = 5;
  Generated r;
  engine::GenerationHooks hooks;
  hooks.on_logits = [&](std::int64_t, std::span<const float> l) { r.logits.emplace_back(l.begin(), l.end()); };
  r.tokens = engine::Generator(be, cfg, engine::load_weights(cfg, src)).generate(req, hooks).tokens;
  return r;
}

ModelConfig in_bf16(ModelConfig c) {
  c.compute_dtype = DType::BF16;
  c.stop_ids.clear();
  return c;
}

ModelConfig tiny_gemma2_config() {  // sandwich norms, (1 + w) RMSNorm, GeGLU
  ModelConfig c = testing::tiny_llama_config();
  c.name = "tiny-gemma2";
  engine::find_family("gemma2", c.name).preset(c);
  c.family = "gemma2";
  return c;
}

ModelConfig tiny_post_norm_opt_config() {  // norms after the residual add (OPT-350m)
  ModelConfig c = testing::tiny_opt_config();
  c.name = "tiny-opt-post-norm";
  c.norm_placement = engine::NormPlacement::Post;
  return c;
}

TEST(Bf16GemmInputs, SameLogitsAsTheGemmsRounding) {
  for (const ModelConfig& base : {testing::tiny_opt_config(), testing::tiny_llama_config(), tiny_gemma2_config(),
                                  tiny_post_norm_opt_config(), testing::tiny_moe_config()}) {
    SCOPED_TRACE(base.name);
    const ModelConfig cfg = in_bf16(base);
    auto cpu = kernels::make_cpu_backend();
    Bf16InputBackend bf16_inputs;
    bf16_inputs.vocab = cfg.vocab_size;
    const Generated want = run(*cpu, cfg), got = run(bf16_inputs, cfg);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.logits, want.logits);
    ASSERT_GT(bf16_inputs.head_calls, 0);
    EXPECT_EQ(bf16_inputs.bf16_head_calls, 0);  // the head reads the final norm's fp32 rows
    EXPECT_GT(bf16_inputs.bf16_calls, 0);
  }
}

// Per forward pass of a pre-norm dense model: q, k, v, the MLP's input projections and its down
// projection read bf16; the attention output projection reads attention's fp32 output.
TEST(Bf16GemmInputs, WhichProjectionsReadBf16) {
  for (const ModelConfig& base : {testing::tiny_opt_config(), testing::tiny_llama_config()}) {
    SCOPED_TRACE(base.name);
    const ModelConfig cfg = in_bf16(base);
    Bf16InputBackend be;
    be.vocab = cfg.vocab_size;
    run(be, cfg);
    const int mlp_inputs = cfg.gated_mlp ? 2 : 1;
    EXPECT_EQ(be.bf16_calls, be.head_calls * cfg.n_layers * (3 + mlp_inputs + 1));
    EXPECT_EQ(be.f32_calls, be.head_calls * cfg.n_layers);
  }
}

// Under fp32 compute nothing is rounded: every GEMM reads fp32.
TEST(Bf16GemmInputs, F32ComputeKeepsFp32Inputs) {
  ModelConfig cfg = testing::tiny_llama_config();
  cfg.stop_ids.clear();
  Bf16InputBackend be;
  be.vocab = cfg.vocab_size;
  run(be, cfg);
  EXPECT_GT(be.f32_calls, 0);
  EXPECT_EQ(be.bf16_calls, 0);
}

}  // namespace
}  // namespace flexh2o
