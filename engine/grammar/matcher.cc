#include "engine/grammar/matcher.h"

#include <algorithm>
#include <stdexcept>

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

// Walks the trie in preorder, keeping the state after each prefix of the current path; a
// prefix the automaton rejects skips its subtree.
const std::vector<std::uint64_t>& CompiledGrammar::token_mask(std::int32_t state) const {
  auto found = masks_.find(state);
  if (found != masks_.end()) return found->second;
  const std::size_t mask_bytes = mask_words(trie_->vocab_size()) * sizeof(std::uint64_t);
  if ((masks_.size() + 1) * mask_bytes > kMaskCacheBytes) masks_.clear();  // recomputed on demand
  auto it = masks_.try_emplace(state).first;
  std::vector<std::uint64_t>& mask = it->second;
  mask.assign(mask_words(trie_->vocab_size()), 0);
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
    for (const std::int32_t* t = trie_->tokens_begin(node); t != trie_->tokens_end(node); ++t)
      mask[static_cast<std::size_t>(*t) >> 6] |= std::uint64_t{1} << (*t & 63);
    ++node;
  }
  return mask;
}

void CompiledGrammar::fill_mask(std::int32_t state, std::span<std::uint64_t> mask) const {
  if (mask.size() != mask_words(trie_->vocab_size())) throw std::invalid_argument("token mask of the wrong size");
  std::lock_guard lock(mutex_);
  const std::vector<std::uint64_t>& tokens = token_mask(state);
  std::copy(tokens.begin(), tokens.end(), mask.begin());
  if (automaton_.accepts(state))
    for (std::int32_t stop : trie_->vocabulary().stop_tokens)
      mask[static_cast<std::size_t>(stop) >> 6] |= std::uint64_t{1} << (stop & 63);
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

void Matcher::fill_mask(std::span<std::uint64_t> mask) const {
  if (stopped_) {
    std::fill(mask.begin(), mask.end(), 0);
    return;
  }
  grammar_->fill_mask(state_, mask);
}

}  // namespace flexh2o::grammar
