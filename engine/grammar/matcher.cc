#include "engine/grammar/matcher.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_set>

namespace flexh2o::grammar {

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenTrie> trie)
    : automaton_(std::move(grammar)), trie_(std::move(trie)) {
  initial_ = automaton_.initial();
  rule_count_ = automaton_.grammar().rule_count();
}

std::int32_t CompiledGrammar::advance(std::int32_t state, std::string_view bytes) const {
  std::lock_guard lock(mutex_);
  for (char b : bytes) {
    if (state == Automaton::kDead) break;
    state = automaton_.next(state, static_cast<std::uint8_t>(b));
  }
  return state;
}

bool CompiledGrammar::accepts(std::int32_t state) const {
  std::lock_guard lock(mutex_);
  return state != Automaton::kDead && automaton_.accepts(state);
}

bool CompiledGrammar::continues(std::int32_t state) const {
  std::lock_guard lock(mutex_);
  return state != Automaton::kDead && automaton_.continues(state);
}

std::size_t CompiledGrammar::state_count() const {
  std::lock_guard lock(mutex_);
  return automaton_.state_count();
}

std::int32_t CompiledGrammar::distance(std::int32_t state) const {
  std::lock_guard lock(mutex_);
  return state == Automaton::kDead ? Automaton::kFarDistance : automaton_.distance(state);
}

// Walks the trie in preorder, keeping the state after each prefix of the current path; a
// prefix the automaton rejects skips its subtree. Calls visit(node, state after its bytes) for
// each node that ends tokens.
template <typename Visit>
void CompiledGrammar::walk_tokens(std::int32_t state, Visit visit) const {
  std::vector<std::int32_t> path(trie_->max_depth() + 1);
  path[0] = state;
  for (std::size_t node = 0; node < trie_->node_count();) {
    const std::uint32_t depth = trie_->depth(node);
    const std::int32_t next = automaton_.next(path[depth - 1], trie_->byte(node));
    if (next == Automaton::kDead) {
      node = trie_->subtree_end(node);
      continue;
    }
    path[depth] = next;
    if (trie_->tokens_begin(node) != trie_->tokens_end(node)) visit(node, next);
    ++node;
  }
}

void CompiledGrammar::walk_trie(std::int32_t state, std::int32_t reach, TokenMask& out) const {
  out.bits.assign(mask_words(trie_->vocab_size()), 0);
  out.farthest = 0;
  out.nearest = kAnyDistance;
  walk_tokens(state, [&](std::size_t node, std::int32_t next) {
    const std::int32_t after = automaton_.distance(next);
    if (after > reach) return;
    out.farthest = std::max(out.farthest, after);
    out.nearest = std::min(out.nearest, after);
    for (const std::int32_t* t = trie_->tokens_begin(node); t != trie_->tokens_end(node); ++t)
      out.bits[static_cast<std::size_t>(*t) >> 6] |= std::uint64_t{1} << (*t & 63);
  });
}

bool CompiledGrammar::closes_within(std::int64_t tokens) const {
  std::lock_guard lock(mutex_);
  const auto known = closes_within_.find(tokens);
  if (known != closes_within_.end()) return known->second;
  return closes_within_[tokens] = search_closing(tokens);
}

// Breadth-first over tokens from the start: the output closes once a state is within one byte
// a token of an end (docs/structured-output.md, "Closing within max_tokens"). States that even
// the longest token each time could not close are dropped.
bool CompiledGrammar::search_closing(std::int64_t tokens) const {
  const std::int64_t longest = trie_->max_depth();
  std::vector<std::int32_t> frontier = {initial_};
  std::unordered_set<std::int32_t> seen = {initial_};
  for (std::int64_t left = tokens; !frontier.empty(); --left) {
    for (const std::int32_t s : frontier)
      if (automaton_.distance(s) <= left) return true;
    if (left == 0 || frontier.size() > kClosingSearchStates) return left > 0;  // too many to search: closing decides
    std::vector<std::int32_t> next;
    for (const std::int32_t s : frontier)
      walk_tokens(s, [&](std::size_t, std::int32_t after) {
        if (automaton_.distance(after) <= (left - 1) * longest && seen.insert(after).second) next.push_back(after);
      });
    frontier = std::move(next);
  }
  return false;
}

const CompiledGrammar::TokenMask& CompiledGrammar::token_mask(std::int32_t state, std::int32_t reach) const {
  const std::uint64_t key = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(state)) << 32) |
                            static_cast<std::uint32_t>(reach);
  auto found = masks_.find(key);
  if (found != masks_.end()) return found->second;
  const std::size_t mask_bytes = mask_words(trie_->vocab_size()) * sizeof(std::uint64_t);
  if ((masks_.size() + 1) * mask_bytes > kMaskCacheBytes) masks_.clear();  // recomputed on demand
  TokenMask& mask = masks_[key];
  walk_trie(state, reach, mask);
  return mask;
}

const CompiledGrammar::TokenMask& CompiledGrammar::mask_for(std::int32_t state, std::int64_t tokens_left) const {
  const TokenMask& any = token_mask(state, kAnyDistance);  // limit_narrows: the same test
  if (tokens_left == kNoLimit || any.farthest <= tokens_left - 1) return any;
  // Closing within the tokens left: each token after this one can write at least one byte of
  // a shortest completion (every byte is a token in byte-level vocabularies), so a token is
  // allowed when the distance after it is at most the tokens left after it. Where no token is
  // (a vocabulary without some single bytes), those nearest to the end are; where the output
  // may end here, the stop tokens always are.
  auto reach = static_cast<std::int32_t>(std::clamp<std::int64_t>(tokens_left - 1, 0, kAnyDistance));
  if (!automaton_.accepts(state)) reach = std::max(reach, any.nearest);
  return token_mask(state, reach);  // may drop `any` from the cache
}

void CompiledGrammar::fill_mask(std::int32_t state, std::span<std::uint64_t> mask, std::int64_t tokens_left) const {
  if (mask.size() != mask_words(trie_->vocab_size())) throw std::invalid_argument("token mask of the wrong size");
  std::lock_guard lock(mutex_);
  const TokenMask& tokens = mask_for(state, tokens_left);
  std::copy(tokens.bits.begin(), tokens.bits.end(), mask.begin());
  if (automaton_.accepts(state))
    for (std::int32_t stop : trie_->vocabulary().stop_tokens)
      mask[static_cast<std::size_t>(stop) >> 6] |= std::uint64_t{1} << (stop & 63);
}

bool CompiledGrammar::limit_narrows(std::int32_t state, std::int64_t tokens_left) const {
  std::lock_guard lock(mutex_);
  return state != Automaton::kDead && tokens_left != kNoLimit &&
         token_mask(state, kAnyDistance).farthest > tokens_left - 1;
}

void CompiledGrammar::prepare_mask(std::int32_t state, std::int64_t tokens_left) const {
  std::lock_guard lock(mutex_);
  if (state != Automaton::kDead) mask_for(state, tokens_left);
}

bool Matcher::accept_token(std::int32_t token) {
  if (stopped_) return false;
  const Vocabulary& vocabulary = grammar_->trie().vocabulary();
  if (token < 0 || static_cast<std::size_t>(token) >= vocabulary.token_bytes.size()) return false;
  if (std::find(vocabulary.stop_tokens.begin(), vocabulary.stop_tokens.end(), token) != vocabulary.stop_tokens.end()) {
    if (!grammar_->accepts(state_)) return false;
    stopped_ = true;
    return true;
  }
  const std::string& bytes = vocabulary.token_bytes[static_cast<std::size_t>(token)];
  return !bytes.empty() && accept_bytes(bytes);
}

bool Matcher::accept_bytes(std::string_view bytes) {
  if (stopped_) return false;
  const std::int32_t next = grammar_->advance(state_, bytes);
  if (next == Automaton::kDead) return false;
  state_ = next;
  return true;
}

void Matcher::fill_mask(std::span<std::uint64_t> mask, std::int64_t tokens_left) const {
  if (stopped_) {
    std::fill(mask.begin(), mask.end(), 0);
    return;
  }
  grammar_->fill_mask(state_, mask, tokens_left);
}

}  // namespace flexh2o::grammar
