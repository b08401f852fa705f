// The tokenizer a GGUF file carries in its tokenizer.ggml.* metadata keys
// (engine/tokenizer/gguf_tokenizer.h builds it from their values).
#pragma once
#include <memory>

#include "engine/loaders/gguf_file.h"
#include "engine/tokenizer/tokenizer.h"

namespace flexh2o::engine {

// Null when the file has no tokenizer (no tokenizer.ggml.model). Throws std::runtime_error
// naming the file and the key on a value of the wrong type or a tokenizer it cannot build.
std::unique_ptr<Tokenizer> gguf_tokenizer(const GgufHeader& h);

}  // namespace flexh2o::engine
