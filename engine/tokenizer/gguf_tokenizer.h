// The tokenizer a GGUF file describes in its tokenizer.ggml.* metadata, assembled from the
// stages tokenizer.json uses (pipeline.h):
//   model "gpt2": byte-level BPE (tokens + merges) behind the regexes llama.cpp picks by
//     tokenizer.ggml.pre (src/llama-vocab.cpp), then GPT-2's byte alphabet;
//   model "llama": SentencePiece-style merging by score with "<0xHH>" byte fallback, spaces as
//     "▁" with one prepended to the text (Metaspace, as transformers' LlamaTokenizer).
// Control and unknown tokens (token_type 3, 2) become special added tokens, user-defined ones
// (4) plain added tokens; add_bos_token / add_eos_token make the post-processor.
// The loader reads the keys (engine/loaders/gguf_tokenizer_keys.h); this file only sees values.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"

namespace flexh2o::engine {

// The tokenizer.ggml.* values of a GGUF file; absent keys stay empty.
struct GgufTokenizerSpec {
  std::string architecture;  // general.architecture (phi3 spells its prefix space differently)
  std::string model;         // tokenizer.ggml.model
  std::optional<std::string> pre;
  std::vector<std::string> tokens;
  std::optional<std::vector<double>> scores;
  std::optional<std::vector<std::int64_t>> token_types;
  std::optional<std::vector<std::string>> merges;
  std::optional<std::uint64_t> bos_id, eos_id, unk_id;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
};

// Throws std::runtime_error "<source>: metadata key 'tokenizer.ggml.<field>' <why>" on a model
// or pre-tokenizer it does not implement, a missing or inconsistent field.
std::unique_ptr<Tokenizer> load_gguf_tokenizer(const GgufTokenizerSpec& spec, const std::string& source);

// The tokenizer.ggml.pre values load_gguf_tokenizer implements, for messages and tests.
std::vector<std::string> gguf_pre_tokenizer_names();

}  // namespace flexh2o::engine
