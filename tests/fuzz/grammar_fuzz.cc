// libFuzzer target: the input is a structured-output constraint, read as the kind its first
// byte picks (a JSON schema, a regex or a GBNF grammar; the rest is the text). It is compiled
// to a grammar and an automaton, whose states are then walked over the text's own bytes. A
// rejection is std::invalid_argument (or a JSON parse error for a schema); any other exception,
// crash, sanitizer report, or a step past libFuzzer's -timeout (a constraint that stalls the
// job) is a bug.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/grammar/automaton.h"
#include "engine/grammar/constraint.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using flexh2o::grammar::Constraint;
  if (size == 0) return 0;
  constexpr Constraint::Kind kKinds[] = {Constraint::Kind::JsonSchema, Constraint::Kind::Regex,
                                         Constraint::Kind::Grammar};
  const Constraint c{.kind = kKinds[data[0] % 3], .text = std::string(reinterpret_cast<const char*>(data) + 1, size - 1)};
  try {
    flexh2o::grammar::Automaton automaton(flexh2o::grammar::constraint_grammar(c));
    std::int32_t state = automaton.initial();
    for (const char byte : c.text) {
      state = automaton.next(state, static_cast<std::uint8_t>(byte));
      if (state == flexh2o::grammar::Automaton::kDead) break;
    }
  } catch (const std::invalid_argument&) {
  } catch (const nlohmann::json::exception&) {
  }
  return 0;
}
