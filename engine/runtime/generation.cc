#include "engine/runtime/generation.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/model/rope_scaling.h"
#include "kernels/option_error.h"

namespace flexh2o::engine {

void check_prompts(const ModelConfig& cfg, std::span<const std::vector<std::int32_t>> prompts,
                   std::int64_t max_new_tokens, std::span<const std::string> names) {
  if (max_new_tokens < 1) throw kernels::OptionError{kernels::Option::GenLen, " must be at least 1"};
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const auto& p = prompts[i];
    const std::string which = "prompt " + (i < names.size() ? names[i] : std::to_string(i));
    if (p.empty()) throw std::invalid_argument(which + " has no tokens");
    for (auto t : p)
      if (t < 0 || t >= cfg.vocab_size)
        throw std::invalid_argument(which + " holds token id " + std::to_string(t) + " outside the vocabulary [0, " +
                                    std::to_string(cfg.vocab_size) + ")");
    const auto need = static_cast<std::int64_t>(p.size()) + max_new_tokens;
    if (need > cfg.position_limit())
      throw kernels::OptionError{which + " has " + std::to_string(p.size()) + " tokens; with " +
                                     std::to_string(max_new_tokens) + " new tokens it needs " + std::to_string(need) +
                                     " positions but the model has " + std::to_string(cfg.position_limit()) +
                                     "; shorten the prompt or lower ",
                                 kernels::Option::GenLen};
  }
}

void check_kv_policy_fits(const ModelConfig& cfg, std::int64_t tokens) {
  for (std::int64_t l = 0; l < cfg.n_layers; ++l)
    if (cfg.window(l) > 0 && cfg.window(l) < tokens)
      throw kernels::OptionError{"KV eviction on a model with a sliding window of " + std::to_string(cfg.window(l)) +
                                     " tokens (layer " + std::to_string(l) + ") over sequences of up to " +
                                     std::to_string(tokens) + " tokens is not supported; use ",
                                 kernels::Option::KvPolicy, " full or shorter runs"};
  if (cfg.rope.reprefill_on_long && tokens > cfg.rope.original_max_positions)
    throw kernels::OptionError{"KV eviction on a LongRoPE model that re-prefills sequences growing past " +
                                   std::to_string(cfg.rope.original_max_positions) +
                                   " tokens (Phi-3) is not supported; use ",
                               kernels::Option::KvPolicy, " full or shorter runs"};
}

double GenerationResult::prefill_throughput() const {
  return static_cast<double>(prompt_tokens) / std::max(prefill_seconds, 1e-9);
}
double GenerationResult::decode_throughput() const {
  return static_cast<double>(decode_tokens) / std::max(decode_seconds, 1e-9);
}
double GenerationResult::total_throughput() const {
  return static_cast<double>(generated_tokens) / std::max(prefill_seconds + decode_seconds, 1e-9);
}
void GenerationResult::add(const GenerationResult& r) {
  prefill_seconds += r.prefill_seconds;
  decode_seconds += r.decode_seconds;
  prefill_steps += r.prefill_steps;
  decode_tokens += r.decode_tokens;
  prompt_tokens += r.prompt_tokens;
  prompt_tokens_computed += r.prompt_tokens_computed;
  prefix_hits += r.prefix_hits;
  prefix_shared_tokens += r.prefix_shared_tokens;
  generated_tokens += r.generated_tokens;
  decode_steps += r.decode_steps;
  sequences += r.sequences;
  sequence_steps += r.sequence_steps;
}

double GenerationResult::slot_utilisation() const {
  return sequence_steps > 0 ? static_cast<double>(generated_tokens) / static_cast<double>(sequence_steps) : 0;
}

GenerationResult GenerationResult::sequence(std::size_t b) const {
  GenerationResult one;
  one.tokens = {tokens[b]};
  one.finish_reasons = {finish_reasons[b]};
  if (b < errors.size()) one.errors = {errors[b]};
  if (!logprobs.empty()) {
    one.logprobs = {logprobs[b]};
    one.top_logprobs = {top_logprobs[b]};
  }
  one.generated_tokens = static_cast<std::int64_t>(tokens[b].size());
  one.sequences = 1;
  return one;
}

std::int64_t new_tokens_limit(const GenerationRequest& req, std::size_t b) {
  return req.sequences[b].max_new_tokens.value_or(req.max_new_tokens);
}

const kernels::SamplingParams& sampling_of(const GenerationRequest& req, std::size_t b) {
  const auto& own = req.sequences[b].sampling;
  return own ? *own : req.sampling;
}

std::int64_t sequence_tokens(const GenerationRequest& req, std::size_t b) {
  const Sequence& s = req.sequences[b];
  return static_cast<std::int64_t>(s.prompt.size()) +
         (s.forced.empty() ? new_tokens_limit(req, b) : static_cast<std::int64_t>(s.forced.size()));
}

std::int64_t longest_prompt(const GenerationRequest& req) {
  std::int64_t most = 0;
  for (const Sequence& s : req.sequences) most = std::max<std::int64_t>(most, static_cast<std::int64_t>(s.prompt.size()));
  return most;
}

}  // namespace flexh2o::engine
