// A compiled constraint bound to a vocabulary, and the per-sequence matcher that walks it.
// The token mask of a state is computed once (a walk over the vocabulary trie through the
// automaton) and kept: it is exact for the whole stack, so a state reached again by any
// sequence of the job costs a copy. All CompiledGrammar methods are thread-safe.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/grammar/automaton.h"
#include "engine/grammar/token_trie.h"

namespace flexh2o::grammar {

inline std::size_t mask_words(std::size_t vocab_size) { return (vocab_size + 63) / 64; }
inline bool mask_allows(std::span<const std::uint64_t> mask, std::int32_t token) {
  return (mask[static_cast<std::size_t>(token) >> 6] >> (token & 63)) & 1;
}

class CompiledGrammar {
 public:
  // The masks kept per compiled constraint; past this the cache starts over (a grammar whose
  // states keep changing, e.g. long length-bounded strings, recomputes instead of growing).
  static constexpr std::size_t kMaskCacheBytes = std::size_t{256} << 20;

  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenTrie> trie);
  std::int32_t initial_state() const { return initial_; }
  // The state after `bytes`, or Automaton::kDead.
  std::int32_t advance(std::int32_t state, std::string_view bytes) const;
  bool accepts(std::int32_t state) const;
  bool continues(std::int32_t state) const;
  // Whether input may end in / continue from `state` (false for Automaton::kDead).
  // fill_mask: the tokens allowed in `state` (bit set = allowed), stop tokens included when it
  // accepts.
  void fill_mask(std::int32_t state, std::span<std::uint64_t> mask) const;
  const TokenTrie& trie() const { return *trie_; }
  std::size_t state_count() const;
  std::size_t rule_count() const { return rule_count_; }

 private:
  const std::vector<std::uint64_t>& token_mask(std::int32_t state) const;  // under mutex_

  mutable std::mutex mutex_;
  mutable Automaton automaton_;
  std::shared_ptr<const TokenTrie> trie_;
  mutable std::unordered_map<std::int32_t, std::vector<std::uint64_t>> masks_;
  std::int32_t initial_;
  std::size_t rule_count_;
};

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar)
      : grammar_(std::move(grammar)), state_(grammar_->initial_state()) {}
  // Feeds a token; false (and no change) when the mask would not allow it. A stop token ends
  // the output.
  bool accept_token(std::int32_t token);
  bool accept_bytes(std::string_view bytes);
  // Whether the output so far is complete (stop tokens allowed).
  bool is_complete() const { return !stopped_ && grammar_->accepts(state_); }
  // Whether a stop token was accepted, or no byte can follow the output (it must stop now).
  bool is_finished() const { return stopped_ || !grammar_->continues(state_); }
  void fill_mask(std::span<std::uint64_t> mask) const;
  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  std::shared_ptr<const CompiledGrammar> grammar_;
  std::int32_t state_;
  bool stopped_ = false;
};

}  // namespace flexh2o::grammar
