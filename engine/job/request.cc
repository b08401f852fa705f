#include "engine/job/request.h"

#include <algorithm>
#include <stdexcept>

#include "engine/runtime/generator.h"

namespace flexh2o::job {

kernels::SamplingParams shared_sampling(std::span<const Request> block) {
  if (block.empty()) throw std::logic_error("shared_sampling: an empty block");
  const Request& first = block.front();
  for (const Request& r : block) {
    const bool same = r.sampling.temperature == first.sampling.temperature &&
                      r.sampling.top_p == first.sampling.top_p && r.sampling.seed == first.sampling.seed;
    if (!same)
      throw std::logic_error("requests " + first.id_json + " and " + r.id_json +
                             " differ in sampling, but a block samples all its requests with one setting");
  }
  return first.sampling;
}

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

nlohmann::json to_json(const Request& r) {
  return {{"id", r.id_json},
          {"text", r.text ? nlohmann::json(*r.text) : nlohmann::json()},
          {"prompt", r.prompt},
          {"max_tokens", r.max_tokens},
          {"temperature", r.sampling.temperature},
          {"top_p", r.sampling.top_p},
          {"seed", r.sampling.seed},
          {"stream", r.stream}};
}

Request request_from_json(const nlohmann::json& j) {
  Request r;
  r.id_json = j.at("id").get<std::string>();
  if (j.at("text").is_string()) r.text = j["text"].get<std::string>();
  r.prompt = j.at("prompt").get<std::vector<std::int32_t>>();
  r.max_tokens = j.at("max_tokens").get<std::int64_t>();
  r.sampling = {j.at("temperature").get<float>(), j.at("top_p").get<float>(), j.at("seed").get<std::uint64_t>()};
  r.stream = j.at("stream").get<std::uint64_t>();
  return r;
}

}  // namespace flexh2o::job
