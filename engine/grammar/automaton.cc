#include "engine/grammar/automaton.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace flexh2o::grammar {

Automaton::Automaton(Grammar grammar)
    : grammar_(std::move(grammar)), position_distance_(position_distances(grammar_, kFarDistance)) {
  if (widest_closure(grammar_, kMaxClosure) > kMaxClosure) throw std::invalid_argument(too_wide_message());
  std::vector<std::int32_t> stacks;
  bool accepts = false;
  std::unordered_set<std::int32_t> seen;  // nodes this transition expanded
  for (std::int32_t pos : grammar_.alternatives(grammar_.root())) close(node(pos, kNoParent), seen, stacks, accepts);
  initial_ = intern_state(std::move(stacks), accepts);
}

std::string Automaton::too_wide_message() {
  return "the grammar keeps more than " + std::to_string(kMaxClosure) +
         " positions open at once (a counted repetition of something optional, like (a?){N}, or nested "
         "repetitions); write it with fewer optional parts";
}

std::int32_t Automaton::node(std::int32_t pos, std::int32_t parent) {
  const std::uint64_t key = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(pos)) << 32) |
                            static_cast<std::uint32_t>(parent);
  auto [it, inserted] = node_index_.try_emplace(key, static_cast<std::int32_t>(node_pos_.size()));
  if (inserted) {
    node_pos_.push_back(pos);
    node_parent_.push_back(parent);
    const std::int64_t below = parent == kNoParent ? 0 : node_distance_[static_cast<std::size_t>(parent)];
    node_distance_.push_back(static_cast<std::int32_t>(
        std::min<std::int64_t>(position_distance_[static_cast<std::size_t>(pos)] + below, kFarDistance)));
  }
  return it->second;
}

// Expands `start` until every stack's top is a byte class: enters rules, returns from ended
// alternatives. The grammar has no left recursion (GrammarBuilder::build), so this ends. A node
// the closure expanded before (for another stack of the same transition) adds nothing new.
void Automaton::close(std::int32_t start, std::unordered_set<std::int32_t>& seen, std::vector<std::int32_t>& stacks,
                      bool& accepts) {
  std::vector<std::int32_t> work = {start};
  while (!work.empty()) {
    const std::int32_t n = work.back();
    work.pop_back();
    if (!seen.insert(n).second) continue;
    // The static bound (widest_closure) leaves out returns through optional tails.
    if (static_cast<std::int64_t>(seen.size()) > kMaxClosure) throw std::invalid_argument(too_wide_message());
    const std::int32_t pos = node_pos_[static_cast<std::size_t>(n)];
    const std::int32_t parent = node_parent_[static_cast<std::size_t>(n)];
    const std::int32_t e = grammar_.element(pos);
    if (Grammar::is_bytes(e)) {
      stacks.push_back(n);
    } else if (e == Grammar::kEnd) {
      if (parent == kNoParent) accepts = true;
      else work.push_back(parent);
    } else {
      const bool tail_call = grammar_.element(pos + 1) == Grammar::kEnd;
      const std::int32_t ret = tail_call ? parent : node(pos + 1, parent);
      for (std::int32_t alt : grammar_.alternatives(e)) work.push_back(node(alt, ret));
    }
  }
}

std::int32_t Automaton::intern_state(std::vector<std::int32_t> stacks, bool accepts) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.empty() && !accepts) return kDead;
  std::string key(stacks.size() * sizeof(std::int32_t) + 1, '\0');
  if (!stacks.empty()) std::memcpy(key.data(), stacks.data(), stacks.size() * sizeof(std::int32_t));
  key.back() = accepts ? '\1' : '\0';
  auto [it, inserted] = state_index_.try_emplace(std::move(key), static_cast<std::int32_t>(states_.size()));
  if (inserted) {
    std::int32_t distance = kFarDistance;
    for (std::int32_t n : stacks) distance = std::min(distance, node_distance_[static_cast<std::size_t>(n)]);
    states_.push_back(State{.stacks = std::move(stacks), .accepts = accepts, .distance = accepts ? 0 : distance});
    transitions_.resize(states_.size() * 256, kUnknown);
  }
  return it->second;
}

std::int32_t Automaton::compute_next(std::int32_t state, std::uint8_t byte) {
  std::vector<std::int32_t> stacks;
  bool accepts = false;
  std::unordered_set<std::int32_t> seen;  // nodes this transition expanded
  for (std::int32_t n : states_[static_cast<std::size_t>(state)].stacks) {
    const std::int32_t pos = node_pos_[static_cast<std::size_t>(n)];
    if (!grammar_.byte_class(grammar_.element(pos)).contains(byte)) continue;
    close(node(pos + 1, node_parent_[static_cast<std::size_t>(n)]), seen, stacks, accepts);
  }
  return intern_state(std::move(stacks), accepts);
}

}  // namespace flexh2o::grammar
