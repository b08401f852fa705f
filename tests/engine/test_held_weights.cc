// Weights converted once at load (held_dtype, engine/model/weights.h): a backend whose GEMMs
// multiply bf16 under bf16 compute (as the CUDA backend's cuBLAS calls do) gets its f16 matrices
// already rounded to bf16, from the tiered load and from the in-memory Generator, and
// generates what the CPU generates from the f16 matrices (the same rounding, once instead of
// per GEMM). Tied heads and embedding tables keep their storage: they are also gathered; a
// tied f16 head multiplies in f16 there (head_compute, engine/model/layers.cc), so no GEMM
// converts a matrix at every step.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "engine/loaders/dummy_weights.h"
#include "engine/loaders/model_source.h"
#include "engine/runtime/block_executor.h"
#include "engine/serving/generate.h"
#include "engine/runtime/generator.h"
#include "kernels/cpu/gemm_cpu.h"
#include "offload/tiers.h"
#include "tests/support/forwarding_backend.h"
#include "tests/support/test_models.h"
#include "tests/support/tiered_run.h"

namespace flexh2o {
namespace {

using engine::GenerationRequest;
using engine::ModelConfig;
using kernels::DType;

// The CPU backend, declaring the CUDA backend's rule (f16 weights under bf16 compute are
// multiplied as bf16) and recording the dtype of every weight its GEMMs get, by shape.
class Bf16GemmBackend final : public testing::ForwardingBackend {
 public:
  DType gemm_weight_dtype(DType stored, DType compute) const override {
    return stored == DType::F16 && compute == DType::BF16 ? DType::BF16 : stored;
  }
  void do_gemm(const kernels::GemmArgs& a) override {
    ++seen[{a.w.dtype, a.compute, a.w.rows, a.w.cols}];
    ForwardingBackend::do_gemm(a);
  }
  struct Weight {
    DType dtype, compute;
    std::int64_t rows, cols;
    auto operator<=>(const Weight&) const = default;
  };
  std::map<Weight, int> seen;
};

struct Generated {
  std::vector<std::vector<std::int32_t>> tokens;
  std::vector<std::vector<float>> logits;  // per step
};

GenerationRequest request(const ModelConfig& cfg, std::int64_t prompts, std::int64_t new_tokens) {
  GenerationRequest req;
  for (std::int64_t p = 0; p < prompts; ++p)
    req.sequences.push_back({.prompt = {1, static_cast<std::int32_t>((7 * p + 3) % cfg.vocab_size),
                                        static_cast<std::int32_t>((11 * p + 5) % cfg.vocab_size)}});
  req.max_new_tokens = new_tokens;
  return req;
}

// Weights, KV and activations over the gpu/cpu/disk tiers (staged weight copies included).
Generated tiered_run(kernels::Backend& be, const ModelConfig& cfg, const engine::WeightSource& src, GenerationRequest req) {
  Generated r;
  engine::GenerationHooks hooks;
  hooks.on_logits = [&](std::int64_t, std::span<const float> l) { r.logits.emplace_back(l.begin(), l.end()); };
  testing::TempDir dir;
  offload::TierOptions to;
  to.offload_dir = dir.path();
  offload::Tiers tiers(be, to);
  engine::BlockExecutor sched(be, tiers, cfg, src, testing::spread_policy(2, 2, {0.3, 0.3, 0.4}), nullptr, {true});
  r.tokens = serving::generate(sched, req, hooks).tokens;
  return r;
}

Generated in_memory_run(kernels::Backend& be, const ModelConfig& cfg, const engine::WeightSource& src,
                  GenerationRequest req) {
  Generated r;
  engine::GenerationHooks hooks;
  hooks.on_logits = [&](std::int64_t, std::span<const float> l) { r.logits.emplace_back(l.begin(), l.end()); };
  r.tokens = engine::Generator(be, cfg, engine::load_weights(cfg, src)).generate(req, hooks).tokens;
  return r;
}

// Under AVX-512 BF16 every float weight under bf16 compute takes one tiled kernel that rounds
// f16 to bf16 as it reads it: the held bf16 copy then gives the same logits bit for bit.
// Elsewhere the paths split the weight into other panels for f16 and bf16: the same products,
// summed in another order, so the tokens are compared.
bool bitwise_comparable() {
  const kernels::GemmArgs bf16{nullptr, 1, {nullptr, DType::F16, 1, 1}, nullptr, nullptr, 0.0f, DType::BF16};
  return kernels::cpu_gemm_path_supported(kernels::CpuGemmPath::TiledBf16, bf16);
}

// A tied head multiplies in f16 on the held-weight backend and in bf16 on the CPU: the same
// tokens, logits a rounding apart.
void expect_same_run(const Generated& held, const Generated& plain, const ModelConfig& cfg) {
  EXPECT_EQ(held.tokens, plain.tokens);
  if (bitwise_comparable() && !cfg.tie_embeddings) {
    EXPECT_EQ(held.logits, plain.logits);
  }
}

// Every GEMM multiplied a bf16 matrix in bf16, except a tied head: the f16 token table (which
// is gathered too), in f16.
void expect_bf16_weights(const Bf16GemmBackend& be, const ModelConfig& cfg) {
  ASSERT_FALSE(be.seen.empty());
  for (const auto& [w, calls] : be.seen) {
    const bool tied_head = cfg.tie_embeddings && w.rows == cfg.vocab_size && w.cols == cfg.hidden;
    const DType want = tied_head ? DType::F16 : DType::BF16;
    EXPECT_EQ(w.dtype, want) << calls << " GEMMs of a " << w.rows << " x " << w.cols << " matrix got "
                             << kernels::dtype_name(w.dtype);
    EXPECT_EQ(w.compute, want) << calls << " GEMMs of a " << w.rows << " x " << w.cols << " matrix";
  }
}

ModelConfig f16_in_bf16(ModelConfig cfg) {
  cfg.dtype = DType::F16;
  cfg.compute_dtype = DType::BF16;
  cfg.stop_ids.clear();
  return cfg;
}

TEST(ModelHeldWeights, TieredLoadHandsBf16GemmsBf16Matrices) {
  for (const ModelConfig& base : {testing::tiny_opt_config(), testing::tiny_llama_config(), testing::tiny_moe_config()}) {
    SCOPED_TRACE(base.name);
    const ModelConfig cfg = f16_in_bf16(base);
    const engine::DummyWeights src(cfg, 31);
    const GenerationRequest req = request(cfg, 4, 6);
    auto cpu = kernels::make_cpu_backend();
    Bf16GemmBackend held;
    const Generated want = tiered_run(*cpu, cfg, src, req);
    expect_same_run(tiered_run(held, cfg, src, req), want, cfg);
    expect_bf16_weights(held, cfg);
  }
}

TEST(ModelHeldWeights, GeneratorHandsBf16GemmsBf16Matrices) {
  for (const ModelConfig& base : {testing::tiny_opt_config(), testing::tiny_llama_config()}) {
    SCOPED_TRACE(base.name);
    const ModelConfig cfg = f16_in_bf16(base);
    const engine::DummyWeights src(cfg, 32);
    const GenerationRequest req = request(cfg, 3, 6);
    auto cpu = kernels::make_cpu_backend();
    Bf16GemmBackend held;
    expect_same_run(in_memory_run(held, cfg, src, req), in_memory_run(*cpu, cfg, src, req), cfg);
    expect_bf16_weights(held, cfg);
  }
}

// Under f32 compute the same backend multiplies the matrices as stored: nothing is converted.
TEST(ModelHeldWeights, F32ComputeKeepsTheStoredMatrices) {
  ModelConfig cfg = f16_in_bf16(testing::tiny_llama_config());
  cfg.compute_dtype = DType::F32;
  const engine::DummyWeights src(cfg, 33);
  Bf16GemmBackend held;
  tiered_run(held, cfg, src, request(cfg, 2, 3));
  ASSERT_FALSE(held.seen.empty());
  for (const auto& [w, calls] : held.seen) EXPECT_EQ(w.dtype, DType::F16);
}

// stories260K (a real checkpoint, its head tied to the token table) stored as f16, in bf16:
// the tokens of the CPU, whose GEMMs round the f16 matrices themselves, and the held-weight
// backend's are the same.
TEST(ModelHeldWeights, Stories260kTokensUnchangedUnderBf16) {
  auto m = engine::open_model({.dtype = DType::F16});
  const ModelConfig cfg = f16_in_bf16(m.config);
  GenerationRequest req;
  req.sequences = engine::sequences_of({m.tokenizer->encode("Once upon a time", true), m.tokenizer->encode("", true)});
  req.max_new_tokens = 48;
  auto cpu = kernels::make_cpu_backend();
  Bf16GemmBackend held;
  expect_same_run(tiered_run(held, cfg, *m.weights, req), tiered_run(*cpu, cfg, *m.weights, req), cfg);
  expect_bf16_weights(held, cfg);
}

}  // namespace
}  // namespace flexh2o
