// A byte-level context-free grammar: rules whose alternatives are sequences of byte classes
// and rule references, stored as one flat array of elements so that a position (an index into
// it) names a point inside an alternative. The automaton (automaton.h) runs on positions.
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "engine/grammar/byte_class.h"
#include "engine/grammar/expr.h"

namespace flexh2o::grammar {

class Grammar {
 public:
  static constexpr std::int32_t kEnd = -1;  // the element after an alternative's last one

  // >= 0: a rule id; kEnd; <= -2: the byte class -2 - value.
  std::int32_t element(std::int32_t pos) const { return elements_[static_cast<std::size_t>(pos)]; }
  static bool is_bytes(std::int32_t element) { return element <= -2; }
  const ByteClass& byte_class(std::int32_t element) const {
    return classes_[static_cast<std::size_t>(-2 - element)];
  }
  // Positions of the first element of each alternative of `rule`.
  std::span<const std::int32_t> alternatives(std::int32_t rule) const {
    return rules_[static_cast<std::size_t>(rule)].alt_starts;
  }
  const std::string& rule_name(std::int32_t rule) const { return rules_[static_cast<std::size_t>(rule)].name; }
  std::int32_t root() const { return root_; }
  std::size_t rule_count() const { return rules_.size(); }
  std::size_t element_count() const { return elements_.size(); }

 private:
  friend class GrammarBuilder;
  struct Rule {
    std::string name;
    std::vector<std::int32_t> alt_starts;
    bool defined = false;
  };
  std::vector<std::int32_t> elements_;
  std::vector<ByteClass> classes_;
  std::vector<Rule> rules_;
  std::int32_t root_ = 0;
};

// The fewest bytes from each position (an index into the elements) to the end of its
// alternative, rules taken at their shortest derivation; capped at `cap`. (Knuth's
// generalization of Dijkstra's algorithm to grammars: a rule's shortest length is final once
// it is the smallest candidate left.)
std::vector<std::int32_t> position_distances(const Grammar& g, std::int32_t cap);

// An upper bound on the nodes the automaton's closure expands from any one position before a
// byte class or the end of the position's alternative (returns past it not counted), capped at
// cap + 1. A nullable rule reference adds what follows it: `(a?){N}` has N optional parts
// open at once, nested repetitions their product.
std::int64_t widest_closure(const Grammar& g, std::int64_t cap);

// Builds a Grammar from expressions; repetitions and nested alternatives become helper rules
// (right-recursive, so the automaton's tail calls keep their stacks flat).
class GrammarBuilder {
 public:
  std::uint32_t add_rule(std::string name);
  bool defined(std::uint32_t rule) const { return grammar_.rules_[rule].defined; }
  // Throws std::invalid_argument if `rule` was defined before.
  void define(std::uint32_t rule, const Expr& body);
  // Throws std::invalid_argument naming the rule for a rule used but never defined, a
  // left-recursive rule, a rule that can never complete, or an empty byte class.
  Grammar build(std::uint32_t root) &&;

 private:
  using Sequence = std::vector<std::int32_t>;
  void define_alternatives(std::uint32_t rule, const std::vector<Sequence>& alternatives);
  void lower(const Expr& expr, Sequence& out, const std::string& owner);
  std::int32_t lower_single(const Expr& expr, const std::string& owner);
  void lower_repeat(const Expr& expr, Sequence& out, const std::string& owner);
  std::int32_t class_element(const ByteClass& bytes);

  Grammar grammar_;
  std::map<std::array<std::uint64_t, 4>, std::int32_t> class_index_;
};

}  // namespace flexh2o::grammar
