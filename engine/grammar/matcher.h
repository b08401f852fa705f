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
  // Whether input may end in / continue from `state` (false for Automaton::kDead).
  bool accepts(std::int32_t state) const;
  bool continues(std::int32_t state) const;
  // The fewest bytes that complete the output from `state` (0 where it may end).
  std::int32_t distance(std::int32_t state) const;
  // fill_mask: the tokens allowed in `state` (bit set = allowed), stop tokens included when it
  // accepts. With `tokens_left` (the tokens the output may still have, this one included):
  // only tokens after which the output can still be completed in the tokens left, one byte a
  // token (docs/structured-output.md, "Closing within max_tokens"); where no token can, those
  // that leave the fewest bytes to write.
  static constexpr std::int64_t kNoLimit = -1;
  void fill_mask(std::int32_t state, std::span<std::uint64_t> mask, std::int64_t tokens_left = kNoLimit) const;
  // Whether fill_mask narrows the mask of `state` for `tokens_left` (the limit shapes the output).
  bool limit_narrows(std::int32_t state, std::int64_t tokens_left) const;
  // Computes and keeps the mask fill_mask will give, so that a later fill_mask is a copy (a
  // worker thread calls it while the step that needs the mask computes).
  void prepare_mask(std::int32_t state, std::int64_t tokens_left = kNoLimit) const;
  // Whether some output of at most `tokens` tokens is complete (the vocabulary spelling every
  // byte): at once where the start's distance is at most `tokens`, else by a search over token
  // sequences (kept per `tokens`). A search past kClosingSearchStates states at one length
  // answers true: closing then decides at run time.
  bool closes_within(std::int64_t tokens) const;
  static constexpr std::size_t kClosingSearchStates = 256;
  const TokenTrie& trie() const { return *trie_; }
  std::size_t state_count() const;
  std::size_t rule_count() const { return rule_count_; }

 private:
  struct TokenMask {
    std::vector<std::uint64_t> bits;
    std::int32_t farthest = 0;  // the largest distance after a token the mask allows
    std::int32_t nearest = 0;   // the smallest
  };
  static constexpr std::int32_t kAnyDistance = Automaton::kFarDistance;
  // The tokens whose bytes the automaton takes from `state` and after which the distance is at
  // most `reach`; kept per (state, reach). Under mutex_.
  const TokenMask& token_mask(std::int32_t state, std::int32_t reach) const;
  const TokenMask& mask_for(std::int32_t state, std::int64_t tokens_left) const;  // under mutex_
  void walk_trie(std::int32_t state, std::int32_t reach, TokenMask& out) const;
  template <typename Visit>
  void walk_tokens(std::int32_t state, Visit visit) const;
  bool search_closing(std::int64_t tokens) const;  // under mutex_

  mutable std::mutex mutex_;
  mutable Automaton automaton_;
  std::shared_ptr<const TokenTrie> trie_;
  mutable std::unordered_map<std::uint64_t, TokenMask> masks_;
  mutable std::unordered_map<std::int64_t, bool> closes_within_;  // closes_within per token count
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
  // The fewest bytes that complete the output (0 when complete).
  std::int32_t distance() const { return stopped_ ? 0 : grammar_->distance(state_); }
  // Whether the output so far is complete (stop tokens allowed).
  bool is_complete() const { return !stopped_ && grammar_->accepts(state_); }
  // Whether a stop token was accepted, or no byte can follow the output (it must stop now).
  bool is_finished() const { return stopped_ || !grammar_->continues(state_); }
  // The tokens allowed next (CompiledGrammar::fill_mask), none once stopped.
  void fill_mask(std::span<std::uint64_t> mask, std::int64_t tokens_left = CompiledGrammar::kNoLimit) const;
  // Whether the limit narrows the next mask (CompiledGrammar::limit_narrows).
  bool limit_narrows(std::int64_t tokens_left) const {
    return !stopped_ && grammar_->limit_narrows(state_, tokens_left);
  }
  const CompiledGrammar& grammar() const { return *grammar_; }
  // The compiled constraint and the state, for CompiledGrammar::prepare_mask on another thread.
  const std::shared_ptr<const CompiledGrammar>& shared_grammar() const { return grammar_; }
  std::int32_t state() const { return stopped_ ? Automaton::kDead : state_; }

 private:
  std::shared_ptr<const CompiledGrammar> grammar_;
  std::int32_t state_;
  bool stopped_ = false;
};

}  // namespace flexh2o::grammar
