// Tokenizer case files (tests/data/tokenizers/README.md): one JSON line per text,
// {"text", "ids", "ids_with_special", "decoded"}, as a reference tokenizer encoded and decoded it.
#pragma once
#include <cstddef>
#include <string>

#include "engine/tokenizer/tokenizer.h"

namespace flexh2o::testing {

// EXPECTs, per line, encode(text, false) == ids, encode(text, true) == ids_with_special and
// decode(ids, skip_special=false) == decoded; returns the number of lines the file has.
std::size_t expect_tokenizer_cases(const engine::Tokenizer& tok, const std::string& jsonl_path);

}  // namespace flexh2o::testing
