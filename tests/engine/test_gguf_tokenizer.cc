// GGUF tokenizers (engine/tokenizer/gguf_tokenizer.*, engine/loaders/gguf_tokenizer_keys.*):
// tiny-llama.gguf's SentencePiece vocabulary against transformers loading the same file
// (tests/gguf_fixtures/make_gguf_tokenizer_cases.py), the byte-level pre-tokenizer families,
// and one error naming the key for each kind of bad tokenizer metadata.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/loaders/gguf_file.h"
#include "engine/loaders/gguf_tokenizer_keys.h"
#include "engine/loaders/model_source.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/gguf_tokenizer.h"
#include "tests/support/error_of.h"
#include "tests/support/gguf_edit.h"
#include "tests/support/test_models.h"
#include "tests/support/tokenizer_cases.h"

namespace flexh2o {
namespace {

using testing::error_of;
using testing::with_metadata;

using ::testing::AllOf;
using ::testing::HasSubstr;
using Ids = std::vector<std::int32_t>;

std::string data(const std::string& name) { return std::string(FLEXH2O_TEST_DATA_DIR) + "/gguf/" + name; }

engine::GgufHeader tiny_llama_header() {
  const std::string bytes = testing::read_file(data("tiny-llama.gguf"));
  return engine::parse_gguf_header(std::as_bytes(std::span(bytes.data(), bytes.size())), "t.gguf");
}

TEST(GgufTokenizer, TinyLlamaEncodesAndDecodesAsTransformers) {
  const auto tok = engine::gguf_tokenizer(engine::GgufFile(data("tiny-llama.gguf")).header());
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_TRUE(tok->decides_special_tokens());
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_GT(testing::expect_tokenizer_cases(*tok, data("tiny-llama.tokenizer-cases.jsonl")), 340u);
}

TEST(GgufTokenizer, ModelSourceUsesTheFileTokenizer) {
  engine::ModelOptions o;
  o.model = data("tiny-llama.gguf");
  const auto m = engine::open_model(o);
  ASSERT_TRUE(m.tokenizer);
  // "▁Once" "▁upon" "▁a" "▁time" after BOS, as llama.cpp and transformers give.
  EXPECT_EQ(m.tokenizer->encode("Once upon a time", true), (Ids{1, 403, 407, 261, 378}));
  EXPECT_EQ(m.tokenizer->decode(Ids{1, 403, 407, 261, 378}), "Once upon a time");
}

TEST(GgufTokenizer, AFileWithoutTokenizerKeysHasNone) {
  engine::GgufHeader h = tiny_llama_header();
  h.metadata.erase("tokenizer.ggml.model");
  EXPECT_EQ(engine::gguf_tokenizer(h), nullptr);
}

// A byte-level vocabulary small enough to see what each pre-tokenizer does with digits.
engine::GgufTokenizerSpec digits_spec(const std::string& pre) {
  engine::GgufTokenizerSpec s;
  s.model = "gpt2";
  s.pre = pre;
  s.tokens = {"<|endoftext|>", "1", "2", "3", "12", "123", "a", "Ġ", "Ġa"};
  s.token_types = std::vector<std::int64_t>{3, 1, 1, 1, 1, 1, 1, 1, 1};
  s.merges = std::vector<std::string>{"1 2", "12 3", "Ġ a"};
  s.bos_id = s.eos_id = 0;
  return s;
}

TEST(GgufTokenizer, PreTokenizerFamiliesSplitDigitsAsLlamaCpp) {
  const auto ids = [](const std::string& pre, const std::string& text) {
    return engine::load_gguf_tokenizer(digits_spec(pre), "d.gguf")->encode(text, false);
  };
  // GPT-2's regex keeps digit runs whole; SmolLM's splits every digit first (\p{N}); Llama-3's
  // keeps up to three; Qwen2's one.
  EXPECT_EQ(ids("gpt-2", "123 a"), (Ids{5, 8}));
  EXPECT_EQ(ids("smollm", "123 a"), (Ids{1, 2, 3, 8}));
  EXPECT_EQ(ids("llama-bpe", "123 a"), (Ids{5, 8}));
  EXPECT_EQ(ids("qwen2", "123 a"), (Ids{1, 2, 3, 8}));
  // Control tokens are cut out of the text whole, and are special.
  const auto tok = engine::load_gguf_tokenizer(digits_spec("gpt-2"), "d.gguf");
  EXPECT_EQ(tok->encode("a<|endoftext|>12", false), (Ids{6, 0, 4}));
  EXPECT_EQ(tok->decode(Ids{6, 0, 4}), "a12");
  EXPECT_EQ(tok->decode(Ids{6, 0, 4}, false), "a<|endoftext|>12");
  // No add_bos_token: a gpt2 vocabulary adds nothing (llama.cpp's default), Llama-3's adds BOS.
  EXPECT_EQ(tok->encode("a", true), (Ids{6}));
  auto spec = digits_spec("llama-bpe");
  EXPECT_EQ(engine::load_gguf_tokenizer(spec, "d.gguf")->encode("a", true), (Ids{0, 6}));
  spec.add_bos = false;
  spec.add_eos = true;
  EXPECT_EQ(engine::load_gguf_tokenizer(spec, "d.gguf")->encode("a", true), (Ids{6, 0}));
}

TEST(GgufTokenizer, EveryPreTokenizerFamilyBuilds) {
  const std::vector<std::string> names = engine::gguf_pre_tokenizer_names();
  EXPECT_GT(names.size(), 40u);
  for (const std::string& pre : names) {
    SCOPED_TRACE(pre);
    // With every byte's character a token, any split decodes back to the text.
    engine::GgufTokenizerSpec spec = digits_spec(pre);
    for (int b = 0; b < 256; ++b) {
      const std::string& c = engine::tok::ByteAlphabet::get().encoded(static_cast<unsigned char>(b));
      if (std::ranges::find(spec.tokens, c) == spec.tokens.end()) {
        spec.tokens.push_back(c);
        spec.token_types->push_back(1);
      }
    }
    const auto tok = engine::load_gguf_tokenizer(spec, "d.gguf");
    EXPECT_EQ(tok->decode(tok->encode("a 123 Привет, 世界! 😊\n\n", false)), "a 123 Привет, 世界! 😊\n\n");
  }
}

// Bad tokenizer metadata: one error naming the file and the key.
TEST(GgufTokenizer, BadMetadataIsNamed) {
  const engine::GgufHeader base = tiny_llama_header();
  using V = engine::GgufValue;
  using T = engine::GgufValueType;
  const auto array_of = [&](const char* key, std::uint64_t keep) {
    auto a = std::make_shared<engine::GgufArray>(*std::get<std::shared_ptr<const engine::GgufArray>>(base.metadata.at(key).value));
    a->size = keep;
    if (!a->strings.empty()) a->strings.resize(keep);
    if (!a->scalars.empty()) a->scalars.resize(a->scalars.size() / 512 * keep);
    return V{T::Array, std::shared_ptr<const engine::GgufArray>(a)};
  };
  struct Case {
    const char* key;
    std::optional<V> value;  // nullopt: the key removed
    const char* mention;
  };
  const Case cases[] = {
      {"tokenizer.ggml.model", V{T::String, std::string("bert")}, "'tokenizer.ggml.model' = \"bert\" is not supported"},
      {"tokenizer.ggml.model", V{T::U32, std::uint64_t{1}}, "'tokenizer.ggml.model' has type"},
      {"tokenizer.ggml.tokens", std::nullopt, "'tokenizer.ggml.tokens' is missing"},
      {"tokenizer.ggml.scores", std::nullopt, "'tokenizer.ggml.scores' is missing"},
      {"tokenizer.ggml.scores", array_of("tokenizer.ggml.scores", 511),
       "'tokenizer.ggml.scores' has 511 entries, but tokenizer.ggml.tokens has 512"},
      {"tokenizer.ggml.token_type", array_of("tokenizer.ggml.token_type", 3),
       "'tokenizer.ggml.token_type' has 3 entries"},
      {"tokenizer.ggml.bos_token_id", std::nullopt, "'tokenizer.ggml.add_bos_token' is true, but tokenizer.ggml.bos_token_id"},
      {"tokenizer.ggml.unknown_token_id", V{T::U32, std::uint64_t{600}}, "'tokenizer.ggml.unknown_token_id' = 600 is outside"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key);
    const engine::GgufHeader h = with_metadata(base, c.key, c.value);
    EXPECT_THAT(error_of([&] { engine::gguf_tokenizer(h); }), AllOf(HasSubstr("t.gguf: "), HasSubstr(c.mention)));
  }

  const auto spec_error = [](engine::GgufTokenizerSpec s) {
    return error_of([&] { engine::load_gguf_tokenizer(s, "d.gguf"); });
  };
  auto s = digits_spec("no-such-pre");
  EXPECT_THAT(spec_error(s), AllOf(HasSubstr("d.gguf: metadata key 'tokenizer.ggml.pre' = \"no-such-pre\" is not a "
                                             "pre-tokenizer flexh2o implements"),
                                   HasSubstr("smollm")));
  s = digits_spec("gpt-2");
  s.merges.reset();
  EXPECT_THAT(spec_error(s), HasSubstr("'tokenizer.ggml.merges' is missing"));
  s = digits_spec("gpt-2");
  s.merges->push_back("1 x");
  EXPECT_THAT(spec_error(s), AllOf(HasSubstr("'tokenizer.ggml.merges' entry 3 (\"1 x\")"), HasSubstr("\"x\"")));
  s = digits_spec("gpt-2");
  s.merges->push_back("12");
  EXPECT_THAT(spec_error(s), HasSubstr("'tokenizer.ggml.merges' entry 3"));
  s = digits_spec("llama-bpe");
  s.bos_id.reset();
  EXPECT_THAT(spec_error(s), HasSubstr("'tokenizer.ggml.bos_token_id' is missing, and a \"gpt2\" tokenizer with pre "
                                       "\"llama-bpe\" starts every text with BOS"));
  s = digits_spec("gpt-2");
  s.add_eos = true;
  s.eos_id.reset();
  EXPECT_THAT(spec_error(s), HasSubstr("'tokenizer.ggml.add_eos_token' is true, but tokenizer.ggml.eos_token_id"));
}

}  // namespace
}  // namespace flexh2o
