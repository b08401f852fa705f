#include "engine/runtime/generation_log.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "engine/runtime/prefill_fork.h"
#include "kernels/option_error.h"

namespace flexh2o::engine {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

namespace {

// Each sequence's own limit within [1, the request's], then each prompt with its limit
// against the model's positions.
void check_limits(const ModelConfig& cfg, const GenerationRequest& req) {
  for (const Sequence& s : req.sequences)
    if (s.max_new_tokens && (*s.max_new_tokens < 1 || *s.max_new_tokens > req.max_new_tokens))
      throw std::invalid_argument("a prompt's new tokens limit " + std::to_string(*s.max_new_tokens) +
                                  " is outside [1, " + std::to_string(req.max_new_tokens) + "]");
  check_prompts(cfg, {}, req.max_new_tokens);  // the request's limit is at least 1
  for (std::size_t b = 0; b < req.sequences.size(); ++b)
    check_prompts(cfg, std::span(&req.sequences[b].prompt, 1), new_tokens_limit(req, b),
                  std::vector<std::string>{std::to_string(b)});
}

}  // namespace

GenerationLog::GenerationLog(kernels::Backend& be, const ModelConfig& cfg, const GenerationRequest& req,
                             const GenerationHooks& hooks)
    : be_(be), cfg_(cfg), req_(req), hooks_(hooks), start_(now_seconds()), t0_(start_) {
  const std::size_t B = req.sequences.size();
  check_limits(cfg, req);
  for (std::size_t b = 0; b < B; ++b) {
    kernels::check_sampling_params(sampling_of(req, b), cfg.vocab_size);
    logprobs_ = logprobs_ || sampling_of(req, b).logprobs >= 0;
  }
  for (const Sequence& s : req.sequences) {
    max_prompt_ = std::max<std::int64_t>(max_prompt_, static_cast<std::int64_t>(s.prompt.size()));
    res_.prompt_tokens += static_cast<std::int64_t>(s.prompt.size());
  }
  res_.prompt_tokens_computed = res_.prompt_tokens;
  check_shared_prompts(req);
  seqs_.reserve(B);
  for (std::size_t b = 0; b < B; ++b) seqs_.push_back(start_sequence(b));
  if (logprobs_) {
    chosen_logprob_.resize(B);
    top_logprobs_.resize(B);
  }
  res_.sequences = static_cast<std::int64_t>(B);
  active_ = static_cast<std::int64_t>(B);
}

SequenceState GenerationLog::start_sequence(std::size_t b) const {
  const Sequence& s = req_.sequences[b];
  SequenceState state;
  state.sampling = sampling_of(req_, b);
  state.stream = s.stream.value_or(b);
  state.history = s.prompt;
  if (s.constraint) {
    if (!s.forced.empty()) throw std::invalid_argument("a constrained sequence cannot be forced");
    state.constraint = s.constraint->clone();
    try {
      state.constraint->prepare(new_tokens_limit(req_, b));
    } catch (const std::invalid_argument& e) {  // ends at its first token, as in fill_allowed
      state.error = e.what();
    }
  }
  return state;
}

// Rows of unconstrained, finished or failed sequences allow everything (a fixed block samples
// the finished ones and drops their tokens; a failed one ends without its token). A constraint
// that throws (a grammar past what can be followed here) fails its sequence alone.
std::span<const std::uint32_t> GenerationLog::fill_allowed(std::size_t first, std::size_t n) {
  const auto constrained = [&](std::size_t b) {
    return seqs_[b].constraint && !seqs_[b].ended() && seqs_[b].error.empty();
  };
  bool any = false;
  for (std::size_t b = first; b < first + n; ++b) any = any || constrained(b);
  if (!any) return {};
  const auto words = static_cast<std::size_t>(kernels::mask_words(cfg_.vocab_size));
  rows_.allowed.assign(n * words, ~0u);
  for (std::size_t i = 0; i < n; ++i)
    if (constrained(first + i)) {
      SequenceState& s = seqs_[first + i];
      const std::int64_t tokens_left = new_tokens_limit(req_, first + i) - s.generated();
      const auto row = std::span(rows_.allowed).subspan(i * words, words);
      try {
        s.constraint->fill_allowed(row, tokens_left);
      } catch (const std::invalid_argument& e) {
        s.error = e.what();
        std::ranges::fill(row, ~0u);
      }
    }
  return rows_.allowed;
}

kernels::SampleArgs GenerationLog::sample_args(const float* logits, std::size_t first, std::span<std::int32_t> out) {
  const std::size_t n = out.size();
  rows_.params.resize(n);
  rows_.streams.resize(n);
  rows_.steps.resize(n);
  rows_.history.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const SequenceState& s = seqs_[first + i];
    rows_.params[i] = s.sampling;
    rows_.streams[i] = s.stream;
    rows_.steps[i] = static_cast<std::uint64_t>(s.generated());
    rows_.history[i] = s.history;
  }
  kernels::SampleArgs a{.logits = logits,
                        .batch = static_cast<std::int64_t>(n),
                        .vocab = cfg_.vocab_size,
                        .params = rows_.params,
                        .streams = rows_.streams,
                        .steps = rows_.steps,
                        .history = rows_.history,
                        .eos_ids = cfg_.stop_ids,
                        .allowed = fill_allowed(first, n),
                        .out = out};
  if (logprobs_) {
    a.chosen_logprob = std::span(chosen_logprob_).subspan(first, n);
    a.top_logprobs = std::span(top_logprobs_).subspan(first, n);
  }
  return a;
}

namespace {

bool is_stop_id(const ModelConfig& cfg, const kernels::SamplingParams& p, std::int32_t token) {
  const auto holds = [&](const auto& ids) { return std::find(ids.begin(), ids.end(), token) != ids.end(); };
  return (!p.ignore_eos && holds(cfg.stop_ids)) || holds(p.stop_token_ids);
}

}  // namespace

void GenerationLog::record(std::int64_t step, std::span<std::int32_t> next) {
  for (std::size_t b = 0; b < seqs_.size(); ++b) {
    if (seqs_[b].ended()) continue;
    std::int32_t token = next[b];
    record_token(b, token);
  }
  for (std::size_t b = 0; b < seqs_.size(); ++b) {
    const auto& forced = req_.sequences[b].forced;
    if (step < static_cast<std::int64_t>(forced.size())) next[b] = forced[static_cast<std::size_t>(step)];
    if (next[b] == kFailedToken) next[b] = 0;  // its row computes on, as a finished one's: any id
  }
  end_step(step, static_cast<std::int64_t>(seqs_.size()), step == 0);  // finished sequences are computed too
}

bool GenerationLog::record_token(std::size_t b, std::int32_t& token) {
  SequenceState& s = seqs_[b];
  if (token == kFailedToken && s.error.empty())
    s.error = "its constraint failed on the pipeline stage holding the output head";
  if (!s.error.empty()) {  // drawn without its constraint's mask: not its token
    end_sequence(b, FinishReason::Error);
    return true;
  }
  const std::int64_t index = s.generated();
  s.tokens.push_back(token);
  ++step_tokens_;
  if (index == 0) {
    s.phase = SequenceState::Phase::Running;
    s.first_token_at = now_seconds() - start_;
  }
  if (logprobs_ && s.sampling.logprobs >= 0) {
    s.logprobs.push_back(chosen_logprob_[b]);
    s.top_logprobs.push_back(std::move(top_logprobs_[b]));
    top_logprobs_[b].clear();
  }
  // A forced sequence runs until its forced tokens are used up, whatever it samples.
  const auto& forced = req_.sequences[b].forced;
  const bool forcing = index < static_cast<std::int64_t>(forced.size());
  bool stop = !forcing && (is_stop_id(cfg_, s.sampling, token) || (hooks_.stop_here && hooks_.stop_here(b, s.tokens)));
  const std::int64_t limit = new_tokens_limit(req_, b);
  try {
    if (s.constraint) {
      if (!s.constraint->accept(token, limit - index))
        throw std::logic_error("sequence " + std::to_string(b) + " drew token " + std::to_string(token) +
                               ", which its constraint does not allow");
      stop = stop || s.constraint->finished();
    }
    if (forcing) token = forced[static_cast<std::size_t>(index)];
    s.history.push_back(token);  // the inputs, for penalties
    if (!stop && s.generated() < limit) {
      if (s.constraint) s.constraint->prepare(limit - s.generated());
      return false;
    }
  } catch (const std::invalid_argument& e) {
    fail_sequence(b, e);
    return true;
  }
  const bool closed_by_limit = s.constraint && s.constraint->closed_by_limit();
  end_sequence(b, stop && !closed_by_limit ? FinishReason::Stop : FinishReason::Length);
  return true;
}

void GenerationLog::fail_sequence(std::size_t b, const std::exception& e) {
  seqs_[b].error = e.what();
  end_sequence(b, FinishReason::Error);
}

void GenerationLog::end_sequence(std::size_t b, FinishReason why) {
  SequenceState& s = seqs_[b];
  s.finish_reason = why;
  s.phase = SequenceState::Phase::Finished;
  --active_;
  s.finished_at = now_seconds() - start_;
  if (hooks_.on_finished) hooks_.on_finished(b, own_result(b));
}

GenerationResult GenerationLog::own_result(std::size_t b) const {
  const SequenceState& s = seqs_[b];
  GenerationResult one;
  one.tokens = {s.tokens};
  one.finish_reasons = {s.finish_reason};
  one.errors = {s.error};
  if (logprobs_) {
    one.logprobs = {s.logprobs};
    one.top_logprobs = {s.top_logprobs};
  }
  one.generated_tokens = s.generated();
  one.sequences = 1;
  return one;
}

void GenerationLog::drop(std::size_t b) {
  SequenceState& s = seqs_[b];
  if (s.phase != SequenceState::Phase::Waiting) throw std::logic_error("GenerationLog::drop: the sequence has started");
  s.phase = SequenceState::Phase::Dropped;
  --active_;
  --res_.sequences;
  res_.prompt_tokens -= static_cast<std::int64_t>(req_.sequences[b].prompt.size());
  res_.prompt_tokens_computed -= static_cast<std::int64_t>(req_.sequences[b].prompt.size());
}

void GenerationLog::share_prefill(std::size_t b) {
  res_.prompt_tokens_computed -= static_cast<std::int64_t>(req_.sequences[b].prompt.size());
}

void GenerationLog::share_prefix(std::size_t b, std::int64_t tokens) {
  if (tokens <= 0 || tokens >= static_cast<std::int64_t>(req_.sequences[b].prompt.size()))
    throw std::logic_error("a shared prefix leaves at least one of the prompt's tokens to compute");
  res_.prompt_tokens_computed -= tokens;
  ++res_.prefix_hits;
  res_.prefix_shared_tokens += tokens;
}

void GenerationLog::end_step(std::int64_t step, std::int64_t sequences, bool prefilled) {
  res_.sequence_steps += sequences;
  if (hooks_.on_step) hooks_.on_step(step, req_.max_new_tokens);
  be_.synchronize();
  const double now = now_seconds();
  (prefilled ? res_.prefill_seconds : res_.decode_seconds) += now - t0_;
  ++(prefilled ? res_.prefill_steps : res_.decode_steps);
  if (!prefilled) res_.decode_tokens += step_tokens_;
  step_tokens_ = 0;
  last_prefilled_ = prefilled;
  t0_ = now;
}

std::vector<RunningSequence> GenerationLog::running() const {
  std::vector<RunningSequence> out;
  for (std::size_t b = 0; b < seqs_.size(); ++b)
    if (seqs_[b].phase == SequenceState::Phase::Running)
      out.push_back({.generated = seqs_[b].generated(),
                     .limit = new_tokens_limit(req_, b),
                     .prompt = static_cast<std::int64_t>(req_.sequences[b].prompt.size())});
  return out;
}

GenerationResult GenerationLog::finish() {
  be_.synchronize();
  if (res_.prefill_steps + res_.decode_steps > 0)  // the time since the last step
    (last_prefilled_ ? res_.prefill_seconds : res_.decode_seconds) += now_seconds() - t0_;
  for (SequenceState& s : seqs_) {
    res_.generated_tokens += s.generated();
    res_.tokens.push_back(std::move(s.tokens));
    res_.finish_reasons.push_back(s.finish_reason);
    res_.errors.push_back(std::move(s.error));
    res_.first_token_at.push_back(s.first_token_at);
    res_.finished_at.push_back(s.finished_at);
    if (logprobs_) {
      res_.logprobs.push_back(std::move(s.logprobs));
      res_.top_logprobs.push_back(std::move(s.top_logprobs));
    }
  }
  return std::move(res_);
}

}  // namespace flexh2o::engine
