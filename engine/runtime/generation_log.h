// What a generation records between steps (GenerationLog), shared by the in-memory Generator
// and the BlockRun beside the BlockExecutor.
#pragma once
#include <cstdint>
#include <exception>
#include <span>
#include <utility>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/runtime/generation.h"
#include "engine/runtime/sequence.h"
#include "kernels/backend.h"

namespace flexh2o::engine {

// What a generation records between steps, shared by Generator and BlockExecutor so that both
// end, force and time sequences identically: one SequenceState per sequence of the request.
class GenerationLog {
 public:
  // Checks the request (prompts, limits, sampling, shared prefills, constraints) and starts the
  // prefill clock. `req` and `hooks` outlive the log.
  GenerationLog(kernels::Backend& be, const ModelConfig& cfg, const GenerationRequest& req,
                const GenerationHooks& hooks);
  // The sampler's arguments for sequences [first, first + out.size()) of the current step,
  // whose logits are `logits` ([rows, vocab] on the device): their sampling, streams, new-token
  // indices, histories, allowed tokens (when any is constrained), and this log's buffers for
  // the log-probabilities. Valid until the next call.
  kernels::SampleArgs sample_args(const float* logits, std::size_t first, std::span<std::int32_t> out);
  std::int64_t max_prompt() const { return max_prompt_; }
  std::int64_t prompt_tokens() const { return res_.prompt_tokens; }
  // After sampling step `step` (0 is the prefill) into next[0, B): records the tokens (and
  // log-probabilities) of the unfinished sequences, ends those that sampled a stop id (the
  // model's unless ignore_eos, and their stop_token_ids; unless still forced), that stop_here
  // ends, or that are full, puts the forced inputs into next, and calls on_step.
  void record(std::int64_t step, std::span<std::int32_t> next);
  // Continuous batching, sequence by sequence: records `token` as sequence b's next one; true
  // when that ended it (stop id unless forced, its limit, or its constraint failing: then
  // `token` is kFailedToken or its constraint failed before or after taking it); a forced
  // input replaces `token`.
  bool record_token(std::size_t b, std::int32_t& token);
  // After every sequence of step `step` was recorded (clocks, on_step); `sequences`: the
  // sequence rows the step computed; `prefilled`: it computed prompt rows (its time counts as
  // prefill, else as decode).
  void end_step(std::int64_t step, std::int64_t sequences, bool prefilled);
  // Continuous batching: sequence b never started and will not (admission stopped): it ends
  // without tokens and counts in no total.
  void drop(std::size_t b);
  // Sequence b takes another's prefill of its prompt (shares_prompt): its prompt is not computed.
  void share_prefill(std::size_t b);
  // Sequence b takes the KV of its prompt's first `tokens` from a cache row: they are not computed.
  void share_prefix(std::size_t b, std::int64_t tokens);
  // Sequence b's constraint failed (SequenceState::error) before its next token was drawn.
  bool failed(std::size_t b) const { return !seqs_[b].error.empty(); }
  // Tokens sequence b has generated so far: the index (sampling step) of its next one.
  std::int64_t generated(std::size_t b) const { return seqs_[b].generated(); }
  bool active() const { return active_ > 0; }
  // Per running sequence (a token sampled, not ended): its tokens so far, its limit, its prompt.
  std::vector<RunningSequence> running() const;
  std::int64_t rows_computed() const { return res_.sequence_steps; }
  // Stops the decode clock; the result, its per-sequence parts taken from the states.
  GenerationResult finish();

 private:
  SequenceState start_sequence(std::size_t b) const;
  // Sequence b ended, for `why`: its finish reason and time.
  void end_sequence(std::size_t b, FinishReason why);
  // Sequence b's constraint threw (a grammar past what can be followed): it ends in error.
  void fail_sequence(std::size_t b, const std::exception& e);
  // Sequence b's result as GenerationResult::sequence gives it (on_finished's).
  GenerationResult own_result(std::size_t b) const;
  // The allowed-token masks of sequences [first, first + n), or none when none is constrained.
  std::span<const std::uint32_t> fill_allowed(std::size_t first, std::size_t n);

  kernels::Backend& be_;
  const ModelConfig& cfg_;
  const GenerationRequest& req_;
  const GenerationHooks& hooks_;
  std::vector<SequenceState> seqs_;  // sequence b's is seqs_[b]
  // The sampler's inputs for the rows of the current sample_args, gathered from the states
  // (it takes each as one span over the rows).
  struct SampleRows {
    std::vector<kernels::SamplingParams> params;
    std::vector<std::uint64_t> streams, steps;
    std::vector<std::span<const std::int32_t>> history;
    std::vector<std::uint32_t> allowed;  // empty: no row is constrained
  } rows_;
  // The sampler's log-probability outputs, per sequence, when some sequence asks for them: a
  // continuous step samples its rows one call at a time before it records any.
  bool logprobs_ = false;
  std::vector<float> chosen_logprob_;
  std::vector<std::vector<kernels::TokenLogprob>> top_logprobs_;
  std::int64_t max_prompt_ = 0;
  std::int64_t active_ = 0;
  double start_ = 0, t0_ = 0;  // t0_: the end of the last step
  std::int64_t step_tokens_ = 0;  // tokens recorded in the current step
  bool last_prefilled_ = true;
  GenerationResult res_;  // the counts and times; the per-sequence parts at finish
};

}  // namespace flexh2o::engine
