// OpenAI batch result lines: {"id", "custom_id", "response": {"status_code", "request_id",
// "body"}, "error"}, the body a chat.completion or text_completion as OpenAI's API returns it
// (choices with finish_reason and logprobs, usage, model, created). A bad request line gets
// {"response": null, "error": {"code", "message"}}.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/serving/openai_batch.h"
#include "engine/runtime/generator.h"
#include "engine/tokenizer/tokenizer.h"

namespace flexh2o::serving {

// How deep a result line nests (line, response, body, choices, choice, logprobs, content,
// entry, top_logprobs, alternative): deeper text is no result line.
constexpr int kOpenAiResultDepth = 10;

// A hash of text that is the same on every build (ids and sampling streams derive from it).
std::uint64_t stable_hash(std::string_view s);

// What one choice generated.
struct ChoiceOutcome {
  std::vector<std::int32_t> tokens;
  engine::FinishReason finish = engine::FinishReason::Length;
  std::vector<float> logprobs;  // per token, when asked
  std::vector<std::vector<kernels::TokenLogprob>> top_logprobs;
  std::string error;  // finish == Error: why
};

// The text of tokens generated after `prompt`: decode(prompt + tokens) minus decode(prompt),
// special tokens skipped (the prompt's decode is computed once).
class Continuation {
 public:
  Continuation(const engine::Tokenizer& tok, std::span<const std::int32_t> prompt);
  std::string text(std::span<const std::int32_t> generated) const;

 private:
  const engine::Tokenizer& tok_;
  std::vector<std::int32_t> prompt_;
  std::size_t prompt_bytes_ = 0;
};

// Where the earliest of the stop strings starts in `text` (npos: none occurs).
std::size_t stop_position(std::string_view text, std::span<const std::string> stop);

struct ResultContext {
  const engine::Tokenizer* tok = nullptr;  // null: texts are empty, tokens are shown as ids
  std::string model;                       // the name results give when body.model is absent
  std::int64_t created = 0;                // Unix seconds
};

// The result line (newline included) of request `r` whose prompt was `prompt` and whose n
// choices gave `choices`.
std::string openai_result_line(const OpenAiLine& r, std::span<const std::int32_t> prompt,
                               std::span<const ChoiceOutcome> choices, const ResultContext& ctx);
// The error line of a bad request line.
std::string openai_error_line(const OpenAiLine& r);
// The error line of request `r` whose generation failed with `message` (its constraint).
std::string openai_failed_line(const OpenAiLine& r, const std::string& message);
// The key (OpenAiLine::key) of a result line, or nullopt when `line` is none.
std::optional<std::string> openai_result_key(const std::string& line);

}  // namespace flexh2o::serving
