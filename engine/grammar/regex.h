// Regular expressions (the Python `re` / ECMAScript subset without lookaround or
// backreferences) as grammar expressions: matching the whole text, or with `search` (JSON
// Schema's "pattern") any text containing a match, as re.search does.
#pragma once
#include <string_view>

#include "engine/grammar/char_set.h"
#include "engine/grammar/expr.h"

namespace flexh2o::grammar {

enum class RegexAlphabet {
  Utf8,        // the text itself, UTF-8
  JsonString,  // the inside of a JSON string literal: '"', '\' and controls written as escapes
};

// Throws std::invalid_argument naming the construct and its offset for what is not supported:
// lookaround, backreferences, word boundaries, anchors other than a leading ^ and trailing $
// (and, with `search`, an anchor beside a top-level '|').
Expr regex_expr(std::string_view pattern, RegexAlphabet alphabet, bool search = false);

// One character of `set` written in `alphabet`.
Expr char_expr(const CharSet& set, RegexAlphabet alphabet);

}  // namespace flexh2o::grammar
