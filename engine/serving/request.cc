#include "engine/serving/request.h"

#include <algorithm>
#include <stdexcept>

#include "engine/serving/structured_output.h"
#include "engine/runtime/generator.h"

namespace flexh2o::serving {

std::int64_t longest_limit(std::span<const Request> requests, std::int64_t none) {
  if (requests.empty()) return none;
  std::int64_t n = 0;
  for (const Request& r : requests) n = std::max(n, r.max_tokens);
  return n;
}

std::int64_t longest_prompt(std::span<const Request> requests) {
  std::size_t n = 0;
  for (const Request& r : requests) n = std::max(n, r.prompt.size());
  return static_cast<std::int64_t>(n);
}

void check_requests(const engine::ModelConfig& cfg, std::span<const Request> requests) {
  for (const Request& r : requests) {
    const std::string name = "id " + r.id_json;
    engine::check_prompts(cfg, std::span(&r.prompt, 1), r.max_tokens, std::span(&name, 1));
  }
}

nlohmann::json to_json(const kernels::SamplingParams& p) {
  nlohmann::json bias = nlohmann::json::array();
  for (const kernels::LogitBias& b : p.logit_bias) bias.push_back({b.token, b.bias});
  return {{"temperature", p.temperature},
          {"top_p", p.top_p},
          {"top_k", p.top_k},
          {"min_p", p.min_p},
          {"seed", p.seed},
          {"repetition_penalty", p.repetition_penalty},
          {"presence_penalty", p.presence_penalty},
          {"frequency_penalty", p.frequency_penalty},
          {"logit_bias", bias},
          {"min_tokens", p.min_tokens},
          {"ignore_eos", p.ignore_eos},
          {"stop_token_ids", p.stop_token_ids},
          {"logprobs", p.logprobs}};
}

kernels::SamplingParams sampling_from_json(const nlohmann::json& j) {
  kernels::SamplingParams p;
  p.temperature = j.at("temperature").get<float>();
  p.top_p = j.at("top_p").get<float>();
  p.top_k = j.at("top_k").get<std::int32_t>();
  p.min_p = j.at("min_p").get<float>();
  p.seed = j.at("seed").get<std::uint64_t>();
  p.repetition_penalty = j.at("repetition_penalty").get<float>();
  p.presence_penalty = j.at("presence_penalty").get<float>();
  p.frequency_penalty = j.at("frequency_penalty").get<float>();
  for (const auto& b : j.at("logit_bias")) p.logit_bias.push_back({b.at(0).get<std::int32_t>(), b.at(1).get<float>()});
  p.min_tokens = j.at("min_tokens").get<std::int64_t>();
  p.ignore_eos = j.at("ignore_eos").get<bool>();
  p.stop_token_ids = j.at("stop_token_ids").get<std::vector<std::int32_t>>();
  p.logprobs = j.at("logprobs").get<std::int32_t>();
  return p;
}

nlohmann::json to_json(const Request& r) {
  return {{"id", r.id_json},
          {"text", r.text ? nlohmann::json(*r.text) : nlohmann::json()},
          {"prompt", r.prompt},
          {"max_tokens", r.max_tokens},
          {"sampling", to_json(r.sampling)},
          {"stream", r.stream},
          {"source", r.source},
          {"choice", r.choice},
          {"stop", r.stop},
          {"constraint", r.constraint ? to_json(*r.constraint) : nlohmann::json()}};
}

Request request_from_json(const nlohmann::json& j) {
  Request r;
  r.id_json = j.at("id").get<std::string>();
  if (j.at("text").is_string()) r.text = j["text"].get<std::string>();
  r.prompt = j.at("prompt").get<std::vector<std::int32_t>>();
  r.max_tokens = j.at("max_tokens").get<std::int64_t>();
  r.sampling = sampling_from_json(j.at("sampling"));
  r.stream = j.at("stream").get<std::uint64_t>();
  r.source = j.at("source").get<std::size_t>();
  r.choice = j.at("choice").get<std::int64_t>();
  r.stop = j.at("stop").get<std::vector<std::string>>();
  if (!j.at("constraint").is_null()) r.constraint = constraint_from_json(j["constraint"]);
  return r;
}

}  // namespace flexh2o::serving
