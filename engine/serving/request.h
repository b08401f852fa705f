// One request of a batch job, as the job runner schedules it: its prompt, its own limit of new
// tokens (a prompts line's max_tokens, else --gen-len) and its sampling.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/grammar/constraint.h"
#include "engine/model/model_config.h"
#include "kernels/sampling.h"
#include "policy/gen_len.h"

namespace flexh2o::serving {

struct Request {
  std::string id_json;               // the id exactly as given (a JSON number or string), echoed in its result
  std::optional<std::string> text;   // the prompt as text, when given so (printed before the continuation)
  std::vector<std::int32_t> prompt;  // token ids, non-empty
  std::int64_t max_tokens = policy::kDefaultGenLen;      // new tokens at most (fewer when a stop id comes first)
  kernels::SamplingParams sampling;  // its own (a block may mix requests of different sampling)
  // The sampling stream: the request's position in the whole job, so that a resumed job (or a
  // rank given a share of it) samples what the uninterrupted one-process job would.
  std::uint64_t stream = 0;
  // OpenAI batch requests: the line (index into the job's lines) and which of its n choices
  // this is, and the stop strings that end it.
  std::size_t source = 0;
  std::int64_t choice = 0;
  std::vector<std::string> stop;
  // Structured output (response_format, guided_*): the constraint as given; compiled on the
  // rank that runs the request (serving::JobConstraints).
  std::optional<grammar::Constraint> constraint;
};

// The longest prompt in tokens (0 for none).
std::int64_t longest_prompt(std::span<const Request> requests);
// The largest max_tokens (`none` for no request): what the planner sizes the KV cache for.
std::int64_t longest_limit(std::span<const Request> requests, std::int64_t none);

// Throws naming the request when its prompt is empty, holds an id outside the vocabulary, or
// with its max_tokens exceeds the model's positions (before any weight loads).
void check_requests(const engine::ModelConfig& cfg, std::span<const Request> requests);

// How a request travels between ranks (every field).
nlohmann::json to_json(const Request& r);
Request request_from_json(const nlohmann::json& j);
nlohmann::json to_json(const kernels::SamplingParams& p);
kernels::SamplingParams sampling_from_json(const nlohmann::json& j);

}  // namespace flexh2o::serving
