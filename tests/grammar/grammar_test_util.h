// Shared by the grammar tests: whole-text acceptance straight on the automaton.
#pragma once
#include <string_view>

#include "engine/grammar/automaton.h"

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

}  // namespace flexh2o::grammar::testing
