// Tokenizers: GPT-2 byte-level BPE against known ids and round trips, the tokenizer.json
// loader against the vocab.json + merges.txt one, llama2.c's tok*.bin against a direct port of
// run.c's encoder, and malformed inputs.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/tokenizer/decoders.h"
#include "engine/tokenizer/normalizers.h"
#include "engine/tokenizer/pipeline.h"
#include "engine/tokenizer/post_processors.h"
#include "engine/tokenizer/pre_tokenizers.h"
#include "engine/tokenizer/score_model.h"
#include "engine/tokenizer/tokenizer.h"

namespace flexh2o::engine {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<std::int32_t>;

const std::string kGpt2Dir = std::string(FLEXH2O_TEST_DATA_DIR) + "/gpt2";
const std::string kTok512 = std::string(FLEXH2O_SOURCE_DIR) + "/models/stories260K/tok512.bin";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

// Printable form of arbitrary bytes for failure messages.
std::string escaped(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    const auto b = static_cast<unsigned char>(c);
    if (b >= 0x20 && b < 0x7F && c != '"' && c != '\\') {
      out += c;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", b);
      out += buf;
    }
  }
  return out + "\"";
}

// The message of the std::runtime_error `fn` throws ("" with a test failure if none).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected std::runtime_error";
  return "";
}

// A directory under the system temp dir, removed again at the end of the test.
class TempDir {
 public:
  TempDir() {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("flexh2o_" + std::string(info->name()) + "_" + std::to_string(std::random_device{}()));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

// Random text from a fixed menu of pieces.
std::string random_text(std::mt19937& rng, const std::vector<std::string>& pieces, std::size_t max_pieces) {
  std::uniform_int_distribution<std::size_t> count(0, max_pieces);
  std::uniform_int_distribution<std::size_t> pick(0, pieces.size() - 1);
  std::string s;
  for (std::size_t n = count(rng); n > 0; --n) s += pieces[pick(rng)];
  return s;
}

// ---- GPT-2 ----

const Tokenizer& gpt2() {
  static const std::unique_ptr<Tokenizer> tok = load_gpt2_tokenizer(kGpt2Dir + "/vocab.json", kGpt2Dir + "/merges.txt");
  return *tok;
}

TEST(Gpt2Tokenizer, KnownIds) {
  const Tokenizer& tok = gpt2();
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.bos_id(), 50256);
  EXPECT_EQ(tok.eos_id(), 50256);
  EXPECT_EQ(tok.encode("Hello world", false), (Ids{15496, 995}));
  EXPECT_EQ(tok.encode(" the", false), (Ids{262}));
  EXPECT_EQ(tok.encode("Hello world", true), (Ids{50256, 15496, 995}));
  EXPECT_EQ(tok.encode("", false), Ids{});
  // Ids from GPT-2's reference encoder.py (regex module + the same vocab/merges).
  EXPECT_EQ(tok.encode("I'm here, aren't you? It's 2024!!\n\n  Done.", false),
            (Ids{40, 1101, 994, 11, 3588, 470, 345, 30, 632, 338, 48609, 3228, 628, 220, 24429, 13}));
  EXPECT_EQ(tok.encode("  leading spaces\tand\ttabs\r\n", false),
            (Ids{220, 3756, 9029, 197, 392, 197, 8658, 82, 201, 198}));
  EXPECT_EQ(tok.encode("naïve café 中文 😀 👍🏽", false),
            (Ids{2616, 38776, 40304, 220, 40792, 23877, 229, 30325, 222, 50169, 235, 8582, 237, 121}));
  EXPECT_EQ(tok.encode("The QUICK brown fox's 12345 jumps.", false),
            (Ids{464, 19604, 11860, 7586, 21831, 338, 17031, 2231, 18045, 13}));
}

TEST(Gpt2Tokenizer, EndOfTextIsSpecial) {
  const Tokenizer& tok = gpt2();
  const Ids ids = tok.encode("a<|endoftext|>b", false);
  EXPECT_EQ(ids, (Ids{64, 50256, 65}));
  EXPECT_EQ(tok.decode(ids), "ab");
  EXPECT_THROW(tok.decode(Ids{50257}), std::runtime_error);
  EXPECT_THROW(tok.decode(Ids{-1}), std::runtime_error);
}

TEST(Gpt2Tokenizer, RandomUtf8RoundTrips) {
  // clang-format off
  const std::vector<std::string> pieces = {
      "the", "The", "quick", "fox", "a", "Z", "hello", "world", "x", "qwzj", "42", "7", "2024", "3.14",
      ".", ",", "!", "?", "...", "--", "(", ")", "\"", "#", "@", "$", "%", "&", "*", "+", "=", "<", ">", "/", "\\",
      " ", " ", " ", "  ", "    ", "\n", "\n\n", " \n ", "\t", "\r\n", "   \n",
      "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'", "don't", "we'll",
      "é", "naïve", "Ünïcödé", "ñ", "ß", "e\xCC\x81", "Ωμέγα", "привет",
      "中文", "日本語", "한국어", "\xE3\x80\x80", "\xC2\xA0",
      "😀", "👍🏽", "🇺🇸", "🐶", "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x92\xBB"};
  // clang-format on
  const Tokenizer& tok = gpt2();
  constexpr unsigned kSeed = 20240521;
  std::mt19937 rng(kSeed);
  for (int i = 0; i < 2000; ++i) {
    const std::string s = random_text(rng, pieces, 24);
    const Ids ids = tok.encode(s, false);
    ASSERT_EQ(tok.decode(ids), s) << "seed " << kSeed << ", string #" << i << ": " << escaped(s);
  }
}

TEST(Gpt2Tokenizer, InvalidUtf8RoundTrips) {
  const Tokenizer& tok = gpt2();
  constexpr unsigned kSeed = 7;
  std::mt19937 rng(kSeed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<std::size_t> length(1, 40);
  const std::vector<std::string> fixed = {
      "\xFF",        "abc\x80", "\xC3", "x\xE4\xB8 y", "\xF0\x9F\x98", std::string("a\0b", 3), "caf\xC3\xA9\xC3 ok",
      "\xED\xA0\x80"};
  for (const std::string& s : fixed) EXPECT_EQ(tok.decode(tok.encode(s, false)), s) << escaped(s);
  for (int i = 0; i < 200; ++i) {
    std::string s(length(rng), '\0');
    for (char& c : s) c = static_cast<char>(byte(rng));
    ASSERT_EQ(tok.decode(tok.encode(s, false)), s) << "seed " << kSeed << ", string #" << i << ": " << escaped(s);
  }
}

TEST(Gpt2Tokenizer, DecodeIsPrefixConsistent) {
  const Tokenizer& tok = gpt2();
  const Ids ids = tok.encode("Grüße, 世界! 😀 It's fine.", true);
  const std::string full = tok.decode(ids);
  for (std::size_t i = 0; i <= ids.size(); ++i) {
    const std::string prefix = tok.decode(std::span(ids).first(i));
    EXPECT_EQ(full.substr(0, prefix.size()), prefix) << i;
  }
}

// ---- Hugging Face tokenizer.json ----

// GPT-2's tokenizer.json as Hugging Face writes it, rebuilt from vocab.json + merges.txt, merges
// as ["a", "b"] pairs, with an extra special "</s>". Spliced as text: parsing and re-dumping
// the vocab is slow under sanitizers.
std::string gpt2_tokenizer_json(bool extra_special = true) {
  std::string merges;
  std::istringstream lines(read_file(kGpt2Dir + "/merges.txt"));
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line.starts_with("#version")) continue;
    const std::size_t space = line.find(' ');
    merges += merges.empty() ? "[" : ",[";
    merges += nlohmann::json(line.substr(0, space)).dump() + "," + nlohmann::json(line.substr(space + 1)).dump() + "]";
  }
  return R"({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [)"
         R"({"id": 50256, "content": "<|endoftext|>", "single_word": false, "lstrip": false, "rstrip": false,)"
         R"( "normalized": true, "special": true})" +
         std::string(extra_special ? R"(, {"id": 50257, "content": "</s>", "special": true})" : "") + "]," +
         R"("normalizer": null,)"
         R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},)"
         R"("post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},)"
         R"("decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},)"
         R"("model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",)"
         R"( "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "vocab": )" +
         read_file(kGpt2Dir + "/vocab.json") + R"(, "merges": [)" + merges + "]}}";
}

TEST(HfTokenizer, MatchesVocabAndMerges) {
  TempDir dir;
  write_file(dir / "tokenizer.json", gpt2_tokenizer_json());
  const auto tok = load_hf_tokenizer((dir / "tokenizer.json").string());
  EXPECT_EQ(tok->vocab_size(), 50258);
  // Its post-processor adds no special tokens (GPT-2's vocab.json + merges.txt put
  // <|endoftext|> first).
  EXPECT_EQ(tok->bos_id(), std::nullopt);
  EXPECT_EQ(tok->eos_id(), std::nullopt);
  EXPECT_EQ(tok->encode("Hello world", true), (Ids{15496, 995}));
  for (const std::string text : {"Hello world", " the", "I'm here, aren't you?\n\n  x", "naïve 中文 😀", "a\xFF b"}) {
    EXPECT_EQ(tok->encode(text, false), gpt2().encode(text, false)) << escaped(text);
  }
  const Ids ids = tok->encode("Hi</s> there</s>", false);
  EXPECT_EQ(ids, (Ids{17250, 50257, 612, 50257}));
  EXPECT_EQ(tok->decode(ids), "Hi there");
}

TEST(HfTokenizer, StringMergesAndNonSpecialAddedToken) {
  TempDir dir;
  nlohmann::json j = {{"model",
                       {{"type", "BPE"},
                        {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {"Ġ", 3}, {"Ġab", 4}}},
                        {"merges", {"a b", "Ġ ab"}}}},
                      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                      {"decoder", {{"type", "ByteLevel"}}},
                      {"added_tokens", {{{"id", 5}, {"content", "[X]"}, {"special", false}}}}};
  write_file(dir / "tokenizer.json", j.dump());
  const auto tok = load_hf_tokenizer((dir / "tokenizer.json").string());
  EXPECT_EQ(tok->encode("ab ab[X]ba", false), (Ids{2, 4, 5, 1, 0}));
  EXPECT_EQ(tok->decode(Ids{2, 4, 5, 1, 0}), "ab ab[X]ba");
  EXPECT_EQ(tok->bos_id(), std::nullopt);
  EXPECT_EQ(tok->encode("ab", true), (Ids{2}));
}

// ---- real tokenizer.json files against Hugging Face tokenizers (tests/data/tokenizers) ----

const std::string kTokenizersDir = std::string(FLEXH2O_TEST_DATA_DIR) + "/tokenizers";

// Each file loaded once per process (loading 6 MB of JSON is slow under sanitizers).
const Tokenizer& real_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  auto& tok = loaded[name];
  if (!tok) tok = load_hf_tokenizer(kTokenizersDir + "/" + name + "/tokenizer.json");
  return *tok;
}

struct Case {
  std::string text;
  Ids ids, ids_with_special;
  std::string decoded;
};

std::vector<Case> read_cases(const std::string& name) {
  std::vector<Case> cases;
  std::istringstream lines(read_file(kTokenizersDir + "/cases-" + name + ".jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    cases.push_back({j.at("text"), j.at("ids"), j.at("ids_with_special"), j.at("decoded")});
  }
  return cases;
}

// Every line: its ids without and with the special tokens, and the text its ids decode to
// (Hugging Face's decode keeping special tokens). Returns the number of lines that match.
std::size_t matching_cases(const Tokenizer& tok, const std::string& name, bool with_special = true) {
  const std::vector<Case> cases = read_cases(name);
  EXPECT_GT(cases.size(), 300u) << name;
  std::size_t matching = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::string where = "cases-" + name + ".jsonl:" + std::to_string(i + 1) + " " + escaped(c.text.substr(0, 60));
    const Ids ids = tok.encode(c.text, false);
    const bool ok = ids == c.ids && (!with_special || tok.encode(c.text, true) == c.ids_with_special) &&
                    tok.decode(c.ids, false) == c.decoded;
    EXPECT_EQ(ids, c.ids) << where;
    if (with_special) {
      EXPECT_EQ(tok.encode(c.text, true), c.ids_with_special) << where;
    }
    EXPECT_EQ(tok.decode(c.ids, false), c.decoded) << where;
    matching += ok ? 1 : 0;
  }
  return matching;
}

TEST(TokenizerCases, Phi3SentencePieceLegacyNormalizer) {
  EXPECT_EQ(matching_cases(real_tokenizer("phi3"), "phi3"), 338u);
}

TEST(TokenizerCases, Phi3Metaspace) {
  EXPECT_EQ(matching_cases(real_tokenizer("phi3-metaspace"), "phi3-metaspace"), 338u);
}

TEST(TokenizerCases, Qwen2ByteLevelSplitRegex) {
  EXPECT_EQ(matching_cases(real_tokenizer("qwen2"), "qwen2"), 338u);
}

TEST(TokenizerCases, SmolLM2ByteLevel) {
  EXPECT_EQ(matching_cases(real_tokenizer("smollm2"), "smollm2"), 338u);
}

TEST(TokenizerCases, Gpt2VocabAndMerges) {
  // encode(text, true) of vocab.json + merges.txt puts <|endoftext|> first; HF's GPT-2
  // tokenizer.json adds nothing (checked below).
  EXPECT_EQ(matching_cases(gpt2(), "gpt2", /*with_special=*/false), 338u);
}

TEST(TokenizerCases, Gpt2TokenizerJson) {
  TempDir dir;
  write_file(dir / "tokenizer.json", gpt2_tokenizer_json(/*extra_special=*/false));
  EXPECT_EQ(matching_cases(*load_hf_tokenizer((dir / "tokenizer.json").string()), "gpt2"), 338u);
}

// Decoding stays prefix-consistent through Strip, Metaspace, ByteFallback and ByteLevel
// decoders (the CLI's generated text is decode(prompt + gen) minus decode(prompt)).
TEST(TokenizerCases, DecodeIsPrefixConsistent) {
  for (const std::string name : {"phi3", "phi3-metaspace", "qwen2"}) {
    const Tokenizer& tok = real_tokenizer(name);
    const std::vector<Case> cases = read_cases(name);
    for (const std::size_t line : {300, 310, 320, 330}) {  // edge cases: accents, CJK, emoji, whitespace
      const Ids ids = tok.encode(cases[line].text, true);
      for (const bool skip : {true, false}) {
        const std::string full = tok.decode(ids, skip);
        for (std::size_t i = 0; i <= ids.size(); ++i) {
          const std::string prefix = tok.decode(std::span(ids).first(i), skip);
          ASSERT_EQ(full.substr(0, prefix.size()), prefix) << name << " line " << line + 1 << ", " << i << " ids";
        }
      }
    }
  }
}

// ---- stages on small hand-made tokenizer.json files ----

std::unique_ptr<Tokenizer> from_json(const TempDir& dir, const nlohmann::json& j) {
  write_file(dir / "tokenizer.json", j.dump());
  return load_hf_tokenizer((dir / "tokenizer.json").string());
}

std::string error_of_json(const TempDir& dir, const nlohmann::json& j) {
  return error_of([&] { from_json(dir, j); });
}

nlohmann::json added(std::int32_t id, const std::string& content, nlohmann::json flags = nlohmann::json::object()) {
  flags["id"] = id;
  flags["content"] = content;
  return flags;
}

// One id per character; "<", ">" and letters in the vocab so unmatched added tokens show.
nlohmann::json char_model() {
  nlohmann::json vocab;
  const std::string chars = " abcmnpqwxy<>_";
  for (std::size_t i = 0; i < chars.size(); ++i) vocab[std::string(1, chars[i])] = i;
  return {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}};
}

TEST(AddedTokens, LstripRstripSingleWordLongest) {
  TempDir dir;
  const auto tok = from_json(
      dir, {{"model", char_model()},
            {"added_tokens",
             {added(14, "<m>", {{"lstrip", true}, {"special", true}}), added(15, "<n>", {{"rstrip", true}, {"normalized", false}}),
              added(16, "<w>", {{"single_word", true}, {"normalized", false}}), added(17, "<m>x", {{"normalized", false}}),
              added(11, "<", {{"normalized", false}})}}});
  // Model ids: ' ' 0, a 1, b 2, w 8, x 9, < 11, > 12. Ids as Hugging Face tokenizers gives them.
  EXPECT_EQ(tok->encode("a  <m> b", false), (Ids{1, 14, 0, 2}));   // takes the spaces before it
  EXPECT_EQ(tok->encode("a <n>  b", false), (Ids{1, 0, 15, 2}));   // and after it
  // Not next to a word character; the search goes on after a match it turned down.
  EXPECT_EQ(tok->encode("a<w> <w>", false), (Ids{1, 11, 8, 12, 0, 16}));
  EXPECT_EQ(tok->encode("<m>xa", false), (Ids{17, 1}));            // the longest at the leftmost start
  EXPECT_EQ(tok->encode("<<m>", false), (Ids{11, 14}));
  // Decoding skips special tokens only.
  // Without a decoder, token strings are joined with spaces (as Hugging Face does).
  EXPECT_EQ(tok->decode(Ids{1, 14, 15, 11}), "a <n> <");
  EXPECT_EQ(tok->decode(Ids{1, 14, 15, 11}, false), "a <m> <n> <");
}

TEST(AddedTokens, NormalizedOnesMatchTheNormalizedText) {
  TempDir dir;
  const auto tok = from_json(
      dir, {{"model", char_model()},
            {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "_"}}},
            {"added_tokens", {added(14, "x y", {{"normalized", true}}), added(15, "p q", {{"normalized", false}})}}});
  // "x y" is matched as "x_y" after normalization, "p q" before it.
  EXPECT_EQ(tok->encode("x y p q", false), (Ids{14, 13, 15}));
  EXPECT_EQ(tok->encode("x_y", false), (Ids{14}));
  EXPECT_EQ(tok->decode(Ids{14, 15}), "x_y p q");  // a normalized token decodes to its normalized form
}

nlohmann::json metaspace_tokenizer(const std::string& scheme, bool split) {
  return {{"model",
           {{"type", "BPE"},
            {"vocab", {{"▁", 0}, {"a", 1}, {"b", 2}, {"▁a", 3}, {"▁b", 4}, {"a▁", 5}, {"<s>", 6}}},
            {"merges", {"a ▁", "▁ a", "▁ b"}}}},
          {"pre_tokenizer",
           {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", scheme}, {"split", split}}},
          {"decoder", {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", scheme}, {"split", split}}},
          {"added_tokens", {added(6, "<s>", {{"special", true}})}}};
}

TEST(Metaspace, PrependSchemesAndSplit) {
  TempDir dir;
  const auto first = from_json(dir, metaspace_tokenizer("first", false));
  EXPECT_EQ(first->encode("a", false), (Ids{3}));
  EXPECT_EQ(first->encode("<s>a", false), (Ids{6, 1}));  // not after a special token
  EXPECT_EQ(first->encode("a b", false), (Ids{0, 5, 2}));  // one piece: "a▁" merges first
  const auto always = from_json(dir, metaspace_tokenizer("always", false));
  EXPECT_EQ(always->encode("<s>a", false), (Ids{6, 3}));
  EXPECT_EQ(always->encode("▁a", false), (Ids{3}));  // already starts with one
  const auto never = from_json(dir, metaspace_tokenizer("never", false));
  EXPECT_EQ(never->encode("a", false), (Ids{1}));
  const auto split = from_json(dir, metaspace_tokenizer("always", true));
  EXPECT_EQ(split->encode("a b", false), (Ids{3, 4}));  // pieces "▁a", "▁b"
  // The decoder drops the first token's prefix, unless the scheme is never.
  EXPECT_EQ(always->decode(Ids{3, 4}), "a b");
  EXPECT_EQ(never->decode(Ids{3, 4}), " a b");

  nlohmann::json contradiction = metaspace_tokenizer("always", false);
  contradiction["pre_tokenizer"]["add_prefix_space"] = false;
  EXPECT_NE(error_of_json(dir, contradiction).find("pre_tokenizer.add_prefix_space"), std::string::npos);
  // Old files: add_prefix_space instead of prepend_scheme.
  nlohmann::json legacy = metaspace_tokenizer("always", false);
  legacy["pre_tokenizer"].erase("prepend_scheme");
  legacy["pre_tokenizer"]["add_prefix_space"] = false;
  EXPECT_EQ(from_json(dir, legacy)->encode("a", false), (Ids{1}));
}

nlohmann::json byte_fallback_tokenizer(bool fuse_unk) {
  return {{"model",
           {{"type", "BPE"},
            {"vocab", {{"<unk>", 0}, {"a", 1}, {"<0xC3>", 2}, {"<0xA9>", 3}}},
            {"merges", nlohmann::json::array()},
            {"unk_token", "<unk>"},
            {"byte_fallback", true},
            {"fuse_unk", fuse_unk}}},
          {"decoder", {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}}};
}

TEST(Bpe, ByteFallbackAndFusedUnk) {
  TempDir dir;
  const auto fused = from_json(dir, byte_fallback_tokenizer(true));
  EXPECT_EQ(fused->encode("aéa", false), (Ids{1, 2, 3, 1}));  // é is C3 A9
  EXPECT_EQ(fused->decode(Ids{1, 2, 3, 1}), "aéa");
  // ü (C3 BC) lacks <0xBC>: unk, and two in a row fuse into one.
  EXPECT_EQ(fused->encode("aüüa", false), (Ids{1, 0, 1}));
  const auto unfused = from_json(dir, byte_fallback_tokenizer(false));
  EXPECT_EQ(unfused->encode("aüüa", false), (Ids{1, 0, 0, 1}));
  // A character cut after its first byte stays that byte (Hugging Face would print U+FFFD).
  EXPECT_EQ(fused->decode(Ids{1, 2}), "a\xC3");

  nlohmann::json bad_unk = byte_fallback_tokenizer(true);
  bad_unk["model"]["unk_token"] = "<missing>";
  EXPECT_NE(error_of_json(dir, bad_unk).find("unk_token"), std::string::npos);
}

TEST(Bpe, IgnoreMergesAndBothMergeSpellings) {
  TempDir dir;
  nlohmann::json j = {{"model",
                       {{"type", "BPE"},
                        {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"abc", 4}, {"a b", 5}, {" ", 6}}},
                        {"merges", {"a b"}}}}};
  // "abc" is in the vocab but no merge makes it.
  EXPECT_EQ(from_json(dir, j)->encode("abc", false), (Ids{3, 2}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(from_json(dir, j)->encode("abc", false), (Ids{4}));
  j["model"]["ignore_merges"] = false;
  // Pairs can name tokens with a space in them; "a b" as a string is the pair (a, b).
  j["model"]["merges"] = nlohmann::json::array(
      {nlohmann::json::array({"a", "b"}), nlohmann::json::array({"a", " "}), nlohmann::json::array({"a ", "b"})});
  j["model"]["vocab"]["a "] = 7;
  EXPECT_EQ(from_json(dir, j)->encode("abc", false), (Ids{3, 2}));
  EXPECT_EQ(from_json(dir, j)->encode("a b", false), (Ids{5}));
  j["model"]["merges"] = {"a b c"};
  EXPECT_NE(error_of_json(dir, j).find("model.merges[0]"), std::string::npos);
}

TEST(Normalizers, NfcPrependReplace) {
  TempDir dir;
  const std::string e_acute = "\xC3\xA9", e_combining = "e\xCC\x81";
  const auto tok = from_json(
      dir, {{"model",
             {{"type", "BPE"}, {"vocab", {{e_acute, 0}, {"e", 1}, {"\xCC\x81", 2}, {"_", 3}}}, {"merges", nlohmann::json::array()}}},
            {"normalizer",
             {{"type", "Sequence"},
              {"normalizers",
               {{{"type", "NFC"}},
                {{"type", "Prepend"}, {"prepend", "_"}},
                {{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", "_"}}}}}}});
  EXPECT_EQ(tok->encode(e_combining, false), (Ids{3, 0}));
  EXPECT_EQ(tok->encode(e_acute + " \t" + e_combining, false), (Ids{3, 0, 3, 0}));
  EXPECT_EQ(tok->encode("", false), Ids{});  // Prepend leaves an empty text empty
}

TEST(PreTokenizers, SplitBehaviors) {
  using tok::Piece;
  using tok::SplitBehavior;
  const tok::Regex dash("-", tok::Regex::Syntax::kLiteral);
  const auto split = [&](SplitBehavior b, bool invert = false) {
    std::vector<std::string> out;
    for (const Piece& p : tok::split_piece({"the-final--countdown", true}, dash, b, invert)) out.push_back(p.text);
    return out;
  };
  using V = std::vector<std::string>;
  // Hugging Face's documented example.
  EXPECT_EQ(split(SplitBehavior::kRemoved), (V{"the", "final", "countdown"}));
  EXPECT_EQ(split(SplitBehavior::kIsolated), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split(SplitBehavior::kMergedWithPrevious), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split(SplitBehavior::kMergedWithNext), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split(SplitBehavior::kContiguous), (V{"the", "-", "final", "--", "countdown"}));
  EXPECT_EQ(split(SplitBehavior::kRemoved, /*invert=*/true), (V{"-", "-", "-"}));
  // Llama-3's regex: lookahead, Unicode classes, case-insensitive contractions, 1-3 digits.
  const tok::Regex llama3(
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      tok::Regex::Syntax::kRegex);
  std::vector<std::string> pieces;
  for (const Piece& p : tok::split_piece({"I'M 12345 héllo  !!\n\n x", true}, llama3, SplitBehavior::kIsolated, false)) {
    pieces.push_back(p.text);
  }
  EXPECT_EQ(pieces, (V{"I", "'M", " ", "123", "45", " héllo", " ", " !!\n\n", " x"}));
}

TEST(PostProcessors, TemplateRobertaSequence) {
  TempDir dir;
  nlohmann::json j = {{"model", char_model()},
                      {"added_tokens", {added(14, "<s>", {{"special", true}}), added(15, "</s>", {{"special", true}})}}};
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"trim_offsets", false}},
        {{"type", "TemplateProcessing"},
         {"single",
          {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
           {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
         {"pair", nlohmann::json::array()},
         {"special_tokens",
          {{"<s>", {{"id", "<s>"}, {"ids", {14}}, {"tokens", {"<s>"}}}},
           {"</s>", {{"id", "</s>"}, {"ids", {15}}, {"tokens", {"</s>"}}}}}}}}}};
  auto tok = from_json(dir, j);
  EXPECT_EQ(tok->encode("ab", true), (Ids{14, 1, 2, 15}));
  EXPECT_EQ(tok->encode("ab", false), (Ids{1, 2}));
  EXPECT_EQ(tok->bos_id(), 14);
  EXPECT_EQ(tok->eos_id(), 15);
  EXPECT_TRUE(tok->decides_special_tokens());
  j["post_processor"] = {{"type", "RobertaProcessing"}, {"cls", {"<s>", 14}}, {"sep", {"</s>", 15}}};
  EXPECT_EQ(from_json(dir, j)->encode("ab", true), (Ids{14, 1, 2, 15}));
  j["post_processor"] = {{"type", "RobertaProcessing"}, {"cls", {"<s>", 3}}, {"sep", {"</s>", 15}}};
  EXPECT_NE(error_of_json(dir, j).find("post_processor.cls"), std::string::npos);
}

// What a GGUF "llama" vocabulary becomes: SentencePiece scores with byte fallback, built in
// code from the same stages as tokenizer.json's.
TEST(Pipeline, SentencePieceScoresBuiltInCode) {
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", "<0xC3>", "<0xA9>", "▁", "a", "b", "▁a", "ab", "▁ab"};
  std::vector<float> scores = {0, 0, 0, 0, 0, -1, -2, -3, -4, -5, -6};
  tok::ScoreModelOptions options;
  options.byte_ids.fill(-1);
  options.byte_ids[0xC3] = 3;
  options.byte_ids[0xA9] = 4;
  options.unk_id = 0;
  tok::PipelineParts parts;
  std::vector<std::unique_ptr<tok::Normalizer>> normalizers;
  normalizers.push_back(std::make_unique<tok::PrependNormalizer>("▁"));
  normalizers.push_back(std::make_unique<tok::ReplaceNormalizer>(tok::Regex(" ", tok::Regex::Syntax::kLiteral), "▁"));
  parts.normalizer = std::make_unique<tok::SequenceNormalizer>(std::move(normalizers));
  parts.model = std::make_unique<tok::ScoreModel>(std::move(pieces), std::move(scores), options);
  parts.added_tokens = {{.id = 1, .content = "<s>", .special = true}, {.id = 2, .content = "</s>", .special = true}};
  parts.post_processor =
      std::make_unique<tok::TemplateProcessor>(std::vector<tok::TemplateProcessor::Item>{{false, {1}}, {true, {}}});
  std::vector<std::unique_ptr<tok::Decoder>> decoders;
  decoders.push_back(std::make_unique<tok::ReplaceDecoder>(tok::Regex("▁", tok::Regex::Syntax::kLiteral), " "));
  decoders.push_back(std::make_unique<tok::ByteFallbackDecoder>());
  decoders.push_back(std::make_unique<tok::FuseDecoder>());
  decoders.push_back(std::make_unique<tok::StripDecoder>(" ", 1, 0));
  parts.decoder = std::make_unique<tok::SequenceDecoder>(std::move(decoders));
  const auto tok = tok::make_tokenizer(std::move(parts), {}, "test");
  // "▁ab": ▁a (-4) merges before ab (-5), then ▁a + b makes ▁ab.
  EXPECT_EQ(tok->encode("ab", true), (Ids{1, 10}));
  EXPECT_EQ(tok->encode("a é", false), (Ids{8, 5, 3, 4}));  // é by its bytes
  EXPECT_EQ(tok->encode("ü", false), (Ids{5, 0}));          // no bytes for it: unk
  EXPECT_EQ(tok->decode(Ids{1, 8, 5, 3, 4}), "a é");
  EXPECT_EQ(tok->vocab_size(), 11);
}

TEST(HfTokenizer, UnknownStagesAndOptionsNameTheField) {
  TempDir dir;
  const std::string path = (dir / "tokenizer.json").string();
  const nlohmann::json base = {{"model", char_model()}};
  const auto expect_error = [&](const char* key, const nlohmann::json& value, const std::string& field) {
    nlohmann::json j = base;
    j[key] = value;
    const std::string message = error_of_json(dir, j);
    EXPECT_TRUE(message.starts_with(path + ": " + field)) << message;
  };
  expect_error("normalizer", {{"type", "Lowercase"}}, "normalizer.type");
  expect_error("normalizer", {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Strip"}}}}},
               "normalizer.normalizers[1].type");
  expect_error("pre_tokenizer", {{"type", "Whitespace"}}, "pre_tokenizer.type");
  expect_error("pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"shiny", true}},
               "pre_tokenizer.shiny");
  expect_error("pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "("}}}, {"behavior", "Isolated"}, {"invert", false}},
               "pre_tokenizer.pattern.Regex");
  expect_error("pre_tokenizer", {{"type", "Split"}, {"pattern", {{"String", "x"}}}, {"behavior", "Weird"}, {"invert", false}},
               "pre_tokenizer.behavior");
  expect_error("decoder", {{"type", "WordPiece"}}, "decoder.type");
  expect_error("post_processor", {{"type", "BertProcessing"}}, "post_processor.type");
  expect_error("truncation", {{"max_length", 512}}, "truncation");
  nlohmann::json j = base;
  j["model"]["dropout"] = 0.1;
  EXPECT_TRUE(error_of_json(dir, j).starts_with(path + ": model.dropout")) << error_of_json(dir, j);
  j = base;
  j["model"]["continuing_subword_prefix"] = "##";
  EXPECT_TRUE(error_of_json(dir, j).starts_with(path + ": model.continuing_subword_prefix"));
  j = base;
  j["added_tokens"] = {added(5, "c")};  // "c" is 3 in the model
  EXPECT_TRUE(error_of_json(dir, j).starts_with(path + ": added_tokens[0].id"));
  j["added_tokens"] = {added(20, "<x>")};  // Hugging Face would make it 14, after the model's 14 tokens
  EXPECT_TRUE(error_of_json(dir, j).starts_with(path + ": added_tokens[0].id")) << error_of_json(dir, j);
}

// ---- llama2.c ----

constexpr std::int32_t kTok512Vocab = 512;

const Tokenizer& tok512() {
  static const std::unique_ptr<Tokenizer> tok = load_llama2c_tokenizer_file(kTok512, kTok512Vocab);
  return *tok;
}

// Straight port of llama2.c run.c's encode(): linear vocab search, O(n^2) merge loop.
class Llama2cReference {
 public:
  explicit Llama2cReference(const std::string& path) {
    const std::string data = read_file(path);
    std::size_t pos = 4;  // skip max_token_length
    for (int i = 0; i < kTok512Vocab; ++i) {
      float score = 0;
      std::int32_t len = 0;
      std::memcpy(&score, data.data() + pos, 4);
      std::memcpy(&len, data.data() + pos + 4, 4);
      vocab.push_back(data.substr(pos + 8, static_cast<std::size_t>(len)));
      scores.push_back(score);
      pos += 8 + static_cast<std::size_t>(len);
    }
  }

  std::int32_t lookup(const std::string& s) const {
    for (std::size_t i = 0; i < vocab.size(); ++i) {
      if (vocab[i] == s) return static_cast<std::int32_t>(i);
    }
    return -1;
  }

  Ids encode(const std::string& text, bool bos) const {
    Ids tokens;
    if (bos) tokens.push_back(1);
    if (!text.empty()) tokens.push_back(lookup(" "));
    std::string buf;
    for (std::size_t i = 0; i < text.size(); ++i) {
      if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) buf.clear();
      buf += text[i];
      if (i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80 && buf.size() < 4) continue;
      const std::int32_t id = lookup(buf);
      if (id != -1) {
        tokens.push_back(id);
      } else {
        for (const char c : buf) tokens.push_back(static_cast<unsigned char>(c) + 3);
      }
      buf.clear();
    }
    while (true) {
      float best_score = -1e10f;
      std::int32_t best_id = -1;
      std::size_t best_idx = 0;
      for (std::size_t i = 0; i + 1 < tokens.size(); ++i) {
        const std::int32_t id =
            lookup(vocab[static_cast<std::size_t>(tokens[i])] + vocab[static_cast<std::size_t>(tokens[i + 1])]);
        if (id != -1 && scores[static_cast<std::size_t>(id)] > best_score) {
          best_score = scores[static_cast<std::size_t>(id)];
          best_id = id;
          best_idx = i;
        }
      }
      if (best_id == -1) break;
      tokens[best_idx] = best_id;
      tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(best_idx) + 1);
    }
    return tokens;
  }

  std::vector<std::string> vocab;
  std::vector<float> scores;
};

// clang-format off
const std::vector<std::string> kLlamaPieces = {
    "Once", "upon", "a", "time", "there", "was", "little", "girl", "named", "Lily", "She", "loved", "play", "the",
    "outside", "friends", "together", "wanted", "everyone", "garden", "ball", "tree", "went", "park", "with", "and",
    "xyzzy", "Tim", "dog", "happy", "said", "q", "ZZ", "0", "123",
    " ", " ", " ", "  ", "\n", "\n\n", ".", ",", "!", "?", "\"", "'", "-", ":", ";", "(", ")",
    "é", "ñ", "ü", "à", "café", "ß", "Ω", "中", "😀", "🐶", "👍🏽"};
// clang-format on

TEST(Llama2cTokenizer, MatchesRunCReference) {
  const Llama2cReference ref(kTok512);
  const Tokenizer& tok = tok512();
  constexpr unsigned kSeed = 1234;
  std::mt19937 rng(kSeed);
  for (int i = 0; i < 300; ++i) {
    const std::string s = random_text(rng, kLlamaPieces, 12);
    const bool bos = i % 2 == 0;
    ASSERT_EQ(tok.encode(s, bos), ref.encode(s, bos)) << "seed " << kSeed << ", string #" << i << ": " << escaped(s);
  }
  const std::string story = "Once upon a time, there was a little girl named Lily. She loved to play outside.";
  EXPECT_EQ(tok.encode(story, true), ref.encode(story, true));
}

TEST(Llama2cTokenizer, RandomTextRoundTrips) {
  const Tokenizer& tok = tok512();
  constexpr unsigned kSeed = 99;
  std::mt19937 rng(kSeed);
  for (int i = 0; i < 300; ++i) {
    const std::string s = random_text(rng, kLlamaPieces, 16);
    const Ids ids = tok.encode(s, true);
    ASSERT_EQ(tok.decode(ids), s) << "seed " << kSeed << ", string #" << i << ": " << escaped(s);
  }
}

TEST(Llama2cTokenizer, OnceUponATime) {
  const Tokenizer& tok = tok512();
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  const Ids ids = tok.encode("Once upon a time", true);
  EXPECT_EQ(ids, (Ids{1, 403, 407, 261, 378}));
  EXPECT_EQ(tok.decode(ids), "Once upon a time");
  EXPECT_EQ(tok.encode("", true), (Ids{1}));
  EXPECT_EQ(tok.encode("", false), Ids{});
}

TEST(Llama2cTokenizer, ByteFallback) {
  const Llama2cReference ref(kTok512);
  const std::string emoji = "\xF0\x9F\x98\x80";  // U+1F600, not in the 512-token vocab
  ASSERT_EQ(ref.lookup(emoji), -1);
  const Tokenizer& tok = tok512();
  EXPECT_EQ(tok.encode(emoji, false), (Ids{ref.lookup(" "), 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80}));
  EXPECT_EQ(tok.decode(tok.encode(emoji, true)), emoji);
}

TEST(Llama2cTokenizer, DecodeStripsSpaceAfterBosAndSpecialsPrintNothing) {
  const Llama2cReference ref(kTok512);
  const Tokenizer& tok = tok512();
  const std::int32_t once = ref.lookup(" Once");
  ASSERT_NE(once, -1);
  EXPECT_EQ(tok.decode(Ids{1, once}), "Once");
  EXPECT_EQ(tok.decode(Ids{once}), " Once");
  EXPECT_EQ(tok.decode(Ids{once, 2, 1, once, 0}), " OnceOnce");
  // A space byte token after BOS is not a leading-space piece, as in run.c.
  EXPECT_EQ(tok.decode(Ids{1, 3 + ' ', once}), "  Once");
  EXPECT_THROW(tok.decode(Ids{512}), std::runtime_error);
}

TEST(Llama2cTokenizer, TruncatedOrMalformedData) {
  const std::string data = read_file(kTok512);
  const auto load = [](std::string_view bytes, std::int32_t vocab) {
    return [bytes, vocab] { load_llama2c_tokenizer(std::as_bytes(std::span(bytes)), vocab, "tok512.bin"); };
  };
  std::string message = error_of(load(std::string_view(data).substr(0, 100), kTok512Vocab));
  EXPECT_TRUE(message.starts_with("tok512.bin: truncated")) << message;
  EXPECT_NE(message.find("of 512"), std::string::npos) << message;

  message = error_of(load(std::string_view(data).substr(0, 2), kTok512Vocab));
  EXPECT_TRUE(message.starts_with("tok512.bin: truncated at max_token_length")) << message;
  // The file holds 512 tokens; asking for more runs off its end.
  message = error_of(load(data, 1000));
  EXPECT_NE(message.find("tok512.bin: truncated at token 512 of 1000"), std::string::npos) << message;

  std::string bad = data;
  const std::int32_t negative = -5;
  std::memcpy(bad.data() + 4 + 4, &negative, 4);  // length of token 0
  message = error_of(load(bad, kTok512Vocab));
  EXPECT_NE(message.find("tok512.bin: negative length"), std::string::npos) << message;

  message = error_of(load(data, 100));
  EXPECT_TRUE(message.starts_with("tok512.bin")) << message;

  message = error_of([] { load_llama2c_tokenizer_file("/nonexistent/tok.bin", kTok512Vocab); });
  EXPECT_NE(message.find("/nonexistent/tok.bin"), std::string::npos) << message;
}

// ---- malformed GPT-2 / Hugging Face files ----

TEST(BpeTokenizer, MalformedFilesNameThePath) {
  TempDir dir;
  const std::string merges = kGpt2Dir + "/merges.txt";
  const std::string vocab = (dir / "vocab.json").string();

  write_file(vocab, "{\"a\": 0, ");
  std::string message = error_of([&] { load_gpt2_tokenizer(vocab, merges); });
  EXPECT_TRUE(message.starts_with(vocab)) << message;

  write_file(vocab, "{\"a\": \"zero\"}");
  message = error_of([&] { load_gpt2_tokenizer(vocab, merges); });
  EXPECT_TRUE(message.starts_with(vocab)) << message;

  write_file(vocab, "{\"a\": 0, \"b\": 1, \"ab\": 2}");
  const std::string bad_merges = (dir / "merges.txt").string();
  write_file(bad_merges, "#version: 0.2\na b\nab\n");
  message = error_of([&] { load_gpt2_tokenizer(vocab, bad_merges); });
  EXPECT_TRUE(message.starts_with(bad_merges + ": line 3")) << message;
  write_file(bad_merges, "a c\n");
  message = error_of([&] { load_gpt2_tokenizer(vocab, bad_merges); });
  EXPECT_TRUE(message.starts_with(bad_merges + ": line 1")) << message;

  message = error_of([&] { load_gpt2_tokenizer((dir / "missing.json").string(), merges); });
  EXPECT_NE(message.find("missing.json"), std::string::npos) << message;

  const std::string tj = (dir / "tokenizer.json").string();
  const auto hf_error = [&](const std::string& text) {
    write_file(tj, text);
    return error_of([&] { load_hf_tokenizer(tj); });
  };
  message = hf_error("{\"model\": ");
  EXPECT_TRUE(message.starts_with(tj)) << message;
  message = hf_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}}})");
  EXPECT_TRUE(message.starts_with(tj)) << message;
  EXPECT_NE(message.find("model.merges"), std::string::npos) << message;
  message = hf_error(R"({"model": {"type": "Unigram", "vocab": {}, "merges": []}})");
  EXPECT_NE(message.find("model.type"), std::string::npos) << message;
  message = hf_error(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [["a", "b"]]}})");
  EXPECT_NE(message.find("model.merges[0]"), std::string::npos) << message;
  message = hf_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [7]}})");
  EXPECT_NE(message.find("model.merges[0]"), std::string::npos) << message;
  message = hf_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "added_tokens": [{"id": 1}]})");
  EXPECT_NE(message.find("added_tokens[0].content"), std::string::npos) << message;
  message = hf_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "byte_fallback": "yes"}})");
  EXPECT_TRUE(message.starts_with(tj)) << message;
}

}  // namespace
}  // namespace flexh2o::engine
