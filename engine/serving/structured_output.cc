#include "engine/serving/structured_output.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "engine/io/json_input.h"

namespace flexh2o::serving {

const std::vector<std::string> kStructuredOutputFields = {"response_format", "guided_json", "guided_regex",
                                                          "guided_choice", "guided_grammar"};

namespace {

using Json = nlohmann::ordered_json;
using Kind = grammar::Constraint::Kind;

[[noreturn]] void bad(const std::string& field, const std::string& message) {
  throw StructuredOutputError(field, message);
}

std::string text_of(const Json& v, const std::string& name, const std::string& field) {
  if (!v.is_string() || v.get<std::string>().empty()) bad(field, name + " must be a non-empty string");
  return v.get<std::string>();
}

// A schema given as an object (or true), or as its JSON text (vLLM takes both for guided_json).
std::string schema_text(const Json& v, const std::string& name, const std::string& field) {
  if (v.is_object() || v.is_boolean()) return v.dump();
  if (v.is_string()) return v.get<std::string>();
  bad(field, name + " must be a JSON schema (an object, or its text)");
}

// OpenAI's response_format: {"type": "text" | "json_object" | "json_schema", "json_schema":
// {"name", "schema", "strict", "description"}}.
std::optional<grammar::Constraint> response_format(const Json& v, const std::string& where) {
  const std::string name = where + "response_format";
  if (!v.is_object() || !v.contains("type") || !v["type"].is_string())
    bad("response_format", name + " must be an object with a string \"type\"");
  const std::string type = v["type"].get<std::string>();
  for (const auto& [key, value] : v.items())
    if (key != "type" && !(key == "json_schema" && type == "json_schema"))
      bad("response_format", name + " has a field \"" + engine::bounded_excerpt(key, 40) + "\" that " +
                                 (key == "json_schema" ? "needs type json_schema" : "is not implemented"));
  if (type == "text") return std::nullopt;
  if (type == "json_object") return grammar::Constraint{.kind = Kind::JsonObject};
  if (type != "json_schema")
    bad("response_format", name + ".type \"" + engine::bounded_excerpt(type, 40) +
                               "\" is not one of text, json_object, json_schema");
  const std::string inner = name + ".json_schema";
  if (!v.contains("json_schema") || !v["json_schema"].is_object()) bad("response_format", inner + " must be an object");
  const Json& js = v["json_schema"];
  for (const auto& [key, value] : js.items()) {
    if (key == "name" || key == "description") {
      if (!value.is_string()) bad("response_format", inner + "." + key + " must be a string");
    } else if (key == "strict") {
      if (!value.is_boolean() && !value.is_null()) bad("response_format", inner + ".strict must be true or false");
    } else if (key != "schema") {
      bad("response_format", inner + " has a field \"" + engine::bounded_excerpt(key, 40) + "\" that is not implemented");
    }
  }
  if (!js.contains("schema")) bad("response_format", inner + ".schema is missing");
  return grammar::Constraint{.kind = Kind::JsonSchema, .text = schema_text(js["schema"], inner + ".schema", "response_format")};
}

void check_size(const grammar::Constraint& c, const std::string& field, const std::string& where) {
  std::size_t bytes = c.text.size();
  for (const std::string& choice : c.choices) bytes += choice.size();
  if (bytes > kMaxConstraintBytes)
    bad(field, where + field + " is " + std::to_string(bytes) + " bytes of constraint, more than " +
                   std::to_string(kMaxConstraintBytes));
}

grammar::Constraint guided(const std::string& field, const Json& v, const std::string& where) {
  const std::string name = where + field;
  if (field == "guided_json") return {.kind = Kind::JsonSchema, .text = schema_text(v, name, field)};
  if (field == "guided_regex") return {.kind = Kind::Regex, .text = text_of(v, name, field)};
  if (field == "guided_grammar") return {.kind = Kind::Grammar, .text = text_of(v, name, field)};
  grammar::Constraint c{.kind = Kind::Choice};
  if (!v.is_array() || v.empty()) bad(field, name + " must be a non-empty array of strings");
  for (const Json& s : v) {
    if (!s.is_string() || s.get<std::string>().empty()) bad(field, name + " must hold non-empty strings");
    c.choices.push_back(s.get<std::string>());
  }
  return c;
}

}  // namespace

std::optional<RequestedConstraint> read_structured_output(const Json& fields, const std::string& where) {
  std::optional<RequestedConstraint> found;
  for (const std::string& field : kStructuredOutputFields) {
    if (!fields.contains(field) || fields[field].is_null()) continue;
    std::optional<grammar::Constraint> c =
        field == "response_format" ? response_format(fields[field], where) : guided(field, fields[field], where);
    if (!c) continue;
    check_size(*c, field, where);
    if (found) bad(field, where + field + " and " + where + found->field + " both constrain the output; give one");
    found = RequestedConstraint{field, std::move(*c)};
  }
  return found;
}

nlohmann::json to_json(const grammar::Constraint& c) {
  return {{"kind", static_cast<int>(c.kind)}, {"text", c.text}, {"choices", c.choices}};
}

grammar::Constraint constraint_from_json(const nlohmann::json& j) {
  const int kind = j.at("kind").get<int>();
  if (kind < static_cast<int>(Kind::JsonSchema) || kind > static_cast<int>(Kind::Grammar))
    throw std::invalid_argument("unknown constraint kind " + std::to_string(kind));
  return {.kind = static_cast<Kind>(kind), .text = j.at("text").get<std::string>(),
          .choices = j.at("choices").get<std::vector<std::string>>()};
}

grammar::Vocabulary model_vocabulary(const engine::Tokenizer& tok, std::int64_t vocab_size,
                                     std::span<const std::int32_t> stop_ids) {
  grammar::Vocabulary v;
  v.token_bytes.resize(static_cast<std::size_t>(vocab_size));
  // A token's bytes are what it adds after an ordinary token: decoders drop the space a piece
  // starts with at the start of a text (SentencePiece's dummy prefix), never after another.
  const std::vector<std::int32_t> anchor_ids = tok.encode("a", false);
  const std::int32_t anchor = anchor_ids.empty() ? -1 : anchor_ids.back();
  const std::string anchor_text = anchor >= 0 ? tok.decode(std::span(&anchor, 1)) : std::string();
  const std::int32_t n = std::min(tok.vocab_size(), static_cast<std::int32_t>(vocab_size));
  for (std::int32_t id = 0; id < n; ++id) {
    if (anchor < 0) {
      v.token_bytes[static_cast<std::size_t>(id)] = tok.decode(std::span(&id, 1));
      continue;
    }
    const std::int32_t pair[2] = {anchor, id};
    std::string text = tok.decode(pair);
    if (text.compare(0, anchor_text.size(), anchor_text) == 0) text.erase(0, anchor_text.size());
    else text = tok.decode(std::span(&id, 1));
    v.token_bytes[static_cast<std::size_t>(id)] = std::move(text);
  }
  v.stop_tokens.assign(stop_ids.begin(), stop_ids.end());
  for (const std::int32_t id : v.stop_tokens)  // stop tokens are never text
    if (id >= 0 && id < vocab_size) v.token_bytes[static_cast<std::size_t>(id)].clear();
  return v;
}

namespace {

// A grammar matcher as the runtime's per-sequence constraint.
class GrammarConstraint final : public engine::TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const grammar::CompiledGrammar> g, std::shared_ptr<grammar::MaskPrefetcher> ahead)
      : matcher_(std::move(g)), ahead_(std::move(ahead)) {}
  std::unique_ptr<engine::TokenConstraint> clone() const override {
    return std::make_unique<GrammarConstraint>(*this);
  }
  void fill_allowed(std::span<std::uint32_t> mask, std::int64_t tokens_left) const override {
    words_.resize(grammar::mask_words(matcher_.grammar().trie().vocab_size()));
    matcher_.fill_mask(words_, tokens_left);
    // Little or big endian alike: bit t of the 64-bit word t / 64 is bit t % 32 of its half t / 32 % 2.
    for (std::size_t i = 0; i < mask.size(); ++i) {
      const std::uint64_t w = i / 2 < words_.size() ? words_[i / 2] : 0;
      mask[i] = static_cast<std::uint32_t>(i % 2 ? w >> 32 : w);
    }
  }
  bool accept(std::int32_t token, std::int64_t tokens_left) override {
    const bool narrowed = matcher_.limit_narrows(tokens_left);
    if (!matcher_.accept_token(token)) return false;
    closed_by_limit_ = closed_by_limit_ || narrowed;
    return true;
  }
  void prepare(std::int64_t tokens_left) const override {
    if (ahead_) ahead_->prepare(matcher_.shared_grammar(), matcher_.state(), tokens_left);
  }
  bool finished() const override { return matcher_.is_finished(); }
  bool closed_by_limit() const override { return closed_by_limit_; }

 private:
  grammar::Matcher matcher_;
  std::shared_ptr<grammar::MaskPrefetcher> ahead_;
  bool closed_by_limit_ = false;  // the tokens left narrowed the mask of a token accepted
  mutable std::vector<std::uint64_t> words_;  // fill_allowed's scratch
};

}  // namespace

std::shared_ptr<const grammar::CompiledGrammar> JobConstraints::compiled(const grammar::Constraint& c) {
  std::call_once(built_, [&] {
    const auto start = std::chrono::steady_clock::now();
    cache_ = std::make_unique<grammar::ConstraintCache>(
        std::make_shared<const grammar::TokenTrie>(model_vocabulary(tok_, vocab_size_, stop_ids_)));
    vocabulary_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  return cache_->get(c);
}

std::shared_ptr<const engine::TokenConstraint> JobConstraints::get(const grammar::Constraint& c) {
  return std::make_shared<const GrammarConstraint>(compiled(c), ahead_);
}

std::shared_ptr<const engine::TokenConstraint> JobConstraints::get(const grammar::Constraint& c,
                                                                   std::int64_t max_tokens) {
  std::shared_ptr<const grammar::CompiledGrammar> g = compiled(c);
  if (!g->closes_within(max_tokens))
    throw std::invalid_argument(fmt::format("no output it allows fits in max_tokens {} (the shortest takes {} bytes)",
                                            max_tokens, g->distance(g->initial_state())));
  return std::make_shared<const GrammarConstraint>(std::move(g), ahead_);
}

nlohmann::json JobConstraints::report() const {
  if (!cache_) return nullptr;
  std::vector<double> ms = cache_->compile_seconds();
  for (double& t : ms) t *= 1e3;
  std::sort(ms.begin(), ms.end());
  nlohmann::json j = {{"distinct", ms.size()}, {"vocabulary_ms", vocabulary_seconds_ * 1e3}};
  if (!ms.empty()) {
    const std::size_t n = ms.size();
    j["compile_ms"] = {{"median", n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2}, {"max", ms.back()}};
  }
  return j;
}

std::string JobConstraints::summary_line() const {
  const nlohmann::json j = report();
  if (j.is_null()) return "";
  std::string line = fmt::format("structured output: {} distinct constraints compiled", j["distinct"].get<std::size_t>());
  if (j.contains("compile_ms"))
    line += fmt::format(", compile median {:.3f} ms, max {:.3f} ms", j["compile_ms"]["median"].get<double>(),
                        j["compile_ms"]["max"].get<double>());
  return line + fmt::format(" (vocabulary {:.1f} ms)\n", j["vocabulary_ms"].get<double>());
}

}  // namespace flexh2o::serving
