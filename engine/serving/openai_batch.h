// OpenAI batch files as input: one request a line, {"custom_id", "method": "POST", "url":
// "/v1/chat/completions" | "/v1/completions", "body": {...}} (the OpenAI Batch API's and vLLM
// run-batch's format). A bad line (invalid JSON, an unknown url or field, a value out of range)
// does not stop the job: it is read as a line with an error, which gets an error result line.
// Body fields and their defaults are listed in docs/batch-jobs.md.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/serving/structured_output.h"
#include "kernels/sampling.h"

namespace flexh2o::serving {

enum class Endpoint { Chat, Completion };

// One line of an OpenAI batch file.
struct OpenAiLine {
  std::int64_t line = 0;  // 1-based, in the file
  // The key results and --resume go by: custom_id as compact JSON, or "line N" when the line
  // has no readable custom_id.
  std::string key;
  nlohmann::ordered_json custom_id;  // echoed in the result (null when unreadable)
  std::string error;         // non-empty: the line is bad; this says why
  std::string error_param;   // the body field at fault, when one is
  Endpoint endpoint = Endpoint::Chat;
  std::string model;                          // body.model, echoed
  nlohmann::ordered_json messages;            // chat
  std::optional<std::string> prompt_text;     // completions: a text prompt
  std::vector<std::int32_t> prompt_tokens;    // completions: token ids (or filled by tokenizing)
  std::optional<std::int64_t> max_tokens;     // absent: the job's --gen-len
  kernels::SamplingParams sampling;           // temperature 1 unless given, as OpenAI's
  bool seeded = false;                        // body.seed given: draws depend on it and the choice only
  std::vector<std::string> stop;              // stop strings
  std::int64_t n = 1;                         // choices
  std::optional<RequestedConstraint> constraint;  // structured output (response_format, guided_*)
};

// The most choices one request may ask for (OpenAI's API: n <= 128).
constexpr std::int64_t kMaxChoices = 128;
// The most stop strings one request may give (OpenAI: "up to 4 sequences").
constexpr std::size_t kMaxStopStrings = 4;

// Whether `path` holds OpenAI batch lines: its first line that is a JSON object has a
// "custom_id" (our own format's lines have an "id").
bool is_openai_batch_file(const std::string& path);

// Every non-blank line of the file, bad ones with their error. A custom_id repeated is an
// error on the later line (results and --resume go by custom_id). Throws only when the file
// cannot be read.
std::vector<OpenAiLine> read_openai_batch(const std::string& path);
// The same over lines given in memory (the Python API's requests), numbered from 1.
std::vector<OpenAiLine> read_openai_batch(std::span<const std::string> texts);

// One line parsed (exposed for tests); `line` numbers it in messages.
OpenAiLine parse_openai_line(const std::string& text, std::int64_t line);

}  // namespace flexh2o::serving
