// GGUF's tokenizer.ggml.* values -> pipeline stages (see gguf_tokenizer.h).
#include "engine/tokenizer/gguf_tokenizer.h"

#include <algorithm>
#include <array>
#include <limits>
#include <stdexcept>

#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/decoders.h"
#include "engine/tokenizer/json_fields.h"
#include "engine/tokenizer/normalizers.h"
#include "engine/tokenizer/pipeline.h"
#include "engine/tokenizer/post_processors.h"
#include "engine/tokenizer/pre_tokenizers.h"
#include "engine/tokenizer/score_model.h"

namespace flexh2o::engine {
namespace {

using namespace tok;

// llama.cpp's token types (llama_token_type).
constexpr std::int64_t kTypeUnknown = 2;
constexpr std::int64_t kTypeControl = 3;
constexpr std::int64_t kTypeUserDefined = 4;

// The pre-tokenizer regexes of llama.cpp's src/llama-vocab.cpp (llm_tokenizer_bpe), applied
// one after the other, each splitting the pieces of the one before and keeping both matches and
// the text between them. Where llama.cpp rewrote a tokenizer.json regex for std::regex (the
// \p{Lu}... classes of GPT-4o and Tekken), the original is used: PCRE2 has those classes.
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen35 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kTekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct PreFamily {
  std::vector<const char*> names;    // tokenizer.ggml.pre values
  std::vector<const char*> regexes;  // applied in order
  bool ignore_merges = false;        // a piece that is a token stays whole (llama.cpp sets it with the family)
  bool add_bos = false;              // llama.cpp's default when tokenizer.ggml.add_bos_token is absent
};

const std::vector<PreFamily>& pre_families() {
  static const std::vector<PreFamily> families = {
      {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"},
       {kLlama3},
       true,
       true},
      {{"dbrx", "smaug-bpe"}, {kLlama3}},
      {{"deepseek-coder"},
       {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", R"([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)",
        R"(\p{N})"}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"},
       {R"(\p{N})", kGpt2}},
      {{"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
        "modern-bert", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4"},
       {kGpt2}},
      {{"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"}, {kQwen2}},
      {{"qwen35"}, {kQwen35}},
      {{"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"}, {kGpt4o}},
      {{"tekken"}, {kTekken}, true, true},
  };
  return families;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte a SentencePiece byte token "<0xHH>" stands for.
std::optional<unsigned char> byte_token(const std::string& t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return std::nullopt;
  const int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<unsigned char>(hi * 16 + lo);
}

class Builder {
 public:
  Builder(const GgufTokenizerSpec& spec, const std::string& source) : s_(spec), source_(source) {}

  std::unique_ptr<Tokenizer> build() {
    check_lengths();
    PipelineParts parts;
    bool add_bos = false;
    if (s_.model == "gpt2") {
      add_bos = build_byte_level(parts);
    } else if (s_.model == "llama") {
      add_bos = true;  // llama.cpp's default for a SentencePiece vocabulary
      build_sentencepiece(parts);
    } else {
      fail("model", "= \"" + s_.model + "\" is not supported (supported: gpt2, llama)");
    }
    parts.added_tokens = added_tokens();

    TokenizerOptions options;
    options.bos_id = checked_id("bos_token_id", s_.bos_id);
    options.eos_id = checked_id("eos_token_id", s_.eos_id);
    add_bos = s_.add_bos.value_or(add_bos);
    const bool add_eos = s_.add_eos.value_or(false);
    if (add_bos && !options.bos_id) {
      if (s_.add_bos) fail("add_bos_token", "is true, but tokenizer.ggml.bos_token_id is not set");
      fail("bos_token_id", "is missing, and a \"" + s_.model + "\" tokenizer" +
                               (s_.model == "gpt2" ? " with pre \"" + s_.pre.value_or("default") + "\"" : "") +
                               " starts every text with BOS (llama.cpp's default without tokenizer.ggml.add_bos_token)");
    }
    if (add_eos && !options.eos_id) fail("add_eos_token", "is true, but tokenizer.ggml.eos_token_id is not set");
    std::vector<TemplateProcessor::Item> single;
    if (add_bos) single.push_back({false, {*options.bos_id}});
    single.push_back({true, {}});
    if (add_eos) single.push_back({false, {*options.eos_id}});
    parts.post_processor = std::make_unique<TemplateProcessor>(std::move(single));
    // The file says whether BOS goes first (add_bos_token or its model's default).
    options.decides_special_tokens = true;
    return make_tokenizer(std::move(parts), options, source_);
  }

 private:
  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw std::runtime_error(source_ + ": metadata key 'tokenizer.ggml." + field + "' " + what);
  }

  void check_lengths() const {
    if (s_.tokens.empty()) fail("tokens", "is missing or empty");
    if (static_cast<std::int64_t>(s_.tokens.size()) >= kMaxVocabSize) {
      fail("tokens", "has " + std::to_string(s_.tokens.size()) + " entries, more than any vocabulary (" +
                         std::to_string(kMaxVocabSize) + ")");
    }
    const auto same_length = [&](const char* field, std::size_t n) {
      if (n != s_.tokens.size()) {
        fail(field, "has " + std::to_string(n) + " entries, but tokenizer.ggml.tokens has " +
                        std::to_string(s_.tokens.size()));
      }
    };
    if (s_.scores) same_length("scores", s_.scores->size());
    if (s_.token_types) same_length("token_type", s_.token_types->size());
  }

  std::optional<std::int32_t> checked_id(const char* field, std::optional<std::uint64_t> id) const {
    if (!id) return std::nullopt;
    if (*id >= s_.tokens.size()) {
      fail(field, "= " + std::to_string(*id) + " is outside the " + std::to_string(s_.tokens.size()) + " tokens");
    }
    return static_cast<std::int32_t>(*id);
  }

  std::vector<AddedToken> added_tokens() const {
    std::vector<AddedToken> added;
    if (!s_.token_types) return added;
    for (std::size_t id = 0; id < s_.tokens.size(); ++id) {
      const std::int64_t type = (*s_.token_types)[id];
      if (s_.tokens[id].empty()) continue;  // matches nothing
      if (type == kTypeControl || type == kTypeUnknown || type == kTypeUserDefined) {
        // llama.cpp and transformers cut these out of the raw text before anything else runs.
        added.push_back({.id = static_cast<std::int32_t>(id),
                         .content = s_.tokens[id],
                         .special = type != kTypeUserDefined,
                         .normalized = false});
      }
    }
    return added;
  }

  Vocab vocab() const {
    std::vector<std::pair<std::string, std::int32_t>> entries;
    entries.reserve(s_.tokens.size());
    for (std::size_t id = 0; id < s_.tokens.size(); ++id) entries.emplace_back(s_.tokens[id], static_cast<std::int32_t>(id));
    return Vocab(std::move(entries));
  }

  // Returns llama.cpp's add_bos default of the pre-tokenizer family.
  bool build_byte_level(PipelineParts& parts) const {
    if (!s_.merges) fail("merges", "is missing (a gpt2 tokenizer needs its merges)");
    // llama.cpp falls back to "default" for files written before the key existed.
    const std::string pre = s_.pre.value_or("default");
    const auto& families = pre_families();
    const auto family = std::ranges::find_if(families, [&](const PreFamily& f) {
      return std::ranges::find(f.names, pre) != f.names.end();
    });
    if (family == families.end()) {
      std::string known;
      for (const std::string& name : gguf_pre_tokenizer_names()) known += (known.empty() ? "" : ", ") + name;
      fail("pre", "= \"" + pre + "\" is not a pre-tokenizer flexh2o implements (known: " + known + ")");
    }
    std::vector<std::unique_ptr<PreTokenizer>> stages;
    for (const char* pattern : family->regexes) {
      stages.push_back(std::make_unique<SplitPreTokenizer>(Regex(pattern, Regex::Syntax::kRegex),
                                                           SplitBehavior::kIsolated, /*invert=*/false));
    }
    stages.push_back(std::make_unique<ByteLevelPreTokenizer>(/*add_prefix_space=*/false, /*use_regex=*/false));
    parts.pre_tokenizer = std::make_unique<SequencePreTokenizer>(std::move(stages));

    Vocab v = vocab();
    std::vector<MergeRule> rules;
    rules.reserve(s_.merges->size());
    for (std::size_t i = 0; i < s_.merges->size(); ++i) {
      const std::string& line = (*s_.merges)[i];
      const std::string field = "merges";
      const auto at = [&] { return "entry " + std::to_string(i) + " (\"" + line + "\")"; };
      const auto pair = split_merge(line);
      if (!pair) fail(field, at() + ": " + bad_merge(line));
      try {
        rules.push_back(resolve_merge(v, pair->first, pair->second));
      } catch (const std::runtime_error& e) {
        fail(field, at() + ": " + e.what());
      }
    }
    BpeOptions options;
    options.ignore_merges = family->ignore_merges;
    parts.model = std::make_unique<BpeModel>(std::move(v), rules, options);
    parts.decoder = std::make_unique<ByteLevelDecoder>();
    return family->add_bos;
  }

  void build_sentencepiece(PipelineParts& parts) const {
    if (!s_.scores) fail("scores", "is missing (a llama tokenizer merges by score)");
    ScoreModelOptions options;
    options.byte_ids.fill(-1);
    for (std::size_t id = 0; id < s_.tokens.size(); ++id) {
      const std::optional<unsigned char> byte = byte_token(s_.tokens[id]);
      if (byte && options.byte_ids[*byte] < 0) options.byte_ids[*byte] = static_cast<std::int32_t>(id);
    }
    options.unk_id = checked_id("unknown_token_id", s_.unk_id);
    // llama.cpp merges into any token by its score; only -inf (and NaN) never merge.
    options.min_score = -std::numeric_limits<float>::infinity();
    std::vector<float> scores(s_.scores->begin(), s_.scores->end());
    parts.model = std::make_unique<ScoreModel>(s_.tokens, std::move(scores), options);

    const std::string space = "\u2581";
    const bool prefix = s_.add_space_prefix.value_or(true);
    if (s_.architecture == "phi3") {
      // As transformers builds Phi-3's: "▁" prepended by a normalizer, so "  hi" -> "▁▁▁hi".
      std::vector<std::unique_ptr<Normalizer>> steps;
      if (prefix) steps.push_back(std::make_unique<PrependNormalizer>(space));
      steps.push_back(std::make_unique<ReplaceNormalizer>(Regex(" ", Regex::Syntax::kLiteral), space));
      parts.normalizer = std::make_unique<SequenceNormalizer>(std::move(steps));
    } else {
      parts.pre_tokenizer = std::make_unique<MetaspacePreTokenizer>(
          space, prefix ? PrependScheme::kFirst : PrependScheme::kNever, /*split=*/false);
    }
    std::vector<std::unique_ptr<Decoder>> decoders;
    decoders.push_back(std::make_unique<ReplaceDecoder>(Regex(space, Regex::Syntax::kLiteral), " "));
    decoders.push_back(std::make_unique<ByteFallbackDecoder>());
    decoders.push_back(std::make_unique<FuseDecoder>());
    if (prefix) decoders.push_back(std::make_unique<StripDecoder>(" ", 1, 0));
    parts.decoder = std::make_unique<SequenceDecoder>(std::move(decoders));
  }

  const GgufTokenizerSpec& s_;
  const std::string& source_;
};

}  // namespace

std::vector<std::string> gguf_pre_tokenizer_names() {
  std::vector<std::string> names;
  for (const PreFamily& f : pre_families()) names.insert(names.end(), f.names.begin(), f.names.end());
  return names;
}

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const GgufTokenizerSpec& spec, const std::string& source) {
  return Builder(spec, source).build();
}

}  // namespace flexh2o::engine
