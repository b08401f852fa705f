#include "engine/runtime/generator.h"

#include "engine/model/kv_eviction.h"
#include "engine/runtime/graph_step.h"
#include "engine/runtime/prefill_fork.h"
#include "engine/model/rope_scaling.h"
#include "kernels/option_error.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <stdexcept>

namespace flexh2o::engine {

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

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

Generator::Generator(kernels::Backend& be, const ModelConfig& cfg, const HostWeights& weights,
                     kernels::DType cache_dtype)
    : be_(be), cfg_(cfg), cache_dtype_(cache_dtype), layers_(build_layers(cfg_)) {
  std::map<std::string, const WeightSpec*> specs;
  const std::vector<WeightSpec> all_specs = weight_specs(cfg_);
  for (const WeightSpec& w : all_specs) specs.emplace(w.name, &w);
  std::map<std::string, MatrixRef> on_device;  // a tied head shares the input embedding's copy
  for (const auto& [name, t] : weights) {
    const auto spec = specs.find(name);
    const kernels::DType held = spec == specs.end() ? t.dtype : held_dtype(*spec->second, cfg_, t.dtype, be);
    if (be.kind() == kernels::DeviceKind::Cpu && held == t.dtype) {
      on_device[name] = t.ref();
      continue;
    }
    const auto bytes = static_cast<std::size_t>(t.rows * kernels::row_bytes(t.dtype, t.cols));
    std::vector<std::byte> converted;
    const void* host = t.data.get();
    if (held != t.dtype) {  // rounded once here, not by every GEMM
      converted.assign(t.data.get(), t.data.get() + bytes);
      hold_rows(converted.data(), t.dtype, held, t.rows, t.cols);
      host = converted.data();
    }
    device_copies_.emplace_back(be, bytes);
    be.copy_to_device(device_copies_.back().data(), host, bytes);
    on_device[name] = {device_copies_.back().data(), held, t.rows, t.cols};
  }
  for (const auto& layer : layers_)
    weights_.push_back(resolve_weights(*layer, [&](const policy::TensorSpec& t) { return on_device.at(t.name); }));
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

GenerationResult Generator::generate(const GenerationRequest& req, const GenerationHooks& hooks) {
  GenerationLog log(be_, cfg_, req, hooks);
  const std::int64_t B = static_cast<std::int64_t>(req.sequences.size());
  if (B == 0) return log.finish();
  const std::vector<std::vector<std::int32_t>> prompts = prompts_of(req.sequences);

  const std::int64_t prompt_tokens = log.prompt_tokens();
  std::int64_t capacity = log.max_prompt() + req.max_new_tokens;
  std::vector<std::unique_ptr<KvEvictionLayer>> eviction;
  if (req.kv) {
    check_kv_policy_fits(cfg_, log.max_prompt() + req.max_new_tokens);
    std::vector<std::int64_t> total;
    for (std::size_t b = 0; b < req.sequences.size(); ++b) total.push_back(sequence_tokens(req, b));
    eviction = make_kv_eviction(be_, *req.kv, cfg_, total, prompt_tokens);
    capacity = 0;
    for (const auto& e : eviction) capacity = std::max(capacity, e->capacity());
  }
  std::vector<KvCache> caches;
  for (std::int64_t l = 0; l < cfg_.n_layers; ++l) {
    caches.emplace_back(be_, cfg_, B, capacity, cache_dtype_);
    if (req.kv) caches.back().view.eviction = eviction[static_cast<std::size_t>(l)].get();
  }
  const std::int64_t rows = rows_for_batch(cfg_, prompts, req.max_new_tokens);
  Activations act(be_, cfg_, rows, B);
  kernels::DeviceBuffer hidden(be_, static_cast<std::size_t>(rows * cfg_.hidden) * sizeof(float));
  act.hidden = hidden.as<float>();

  std::vector<std::int32_t> next(static_cast<std::size_t>(B));
  const bool graphs = req.cuda_graphs && !req.kv && cfg_.moe.experts == 0;  // graph_step.h
  auto run_step = [&](const StepBatch& s, std::int64_t step) {
    GraphStepScope graph(be_, graphs ? decode_graph_key(s) : std::nullopt);
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const std::int64_t c = layers_[i]->cache_index();
      layers_[i]->forward(be_, weights_[i], s, act, c < 0 ? nullptr : &caches[static_cast<std::size_t>(c)].view);
    }
    graph.end();
    const float* logits = be_.logits_on_host(act.logits.as<float>(), B, cfg_.vocab_size);  // one copy
    if (hooks.on_logits) hooks.on_logits(step, std::span(logits, static_cast<std::size_t>(B * cfg_.vocab_size)));
    kernels::SampleArgs args = log.sample_args(logits, 0, next);
    args.logits_on_host = true;
    be_.sample(args);
    log.record(step, next);
  };

  StepBatch s = StepBatch::make_prefill(prompts);
  run_step(s, 0);
  // Every sequence's tokens so far, for a re-prefill (rope_reprefills).
  std::vector<std::vector<std::int32_t>> history = prompts;
  for (std::int64_t step = 1; log.active(); ++step) {
    for (std::int64_t b = 0; b < B; ++b) history[static_cast<std::size_t>(b)].push_back(next[static_cast<std::size_t>(b)]);
    // Finished sequences keep their slot in the batch (its shape is fixed); their tokens are dropped.
    s = rope_reprefills(cfg_, s.lens) ? StepBatch::make_prefill(history) : StepBatch::make_decode(next, s.lens);
    run_step(s, step);
  }
  return log.finish();
}

}  // namespace flexh2o::engine
