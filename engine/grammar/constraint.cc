#include "engine/grammar/constraint.h"

#include <chrono>
#include <stdexcept>

#include "engine/grammar/gbnf.h"
#include "engine/grammar/regex.h"
#include "engine/io/json_input.h"

namespace flexh2o::grammar {

namespace {

// Depth-bounded (engine/io): re-serializing and copying a schema recurse per level.
nlohmann::ordered_json parse_schema(const std::string& text) {
  try {
    return engine::parse_json<nlohmann::ordered_json>(text, "json schema");
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(e.what());
  }
}

Grammar single_rule_grammar(const Expr& body) {
  GrammarBuilder builder;
  const std::uint32_t root = builder.add_rule("root");
  builder.define(root, body);
  return std::move(builder).build(root);
}

// The cache key: the kind, then the text in canonical form (a schema re-serialized compactly,
// keeping its key order, which the grammar follows).
std::string canonical_key(const Constraint& c) {
  std::string key(1, static_cast<char>('0' + static_cast<int>(c.kind)));
  if (c.kind == Constraint::Kind::JsonSchema) return key + parse_schema(c.text).dump();
  if (c.kind == Constraint::Kind::Choice) return key + nlohmann::json(c.choices).dump();
  return key + c.text;
}

}  // namespace

Grammar constraint_grammar(const Constraint& constraint, const JsonOptions& options) {
  switch (constraint.kind) {
    case Constraint::Kind::JsonSchema: return json_schema_grammar(parse_schema(constraint.text), options);
    case Constraint::Kind::JsonObject: return json_object_grammar(options);
    case Constraint::Kind::Regex: return single_rule_grammar(regex_expr(constraint.text, RegexAlphabet::Utf8));
    case Constraint::Kind::Grammar: return parse_gbnf(constraint.text);
    case Constraint::Kind::Choice: {
      if (constraint.choices.empty()) throw std::invalid_argument("choice: the list of choices is empty");
      std::vector<Expr> options_list;
      for (const std::string& choice : constraint.choices) options_list.push_back(literal(choice));
      return single_rule_grammar(alt(std::move(options_list)));
    }
  }
  throw std::invalid_argument("unknown constraint kind");
}

std::shared_ptr<const CompiledGrammar> ConstraintCache::get(const Constraint& constraint) {
  const std::string key = canonical_key(constraint);
  {
    std::lock_guard lock(mutex_);
    auto it = compiled_.find(key);
    if (it != compiled_.end()) return it->second;
  }
  const auto start = std::chrono::steady_clock::now();
  auto compiled = std::make_shared<const CompiledGrammar>(constraint_grammar(constraint, options_), trie_);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  std::lock_guard lock(mutex_);
  const auto [it, added] = compiled_.try_emplace(key, std::move(compiled));
  if (added) compile_seconds_.push_back(took.count());
  return it->second;
}

std::vector<double> ConstraintCache::compile_seconds() const {
  std::lock_guard lock(mutex_);
  return compile_seconds_;
}

std::size_t ConstraintCache::size() const {
  std::lock_guard lock(mutex_);
  return compiled_.size();
}

}  // namespace flexh2o::grammar
