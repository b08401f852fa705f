#include "engine/serving/openai_job.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "engine/serving/prompts.h"
#include "engine/runtime/generator.h"
#include "kernels/hash.h"

namespace flexh2o::serving {

namespace {

// A field of a well-formed line that the model bounds.
struct FieldError : std::invalid_argument {
  FieldError(std::string field, const std::string& message)
      : std::invalid_argument(message), param(std::move(field)) {}
  std::string param;
};

// Bounds the model sets (docs/batch-jobs.md), checked before a chat template renders anything:
// every message takes at least a position, and a logit_bias (each token once) or a list of
// stop ids longer than the vocabulary names a token outside it or one twice.
void check_sizes(const OpenAiLine& r, const engine::ModelConfig& cfg) {
  const auto at_most = [](const char* field, std::size_t n, std::int64_t bound, const std::string& of) {
    if (static_cast<std::int64_t>(n) > bound)
      throw FieldError(field, "body." + std::string(field) + " has " + std::to_string(n) + " entries, more than the " +
                                  std::to_string(bound) + " " + of);
  };
  at_most("messages", r.messages.size(), cfg.position_limit(), "positions of the model");
  at_most("logit_bias", r.sampling.logit_bias.size(), cfg.vocab_size, "tokens of the model's vocabulary");
  at_most("stop_token_ids", r.sampling.stop_token_ids.size(), cfg.vocab_size, "tokens of the model's vocabulary");
}

std::vector<std::int32_t> prompt_of(const OpenAiLine& r, const OpenAiPromptContext& ctx) {
  const engine::ModelConfig& cfg = *ctx.config;
  if (r.endpoint == Endpoint::Chat) {
    if (!ctx.tok) throw std::invalid_argument("model '" + cfg.name + "' has no tokenizer to read chat messages with");
    if (!ctx.render_chat) throw std::invalid_argument("model '" + cfg.name + "' has no chat template");
    // As transformers' apply_chat_template(tokenize=True): the template places the special tokens.
    const std::string text = ctx.render_chat(r.messages);
    if (static_cast<std::int64_t>(text.size()) > cfg.position_limit() * engine::kMaxBytesPerToken)
      throw FieldError("messages", "body.messages make a text of " + std::to_string(text.size()) +
                                       " bytes through the chat template, too long for the model's " +
                                       std::to_string(cfg.position_limit()) + " positions");
    return ctx.tok->encode(text, false);
  }
  if (!r.prompt_text) return r.prompt_tokens;
  if (!ctx.tok)
    throw std::invalid_argument("model '" + cfg.name + "' has no tokenizer; give body.prompt as token ids");
  const auto bytes = static_cast<std::int64_t>(r.prompt_text->size());
  if (bytes > cfg.position_limit() * engine::kMaxBytesPerToken)
    throw std::invalid_argument("body.prompt has " + std::to_string(bytes) + " bytes, too long for the model's " +
                                std::to_string(cfg.position_limit()) + " positions");
  return engine::encode_prompt(*ctx.tok, *r.prompt_text, cfg.bos_id);
}

// Compiles the line's constraint (once per distinct one in the job): a schema keyword, a regex
// construct or a grammar line not supported is the line's error, naming the field.
void check_constraint(const OpenAiLine& r, const OpenAiPromptContext& ctx) {
  if (!r.constraint) return;
  const std::string field = "body." + r.constraint->field;
  if (!ctx.constraints)
    throw FieldError(r.constraint->field, field + ": model '" + ctx.config->name +
                                              "' has no tokenizer, which structured output needs (the tokens' bytes)");
  try {
    ctx.constraints->get(r.constraint->constraint, r.max_tokens.value_or(ctx.gen_len));
  } catch (const std::exception& e) {
    throw FieldError(r.constraint->field, field + ": " + e.what());
  }
}

// The prompt of a good line, checked against the model; throws naming what is wrong.
std::vector<std::int32_t> prepare(const OpenAiLine& r, const OpenAiPromptContext& ctx) {
  check_sizes(r, *ctx.config);
  std::vector<std::int32_t> prompt = prompt_of(r, ctx);
  const std::string name = "of custom_id " + r.key;
  engine::check_prompts(*ctx.config, std::span(&prompt, 1), r.max_tokens.value_or(ctx.gen_len), std::span(&name, 1));
  kernels::check_sampling_params(r.sampling, ctx.config->vocab_size);
  check_constraint(r, ctx);
  return prompt;
}

}  // namespace

OpenAiJob open_openai_job(const std::string& path, const OpenAiPromptContext& ctx) {
  return open_openai_job(read_openai_batch(path), ctx);
}

OpenAiJob open_openai_job(std::vector<OpenAiLine> lines, const OpenAiPromptContext& ctx) {
  OpenAiJob job;
  job.lines = std::move(lines);
  job.prompts.resize(job.lines.size());
  for (std::size_t i = 0; i < job.lines.size(); ++i) {
    OpenAiLine& r = job.lines[i];
    if (!r.error.empty()) continue;
    try {
      job.prompts[i] = prepare(r, ctx);
    } catch (const FieldError& e) {
      r.error = e.what();
      r.error_param = e.param;
      continue;
    } catch (const std::exception& e) {  // the chat template's errors, a prompt too long, ...
      r.error = e.what();
      continue;
    }
    for (std::int64_t c = 0; c < r.n; ++c) {
      Request q;
      q.id_json = r.key;
      q.prompt = job.prompts[i];
      q.max_tokens = r.max_tokens.value_or(ctx.gen_len);
      q.sampling = r.sampling;
      // OpenAI: the same seed and parameters give the same result, wherever the request is
      // in the file; without a seed, each request draws its own (from the job's --seed).
      if (!r.seeded) q.sampling.seed = ctx.default_seed;
      q.stream = r.seeded ? static_cast<std::uint64_t>(c) : kernels::splitmix64(stable_hash(r.key)) + static_cast<std::uint64_t>(c);
      q.source = i;
      q.choice = c;
      q.stop = r.stop;
      if (r.constraint) q.constraint = r.constraint->constraint;
      job.requests.push_back(std::move(q));
    }
  }
  return job;
}

std::vector<FinishedLine> OpenAiCollector::add(std::span<const Request> block, const engine::GenerationResult& r) {
  std::vector<FinishedLine> lines;
  for (std::size_t b = 0; b < block.size(); ++b) {
    const Request& q = block[b];
    const OpenAiLine& line = job_.lines[q.source];
    auto& choices = pending_[q.source];
    choices.resize(static_cast<std::size_t>(line.n));
    ChoiceOutcome c{r.tokens[b], r.finish_reasons[b], {}, {}, b < r.errors.size() ? r.errors[b] : std::string()};
    if (!r.logprobs.empty()) {
      c.logprobs = r.logprobs[b];
      c.top_logprobs = r.top_logprobs[b];
    }
    choices[static_cast<std::size_t>(q.choice)] = std::move(c);
    if (std::any_of(choices.begin(), choices.end(), [](const auto& o) { return !o.has_value(); })) continue;
    FinishedLine done{.index = q.source};
    for (auto& o : choices) done.choices.push_back(std::move(*o));
    const auto failed = std::ranges::find(done.choices, engine::FinishReason::Error, &ChoiceOutcome::finish);
    done.text = failed != done.choices.end() ? openai_failed_line(line, failed->error)
                                             : openai_result_line(line, job_.prompts[q.source], done.choices, ctx_);
    lines.push_back(std::move(done));
    pending_.erase(q.source);
  }
  return lines;
}

}  // namespace flexh2o::serving
