#include "engine/serving/openai_batch.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <stdexcept>

#include "engine/serving/line_reader.h"
#include "engine/serving/linear_json.h"
#include "engine/serving/prompts.h"
#include "engine/io/json_input.h"

namespace flexh2o::serving {

namespace {

using Json = nlohmann::ordered_json;

// A bad line: the message, and the body field it is about.
struct LineError {
  std::string message;
  std::string param;
};

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw LineError{message, param}; }

// The body fields each endpoint takes; anything else is an error naming it.
const std::vector<std::string> kSamplingFields = {
    "model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "presence_penalty", "frequency_penalty",
    "logit_bias", "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids", "stream", "user"};

bool takes(Endpoint e, const std::string& field) {
  if (std::find(kSamplingFields.begin(), kSamplingFields.end(), field) != kSamplingFields.end()) return true;
  if (std::find(kStructuredOutputFields.begin(), kStructuredOutputFields.end(), field) != kStructuredOutputFields.end())
    return true;
  if (e == Endpoint::Chat)
    return field == "messages" || field == "max_completion_tokens" || field == "logprobs" || field == "top_logprobs";
  return field == "prompt" || field == "logprobs";
}

double number(const Json& body, const std::string& field, double lo, double hi) {
  const Json& v = body[field];
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < lo || v.get<double>() > hi)
    bad(field, "body." + field + " must be a number in [" + engine::json_excerpt(Json(lo)) + ", " +
                   engine::json_excerpt(Json(hi)) + "], got " + engine::json_excerpt(v));
  return v.get<double>();
}

std::int64_t integer(const Json& body, const std::string& field, std::int64_t lo, std::int64_t hi) {
  const Json& v = body[field];
  if (!v.is_number_integer() || v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi)
    bad(field, "body." + field + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                   "], got " + engine::json_excerpt(v));
  return v.get<std::int64_t>();
}

bool boolean(const Json& body, const std::string& field) {
  if (!body[field].is_boolean()) bad(field, "body." + field + " must be true or false");
  return body[field].get<bool>();
}

std::vector<std::int32_t> token_ids(const Json& v, const std::string& field) {
  if (!v.is_array()) bad(field, "body." + field + " must be an array of token ids");
  std::vector<std::int32_t> ids;
  for (const Json& t : v) {
    if (!t.is_number_integer() || t.get<std::int64_t>() < 0 || t.get<std::int64_t>() > INT32_MAX)
      bad(field, "body." + field + " must hold non-negative integer token ids");
    ids.push_back(t.get<std::int32_t>());
  }
  return ids;
}

std::vector<std::string> stop_strings(const Json& v) {
  std::vector<std::string> stop;
  if (v.is_array() && v.size() > kMaxStopStrings)
    bad("stop", "body.stop holds " + std::to_string(v.size()) + " strings; at most " +
                    std::to_string(kMaxStopStrings) + " (as OpenAI's API)");
  if (v.is_string()) stop.push_back(v.get<std::string>());
  else if (v.is_array())
    for (const Json& s : v) {
      if (!s.is_string()) bad("stop", "body.stop must be a string or an array of strings");
      stop.push_back(s.get<std::string>());
    }
  else if (!v.is_null())
    bad("stop", "body.stop must be a string or an array of strings");
  for (const std::string& s : stop)
    if (s.empty()) bad("stop", "body.stop holds an empty string, which would end every choice at once");
  return stop;
}

// OpenAI's logit_bias: {"token id": bias in [-100, 100]}, kept sorted by token.
std::vector<kernels::LogitBias> logit_bias(const Json& v) {
  if (!v.is_object()) bad("logit_bias", "body.logit_bias must be an object of \"token id\": bias");
  std::vector<kernels::LogitBias> out;
  for (const auto& [key, bias] : v.items()) {
    std::size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != key.size() || id < 0 || id > INT32_MAX)
      bad("logit_bias", "body.logit_bias key \"" + engine::bounded_excerpt(key, 40) + "\" is not a token id");
    if (!bias.is_number() || !std::isfinite(bias.get<double>()) || std::abs(bias.get<double>()) > 100.0)
      bad("logit_bias", "body.logit_bias values must be numbers in [-100, 100]");
    out.push_back({static_cast<std::int32_t>(id), bias.get<float>()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.token < b.token; });
  for (std::size_t i = 1; i < out.size(); ++i)
    if (out[i].token == out[i - 1].token) bad("logit_bias", "body.logit_bias names token " + std::to_string(out[i].token) + " twice");
  return out;
}

// `ids`: body.prompt's token ids, read aside (parse_openai_line).
void read_prompt(const Json& body, IdArray& ids, OpenAiLine& r) {
  if (r.endpoint == Endpoint::Chat) {
    if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
      bad("messages", "body.messages must be a non-empty array of messages");
    for (const Json& m : body["messages"])
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        bad("messages", "every message must be an object with a string \"role\"");
    r.messages = body["messages"];
    return;
  }
  if (!body.contains("prompt")) bad("prompt", "body.prompt is missing (a text or an array of token ids)");
  const Json& p = body["prompt"];
  if (p.is_string()) r.prompt_text = p.get<std::string>();
  else if (p.is_array() && !ids.ids.empty() && p.empty()) r.prompt_tokens = std::move(ids.ids);
  else if (p.is_array() && (!ids.ids.empty() || (!p.empty() && p[0].is_number_integer())))
    bad("prompt", "body.prompt must hold non-negative integer token ids");
  else if (p.is_array() && p.size() == 1 && p[0].is_string()) r.prompt_text = p[0].get<std::string>();
  else
    bad("prompt", "body.prompt must be a text or an array of token ids; several prompts in one request are not "
                  "supported (give each its own line)");
}

void read_limits(const Json& body, OpenAiLine& r) {
  if (body.contains("max_tokens") && body.contains("max_completion_tokens"))
    bad("max_completion_tokens", "body has both max_tokens and max_completion_tokens; give one");
  for (const char* f : {"max_tokens", "max_completion_tokens"})
    if (body.contains(f) && !body[f].is_null()) r.max_tokens = integer(body, f, 1, engine::kMaxTokensPerLine);
  if (body.contains("n")) r.n = integer(body, "n", 1, kMaxChoices);
  if (body.contains("stop")) r.stop = stop_strings(body["stop"]);
  if (body.contains("stream") && (!body["stream"].is_boolean() || body["stream"].get<bool>()))
    bad("stream", "body.stream must be false: a batch job writes whole results");
  if (body.contains("user") && !body["user"].is_string()) bad("user", "body.user must be a string");
  if (body.contains("model")) {
    if (!body["model"].is_string()) bad("model", "body.model must be a string");
    r.model = body["model"].get<std::string>();
  }
}

void read_logprobs(const Json& body, OpenAiLine& r) {
  kernels::SamplingParams& p = r.sampling;
  if (r.endpoint == Endpoint::Completion) {
    if (body.contains("logprobs") && !body["logprobs"].is_null())
      p.logprobs = static_cast<std::int32_t>(integer(body, "logprobs", 0, 20));
    return;
  }
  const bool wanted = body.contains("logprobs") && !body["logprobs"].is_null() && boolean(body, "logprobs");
  if (body.contains("top_logprobs") && !body["top_logprobs"].is_null()) {
    if (!wanted) bad("top_logprobs", "body.top_logprobs needs body.logprobs true");
    p.logprobs = static_cast<std::int32_t>(integer(body, "top_logprobs", 0, 20));
  } else if (wanted) {
    p.logprobs = 0;
  }
}

void read_sampling(const Json& body, OpenAiLine& r) {
  kernels::SamplingParams& p = r.sampling;
  p.temperature = 1.0f;  // OpenAI's default
  const auto given = [&](const char* f) { return body.contains(f) && !body[f].is_null(); };
  if (given("temperature")) p.temperature = static_cast<float>(number(body, "temperature", 0.0, 2.0));
  if (given("top_p")) {
    p.top_p = static_cast<float>(number(body, "top_p", 0.0, 1.0));
    if (p.top_p <= 0.0f) bad("top_p", "body.top_p must be > 0");
  }
  if (given("seed")) {
    const Json& s = body["seed"];
    if (!s.is_number_integer()) bad("seed", "body.seed must be an integer");
    p.seed = s.is_number_unsigned() ? s.get<std::uint64_t>() : static_cast<std::uint64_t>(s.get<std::int64_t>());
    r.seeded = true;
  }
  if (given("presence_penalty")) p.presence_penalty = static_cast<float>(number(body, "presence_penalty", -2.0, 2.0));
  if (given("frequency_penalty"))
    p.frequency_penalty = static_cast<float>(number(body, "frequency_penalty", -2.0, 2.0));
  if (given("logit_bias")) p.logit_bias = logit_bias(body["logit_bias"]);
  if (given("top_k")) {  // vLLM: -1 or 0 is off
    const std::int64_t k = integer(body, "top_k", -1, INT32_MAX);
    p.top_k = static_cast<std::int32_t>(std::max<std::int64_t>(k, 0));
  }
  if (given("min_p")) p.min_p = static_cast<float>(number(body, "min_p", 0.0, 1.0));
  if (given("repetition_penalty")) {
    p.repetition_penalty = static_cast<float>(number(body, "repetition_penalty", 0.0, 1e6));
    if (p.repetition_penalty <= 0.0f) bad("repetition_penalty", "body.repetition_penalty must be > 0");
  }
  if (given("min_tokens")) p.min_tokens = integer(body, "min_tokens", 0, engine::kMaxTokensPerLine);
  if (given("ignore_eos")) p.ignore_eos = boolean(body, "ignore_eos");
  if (given("stop_token_ids")) p.stop_token_ids = token_ids(body["stop_token_ids"], "stop_token_ids");
  read_logprobs(body, r);
}

Endpoint endpoint_of(const Json& j) {
  if (!j.contains("url") || !j["url"].is_string()) bad("url", "\"url\" is missing or not a string");
  const std::string url = j["url"].get<std::string>();
  if (url == "/v1/chat/completions") return Endpoint::Chat;
  if (url == "/v1/completions") return Endpoint::Completion;
  bad("url", "unknown url \"" + engine::bounded_excerpt(url, 60) +
                 "\"; this engine serves /v1/chat/completions and /v1/completions");
}

void read_line(const Json& j, IdArray& prompt_ids, OpenAiLine& r) {
  if (!j.is_object()) bad("", "a line must be an object {\"custom_id\", \"method\", \"url\", \"body\"}");
  if (!j.contains("custom_id") || !j["custom_id"].is_string())
    bad("custom_id", "\"custom_id\" is missing or not a string");
  r.custom_id = j["custom_id"];
  r.key = r.custom_id.dump();
  for (const auto& [key, value] : j.items())
    if (key != "custom_id" && key != "method" && key != "url" && key != "body")
      bad(key, "unknown field \"" + engine::bounded_excerpt(key, 64) + "\"; a line holds custom_id, method, url, body");
  if (!j.contains("method") || j["method"] != "POST") bad("method", "\"method\" must be \"POST\"");
  r.endpoint = endpoint_of(j);
  if (!j.contains("body") || !j["body"].is_object()) bad("body", "\"body\" is missing or not an object");
  const Json& body = j["body"];
  for (const auto& [key, value] : body.items())
    if (!takes(r.endpoint, key))
      bad(key, "body field \"" + engine::bounded_excerpt(key, 64) + "\" is not implemented for " +
                   j["url"].get<std::string>() + " (docs/batch-jobs.md lists the fields taken)");
  read_prompt(body, prompt_ids, r);
  read_limits(body, r);
  read_sampling(body, r);
  try {
    r.constraint = read_structured_output(body, "body.");
  } catch (const StructuredOutputError& e) {
    bad(e.field, e.what());
  }
}

}  // namespace

OpenAiLine parse_openai_line(const std::string& text, std::int64_t line) {
  OpenAiLine r;
  r.line = line;
  r.key = "line " + std::to_string(line);
  try {
    IdArray prompt_ids{.path = {"body", "prompt"}};
    const Json j = parse_linear_json(text, "the line", &prompt_ids);
    read_line(j, prompt_ids, r);
  } catch (const LineError& e) {
    r.error = e.message;
    r.error_param = e.param;
  } catch (const std::runtime_error& e) {  // not valid JSON, too deep
    r.error = e.what();
  }
  return r;
}

bool is_openai_batch_file(const std::string& path) {
  engine::LineReader in(path, engine::kMaxPromptLineBytes);
  std::string line;
  while (in.next(line))
    if (const std::optional<bool> has_custom_id = object_has_key(line, "custom_id")) return *has_custom_id;
  return false;
}

namespace {

// Numbers and parses each non-blank line that `next` gives; a custom_id repeated is an error on
// the later line.
std::vector<OpenAiLine> read_lines(const std::function<bool(std::string&)>& next) {
  std::vector<OpenAiLine> lines;
  std::map<std::string, std::int64_t> line_of_key;
  std::string text;
  for (std::int64_t n = 1; next(text); ++n) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    OpenAiLine r = parse_openai_line(text, n);
    if (const auto [it, fresh] = line_of_key.emplace(r.key, n); !fresh && r.error.empty()) {
      r.error = "custom_id " + engine::bounded_excerpt(r.key, 80) + " was already used on line " +
                std::to_string(it->second) + "; custom_ids must be unique (results and --resume go by them)";
      r.error_param = "custom_id";
      r.key = "line " + std::to_string(n);
    }
    lines.push_back(std::move(r));
  }
  return lines;
}

}  // namespace

std::vector<OpenAiLine> read_openai_batch(const std::string& path) {
  engine::LineReader in(path, engine::kMaxPromptLineBytes);
  return read_lines([&](std::string& text) {
    if (!in.next(text)) return false;
    in.count_line();
    return true;
  });
}

std::vector<OpenAiLine> read_openai_batch(std::span<const std::string> texts) {
  std::size_t i = 0;
  return read_lines([&](std::string& text) {
    if (i == texts.size()) return false;
    text = texts[i++];
    return true;
  });
}

}  // namespace flexh2o::serving
