// Batch job input: JSON lines, {"id": ..., "prompt": "text"} or {"id": ..., "tokens": [1, 2, 3]},
// optionally with "max_tokens" and a structured-output field (structured_output.h).
// (The results file is engine/serving/result_file.h.)
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/serving/structured_output.h"
#include "engine/tokenizer/tokenizer.h"

namespace flexh2o::engine {

struct PromptItem {
  std::string id_json;  // the id exactly as given (a JSON number or string), echoed in the output
  std::optional<std::string> text;
  std::vector<std::int32_t> tokens;  // filled by tokenize_prompts when text is given
  std::optional<std::int64_t> max_tokens;  // the line's own limit of new tokens (else --gen-len)
  std::optional<serving::RequestedConstraint> constraint;  // structured output (response_format, guided_*)
};

// The largest max_tokens a prompts line may ask for (a model's positions bound it further).
constexpr std::int64_t kMaxTokensPerLine = std::int64_t{1} << 24;
// The longest line read_prompts_jsonl takes: far beyond any model's context in text.
constexpr std::size_t kMaxPromptLineBytes = std::size_t{256} << 20;
// More bytes of text than any tokenizer puts in one token (the longest vocab entries are runs
// of spaces or '=' of a few dozen bytes): a text longer than this times the context cannot fit.
constexpr std::int64_t kMaxBytesPerToken = 1024;

// Throws naming the file, line and field on malformed input, and both lines of a repeated id.
// Reads a regular file or a pipe, lines of at most kMaxPromptLineBytes.
std::vector<PromptItem> read_prompts_jsonl(const std::string& path);
// The ids the model takes for a text: with the tokenizer's own special tokens where it decides
// them (tokenizer.json's post-processor, as Hugging Face and vLLM encode; llama2.c's BOS);
// otherwise (GPT-2's vocab.json + merges.txt) the model config's BOS id first, when it has one
// (-1: none).
std::vector<std::int32_t> encode_prompt(const Tokenizer& tok, std::string_view text, std::int32_t config_bos_id);
// Encodes every text prompt with encode_prompt. Needs a tokenizer when any prompt is text.
// A prompt longer than `context` positions is an error; a text too long for any tokenizer to
// fit in them is refused before it is encoded (encoding megabytes takes seconds and gigabytes).
void tokenize_prompts(std::vector<PromptItem>& items, const Tokenizer* tok, std::int32_t config_bos_id,
                      const std::string& model_name, std::int64_t context);

// `count` deterministic prompts of `len` token ids below `vocab`, different per prompt: the
// fixed workload the benchmarks compare systems and policies on.
std::vector<std::vector<std::int32_t>> synthetic_prompts(std::int64_t count, std::int64_t len, std::int64_t vocab);

}  // namespace flexh2o::engine
