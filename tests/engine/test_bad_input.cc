// Hostile and mistaken input (issue 33): every case is one clear error, never a crash, a
// runaway allocation or a read that never ends. Run under AddressSanitizer + UBSan
// (scripts/test.sh), where a stack overflow or an out-of-bounds write stops the binary.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "engine/runtime/cgroup_memory.h"
#include "engine/families/family.h"
#include "engine/io/json_input.h"
#include "engine/families/model_yaml.h"
#include "engine/model/model_config.h"
#include "engine/serving/result_file.h"
#include "engine/serving/prompts.h"
#include "engine/tokenizer/tokenizer.h"
#include "offload/text_file.h"
#include "tests/support/error_of.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

using testing::error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// {"model": [[[...]]]}, `depth` arrays deep: dumping or copying it recursed once a level.
std::string deep_json(int depth) {
  return "{\"model\":" + std::string(static_cast<std::size_t>(depth), '[') + std::string(static_cast<std::size_t>(depth), ']') +
         "}";
}

TEST(JsonInput, DeepNestingIsAnErrorNotAStackOverflow) {
  const std::string msg = error_of([] { engine::parse_json(deep_json(100000), "deep.json"); });
  EXPECT_THAT(msg, AllOf(HasSubstr("deep.json"), HasSubstr("nested deeper than 128")));
  EXPECT_LT(msg.size(), 300u);
  // Strings do not count, and real nesting within the limit parses.
  EXPECT_NO_THROW(engine::parse_json("[\"[[[[{{{{\\\"[[[\"]", "s.json"));
  EXPECT_NO_THROW(engine::parse_json(deep_json(100), "ok.json"));
  // A parse error quotes a bounded part of a long token.
  const std::string long_token = "[\"" + std::string(100000, 'x');
  EXPECT_LT(error_of([&] { engine::parse_json(long_token, "t.json"); }).size(), 400u);
}

TEST(JsonInput, ExcerptIsBounded) {
  nlohmann::json big = nlohmann::json::array();
  for (int i = 0; i < 10000; ++i) big.push_back(i);
  EXPECT_EQ(engine::json_excerpt(big), "an array of 10000 items");
  EXPECT_LT(engine::json_excerpt(nlohmann::json(std::string(5000, 'a'))).size(), 200u);
}

TEST(JsonInput, DeepTokenizerJsonIsAnError) {
  testing::TempDir dir;
  testing::write_file(dir.file("tokenizer.json"), deep_json(100000));
  EXPECT_THAT(error_of([&] { engine::load_hf_tokenizer(dir.file("tokenizer.json")); }),
              AllOf(HasSubstr("tokenizer.json"), HasSubstr("nested deeper")));
  // Within the limit but not a tokenizer: the error quotes the value, which is safe to print.
  testing::write_file(dir.file("tokenizer.json"), deep_json(120));
  EXPECT_THAT(error_of([&] { engine::load_hf_tokenizer(dir.file("tokenizer.json")); }), HasSubstr("tokenizer.json"));
}

TEST(JsonInput, DeepHfConfigIsAnError) {
  EXPECT_THAT(error_of([] { engine::load_hf_config(deep_json(100000), "config.json"); }),
              AllOf(HasSubstr("config.json"), HasSubstr("nested deeper")));
}

TEST(TextFile, DevicesAreRefusedAndSizesBounded) {
  EXPECT_THAT(error_of([] { offload::read_text_file("/dev/zero"); }),
              AllOf(HasSubstr("/dev/zero"), HasSubstr("not a regular file")));
  testing::TempDir dir;
  EXPECT_THAT(error_of([&] { offload::read_text_file(dir.path()); }), HasSubstr("a directory"));
  testing::write_file(dir.file("big"), std::string(4096, 'x'));
  EXPECT_THAT(error_of([&] { offload::read_text_file(dir.file("big"), 1024); }), HasSubstr("more than"));
  EXPECT_EQ(offload::read_text_file(dir.file("big"), 4096)->size(), 4096u);
  // A pipe is read, to the limit.
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  std::thread writer([&] { std::ofstream(dir.file("fifo")) << std::string(3000, 'y'); });
  EXPECT_THAT(error_of([&] { offload::read_text_file(dir.file("fifo"), 1024); }), HasSubstr("more than"));
  writer.join();
}

// --- Model sizes -----------------------------------------------------------------------------

std::string opt_yaml(const std::string& field, const std::string& value) {
  std::string y = "name: x\nfamily: opt\nnum_layers: 2\nhidden_size: 64\nffn_size: 256\nnum_heads: 4\n"
                  "vocab_size: 100\nmax_positions: 64\n";
  const auto at = y.find(field + ":");
  const auto end = y.find('\n', at);
  return y.replace(at, end - at, field + ": " + value);
}

TEST(ModelLimits, HugeYamlSizesAreErrorsBeforeAnyAllocation) {
  // 2^62: ffn x hidden x 4 bytes overflowed to a negative size, then a heap write past the end.
  EXPECT_THAT(error_of([] { engine::load_model_yaml(opt_yaml("ffn_size", "4611686018427387904"), "m.yaml"); }),
              AllOf(HasSubstr("m.yaml"), HasSubstr("'ffn_size'"), HasSubstr("limit of 1048576")));
  EXPECT_THAT(error_of([] { engine::load_model_yaml(opt_yaml("num_layers", "2147483647"), "m.yaml"); }),
              AllOf(HasSubstr("'num_layers'"), HasSubstr("limit of 1024")));
  EXPECT_THAT(error_of([] { engine::load_model_yaml(opt_yaml("hidden_size", "32.5"), "m.yaml"); }),
              HasSubstr("hidden_size"));
  EXPECT_THAT(error_of([] { engine::load_model_yaml(opt_yaml("vocab_size", "-5"), "m.yaml"); }),
              HasSubstr("vocab_size"));
  EXPECT_NO_THROW(engine::load_model_yaml(opt_yaml("num_layers", "2"), "m.yaml"));
  // A MoE model: the expert count is bounded before the per-layer list is made.
  const std::string moe = "name: x\nfamily: mixtral\nnum_layers: 2\nhidden_size: 64\nffn_size: 128\nnum_heads: 4\n"
                          "vocab_size: 100\nmax_positions: 64\nnum_experts: 4611686018427387904\n"
                          "experts_per_token: 2\nexpert_ffn_size: 128\n";
  EXPECT_THAT(error_of([&] { engine::load_model_yaml(moe, "m.yaml"); }), HasSubstr("'num_experts'"));
}

nlohmann::json llama_json() {
  return {{"model_type", "llama"},        {"hidden_size", 64},        {"num_hidden_layers", 2},
          {"num_attention_heads", 4},     {"intermediate_size", 128}, {"vocab_size", 100},
          {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-5}};
}

TEST(ModelLimits, HugeHfConfigSizesAreErrors) {
  auto with = [](const std::string& field, const std::string& value) {
    nlohmann::json j = llama_json();
    j[field] = nlohmann::json::parse(value);
    return error_of([&] { engine::load_hf_config(j.dump(), "config.json"); });
  };
  EXPECT_THAT(with("intermediate_size", "4611686018427387904"),
              AllOf(HasSubstr("config.json"), HasSubstr("'intermediate_size'"), HasSubstr("limit")));
  EXPECT_THAT(with("num_hidden_layers", "2147483647"), AllOf(HasSubstr("'num_hidden_layers'"), HasSubstr("limit of 1024")));
  EXPECT_THAT(with("num_hidden_layers", "18446744073709551615"), HasSubstr("'num_hidden_layers'"));
  EXPECT_THAT(with("hidden_size", "32.5"), AllOf(HasSubstr("'hidden_size'"), HasSubstr("must be an integer")));
  EXPECT_THAT(with("bos_token_id", "4294967296"), AllOf(HasSubstr("'bos_token_id'"), HasSubstr("out of range")));
  EXPECT_EQ(with("hidden_size", "64"), "");
  // Mixtral: a huge expert count (each expert's MLP is allocated per layer).
  nlohmann::json m = llama_json();
  m["model_type"] = "mixtral";
  m["num_local_experts"] = std::int64_t{1} << 40;
  m["num_experts_per_tok"] = 2;
  EXPECT_THAT(error_of([&] { engine::load_hf_config(m.dump(), "config.json"); }), HasSubstr("'num_local_experts'"));
}

// --- Prompts ----------------------------------------------------------------------------------

TEST(Prompts, BadLinesAreErrors) {
  testing::TempDir dir;
  testing::write_file(dir.file("both.jsonl"), "{\"id\": 1, \"prompt\": \"a\", \"tokens\": [1]}\n");
  EXPECT_THAT(error_of([&] { engine::read_prompts_jsonl(dir.file("both.jsonl")); }),
              AllOf(HasSubstr("both.jsonl:1"), HasSubstr("both 'prompt' and 'tokens'")));
  testing::write_file(dir.file("deep.jsonl"), "{\"id\": 1, \"prompt\": \"a\"}\n" + deep_json(100000) + "\n");
  EXPECT_THAT(error_of([&] { engine::read_prompts_jsonl(dir.file("deep.jsonl")); }),
              AllOf(HasSubstr("deep.jsonl:2"), HasSubstr("nested deeper")));
  EXPECT_THAT(error_of([] { engine::read_prompts_jsonl("/dev/zero"); }), HasSubstr("not a regular file"));
  // The last line needs no newline.
  testing::write_file(dir.file("ok.jsonl"), "{\"id\": 1, \"tokens\": [1, 2]}\n\n{\"id\": \"b\", \"prompt\": \"x\"}");
  const auto items = engine::read_prompts_jsonl(dir.file("ok.jsonl"));
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[1].id_json, "\"b\"");
}

// A field given twice is ambiguous: an error naming it, as in OpenAI batch lines (the last one
// used to win). Token ids are read aside from the JSON value; a bad one is still an error.
TEST(Prompts, RepeatedFieldsAndBadTokenIdsAreErrors) {
  testing::TempDir dir;
  testing::write_file(dir.file("twice.jsonl"), "{\"id\": 1, \"prompt\": \"a\", \"prompt\": \"b\"}\n");
  EXPECT_THAT(error_of([&] { engine::read_prompts_jsonl(dir.file("twice.jsonl")); }),
              AllOf(HasSubstr("twice.jsonl:1"), HasSubstr("\"prompt\" appears twice")));
  for (const char* tokens : {"[1, -2]", "[1, \"a\"]", "[4294967296]", "[[1]]"}) {
    testing::write_file(dir.file("bad.jsonl"), std::string("{\"id\": 1, \"tokens\": ") + tokens + "}\n");
    EXPECT_THAT(error_of([&] { engine::read_prompts_jsonl(dir.file("bad.jsonl")); }),
                HasSubstr("field 'tokens' must hold non-negative integers")) << tokens;
  }
  testing::write_file(dir.file("ids.jsonl"), "{\"tokens\": [7, 0, 2147483647], \"id\": 2}\n");
  const auto items = engine::read_prompts_jsonl(dir.file("ids.jsonl"));
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].tokens, (std::vector<std::int32_t>{7, 0, 2147483647}));
}

TEST(Prompts, ResumingOverADeepLineIsAnError) {
  testing::TempDir dir;
  testing::write_file(dir.file("out.jsonl"), deep_json(100000) + "\n");
  EXPECT_THAT(error_of([&] { serving::ResultFile w(dir.file("out.jsonl"), true, ""); }), HasSubstr("out.jsonl:1"));
  // A refused file leaves no descriptor open (the fuzzer ran out of them).
  const auto open_fds = [] { return std::distance(std::filesystem::directory_iterator("/proc/self/fd"), {}); };
  const auto before = open_fds();
  for (int i = 0; i < 10; ++i) error_of([&] { serving::ResultFile w(dir.file("out.jsonl"), true, ""); });
  EXPECT_EQ(open_fds(), before);
}

TEST(Prompts, TextTooLongForTheContextIsRefusedBeforeEncoding) {
  const auto tok = engine::load_hf_tokenizer(std::string(FLEXH2O_TEST_DATA_DIR) + "/tokenizers/smollm2/tokenizer.json");
  std::vector<engine::PromptItem> items{{"\"long\"", std::string(64 * engine::kMaxBytesPerToken + 1, 'a'), {}}};
  EXPECT_THAT(error_of([&] { engine::tokenize_prompts(items, tok.get(), -1, "m", 64); }),
              AllOf(HasSubstr("prompt \"long\""), HasSubstr("bytes of text"), HasSubstr("64 positions")));
  EXPECT_TRUE(items[0].tokens.empty()) << "refused before encoding";
  std::vector<engine::PromptItem> ids{{"7", std::nullopt, std::vector<std::int32_t>(65, 1)}};
  EXPECT_THAT(error_of([&] { engine::tokenize_prompts(ids, nullptr, -1, "m", 64); }), HasSubstr("65 tokens"));
}

// --- Cgroups (fixture directories, not the live cgroup) ----------------------------------------

void put(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  testing::write_file(p.string(), text);
}

TEST(CgroupMemory, V1LimitLessWorkingSet) {
  testing::TempDir root;
  const std::filesystem::path g = std::filesystem::path(root.path()) / "memory/probe";
  put(g / "memory.limit_in_bytes", "536870912\n");
  put(g / "memory.usage_in_bytes", "104857600\n");
  put(g / "memory.stat", "cache 4096\ntotal_inactive_file 4194304\n");
  put(std::filesystem::path(root.path()) / "memory/memory.limit_in_bytes", "9223372036854771712\n");  // no limit
  const std::string self = "12:cpuset:/\n11:memory:/probe\n0::/\n";
  EXPECT_EQ(engine::cgroup_memory_headroom(self, root.path()), 536870912 - (104857600 - 4194304));
  // No memory controller in the list: no limit known.
  EXPECT_EQ(engine::cgroup_memory_headroom("12:cpuset:/\n", root.path()), std::nullopt);
}

TEST(CgroupMemory, V2TakesTheTightestAncestor) {
  testing::TempDir root;
  const std::filesystem::path parent = std::filesystem::path(root.path()) / "jobs";
  put(parent / "memory.max", "1073741824\n");
  put(parent / "memory.current", "1000000000\n");
  put(parent / "run/memory.max", "max\n");
  put(parent / "run/memory.current", "50000000\n");
  put(parent / "run/memory.stat", "anon 50000000\ninactive_file 0\n");
  EXPECT_EQ(engine::cgroup_memory_headroom("0::/jobs/run\n", root.path()), 1073741824 - 1000000000);
  // Usage past the limit (possible briefly): nothing left, not a negative size.
  put(parent / "memory.current", "2000000000\n");
  EXPECT_EQ(engine::cgroup_memory_headroom("0::/jobs/run\n", root.path()), 0);
}

}  // namespace
}  // namespace flexh2o
