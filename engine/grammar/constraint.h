// The constraints a request can carry, compiled once per distinct constraint: a cache keyed
// by the constraint's kind and canonical text, shared by the sequences of a job.
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/grammar/json_schema.h"
#include "engine/grammar/matcher.h"

namespace flexh2o::grammar {

struct Constraint {
  enum class Kind { JsonSchema, JsonObject, Regex, Choice, Grammar };
  Kind kind = Kind::JsonObject;
  std::string text;                  // JsonSchema: the schema (JSON); Regex; Grammar: GBNF
  std::vector<std::string> choices;  // Choice: the outputs allowed, exactly
};

// The grammar of a constraint. Throws std::invalid_argument naming what is wrong or not
// supported (a JSON Schema keyword, a regex construct, a grammar line).
Grammar constraint_grammar(const Constraint& constraint, const JsonOptions& options = {});

class ConstraintCache {
 public:
  explicit ConstraintCache(std::shared_ptr<const TokenTrie> trie, JsonOptions options = {})
      : trie_(std::move(trie)), options_(options) {}
  // The compiled constraint, compiled on first request. Thread-safe.
  std::shared_ptr<const CompiledGrammar> get(const Constraint& constraint);
  std::size_t size() const;
  // The seconds each distinct constraint took to compile (its grammar and start state), in
  // the order they were compiled; a constraint that failed to compile is not counted.
  std::vector<double> compile_seconds() const;

 private:
  std::shared_ptr<const TokenTrie> trie_;
  JsonOptions options_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const CompiledGrammar>> compiled_;
  std::vector<double> compile_seconds_;
};

}  // namespace flexh2o::grammar
