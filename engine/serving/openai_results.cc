#include "engine/serving/openai_results.h"

#include <fmt/format.h>

#include <cmath>

namespace flexh2o::serving {

namespace {

using Json = nlohmann::ordered_json;

// OpenAI's log-probability of a token that cannot be drawn (JSON has no -inf).
constexpr float kImpossibleLogprob = -9999.0f;

// Ids derived from the key, so that a rerun writes the same lines. A line keyed by its number
// says so in its id (openai_result_key reads it back).
std::string result_id(const OpenAiLine& r) {
  if (r.key.starts_with("line ")) return "batch_req_line_" + r.key.substr(5);
  return fmt::format("batch_req_{:016x}", stable_hash(r.key));
}

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n"; }

float finite_logprob(float lp) { return std::isfinite(lp) ? lp : kImpossibleLogprob; }

std::string token_text(const ResultContext& ctx, std::int32_t t) {
  if (!ctx.tok) return std::to_string(t);
  return ctx.tok->decode(std::span(&t, 1), false);
}

Json utf8_bytes(const std::string& s) {
  Json b = Json::array();
  for (const char c : s) b.push_back(static_cast<unsigned char>(c));
  return b;
}

Json chat_logprobs(const ChoiceOutcome& c, const ResultContext& ctx) {
  Json content = Json::array();
  for (std::size_t i = 0; i < c.tokens.size() && i < c.logprobs.size(); ++i) {
    const std::string text = token_text(ctx, c.tokens[i]);
    Json top = Json::array();
    for (const kernels::TokenLogprob& t : c.top_logprobs[i]) {
      const std::string alt = token_text(ctx, t.token);
      top.push_back({{"token", alt}, {"logprob", finite_logprob(t.logprob)}, {"bytes", utf8_bytes(alt)}});
    }
    content.push_back({{"token", text}, {"logprob", finite_logprob(c.logprobs[i])}, {"bytes", utf8_bytes(text)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

Json completion_logprobs(const ChoiceOutcome& c, const ResultContext& ctx) {
  Json tokens = Json::array(), lps = Json::array(), tops = Json::array(), offsets = Json::array();
  std::size_t offset = 0;
  for (std::size_t i = 0; i < c.tokens.size() && i < c.logprobs.size(); ++i) {
    const std::string text = token_text(ctx, c.tokens[i]);
    tokens.push_back(text);
    lps.push_back(finite_logprob(c.logprobs[i]));
    Json top = Json::object();
    for (const kernels::TokenLogprob& t : c.top_logprobs[i]) top[token_text(ctx, t.token)] = finite_logprob(t.logprob);
    tops.push_back(top);
    offsets.push_back(offset);
    offset += text.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

Json choice_json(const OpenAiLine& r, std::size_t index, const ChoiceOutcome& c, std::span<const std::int32_t> prompt,
                 const ResultContext& ctx) {
  std::string text = ctx.tok ? Continuation(*ctx.tok, prompt).text(c.tokens) : std::string();
  const std::size_t stop_at = stop_position(text, r.stop);
  const bool stopped = stop_at != std::string::npos || c.finish == engine::FinishReason::Stop;
  if (stop_at != std::string::npos) text.resize(stop_at);  // OpenAI leaves the stop string out
  Json j = {{"index", index}};
  const bool logprobs = r.sampling.logprobs >= 0;
  if (r.endpoint == Endpoint::Chat) {
    j["message"] = {{"role", "assistant"}, {"content", text}};
    j["logprobs"] = logprobs ? chat_logprobs(c, ctx) : Json();
  } else {
    j["text"] = text;
    j["logprobs"] = logprobs ? completion_logprobs(c, ctx) : Json();
  }
  j["finish_reason"] = stopped ? "stop" : "length";
  return j;
}

}  // namespace

std::uint64_t stable_hash(std::string_view s) {  // FNV-1a
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

Continuation::Continuation(const engine::Tokenizer& tok, std::span<const std::int32_t> prompt)
    : tok_(tok), prompt_(prompt.begin(), prompt.end()), prompt_bytes_(tok.decode(prompt).size()) {}

std::string Continuation::text(std::span<const std::int32_t> generated) const {
  std::vector<std::int32_t> all = prompt_;
  all.insert(all.end(), generated.begin(), generated.end());
  return tok_.decode(all).substr(prompt_bytes_);
}

std::size_t stop_position(std::string_view text, std::span<const std::string> stop) {
  std::size_t first = std::string::npos;
  for (const std::string& s : stop) first = std::min(first, text.find(s));
  return first;
}

std::string openai_result_line(const OpenAiLine& r, std::span<const std::int32_t> prompt,
                               std::span<const ChoiceOutcome> choices, const ResultContext& ctx) {
  Json list = Json::array();
  std::int64_t completion_tokens = 0;
  for (std::size_t i = 0; i < choices.size(); ++i) {
    list.push_back(choice_json(r, i, choices[i], prompt, ctx));
    completion_tokens += static_cast<std::int64_t>(choices[i].tokens.size());
  }
  const std::uint64_t h = stable_hash(r.key);
  const bool chat = r.endpoint == Endpoint::Chat;
  const auto prompt_tokens = static_cast<std::int64_t>(prompt.size());
  const Json body = {{"id", fmt::format("{}-{:016x}", chat ? "chatcmpl" : "cmpl", h)},
                     {"object", chat ? "chat.completion" : "text_completion"},
                     {"created", ctx.created},
                     {"model", r.model.empty() ? ctx.model : r.model},
                     {"choices", list},
                     {"usage",
                      {{"prompt_tokens", prompt_tokens},
                       {"completion_tokens", completion_tokens},
                       {"total_tokens", prompt_tokens + completion_tokens}}}};
  const Json line = {{"id", result_id(r)},
                     {"custom_id", r.custom_id},
                     {"response", {{"status_code", 200}, {"request_id", fmt::format("{:016x}", h)}, {"body", body}}},
                     {"error", nullptr}};
  return dump(line);
}

namespace {

// {"response": null, "error": {"code", "message": "line N: ...", "param" when given}}.
std::string error_result(const OpenAiLine& r, const char* code, const std::string& message, const std::string& param) {
  Json error = {{"code", code}, {"message", "line " + std::to_string(r.line) + ": " + message}};
  if (!param.empty()) error["param"] = param;
  return dump({{"id", result_id(r)}, {"custom_id", r.custom_id}, {"response", nullptr}, {"error", error}});
}

}  // namespace

std::string openai_error_line(const OpenAiLine& r) { return error_result(r, "invalid_request", r.error, r.error_param); }

std::string openai_failed_line(const OpenAiLine& r, const std::string& message) {
  return error_result(r, "generation_failed", message, "");
}

std::optional<std::string> openai_result_key(const std::string& line) {
  // Looked up, never echoed: a std::map object (ordered_json's would parse in quadratic time).
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("id") || !j["id"].is_string() || !j.contains("custom_id") ||
      !j.contains("response") || !j.contains("error"))
    return std::nullopt;
  const std::string id = j["id"].get<std::string>();
  if (id.starts_with("batch_req_line_")) return "line " + id.substr(15);
  if (!j["custom_id"].is_string()) return std::nullopt;
  return j["custom_id"].dump();
}

}  // namespace flexh2o::serving
