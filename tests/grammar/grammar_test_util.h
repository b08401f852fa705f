// Shared by the grammar tests: whole-text acceptance straight on the automaton, and a random
// vocabulary.
#pragma once
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "engine/grammar/automaton.h"
#include "engine/grammar/token_trie.h"

namespace flexh2o::grammar::testing {

inline bool accepts(const Grammar& grammar, std::string_view text) {
  Automaton automaton(grammar);
  std::int32_t state = automaton.initial();
  for (char c : text) {
    state = automaton.next(state, static_cast<std::uint8_t>(c));
    if (state == Automaton::kDead) return false;
  }
  return automaton.accepts(state);
}

// Every single byte, then random concatenations of JSON-ish pieces (multi-byte characters cut
// in the middle among them), a control token (empty) and a stop token.
inline Vocabulary random_vocabulary(std::mt19937& rng, int pieces_tokens) {
  const std::vector<std::string> pieces = {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "a", "b", "x", "name", "age",
                                           "kind", "0", "1", "12", "7", "-", ".", "e", "true", "null", "false", "\\",
                                           "\\n", "\\u00", "\xc3\xa9", "\xc3", "\xa9", "\xe2\x82\xac", "AB", "Z", "T",
                                           "@", "2024", "-02-", "29", "::", "/", "http", "Al"};
  Vocabulary v;
  for (int b = 0; b < 256; ++b) v.token_bytes.push_back(std::string(1, static_cast<char>(b)));
  for (int i = 0; i < pieces_tokens; ++i) {
    std::string token;
    for (int k = 1 + static_cast<int>(rng() % 4); k > 0; --k) token += pieces[rng() % pieces.size()];
    v.token_bytes.push_back(token);
  }
  v.token_bytes.push_back("");  // a control token: never allowed
  v.token_bytes.push_back("");  // the stop token
  v.stop_tokens = {static_cast<std::int32_t>(v.token_bytes.size() - 1)};
  return v;
}

}  // namespace flexh2o::grammar::testing
