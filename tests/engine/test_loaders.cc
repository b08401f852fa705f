// Bad checkpoints and configs: each gives one clear error naming the file and the field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "engine/loaders/dummy_weights.h"
#include "engine/loaders/hf_checkpoint.h"
#include "engine/loaders/llama2c_checkpoint.h"
#include "engine/families/model_yaml.h"
#include "engine/loaders/model_source.h"
#include "tests/support/error_of.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

using testing::error_of;

using ::testing::AllOf;
using ::testing::HasSubstr;

// Runs f and returns the message of the std::exception it throws ("" if none).
std::string load_hf(const std::string& dir) {
  return error_of([&] {
    engine::HfCheckpoint ckpt(dir);
    engine::load_weights(ckpt.config(), ckpt);
  });
}

class HfDir : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_ = testing::tiny_opt_config();
    engine::DummyWeights src(cfg_, 1);
    w_ = engine::load_weights(cfg_, src);
    testing::export_hf_checkpoint(dir_.path(), cfg_, w_, kernels::DType::F16, false);
  }
  std::string st() const { return dir_.file("model.safetensors"); }
  // Replaces the safetensors header by `json` (keeps the data section).
  void rewrite_header(const std::function<void(std::string&)>& edit) {
    std::string bytes = testing::read_file(st());
    std::uint64_t n;
    std::memcpy(&n, bytes.data(), 8);
    std::string header = bytes.substr(8, n), data = bytes.substr(8 + n);
    edit(header);
    n = header.size();
    std::string out(8, '\0');
    std::memcpy(out.data(), &n, 8);
    testing::write_file(st(), out + header + data);
  }
  engine::ModelConfig cfg_;
  engine::HostWeights w_;
  testing::TempDir dir_;
};

TEST_F(HfDir, LoadsWhenIntact) { EXPECT_EQ(load_hf(dir_.path()), ""); }

TEST_F(HfDir, TruncatedSafetensors) {
  const std::string bytes = testing::read_file(st());
  testing::write_file(st(), bytes.substr(0, bytes.size() / 2));
  EXPECT_THAT(load_hf(dir_.path()), HasSubstr("model.safetensors"));
  testing::write_file(st(), bytes.substr(0, 5));
  EXPECT_THAT(load_hf(dir_.path()), AllOf(HasSubstr("model.safetensors"), HasSubstr("truncated")));
}

TEST_F(HfDir, HeaderLengthBeyondTheFile) {
  std::string bytes = testing::read_file(st());
  const std::uint64_t huge = bytes.size() + 100;
  std::memcpy(bytes.data(), &huge, 8);
  testing::write_file(st(), bytes);
  EXPECT_THAT(load_hf(dir_.path()), HasSubstr("model.safetensors"));
}

TEST_F(HfDir, OffsetsOutOfRangeOrOverlapping) {
  rewrite_header([](std::string& h) {
    auto j = nlohmann::json::parse(h);
    j["model.decoder.embed_tokens.weight"]["data_offsets"][1] = 1u << 30;
    h = j.dump();
  });
  EXPECT_THAT(load_hf(dir_.path()), AllOf(HasSubstr("model.safetensors"), HasSubstr("decoder.embed_tokens.weight")));
  SetUp();
  rewrite_header([](std::string& h) {
    auto j = nlohmann::json::parse(h);
    j["model.decoder.layers.0.fc1.bias"]["data_offsets"] = j["model.decoder.layers.0.fc2.bias"]["data_offsets"];
    j["model.decoder.layers.0.fc1.bias"]["shape"] = j["model.decoder.layers.0.fc2.bias"]["shape"];
    h = j.dump();
  });
  EXPECT_THAT(load_hf(dir_.path()), AllOf(HasSubstr("model.safetensors"), HasSubstr("overlap")));
}

TEST_F(HfDir, WrongShapeOrDtypeForTheConfig) {
  auto j = nlohmann::json::parse(testing::read_file(dir_.file("config.json")));
  j["ffn_dim"] = 96;
  testing::write_file(dir_.file("config.json"), j.dump());
  EXPECT_THAT(load_hf(dir_.path()), AllOf(HasSubstr("fc1.weight"), HasSubstr("shape")));
  SetUp();
  rewrite_header([](std::string& h) {
    auto j = nlohmann::json::parse(h);
    j["model.decoder.layers.1.fc2.bias"]["dtype"] = "I16";  // same size, unsupported type
    h = j.dump();
  });
  EXPECT_THAT(load_hf(dir_.path()), AllOf(HasSubstr("decoder.layers.1.fc2.bias"), HasSubstr("I16")));
}

TEST_F(HfDir, MissingTensor) {
  rewrite_header([](std::string& h) {
    auto j = nlohmann::json::parse(h);
    j.erase("model.decoder.layers.1.self_attn.v_proj.weight");
    h = j.dump();
  });
  EXPECT_THAT(load_hf(dir_.path()), AllOf(HasSubstr("missing tensor"), HasSubstr("decoder.layers.1.self_attn.v_proj.weight")));
}

TEST_F(HfDir, UnknownFamilyAndMalformedConfig) {
  auto j = nlohmann::json::parse(testing::read_file(dir_.file("config.json")));
  j["model_type"] = "gpt_neox";
  testing::write_file(dir_.file("config.json"), j.dump());
  EXPECT_THAT(load_hf(dir_.path()), AllOf(HasSubstr("config.json"), HasSubstr("gpt_neox")));
  testing::write_file(dir_.file("config.json"), "{\"model_type\": \"opt\", ");
  EXPECT_THAT(load_hf(dir_.path()), AllOf(HasSubstr("config.json"), HasSubstr("JSON")));
  testing::write_file(dir_.file("config.json"), R"({"model_type": "opt", "hidden_size": "big"})");
  EXPECT_THAT(load_hf(dir_.path()), AllOf(HasSubstr("config.json"), HasSubstr("hidden_size")));
  std::filesystem::remove(dir_.file("config.json"));
  EXPECT_THAT(load_hf(dir_.path()), HasSubstr("config.json"));
}

TEST_F(HfDir, ShardIndexProblems) {
  testing::write_file(dir_.file("model.safetensors.index.json"), R"({"weight_map": {"a": "../../etc/passwd"}})");
  EXPECT_THAT(load_hf(dir_.path()), HasSubstr("outside the directory"));
  testing::write_file(dir_.file("model.safetensors.index.json"), R"({"weight_map": {"a": "missing.safetensors"}})");
  EXPECT_THAT(load_hf(dir_.path()), HasSubstr("missing.safetensors"));
  testing::write_file(dir_.file("model.safetensors.index.json"), "[1, 2");
  EXPECT_THAT(load_hf(dir_.path()), HasSubstr("model.safetensors.index.json"));
}

TEST(Llama2cLoader, TruncatedOrNonsenseFiles) {
  testing::TempDir dir;
  const auto model = testing::read_file(FLEXH2O_SOURCE_DIR "/models/stories260K/stories260K.bin");
  testing::write_file(dir.file("cut.bin"), model.substr(0, model.size() - 1000));
  EXPECT_THAT(error_of([&] { engine::Llama2cCheckpoint c(dir.file("cut.bin")); }),
              AllOf(HasSubstr("cut.bin"), HasSubstr("truncated")));
  testing::write_file(dir.file("short.bin"), model.substr(0, 10));
  EXPECT_THAT(error_of([&] { engine::Llama2cCheckpoint c(dir.file("short.bin")); }), HasSubstr("short.bin"));
  std::string bad = model;
  const std::int32_t huge = 1 << 30;
  std::memcpy(bad.data() + 8, &huge, 4);  // n_layers
  testing::write_file(dir.file("bad.bin"), bad);
  EXPECT_THAT(error_of([&] { engine::Llama2cCheckpoint c(dir.file("bad.bin")); }),
              AllOf(HasSubstr("bad.bin"), HasSubstr("n_layers")));
  EXPECT_THAT(error_of([&] { engine::Llama2cCheckpoint c(dir.file("nope.bin")); }), HasSubstr("nope.bin"));
}

TEST(ModelYaml, MalformedOrIncomplete) {
  EXPECT_THAT(error_of([] { engine::load_model_yaml("name: [unclosed", "m.yaml"); }),
              AllOf(HasSubstr("m.yaml"), HasSubstr("YAML")));
  EXPECT_THAT(error_of([] { engine::load_model_yaml("name: x\nfamily: opt\n", "m.yaml"); }),
              AllOf(HasSubstr("m.yaml"), HasSubstr("num_layers")));
  EXPECT_THAT(error_of([] {
                engine::load_model_yaml("name: x\nfamily: gpt\nnum_layers: 1\nhidden_size: 8\nffn_size: 8\n"
                                        "num_heads: 2\nvocab_size: 4\nmax_positions: 8\n",
                                        "m.yaml");
              }),
              AllOf(HasSubstr("m.yaml"), HasSubstr("gpt")));
  EXPECT_THAT(error_of([] {
                engine::load_model_yaml("name: x\nfamily: llama\nnum_layers: two\nhidden_size: 8\nffn_size: 8\n"
                                        "num_heads: 2\nvocab_size: 4\nmax_positions: 8\n",
                                        "m.yaml");
              }),
              AllOf(HasSubstr("m.yaml"), HasSubstr("num_layers")));
  EXPECT_THAT(error_of([] {
                engine::load_model_yaml("name: x\nfamily: llama\nnum_layers: 2\nhidden_size: 8\nffn_size: 8\n"
                                        "num_heads: 3\nnum_kv_heads: 2\nvocab_size: 4\nmax_positions: 8\n",
                                        "m.yaml");
              }),
              AllOf(HasSubstr("m.yaml"), HasSubstr("num_kv_heads")));
  // 4-bit is a compression the policy picks, not a model dtype.
  EXPECT_THAT(error_of([] {
                engine::load_model_yaml("name: x\nfamily: llama\nnum_layers: 2\nhidden_size: 8\nffn_size: 8\n"
                                        "num_heads: 2\nvocab_size: 4\nmax_positions: 8\ndtype: q4\n",
                                        "m.yaml");
              }),
              AllOf(HasSubstr("m.yaml"), HasSubstr("'dtype'"), HasSubstr("use weight compression")));
}

TEST(BuiltinConfigs, PublishedShapes) {
  const auto opt175 = engine::builtin_model("opt-175b");
  EXPECT_EQ(opt175.n_layers, 96);
  EXPECT_EQ(opt175.hidden, 12288);
  EXPECT_EQ(opt175.n_heads, 96);
  EXPECT_EQ(opt175.ffn, 49152);
  // 175B parameters at 2 bytes each (within 1%).
  EXPECT_NEAR(static_cast<double>(opt175.weight_bytes()) / 2e9, 175.0, 1.75);
  const auto l70 = engine::builtin_model("llama-2-70b");
  EXPECT_EQ(l70.n_kv_heads, 8);
  EXPECT_NEAR(static_cast<double>(l70.weight_bytes()) / 2e9, 69.0, 0.7);
  const auto opt13 = engine::builtin_model("opt-1.3b");
  EXPECT_NEAR(static_cast<double>(opt13.weight_bytes()) / 2e9, 1.3, 0.05);
  // Mixture of experts: all parameters counted (46.7B and 30.5B, within 1%).
  EXPECT_NEAR(static_cast<double>(engine::builtin_model("mixtral-8x7b").weight_bytes()) / 2e9, 46.7, 0.47);
  EXPECT_NEAR(static_cast<double>(engine::builtin_model("qwen3-30b-a3b").weight_bytes()) / 2e9, 30.5, 0.31);
  EXPECT_EQ(engine::builtin_model_names().size(), 13u);
  EXPECT_THAT(error_of([] { engine::builtin_model("opt-7b"); }), AllOf(HasSubstr("opt-7b"), HasSubstr("opt-6.7b")));
}

TEST(ModelSource, ConfigWithoutWeightsNeedsDummy) {
  EXPECT_THAT(error_of([] { engine::ModelOptions o;
    o.model = "opt-125m";
    engine::open_model(o);; }), HasSubstr("add random (dummy) weights"));
  engine::ModelOptions o;
  o.model = "opt-125m";
  o.dummy = true;
  const auto m = engine::open_model(o);
  EXPECT_EQ(m.config.hidden, 768);
  EXPECT_EQ(m.tokenizer, nullptr);
  EXPECT_THAT(error_of([] { engine::ModelOptions o;
    o.model = "/no/such/dir";
    engine::open_model(o);; }), HasSubstr("/no/such/dir"));
}

TEST(DummyWeights, AnyRowRangeGivesTheSameValues) {
  const auto cfg = testing::tiny_llama_config();
  engine::DummyWeights d(cfg, 5);
  std::vector<float> whole(static_cast<std::size_t>(cfg.ffn * cfg.hidden)), part(static_cast<std::size_t>(10 * cfg.hidden));
  d.read_rows("layers.1.w_up", 0, cfg.ffn, whole.data(), kernels::DType::F32);
  d.read_rows("layers.1.w_up", 20, 30, part.data(), kernels::DType::F32);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + 20 * cfg.hidden));
  engine::DummyWeights other(cfg, 6);
  std::vector<float> o(whole.size());
  other.read_rows("layers.1.w_up", 0, cfg.ffn, o.data(), kernels::DType::F32);
  EXPECT_NE(o, whole);
}

}  // namespace
}  // namespace flexh2o
