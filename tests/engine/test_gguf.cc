// GGUF files (engine/loaders/gguf_*): the reader against files gguf-py wrote
// (tests/gguf_fixtures/), every tensor type's dequantizer against gguf-py's own on random
// blocks, the lossless repacking of Q4_0/Q4_1/Q8_0 into the engine's 32-value groups, one
// clear error per kind of bad file, and a tiny LLaMA converted as llama.cpp does against
// transformers loading the same file: greedy tokens in memory and offloaded.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "engine/runtime/block_executor.h"
#include "engine/serving/generate.h"
#include "engine/runtime/generator.h"
#include "engine/loaders/gguf_blocks.h"
#include "engine/loaders/gguf_checkpoint.h"
#include "engine/model/model_shape.h"
#include "engine/loaders/model_source.h"
#include "kernels/quantize.h"
#include "tests/support/error_of.h"
#include "tests/support/gguf_edit.h"
#include "tests/support/fp_tolerance.h"
#include "tests/support/test_models.h"
#include "tests/support/tiered_run.h"

namespace flexh2o {
namespace {

using testing::error_of;
using testing::with_metadata;

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string data(const std::string& name) { return std::string(FLEXH2O_TEST_DATA_DIR) + "/gguf/" + name; }
nlohmann::json expected(const std::string& name) { return nlohmann::json::parse(testing::read_file(data(name))); }

std::vector<float> base64_floats(const std::string& text) {
  std::string bytes;
  std::uint32_t acc = 0;
  int bits = 0;
  for (const char c : text) {
    const auto* p = std::strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", c);
    if (c == '=' || p == nullptr) continue;
    acc = acc << 6 | static_cast<std::uint32_t>(p - "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/");
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(static_cast<char>(acc >> bits & 0xff));
    }
  }
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// Equal bit for bit, or both zero (the dequantizers may give +0 where gguf-py gives -0).
bool same_value(float a, float b) { return std::memcmp(&a, &b, 4) == 0 || (a == 0 && b == 0); }

// ---------------------------------------------------------------------------- the reader

TEST(GgufFile, ReadsEveryMetadataValueType) {
  const engine::GgufFile f(data("types.gguf"));
  const auto want = expected("types.expected.json");
  const engine::GgufHeader& h = f.header();
  EXPECT_EQ(h.version, 3u);
  EXPECT_EQ(h.alignment, 32u);
  EXPECT_EQ(h.data_start, want["data_offset"].get<std::uint64_t>());
  EXPECT_EQ(h.get_string("general.architecture"), "flexh2o-test");
  for (const auto& [key, tv] : want["kv"].items()) {
    SCOPED_TRACE(key);
    const std::string type = tv[0];
    const auto& v = tv[1];
    if (type == "UINT8" || type == "UINT16" || type == "UINT32" || type == "UINT64") {
      EXPECT_EQ(h.get_uint(key), v.get<std::uint64_t>());
    } else if (type == "INT8" || type == "INT16" || type == "INT32" || type == "INT64") {
      EXPECT_EQ(std::get<std::int64_t>(h.find(key)->value), v.get<std::int64_t>());
      if (v.get<std::int64_t>() < 0) {
        EXPECT_THAT(error_of([&] { h.get_uint(key); }), HasSubstr("negative"));
      }
    } else if (type == "FLOAT32" || type == "FLOAT64") {
      EXPECT_EQ(h.get_float(key), v.get<double>());
    } else if (type == "BOOL") {
      EXPECT_EQ(h.get_bool(key), v.get<bool>());
    } else if (type == "STRING") {
      EXPECT_EQ(h.get_string(key), v.get<std::string>());
    } else if (type == "ARRAY[INT32]") {
      EXPECT_EQ(h.get_ints(key), v.get<std::vector<std::int64_t>>());
    } else if (type == "ARRAY[FLOAT32]") {
      EXPECT_EQ(h.get_floats(key), v.get<std::vector<double>>());
    } else if (type == "ARRAY[STRING]") {
      EXPECT_EQ(*h.get_strings(key), v.get<std::vector<std::string>>());
    } else if (type == "ARRAY[ARRAY[INT32]]") {
      const auto& outer = *std::get<std::shared_ptr<const engine::GgufArray>>(h.find(key)->value);
      ASSERT_EQ(outer.arrays.size(), v.size());
      for (std::size_t i = 0; i < v.size(); ++i) {
        const auto& inner = *std::get<std::shared_ptr<const engine::GgufArray>>(outer.arrays[i].value);
        EXPECT_EQ(inner.size, v[i].size());
      }
    } else {
      ADD_FAILURE() << "type " << type << " not checked";
    }
  }
  // A value read as another type is an error naming the file and the key.
  EXPECT_THAT(error_of([&] { h.get_uint("test.string"); }),
              AllOf(HasSubstr("types.gguf"), HasSubstr("'test.string'"), HasSubstr("expected an integer")));
  EXPECT_THAT(error_of([&] { h.get_strings("test.array.i32"); }), HasSubstr("expected array of string"));
}

// Every tensor type, read from the file and dequantized, against gguf-py's dequantize of the
// same random blocks: the same fp32 values bit for bit (an exact zero's sign aside).
TEST(GgufBlocks, EveryTypeDequantizesAsGgufPy) {
  const engine::GgufFile f(data("types.gguf"));
  const auto want = expected("types.expected.json");
  ASSERT_EQ(want["tensors"].size(), 13u);
  for (const auto& t : want["tensors"]) {
    const std::string name = t["name"];
    SCOPED_TRACE(name);
    const engine::GgufTensor* g = f.header().find_tensor(name);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->type->name, t["type"].get<std::string>());
    EXPECT_EQ(g->ne, t["ne"].get<std::vector<std::int64_t>>());
    EXPECT_EQ(g->offset, t["offset_in_data"].get<std::uint64_t>());
    EXPECT_EQ(g->bytes, t["n_bytes"].get<std::uint64_t>());
    ASSERT_TRUE(engine::ggml_dequantizable(*g->type));
    std::vector<std::byte> raw(g->bytes);
    f.read(*g, 0, raw.data(), raw.size());
    std::vector<float> got(static_cast<std::size_t>(g->numel()), std::nanf(""));
    engine::dequantize_ggml(*g->type, raw.data(), g->numel(), got.data());
    const std::vector<float> ref = base64_floats(t["values_f32_b64"]);
    ASSERT_EQ(got.size(), ref.size());
    for (std::size_t i = 0; i < ref.size(); ++i) ASSERT_TRUE(same_value(got[i], ref[i])) << i << ": " << got[i] << " vs " << ref[i];
  }
}

// Q4_0, Q4_1 and Q8_0 rows repacked into q4g32/q8g32 hold the same values (no second rounding).
TEST(GgufBlocks, Q4AndQ8BlocksRepackWithoutLoss) {
  const engine::GgufFile f(data("types.gguf"));
  const auto want = expected("types.expected.json");
  int repacked = 0;
  for (const auto& t : want["tensors"]) {
    const engine::GgufTensor& g = *f.header().find_tensor(t["name"].get<std::string>());
    const auto format = engine::ggml_group_format(*g.type);
    if (!format) continue;
    SCOPED_TRACE(g.name);
    ++repacked;
    const std::int64_t rows = g.ne[1], cols = g.ne[0];
    EXPECT_EQ(*format, g.type->name == "Q8_0" ? kernels::DType::Q8G32 : kernels::DType::Q4G32);
    std::vector<std::byte> raw(g.bytes);
    f.read(g, 0, raw.data(), raw.size());
    const std::vector<float> ref = base64_floats(t["values_f32_b64"]);
    const std::int64_t in_row = static_cast<std::int64_t>(g.bytes) / rows;
    std::vector<std::byte> row(static_cast<std::size_t>(kernels::row_bytes(*format, cols)));
    std::vector<float> back(static_cast<std::size_t>(cols));
    for (std::int64_t r = 0; r < rows; ++r) {
      engine::repack_ggml_row(*g.type, raw.data() + r * in_row, cols, row.data());
      kernels::dequantize_row(row.data(), cols, *format, back.data());
      for (std::int64_t i = 0; i < cols; ++i)
        ASSERT_TRUE(same_value(back[static_cast<std::size_t>(i)], ref[static_cast<std::size_t>(r * cols + i)])) << r << "," << i;
    }
  }
  EXPECT_EQ(repacked, 3);
}

TEST(GgufBlocks, RepackRefusesAMinimumBeyondFp16) {
  const engine::GgmlTypeInfo& q8 = *engine::ggml_type_info(8);
  std::vector<std::uint8_t> block(34, 0);
  const std::uint16_t d = kernels::f32_to_f16(1024.0f);  // -128 d = -131072: no fp16
  std::memcpy(block.data(), &d, 2);
  std::vector<std::byte> row(static_cast<std::size_t>(kernels::row_bytes(kernels::DType::Q8G32, 32)));
  EXPECT_THROW(engine::repack_ggml_row(q8, block.data(), 32, row.data()), std::range_error);
}

// ---------------------------------------------------------------------------- bad files

// A GGUF file written field by field.
class Writer {
 public:
  Writer& u32(std::uint32_t v) { return put(v); }
  Writer& u64(std::uint64_t v) { return put(v); }
  Writer& str(const std::string& s) {
    u64(s.size());
    bytes_ += s;
    return *this;
  }
  Writer& pad(std::size_t alignment) {
    bytes_.append((alignment - bytes_.size() % alignment) % alignment, '\0');
    return *this;
  }
  Writer& raw(const std::string& s) {
    bytes_ += s;
    return *this;
  }
  std::size_t size() const { return bytes_.size(); }
  const std::string& bytes() const { return bytes_; }

 private:
  template <class T>
  Writer& put(T v) {
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  std::string bytes_;
};

// The parts of a small file, each replaceable by a test.
struct Parts {
  std::uint32_t version = 3;
  std::uint64_t n_tensors = 2, n_kv = 2;
  std::uint32_t alignment_type = 4, alignment = 32;
  std::uint32_t name_type = 8;
  std::uint64_t name_len = 4;
  std::uint32_t a_dims = 2, a_type = 0;  // "a": F32 [2, 32] at 0
  std::uint64_t a_ne0 = 32, a_offset = 0;
  std::uint32_t b_type = 8;  // "b": Q8_0 [32] at 256
  std::uint64_t b_offset = 256;
  std::size_t data_bytes = 256 + 34;
};

std::string build(const Parts& p) {
  Writer w;
  w.raw("GGUF").u32(p.version).u64(p.n_tensors).u64(p.n_kv);
  w.str("general.alignment").u32(p.alignment_type);
  if (p.alignment_type == 10) {
    w.u64(p.alignment);
  } else {
    w.u32(p.alignment);
  }
  w.str("general.name").u32(p.name_type).u64(p.name_len).raw("tiny");
  w.str("a").u32(p.a_dims).u64(p.a_ne0);
  if (p.a_dims > 1) w.u64(2);
  w.u32(p.a_type).u64(p.a_offset);
  w.str("b").u32(1).u64(32).u32(p.b_type).u64(p.b_offset);
  w.pad(p.alignment == 0 ? 32 : p.alignment);
  w.raw(std::string(p.data_bytes, '\0'));
  return w.bytes();
}

std::string parse_error(const std::string& bytes) {
  return error_of([&] { engine::parse_gguf_header(std::as_bytes(std::span(bytes.data(), bytes.size())), "bad.gguf"); });
}

TEST(GgufBadInput, TheBaseFileIsValid) {
  const std::string bytes = build({});
  const auto h = engine::parse_gguf_header(std::as_bytes(std::span(bytes.data(), bytes.size())), "ok.gguf");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].shape(), (std::vector<std::int64_t>{2, 32}));
  EXPECT_EQ(h.tensors[1].bytes, 34u);
  EXPECT_EQ(h.get_string("general.name"), "tiny");
}

// Every prefix of a real file is a clean error that says it is truncated.
TEST(GgufBadInput, TruncatedFiles) {
  const std::string bytes = testing::read_file(data("types.gguf"));
  for (std::size_t n = 0; n < bytes.size(); n += (n < 1400 ? 1 : 97)) {
    SCOPED_TRACE(n);
    const std::string e = parse_error(bytes.substr(0, n));
    ASSERT_THAT(e, AllOf(HasSubstr("bad.gguf"), HasSubstr("truncated")));
  }
  // Through a file on disk too, where the error names the path: the last byte of the last
  // tensor missing (gguf-py pads the file after it).
  const engine::GgufFile whole(data("types.gguf"));
  const engine::GgufTensor& last = *whole.header().find_tensor("t.Q6_K");
  testing::TempDir dir;
  testing::write_file(dir.file("cut.gguf"), bytes.substr(0, whole.header().data_start + last.offset + last.bytes - 1));
  EXPECT_THAT(error_of([&] { engine::GgufFile f(dir.file("cut.gguf")); }),
              AllOf(HasSubstr(dir.file("cut.gguf")), HasSubstr("tensor 't.Q6_K'"), HasSubstr("truncated")));
}

TEST(GgufBadInput, HugeCountsAndLengths) {
  Parts p;
  p.n_kv = 1ull << 62;
  EXPECT_THAT(parse_error(build(p)), AllOf(HasSubstr("metadata count"), HasSubstr("cannot fit")));
  p = {};
  p.n_tensors = 1ull << 40;
  EXPECT_THAT(parse_error(build(p)), AllOf(HasSubstr("tensor count"), HasSubstr("cannot fit")));
  p = {};
  p.name_len = ~0ull;
  EXPECT_THAT(parse_error(build(p)), AllOf(HasSubstr("'general.name'"), HasSubstr("truncated")));
  p = {};
  p.a_ne0 = 1ull << 62;  // 2^63 elements
  EXPECT_THAT(parse_error(build(p)), AllOf(HasSubstr("tensor 'a'"), HasSubstr("2^63-1 elements")));
  // An array whose count the file cannot hold, before anything is allocated for it.
  Writer w;
  w.raw("GGUF").u32(3).u64(0).u64(1).str("tokens").u32(9).u32(8).u64(1ull << 61);
  EXPECT_THAT(parse_error(w.bytes()), AllOf(HasSubstr("'tokens'"), HasSubstr("array of 2305843009213693952 string")));
  Writer nested;
  nested.raw("GGUF").u32(3).u64(0).u64(1).str("deep").u32(9);
  for (int i = 0; i < 20; ++i) nested.u32(9).u64(1);  // an array of one array of ...
  EXPECT_THAT(parse_error(nested.bytes()), HasSubstr("deeper than"));
}

TEST(GgufBadInput, OffsetsPastTheEndAndOverlaps) {
  Parts p;
  p.b_offset = 1ull << 40;
  EXPECT_THAT(parse_error(build(p)), AllOf(HasSubstr("tensor 'b'"), HasSubstr("data section")));
  p = {};
  p.b_offset = ~0ull - 31;  // offset + bytes wraps
  EXPECT_THAT(parse_error(build(p)), AllOf(HasSubstr("tensor 'b'"), HasSubstr("2^64")));
  p = {};
  p.data_bytes = 256 + 33;
  EXPECT_THAT(parse_error(build(p)), AllOf(HasSubstr("tensor 'b'"), HasSubstr("truncated")));
  p = {};
  p.b_offset = 224;
  EXPECT_THAT(parse_error(build(p)), AllOf(HasSubstr("'a' and 'b'"), HasSubstr("overlap")));
}

TEST(GgufBadInput, UnknownTypes) {
  Parts p;
  p.a_type = 99;
  EXPECT_THAT(parse_error(build(p)), AllOf(HasSubstr("tensor 'a'"), HasSubstr("unknown ggml type 99")));
  p = {};
  p.name_type = 13;
  EXPECT_THAT(parse_error(build(p)), AllOf(HasSubstr("'general.name'"), HasSubstr("unknown value type 13")));
  p = {};
  p.alignment_type = 10;  // u64: the spec says u32
  EXPECT_THAT(parse_error(build(p)), HasSubstr("'general.alignment' has type u64"));
  p = {};
  p.a_dims = 5;
  EXPECT_THAT(parse_error(build(p)), AllOf(HasSubstr("tensor 'a'"), HasSubstr("n_dims = 5")));
  p = {};
  p.a_type = 8;  // Q8_0 rows of 32 are fine; of 33 values are not whole blocks
  p.a_ne0 = 33;
  EXPECT_THAT(parse_error(build(p)), AllOf(HasSubstr("tensor 'a'"), HasSubstr("block of 32")));
  Writer b;
  b.raw("GGUF").u32(3).u64(0).u64(1).str("flag").u32(7).raw(std::string(1, '\x02'));
  EXPECT_THAT(parse_error(b.bytes()), AllOf(HasSubstr("'flag'"), HasSubstr("bool stored as 2")));
}

TEST(GgufBadInput, MisalignedData) {
  Parts p;
  p.b_offset = 260;
  EXPECT_THAT(parse_error(build(p)), AllOf(HasSubstr("tensor 'b'"), HasSubstr("offset 260 is not a multiple of the alignment 32")));
  p = {};
  p.alignment = 24;
  EXPECT_THAT(parse_error(build(p)), AllOf(HasSubstr("'general.alignment' = 24"), HasSubstr("power of two")));
  p = {};
  p.alignment = 64;  // the data section moves to the next 64; b at 256 is still aligned
  EXPECT_EQ(parse_error(build(p)), "");
}

TEST(GgufBadInput, HeaderAndDuplicates) {
  std::string bytes = build({});
  EXPECT_THAT(parse_error("GGML" + bytes.substr(4)), HasSubstr("not a GGUF file"));
  Parts p;
  p.version = 1;
  EXPECT_THAT(parse_error(build(p)), HasSubstr("version 1 is not supported"));
  p.version = 0x03000000;
  EXPECT_THAT(parse_error(build(p)), HasSubstr("big-endian"));
  p.version = 7;
  EXPECT_THAT(parse_error(build(p)), HasSubstr("unknown GGUF version 7"));
  Writer w;
  w.raw("GGUF").u32(3).u64(0).u64(2).str("k").u32(4).u32(1).str("k").u32(4).u32(2);
  EXPECT_THAT(parse_error(w.bytes()), HasSubstr("'k' appears twice"));
  Writer t;
  t.raw("GGUF").u32(3).u64(2).u64(0);
  for (int i = 0; i < 2; ++i) t.str("w").u32(1).u64(8).u32(0).u64(0);
  t.pad(32).raw(std::string(32, '\0'));
  EXPECT_THAT(parse_error(t.bytes()), HasSubstr("tensor 'w' appears twice"));
}

// Bytes flipped at random never crash the parser: it accepts or gives its one error.
TEST(GgufBadInput, SurvivesRandomMutations) {
  const std::string good = testing::read_file(data("tiny-llama.gguf"));
  std::mt19937_64 rng(::testing::UnitTest::GetInstance()->random_seed());
  std::uniform_int_distribution<std::size_t> at(0, 4096);
  for (int i = 0; i < 300; ++i) {
    std::string bytes = good;
    for (int k = 0; k < 4; ++k) bytes[at(rng) % bytes.size()] = static_cast<char>(rng());
    try {
      const auto h = engine::parse_gguf_header(std::as_bytes(std::span(bytes.data(), bytes.size())), "m.gguf");
      engine::gguf_model_config(h, [&](const engine::GgufTensor& t) {
        std::vector<float> v(static_cast<std::size_t>(t.numel()));
        std::memcpy(v.data(), bytes.data() + h.data_start + t.offset, t.bytes);
        return v;
      });
    } catch (const std::runtime_error& e) {
      ASSERT_THAT(e.what(), HasSubstr("m.gguf"));
    }
  }
}

// ---------------------------------------------------------------------------- the tiny llama

class TinyLlama : public ::testing::Test {
 protected:
  TinyLlama() : ckpt_(data("tiny-llama.gguf")), want_(expected("tiny-llama.expected.json")) {}
  // The config at fp32, as transformers runs it, generating past EOS as the fixture does.
  engine::ModelConfig f32_config() const {
    engine::ModelConfig c = ckpt_.config();
    c.dtype = kernels::DType::F32;
    c.stop_ids.clear();
    return c;
  }
  std::vector<std::vector<std::int32_t>> prompts() const {
    std::vector<std::vector<std::int32_t>> p;
    for (const auto& c : want_["cases"]) p.push_back(c["prompt_ids"]);
    return p;
  }

  engine::GgufCheckpoint ckpt_;
  nlohmann::json want_;
};

TEST_F(TinyLlama, ConfigFromTheMetadata) {
  const engine::ModelConfig& c = ckpt_.config();
  const auto& hf = want_["config"];
  EXPECT_EQ(c.family, "llama");
  EXPECT_EQ(c.hidden, hf["hidden_size"].get<std::int64_t>());
  EXPECT_EQ(c.n_layers, hf["num_hidden_layers"].get<std::int64_t>());
  EXPECT_EQ(c.n_heads, hf["num_attention_heads"].get<std::int64_t>());
  EXPECT_EQ(c.n_kv_heads, hf["num_key_value_heads"].get<std::int64_t>());
  EXPECT_EQ(c.head_dim, hf["head_dim"].get<std::int64_t>());
  EXPECT_EQ(c.ffn, hf["intermediate_size"].get<std::int64_t>());
  EXPECT_EQ(c.vocab_size, hf["vocab_size"].get<std::int64_t>());
  EXPECT_EQ(c.max_positions, hf["max_position_embeddings"].get<std::int64_t>());
  EXPECT_EQ(c.norm_eps, hf["rms_norm_eps"].get<float>());
  EXPECT_EQ(c.rope.theta, hf["rope_theta"].get<double>());
  EXPECT_EQ(c.rope.layout, kernels::RopeLayout::Interleaved);  // the converter permuted q/k
  EXPECT_EQ(c.tie_embeddings, false);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.stop_ids, std::vector<std::int32_t>{2});
  EXPECT_EQ(c.dtype, kernels::DType::F16);  // mixed types: f16 unless the run says otherwise
  // Layer 0 is Q8_0, layer 1 Q4_1: both kept under compression; the F32 embedding and head not.
  EXPECT_EQ(c.stored_group_formats.at("layers.0.wq"), kernels::DType::Q8G32);
  EXPECT_EQ(c.stored_group_formats.at("layers.1.w_down"), kernels::DType::Q4G32);
  EXPECT_EQ(c.stored_group_formats.size(), 14u);
  EXPECT_FALSE(c.stored_group_formats.contains("tok_embed"));
}

TEST_F(TinyLlama, GreedyTokensEqualTransformers) {
  const engine::ModelConfig cfg = f32_config();
  const auto weights = engine::load_weights(cfg, ckpt_);
  auto be = kernels::make_cpu_backend();
  engine::Generator gen(*be, cfg, weights);
  for (const auto& c : want_["cases"]) {
    const std::vector<std::int32_t> prompt = c["prompt_ids"], greedy = c["greedy_new_ids"];
    SCOPED_TRACE(::testing::PrintToString(prompt));
    std::vector<float> first;
    engine::GenerationRequest req;
    req.sequences = engine::sequences_of({prompt});
    req.max_new_tokens = static_cast<std::int64_t>(greedy.size());
    engine::GenerationHooks hooks;
    hooks.on_logits = [&](std::int64_t step, std::span<const float> l) {
      if (step == 0) first.assign(l.begin(), l.end());
    };
    EXPECT_EQ(gen.generate(req, hooks).tokens[0], greedy);
    // The prefill's last position against transformers' logits, within fp32 rounding.
    const std::vector<float> all = base64_floats(c["prefill_logits_f32_b64"]);
    const std::vector<float> last(all.end() - cfg.vocab_size, all.end());
    const double tol = testing::forward_tolerance(cfg, static_cast<std::int64_t>(prompt.size()), last);
    for (std::size_t i = 0; i < last.size(); ++i) ASSERT_NEAR(first[i], last[i], tol) << i;
  }
}

// Offloaded: weights, KV and activations over the three tiers, two GPU batches.
TEST_F(TinyLlama, TieredRunGeneratesTransformersTokens) {
  const engine::ModelConfig cfg = f32_config();
  auto be = kernels::make_cpu_backend();
  engine::GenerationRequest req;
  req.sequences = engine::sequences_of(prompts());
  req.max_new_tokens = want_["n_new_tokens"];
  const auto got = testing::generate_tiered(*be, cfg, ckpt_, testing::spread_policy(2, 2, {0.3, 0.3, 0.4}), req, {true});
  ASSERT_EQ(got.size(), want_["cases"].size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(got[i], want_["cases"][i]["greedy_new_ids"].get<std::vector<std::int32_t>>()) << "prompt " << i;
}

// Compressed: the Q8_0 and Q4_1 matrices stay in their blocks (q8g32/q4g32 rows holding exactly
// the dequantized values), the F32 ones are quantized as --compress-weight does; in memory and
// offloaded the same tokens.
TEST_F(TinyLlama, CompressedKeepsTheFileBlocks) {
  const engine::ModelConfig f32 = f32_config();
  const engine::ModelConfig q4 = engine::with_weight_dtype(f32, kernels::DType::Q4);
  const auto plain = engine::load_weights(f32, ckpt_);
  const auto packed = engine::load_weights(q4, ckpt_);
  EXPECT_EQ(packed.at("layers.0.wk").dtype, kernels::DType::Q8G32);
  EXPECT_EQ(packed.at("layers.1.w_gate").dtype, kernels::DType::Q4G32);
  EXPECT_EQ(packed.at("tok_embed").dtype, kernels::DType::Q4);
  EXPECT_EQ(packed.at("final_norm.weight").dtype, kernels::DType::F32);
  for (const auto& [name, format] : q4.stored_group_formats) {
    const engine::HostTensor& t = packed.at(name);
    std::vector<float> back(static_cast<std::size_t>(t.rows * t.cols));
    kernels::convert_rows(t.data.get(), t.dtype, back.data(), kernels::DType::F32, t.rows, t.cols);
    const float* want = plain.at(name).f32();
    for (std::size_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], want[i]) << name << " " << i;
  }
  // Sizes: what the tiers hold is what the config says.
  EXPECT_EQ(q4.weight_bytes(), [&] {
    std::int64_t b = 0;
    for (const auto& [name, t] : packed) b += t.rows * kernels::row_bytes(t.dtype, t.cols);
    return b;
  }());

  auto be = kernels::make_cpu_backend();
  engine::GenerationRequest req;
  req.sequences = engine::sequences_of(prompts());
  req.max_new_tokens = want_["n_new_tokens"];
  const auto in_memory = engine::Generator(*be, q4, packed).generate(req).tokens;
  policy::Policy pol;
  pol.compress_weight = true;
  pol.gpu_batch_size = 3;
  pol.weights = {0.5, 0.25, 0.25};
  testing::TempDir dir;
  offload::TierOptions to;
  to.offload_dir = dir.path();
  offload::Tiers tiers(*be, to);
  engine::BlockExecutor sched(*be, tiers, f32, ckpt_, pol, nullptr, {true});
  EXPECT_EQ(serving::generate(sched, req).tokens, in_memory);
}

// Bytes of the weights of `c` with its matrices compressed to q4, the kept formats as they
// are (norm vectors stay fp32).
std::int64_t compressed_weight_bytes(const engine::ModelConfig& c) {
  const engine::ModelConfig q4 = engine::with_weight_dtype(c, kernels::DType::Q4);
  std::int64_t bytes = 0;
  for (const auto& w : engine::weight_specs(q4)) bytes += w.rows * kernels::row_bytes(w.dtype(q4), w.cols);
  return bytes;
}

// The planner sizes kept blocks as the tiers hold them.
TEST_F(TinyLlama, PlannerSizesTheKeptFormats) {
  policy::Policy pol;
  pol.compress_weight = true;
  // Every matrix kept in one format: the planner's sizes are exactly the tensors' bytes.
  engine::ModelConfig uniform = f32_config();
  for (const auto& w : engine::weight_specs(uniform))
    if (w.matrix) uniform.stored_group_formats[w.name] = kernels::DType::Q4G32;
  const auto exact = policy::model_sizes(policy::with_compression(engine::model_shape(uniform), pol));
  EXPECT_EQ(exact.total_weights, compressed_weight_bytes(uniform));
  // The file's mix (a Q8_0 layer, a Q4_1 layer, F32 embedding and head): sized by the widest
  // format of each part, never below what the tiers hold.
  const engine::ModelConfig file = f32_config();
  const auto mixed = policy::model_sizes(policy::with_compression(engine::model_shape(file), pol));
  EXPECT_GE(mixed.total_weights, compressed_weight_bytes(file));
  EXPECT_LT(mixed.total_weights, compressed_weight_bytes(file) + exact.layer_weights);
}

TEST(GgufModelSource, OpensByExtensionOrMagic) {
  testing::TempDir dir;
  fs::copy_file(data("tiny-llama.gguf"), dir.file("model.bin"));
  engine::ModelOptions o;
  o.model = dir.file("model.bin");
  const auto m = engine::open_model(o);
  EXPECT_EQ(m.config.family, "llama");
  EXPECT_EQ(m.config.name, "model");
  o.model = data("tiny-llama.gguf");
  o.dtype = kernels::DType::BF16;
  EXPECT_EQ(engine::open_model(o).config.dtype, kernels::DType::BF16);
}

// Metadata that is missing, out of range or describes math the engine lacks: named errors.
TEST(GgufConfig, BadMetadataIsNamed) {
  const std::string good = testing::read_file(data("tiny-llama.gguf"));
  const auto base = engine::parse_gguf_header(std::as_bytes(std::span(good.data(), good.size())), "t.gguf");
  auto no_tensors = [](const engine::GgufTensor&) -> std::vector<float> { return {}; };
  using V = engine::GgufValue;
  struct Case {
    const char* key;
    std::optional<V> value;  // nullopt: the key removed
    const char* mention;
  };
  const Case cases[] = {
      {"general.architecture", V{engine::GgufValueType::String, std::string("mamba")}, "architecture not supported"},
      {"llama.block_count", V{engine::GgufValueType::U32, std::uint64_t{0}}, "'llama.block_count' = 0 is out of range"},
      {"llama.block_count", V{engine::GgufValueType::U64, std::uint64_t{1} << 40}, "out of range"},
      {"llama.block_count", V{engine::GgufValueType::U32, std::uint64_t{1000}}, "more than the file's"},
      {"llama.embedding_length", V{engine::GgufValueType::String, std::string("64")}, "expected an integer"},
      {"llama.attention.layer_norm_rms_epsilon", std::nullopt, "missing metadata key 'llama.attention.layer_norm_rms_epsilon'"},
      {"llama.expert_count", V{engine::GgufValueType::U32, std::uint64_t{8}}, "mixture-of-experts"},
      {"llama.rope.scaling.type", V{engine::GgufValueType::String, std::string("su")}, "RoPE scaling not supported"},
      {"llama.logit_scale", V{engine::GgufValueType::F32, 0.5}, "'llama.logit_scale' is set"},
      {"tokenizer.ggml.eos_token_id", V{engine::GgufValueType::U32, std::uint64_t{512}}, "outside the vocabulary"},
      {"llama.attention.head_count_kv", V{engine::GgufValueType::U32, std::uint64_t{3}}, "num_kv_heads must divide"},
      {"llama.attention.head_count", V{engine::GgufValueType::U32, std::uint64_t{100}}, "exceeds the embedding length 64"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key);
    const engine::GgufHeader h = with_metadata(base, c.key, c.value);
    EXPECT_THAT(error_of([&] { engine::gguf_model_config(h, no_tensors); }), AllOf(HasSubstr("t.gguf"), HasSubstr(c.mention)));
  }
}

}  // namespace
}  // namespace flexh2o
