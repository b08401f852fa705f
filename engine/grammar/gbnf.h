// GBNF grammars (llama.cpp's grammar format, which xgrammar's EBNF also reads): rules
// `name ::= ...` with "strings", [classes], ., groups, | and the * + ? {m,n} repetitions; the
// start rule is `root`.
#pragma once
#include <string_view>

#include "engine/grammar/grammar.h"

namespace flexh2o::grammar {

// Throws std::invalid_argument naming the line and what is wrong.
Grammar parse_gbnf(std::string_view text);

}  // namespace flexh2o::grammar
