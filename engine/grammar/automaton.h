// The grammar as a pushdown automaton over bytes, determinized lazily: a stack is a node
// (position, return node), nodes are shared (hash-consed) so that a stack is one integer, and a
// state is the set of stacks whose top is a byte class, plus whether the input may end there.
// A state's transitions are computed on first use and kept, so a state reached again (the
// inside of a JSON string, after a comma, ...) costs a table lookup per byte. Tail calls reuse
// the caller's frame: right recursion (repetitions) keeps stacks flat and states few.
// Not thread-safe: the owner (matcher.h) serializes calls.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/grammar/grammar.h"

namespace flexh2o::grammar {

class Automaton {
 public:
  static constexpr std::int32_t kDead = -1;

  explicit Automaton(Grammar grammar);
  std::int32_t initial() const { return initial_; }
  // The state after `byte`, or kDead when the grammar cannot continue with it.
  std::int32_t next(std::int32_t state, std::uint8_t byte) {
    const std::size_t slot = static_cast<std::size_t>(state) * 256 + byte;
    if (transitions_[slot] == kUnknown) {
      const std::int32_t to = compute_next(state, byte);  // may grow transitions_
      transitions_[slot] = to;
    }
    return transitions_[slot];
  }
  // Whether the input may end in this state.
  bool accepts(std::int32_t state) const { return states_[static_cast<std::size_t>(state)].accepts; }
  // Whether some byte continues the input from this state.
  bool continues(std::int32_t state) const { return !states_[static_cast<std::size_t>(state)].stacks.empty(); }
  // The fewest bytes that complete the input from this state (0 where it may end), capped at
  // kFarDistance.
  std::int32_t distance(std::int32_t state) const { return states_[static_cast<std::size_t>(state)].distance; }
  static constexpr std::int32_t kFarDistance = 1 << 30;
  // The most nodes one transition's closure may expand. A node costs ~0.1-0.25 us (hashing,
  // then sorting and keying the state's stacks), and a mask walk creates a state for each trie
  // node whose prefix leads somewhere new (a few per token): (a?){4000}b, ~24000 nodes a
  // closure, took 85 ms for its first 2 tokens (34 states; 14 s before closures expanded each
  // node once), so 2^15 bounds a new state at ~10 ms. Real grammars stay far
  // below: the widest closure of the 212 JSONSchemaBench schemas compiled
  // (bench/structured/schemas.jsonl) is 221; a JSON string of maxLength 100000 or [0-9]{1,20}
  // needs a few (one optional part open at a time); (a?){N} needs ~6N (up to N = 5400). The
  // constructor refuses a grammar whose static bound (widest_closure) exceeds it; a closure
  // past it at run time (a return chain through optional tails, as deep as the input) throws.
  static constexpr std::int64_t kMaxClosure = std::int64_t{1} << 15;
  static std::string too_wide_message();
  std::size_t state_count() const { return states_.size(); }
  const Grammar& grammar() const { return grammar_; }

 private:
  static constexpr std::int32_t kUnknown = -2;
  static constexpr std::int32_t kNoParent = -1;
  struct State {
    std::vector<std::int32_t> stacks;  // nodes whose position is a byte class, sorted
    bool accepts = false;
    std::int32_t distance = 0;  // distance(): 0 when accepts, else the nearest stack's node_distance_
  };
  std::int32_t node(std::int32_t pos, std::int32_t parent);
  void close(std::int32_t start, std::unordered_set<std::int32_t>& seen, std::vector<std::int32_t>& stacks,
             bool& accepts);
  std::int32_t intern_state(std::vector<std::int32_t> stacks, bool accepts);
  std::int32_t compute_next(std::int32_t state, std::uint8_t byte);

  Grammar grammar_;
  std::vector<std::int32_t> position_distance_;  // fewest bytes from a position to its alternative's end
  std::vector<std::int32_t> node_pos_, node_parent_;
  std::vector<std::int32_t> node_distance_;  // fewest bytes that empty a node's whole stack
  std::unordered_map<std::uint64_t, std::int32_t> node_index_;
  std::vector<State> states_;
  std::unordered_map<std::string, std::int32_t> state_index_;
  std::vector<std::int32_t> transitions_;  // 256 per state
  std::int32_t initial_ = kDead;
};

}  // namespace flexh2o::grammar
