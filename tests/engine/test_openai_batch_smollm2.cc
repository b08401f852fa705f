// SmolLM2-135M-Instruct (its Hugging Face directory, and the GGUF file it came from dequantized
// with --dtype f32) run from an OpenAI batch file of chat requests (`flexh2o run`), against
// transformers (tests/data/smollm2/chat_expected.json, made by make_chat_expected.py there):
// the chat template's prompt tokens, greedy content, the chosen tokens' log-probabilities
// within 1e-3, and repetition_penalty's greedy content. Skips when the model files are absent
// (scripts/models/make_smollm2.sh makes them).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

fs::path models_dir() {
  const char* root = std::getenv("FLEXH2O_MODELS");
  const char* home = std::getenv("HOME");
  return root ? fs::path(root) : fs::path(home ? home : ".") / ".cache/flexh2o/models";
}

Json expected() {
  return Json::parse(testing::read_file(std::string(FLEXH2O_TEST_DATA_DIR) + "/smollm2/chat_expected.json"));
}

std::string request(const std::string& id, const Json& messages, const Json& extra) {
  Json body = {{"model", "smollm2"}, {"messages", messages}, {"temperature", 0}, {"max_tokens", expected()["max_new_tokens"]}};
  body.update(extra);
  return Json{{"custom_id", id}, {"method", "POST"}, {"url", "/v1/chat/completions"}, {"body", body}}.dump() + "\n";
}

// The model as a Hugging Face directory or the GGUF file transformers' directory came from.
class SmolLM2OpenAiBatch : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    model_ = models_dir() / GetParam();
    if (!fs::exists(model_)) GTEST_SKIP() << model_ << " is absent (scripts/models/make_smollm2.sh makes it)";
  }
  // Runs every case greedy (with logprobs) and with transformers' repetition penalty.
  std::map<std::string, Json> run_cases() {
    testing::TempDir dir;
    std::string file;
    const Json want = expected();
    for (std::size_t i = 0; i < want["cases"].size(); ++i) {
      const Json& c = want["cases"][i];
      file += request("greedy-" + std::to_string(i), c["messages"], {{"logprobs", true}});
      file += request("repetition-" + std::to_string(i), c["messages"], {{"repetition_penalty", c["repetition_penalty"]}});
    }
    testing::write_file(dir.file("batch.jsonl"), file);
    // The GGUF file dequantized to fp32, as transformers loads it (its Q4_1 weights as stored
    // compute otherwise).
    const std::string dtype = GetParam().ends_with(".gguf") ? " --dtype f32" : "";
    const std::string cmd = std::string(FLEXH2O_BINARY) + " run --model " + model_.string() + dtype + " --prompts " +
                            dir.file("batch.jsonl") + " --out " + dir.file("out.jsonl") + " 2>" + dir.file("err");
    const int status = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << testing::read_file(dir.file("err"));
    std::map<std::string, Json> by_id;
    std::istringstream lines(testing::read_file(dir.file("out.jsonl")));
    for (std::string line; std::getline(lines, line);) {
      const Json j = Json::parse(line);
      by_id[j["custom_id"].get<std::string>()] = j;
    }
    return by_id;
  }
  fs::path model_;
};

TEST_P(SmolLM2OpenAiBatch, ChatRequestsGiveTransformersGreedyContentAndLogprobs) {
  const Json want = expected();
  const std::map<std::string, Json> got = run_cases();
  ASSERT_EQ(got.size(), 2 * want["cases"].size());
  for (std::size_t i = 0; i < want["cases"].size(); ++i) {
    const Json& c = want["cases"][i];
    const Json& greedy = got.at("greedy-" + std::to_string(i));
    ASSERT_TRUE(greedy["error"].is_null()) << greedy.dump();
    const Json& body = greedy["response"]["body"];
    EXPECT_EQ(body["model"], "smollm2");
    EXPECT_EQ(body["usage"]["prompt_tokens"], c["prompt_ids"].size()) << "case " << i << ": the chat template's tokens";
    EXPECT_EQ(body["usage"]["completion_tokens"], c["greedy"]["ids"].size()) << "case " << i;
    const Json& choice = body["choices"][0];
    EXPECT_EQ(choice["message"]["content"], c["greedy"]["text"]) << "case " << i;
    EXPECT_EQ(choice["finish_reason"], c["greedy"]["ids"].size() < want["max_new_tokens"].get<std::size_t>() ? "stop" : "length");
    const Json& content = choice["logprobs"]["content"];
    ASSERT_EQ(content.size(), c["greedy"]["logprobs"].size()) << "case " << i;
    for (std::size_t t = 0; t < content.size(); ++t)
      EXPECT_NEAR(content[t]["logprob"].get<double>(), c["greedy"]["logprobs"][t].get<double>(), 1e-3)
          << "case " << i << " token " << t;
    const Json& rep = got.at("repetition-" + std::to_string(i));
    ASSERT_TRUE(rep["error"].is_null()) << rep.dump();
    EXPECT_EQ(rep["response"]["body"]["choices"][0]["message"]["content"], c["repetition"]["text"])
        << "case " << i << " with repetition_penalty " << c["repetition_penalty"];
    EXPECT_EQ(rep["response"]["body"]["usage"]["completion_tokens"], c["repetition"]["ids"].size()) << "case " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Model, SmolLM2OpenAiBatch,
                         ::testing::Values("smollm2-135m-v5", "smollm2-135m-instruct.Q4_1.gguf"),
                         [](const auto& info) { return info.param.ends_with(".gguf") ? std::string("gguf") : std::string("hf"); });

}  // namespace
}  // namespace flexh2o
