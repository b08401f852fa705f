// Hugging Face tokenizer.json -> pipeline stages. Every stage type and option is either
// implemented or an error naming the file and the field.
#include <algorithm>
#include <map>
#include <stdexcept>

#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/decoders.h"
#include "engine/tokenizer/json_fields.h"
#include "engine/tokenizer/normalizers.h"
#include "engine/tokenizer/pipeline.h"
#include "engine/tokenizer/post_processors.h"
#include "engine/tokenizer/pre_tokenizers.h"

namespace flexh2o::engine {
namespace {

using nlohmann::json;
using namespace tok;

class Parser {
 public:
  explicit Parser(std::string path) : path_(std::move(path)) {}

  PipelineParts parse(const json& root) {
    expect_object(root, "");
    only_keys(root, "",
              {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "post_processor",
               "decoder", "model"});
    if (const auto it = root.find("version"); it != root.end() && *it != "1.0") {
      fail(path_, "version: only \"1.0\" is known, got " + it->dump());
    }
    // They change what encode returns (cut or padded ids); flexh2o encodes whole texts.
    if (const auto it = root.find("truncation"); it != root.end() && !it->is_null()) {
      fail(path_, "truncation: not supported (flexh2o encodes whole texts); set it to null");
    }
    if (const auto it = root.find("padding"); it != root.end() && !it->is_null()) {
      fail(path_, "padding: not supported (flexh2o encodes one text at a time, unpadded); set it to null");
    }
    PipelineParts parts;
    parts.model = parse_model(field(root, "model", path_, ""), "model");
    parts.added_tokens = parse_added_tokens(root);
    for (const AddedToken& t : parts.added_tokens) token_ids_[t.content] = t.id;
    parts.normalizer = parse_normalizer(optional(root, "normalizer"), "normalizer");
    parts.pre_tokenizer = parse_pre_tokenizer(optional(root, "pre_tokenizer"), "pre_tokenizer");
    parts.post_processor = parse_post_processor(optional(root, "post_processor"), "post_processor");
    parts.decoder = parse_decoder(optional(root, "decoder"), "decoder");
    return parts;
  }

 private:
  static json optional(const json& object, const char* name) {
    const auto it = object.find(name);
    return it == object.end() ? json() : *it;
  }

  [[noreturn]] void unsupported(const std::string& where, const json& value, const std::string& supported) const {
    fail(path_, where + ": " + json_excerpt(value) + " is not supported (supported: " + supported + ")");
  }

  void expect_object(const json& j, const std::string& where) const {
    if (!j.is_object()) fail(path_, (where.empty() ? "" : where + ": ") + "expected an object, got " + json_excerpt(j));
  }

  // Every key must be one the stage knows: an option flexh2o would ignore could change the ids.
  void only_keys(const json& object, const std::string& where, std::initializer_list<const char*> known) const {
    // Not a structured binding: clang 14 cannot capture one in the lambda.
    for (const auto& item : object.items()) {
      const std::string& key = item.key();
      if (std::none_of(known.begin(), known.end(), [&](const char* k) { return key == k; })) {
        fail(path_, prefix(where) + key + ": unknown option of this stage (value " + json_excerpt(item.value()) + ")");
      }
    }
  }

  static std::string prefix(const std::string& where) { return where.empty() ? "" : where + "."; }

  std::string string_field(const json& object, const char* name, const std::string& where) const {
    const json& value = field(object, name, path_, prefix(where));
    if (!value.is_string()) fail(path_, prefix(where) + name + ": expected a string, got " + json_excerpt(value));
    return value.get<std::string>();
  }

  bool bool_field(const json& object, const char* name, const std::string& where, bool default_value) const {
    const auto it = object.find(name);
    if (it == object.end() || it->is_null()) return default_value;
    if (!it->is_boolean()) fail(path_, prefix(where) + name + ": expected true or false, got " + it->dump());
    return it->get<bool>();
  }

  std::size_t count_field(const json& object, const char* name, const std::string& where) const {
    const json& value = field(object, name, path_, prefix(where));
    if (!value.is_number_unsigned()) {
      fail(path_, prefix(where) + name + ": expected a non-negative integer, got " + json_excerpt(value));
    }
    return value.get<std::size_t>();
  }

  const json& array_field(const json& object, const char* name, const std::string& where) const {
    const json& value = field(object, name, path_, prefix(where));
    if (!value.is_array()) fail(path_, prefix(where) + name + ": expected an array, got " + json_excerpt(value));
    return value;
  }

  std::string type_of(const json& stage, const std::string& where) const {
    expect_object(stage, where);
    return string_field(stage, "type", where);
  }

  // {"String": "literal"} or {"Regex": "pattern"}.
  Regex parse_pattern(const json& stage, const std::string& where) const {
    const json& pattern = field(stage, "pattern", path_, prefix(where));
    const std::string at = prefix(where) + "pattern";
    expect_object(pattern, at);
    if (pattern.size() == 1 && pattern.contains("String") && pattern["String"].is_string()) {
      return Regex(pattern["String"].get<std::string>(), Regex::Syntax::kLiteral);
    }
    if (pattern.size() == 1 && pattern.contains("Regex") && pattern["Regex"].is_string()) {
      try {
        return Regex(pattern["Regex"].get<std::string>(), Regex::Syntax::kRegex);
      } catch (const std::runtime_error& e) {
        fail(path_, at + ".Regex: " + e.what());
      }
    }
    unsupported(at, pattern, "{\"String\": ...}, {\"Regex\": ...}");
  }

  // One Unicode character, as Hugging Face's char fields.
  std::string char_field(const json& object, const char* name, const std::string& where) const {
    std::string value = string_field(object, name, where);
    if (value.empty() || value.size() > 4 ||
        std::any_of(value.begin() + 1, value.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; })) {
      fail(path_, prefix(where) + name + ": expected one character, got \"" + value + "\"");
    }
    return value;
  }

  std::vector<AddedToken> parse_added_tokens(const json& root) const {
    std::vector<AddedToken> tokens;
    const json list = optional(root, "added_tokens");
    if (list.is_null()) return tokens;
    if (!list.is_array()) fail(path_, "added_tokens: expected an array");
    std::map<std::string, std::int64_t> assigned;
    std::int64_t next_id = vocab_count_;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string where = "added_tokens[" + std::to_string(i) + "]";
      const json& t = list[i];
      expect_object(t, where);
      only_keys(t, where, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
      AddedToken token;
      token.id = parse_id(field(t, "id", path_, where + "."), path_, where + ".id");
      token.content = string_field(t, "content", where);
      if (token.content.empty()) fail(path_, where + ".content: expected a non-empty string");
      token.special = bool_field(t, "special", where, false);
      // Hugging Face's default: special tokens match the raw text, others the normalized text.
      token.normalized = bool_field(t, "normalized", where, !token.special);
      token.lstrip = bool_field(t, "lstrip", where, false);
      token.rstrip = bool_field(t, "rstrip", where, false);
      token.single_word = bool_field(t, "single_word", where, false);
      // Hugging Face does not read these ids: a content the model has takes the model's id,
      // a new one the next id after the model's tokens. A file that says otherwise would
      // encode differently there.
      std::int64_t expected = 0;
      if (const auto model_id = vocab_ids_->token_to_id(token.content)) {
        expected = *model_id;
      } else if (const auto it = assigned.find(token.content); it != assigned.end()) {
        expected = it->second;
      } else {
        expected = next_id++;
        assigned.emplace(token.content, expected);
      }
      if (expected != token.id) {
        fail(path_, where + ".id: " + std::to_string(token.id) + ", but Hugging Face tokenizers gives \"" +
                        token.content + "\" id " + std::to_string(expected) +
                        " (its id in model.vocab, or the next after the model's " + std::to_string(vocab_count_) +
                        " tokens)");
      }
      tokens.push_back(std::move(token));
    }
    return tokens;
  }

  std::unique_ptr<Model> parse_model(const json& j, const std::string& where) {
    const std::string type = type_of(j, where);
    if (type != "BPE") unsupported(where + ".type", type, "\"BPE\"");
    only_keys(j, where,
              {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
               "byte_fallback", "ignore_merges", "vocab", "merges"});
    if (const json dropout = optional(j, "dropout"); !dropout.is_null() && dropout != 0) {
      fail(path_, where + ".dropout: " + json_excerpt(dropout) +
                      " is not supported (BPE dropout randomizes the ids; it must be null)");
    }
    for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const json value = optional(j, affix);
      if (!value.is_null() && value != "") {
        fail(path_, where + "." + affix + ": " + json_excerpt(value) + " is not supported (only null or \"\")");
      }
    }
    BpeOptions options;
    options.byte_fallback = bool_field(j, "byte_fallback", where, false);
    options.fuse_unk = bool_field(j, "fuse_unk", where, false);
    options.ignore_merges = bool_field(j, "ignore_merges", where, false);
    if (const json unk = optional(j, "unk_token"); !unk.is_null()) {
      if (!unk.is_string()) fail(path_, where + ".unk_token: expected a string or null, got " + json_excerpt(unk));
      options.unk_token = unk.get<std::string>();
    }
    Vocab vocab = parse_vocab(field(j, "vocab", path_, where + "."), path_, where + ".vocab");
    vocab_count_ = static_cast<std::int64_t>(vocab.size());

    const json& merges = array_field(j, "merges", where);
    std::vector<MergeRule> rules;
    rules.reserve(merges.size());
    for (std::size_t i = 0; i < merges.size(); ++i) {
      // The location string only on error: files have 10^5 merges.
      const auto at = [&] { return where + ".merges[" + std::to_string(i) + "]"; };
      const json& m = merges[i];
      std::pair<std::string, std::string> pair;
      if (m.is_string()) {
        const std::string& line = m.get_ref<const std::string&>();
        auto split = split_merge(line);
        if (!split) fail(path_, at() + ": " + bad_merge(line));
        pair = std::move(*split);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        pair = {m[0].get<std::string>(), m[1].get<std::string>()};
      } else {
        fail(path_, at() + ": expected \"a b\" or [\"a\", \"b\"], got " + json_excerpt(m));
      }
      try {
        rules.push_back(resolve_merge(vocab, pair.first, pair.second));
      } catch (const std::runtime_error& e) {
        fail(path_, at() + ": " + e.what());
      }
    }
    try {
      auto model = std::make_unique<BpeModel>(std::move(vocab), rules, options);
      vocab_ids_ = model.get();
      return model;
    } catch (const std::runtime_error& e) {
      fail(path_, where + ": " + e.what());
    }
  }

  std::unique_ptr<Normalizer> parse_normalizer(const json& j, const std::string& where) const {
    if (j.is_null()) return nullptr;
    const std::string type = type_of(j, where);
    if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
      only_keys(j, where, {"type"});
      using Form = UnicodeNormalizer::Form;
      const Form form = type == "NFC" ? Form::kNfc : type == "NFD" ? Form::kNfd : type == "NFKC" ? Form::kNfkc : Form::kNfkd;
      return std::make_unique<UnicodeNormalizer>(form);
    }
    if (type == "Prepend") {
      only_keys(j, where, {"type", "prepend"});
      return std::make_unique<PrependNormalizer>(string_field(j, "prepend", where));
    }
    if (type == "Replace") {
      only_keys(j, where, {"type", "pattern", "content"});
      return std::make_unique<ReplaceNormalizer>(parse_pattern(j, where), string_field(j, "content", where));
    }
    if (type == "Sequence") {
      only_keys(j, where, {"type", "normalizers"});
      const json& list = array_field(j, "normalizers", where);
      std::vector<std::unique_ptr<Normalizer>> stages;
      for (std::size_t i = 0; i < list.size(); ++i) {
        stages.push_back(parse_normalizer(list[i], where + ".normalizers[" + std::to_string(i) + "]"));
        if (!stages.back()) fail(path_, where + ".normalizers[" + std::to_string(i) + "]: expected a normalizer");
      }
      return std::make_unique<SequenceNormalizer>(std::move(stages));
    }
    unsupported(where + ".type", type, "NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence");
  }

  PrependScheme parse_prepend_scheme(const json& j, const std::string& where) const {
    // An old file says add_prefix_space instead: true is "always", false "never".
    const auto legacy = j.find("add_prefix_space");
    if (!j.contains("prepend_scheme")) {
      return legacy != j.end() && *legacy == false ? PrependScheme::kNever : PrependScheme::kAlways;
    }
    const std::string scheme = string_field(j, "prepend_scheme", where);
    PrependScheme result = PrependScheme::kAlways;
    if (scheme == "never") {
      result = PrependScheme::kNever;
    } else if (scheme == "first") {
      result = PrependScheme::kFirst;
    } else if (scheme != "always") {
      unsupported(where + ".prepend_scheme", scheme, "first, always, never");
    }
    if (legacy != j.end() && *legacy == false && result != PrependScheme::kNever) {
      fail(path_, where + ".add_prefix_space: false contradicts prepend_scheme \"" + scheme + "\"");
    }
    return result;
  }

  std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const json& j, const std::string& where) const {
    if (j.is_null()) return nullptr;
    const std::string type = type_of(j, where);
    if (type == "Metaspace") {
      only_keys(j, where, {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"});
      return std::make_unique<MetaspacePreTokenizer>(char_field(j, "replacement", where),
                                                     parse_prepend_scheme(j, where), bool_field(j, "split", where, true));
    }
    if (type == "Split") {
      only_keys(j, where, {"type", "pattern", "behavior", "invert"});
      const std::string behavior = string_field(j, "behavior", where);
      static const std::map<std::string, SplitBehavior> kBehaviors = {
          {"Removed", SplitBehavior::kRemoved},
          {"Isolated", SplitBehavior::kIsolated},
          {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
          {"MergedWithNext", SplitBehavior::kMergedWithNext},
          {"Contiguous", SplitBehavior::kContiguous}};
      const auto it = kBehaviors.find(behavior);
      if (it == kBehaviors.end()) {
        unsupported(where + ".behavior", behavior, "Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
      }
      return std::make_unique<SplitPreTokenizer>(parse_pattern(j, where), it->second,
                                                 bool_field(j, "invert", where, false));
    }
    if (type == "ByteLevel") {
      // trim_offsets only moves offsets.
      only_keys(j, where, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
      return std::make_unique<ByteLevelPreTokenizer>(bool_field(j, "add_prefix_space", where, true),
                                                     bool_field(j, "use_regex", where, true));
    }
    if (type == "Sequence") {
      only_keys(j, where, {"type", "pretokenizers"});
      const json& list = array_field(j, "pretokenizers", where);
      std::vector<std::unique_ptr<PreTokenizer>> stages;
      for (std::size_t i = 0; i < list.size(); ++i) {
        stages.push_back(parse_pre_tokenizer(list[i], where + ".pretokenizers[" + std::to_string(i) + "]"));
        if (!stages.back()) fail(path_, where + ".pretokenizers[" + std::to_string(i) + "]: expected a pre-tokenizer");
      }
      return std::make_unique<SequencePreTokenizer>(std::move(stages));
    }
    unsupported(where + ".type", type, "Metaspace, Split, ByteLevel, Sequence");
  }

  std::int32_t token_id(const std::string& token, const std::string& where) const {
    if (const auto it = token_ids_.find(token); it != token_ids_.end()) return it->second;
    if (const auto id = vocab_ids_->token_to_id(token)) return *id;
    fail(path_, where + ": \"" + token + "\" is not a token of this file");
  }

  // ["token", id], as RobertaProcessing writes cls and sep.
  std::int32_t token_pair(const json& j, const char* name, const std::string& where) const {
    const json& pair = field(j, name, path_, prefix(where));
    const std::string at = prefix(where) + name;
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string()) {
      fail(path_, at + ": expected [\"token\", id], got " + json_excerpt(pair));
    }
    const std::int32_t id = parse_id(pair[1], path_, at + "[1]");
    if (token_id(pair[0].get<std::string>(), at) != id) {
      fail(path_, at + ": \"" + pair[0].get<std::string>() + "\" does not have id " + std::to_string(id));
    }
    return id;
  }

  std::unique_ptr<PostProcessor> parse_template(const json& j, const std::string& where) const {
    only_keys(j, where, {"type", "single", "pair", "special_tokens"});
    array_field(j, "pair", where);  // two-text encoding: not something flexh2o does
    const json& specials = field(j, "special_tokens", path_, prefix(where));
    expect_object(specials, where + ".special_tokens");
    const json& single = array_field(j, "single", where);
    std::vector<TemplateProcessor::Item> items;
    bool has_text = false;
    for (std::size_t i = 0; i < single.size(); ++i) {
      const std::string at = where + ".single[" + std::to_string(i) + "]";
      const json& item = single[i];
      if (!item.is_object() || item.size() != 1) {
        fail(path_, at + ": expected {\"SpecialToken\": ...} or {\"Sequence\": ...}, got " + json_excerpt(item));
      }
      if (const auto seq = item.find("Sequence"); seq != item.end()) {
        if (!seq->is_object() || seq->value("id", json()) != "A") {
          fail(path_, at + ".Sequence: only the text \"A\" is supported in the single template, got " + seq->dump());
        }
        items.push_back({true, {}});
        has_text = true;
        continue;
      }
      const auto special = item.find("SpecialToken");
      if (special == item.end() || !special->is_object()) {
        fail(path_, at + ": expected {\"SpecialToken\": ...} or {\"Sequence\": ...}, got " + json_excerpt(item));
      }
      const std::string name = string_field(*special, "id", at + ".SpecialToken");
      const auto def = specials.find(name);
      if (def == specials.end()) fail(path_, at + ".SpecialToken.id: \"" + name + "\" is not in special_tokens");
      const std::string def_at = where + ".special_tokens[\"" + name + "\"]";
      expect_object(*def, def_at);
      const json& ids = array_field(*def, "ids", def_at);
      TemplateProcessor::Item special_item{false, {}};
      for (std::size_t k = 0; k < ids.size(); ++k) {
        special_item.ids.push_back(parse_id(ids[k], path_, def_at + ".ids[" + std::to_string(k) + "]"));
      }
      items.push_back(std::move(special_item));
    }
    if (!has_text) fail(path_, where + ".single: has no {\"Sequence\": {\"id\": \"A\"}} for the text");
    return std::make_unique<TemplateProcessor>(std::move(items));
  }

  std::unique_ptr<PostProcessor> parse_post_processor(const json& j, const std::string& where) const {
    if (j.is_null()) return nullptr;
    const std::string type = type_of(j, where);
    if (type == "TemplateProcessing") return parse_template(j, where);
    if (type == "ByteLevel") {
      only_keys(j, where, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
      return std::make_unique<ByteLevelProcessor>();
    }
    if (type == "RobertaProcessing") {
      only_keys(j, where, {"type", "sep", "cls", "trim_offsets", "add_prefix_space"});
      return std::make_unique<RobertaProcessor>(token_pair(j, "cls", where), token_pair(j, "sep", where));
    }
    if (type == "Sequence") {
      only_keys(j, where, {"type", "processors"});
      const json& list = array_field(j, "processors", where);
      std::vector<std::unique_ptr<PostProcessor>> stages;
      for (std::size_t i = 0; i < list.size(); ++i) {
        stages.push_back(parse_post_processor(list[i], where + ".processors[" + std::to_string(i) + "]"));
        if (!stages.back()) fail(path_, where + ".processors[" + std::to_string(i) + "]: expected a post-processor");
      }
      return std::make_unique<SequenceProcessor>(std::move(stages));
    }
    unsupported(where + ".type", type, "TemplateProcessing, ByteLevel, RobertaProcessing, Sequence");
  }

  std::unique_ptr<Decoder> parse_decoder(const json& j, const std::string& where) const {
    if (j.is_null()) return nullptr;
    const std::string type = type_of(j, where);
    if (type == "ByteFallback") {
      only_keys(j, where, {"type"});
      return std::make_unique<ByteFallbackDecoder>();
    }
    if (type == "Fuse") {
      only_keys(j, where, {"type"});
      return std::make_unique<FuseDecoder>();
    }
    if (type == "Strip") {
      only_keys(j, where, {"type", "content", "start", "stop"});
      return std::make_unique<StripDecoder>(char_field(j, "content", where), count_field(j, "start", where),
                                            count_field(j, "stop", where));
    }
    if (type == "Metaspace") {
      only_keys(j, where, {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"});
      return std::make_unique<MetaspaceDecoder>(char_field(j, "replacement", where), parse_prepend_scheme(j, where));
    }
    if (type == "Replace") {
      only_keys(j, where, {"type", "pattern", "content"});
      return std::make_unique<ReplaceDecoder>(parse_pattern(j, where), string_field(j, "content", where));
    }
    if (type == "ByteLevel") {
      only_keys(j, where, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
      return std::make_unique<ByteLevelDecoder>();
    }
    if (type == "Sequence") {
      only_keys(j, where, {"type", "decoders"});
      const json& list = array_field(j, "decoders", where);
      std::vector<std::unique_ptr<Decoder>> stages;
      for (std::size_t i = 0; i < list.size(); ++i) {
        stages.push_back(parse_decoder(list[i], where + ".decoders[" + std::to_string(i) + "]"));
        if (!stages.back()) fail(path_, where + ".decoders[" + std::to_string(i) + "]: expected a decoder");
      }
      return std::make_unique<SequenceDecoder>(std::move(stages));
    }
    unsupported(where + ".type", type, "ByteFallback, Fuse, Strip, Metaspace, Replace, ByteLevel, Sequence");
  }

  std::string path_;
  const Model* vocab_ids_ = nullptr;               // the model, once parsed
  std::int64_t vocab_count_ = 0;                   // its tokens
  std::map<std::string, std::int32_t> token_ids_;  // added tokens
};

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& tokenizer_json_path) {
  Parser parser(tokenizer_json_path);
  tok::PipelineParts parts;
  try {
    parts = parser.parse(tok::read_json(tokenizer_json_path));
  } catch (const json::exception& e) {  // a field of an unexpected type
    tok::fail(tokenizer_json_path, e.what());
  }
  return tok::make_tokenizer(std::move(parts), tok::TokenizerOptions{}, tokenizer_json_path);
}

}  // namespace flexh2o::engine
