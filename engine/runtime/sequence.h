// One sequence of a generation request: its prompt and what it asks for on its own (its new
// tokens limit, sampling, sampling stream, a prefill shared with the sequence before it, a
// constraint, forced tokens). What it leaves unset it takes from the request it is in
// (GenerationRequest: max_new_tokens, sampling) or from its index there (its stream), so a
// request of plain prompts runs every one alike. SequenceState: where one is in a run, and
// what it has produced.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/runtime/token_constraint.h"
#include "kernels/sampling.h"

namespace flexh2o::engine {

// A sequence that sampled a token and has not ended (GenerationLog::running): what the progress
// line's time left needs of it.
struct RunningSequence {
  std::int64_t generated = 0, limit = 0;  // tokens so far, max_tokens
  std::int64_t prompt = 0;                // its prompt's tokens
  bool operator==(const RunningSequence&) const = default;
};

struct Sequence {
  std::vector<std::int32_t> prompt;  // non-empty
  // Its own limit (at most the request's max_new_tokens, which sizes the cache and
  // activations); unset: the request's. It stops at its limit or a stop id, as it would alone.
  std::optional<std::int64_t> max_new_tokens;
  // Its own sampling; unset: the request's. Its tokens depend only on its prompt, sampling and
  // stream, not on the batch it runs in.
  std::optional<kernels::SamplingParams> sampling;
  std::optional<std::uint64_t> stream;  // its sampling stream; unset: its index in the request
  // n samples of one prompt (BlockExecutor only; Generator prefills each): this sequence is
  // the one before it again, with the same prompt and new tokens limit. Such a run is
  // prefilled once and the others fork that slot (engine/runtime/prefill_fork.h); each still
  // samples its own tokens, those its own prefill would give.
  bool shares_prompt = false;
  // Constrained decoding: null or the constraint in its start state; the sequence walks its
  // own copy, samples only the tokens it allows and ends (finish reason stop) when it is
  // finished; its limit may still end it first (length). Not with forced tokens.
  std::shared_ptr<const TokenConstraint> constraint;
  // Teacher forcing (evaluation), when not empty: its input after step i is forced[i] instead
  // of the sampled token, and it runs until they are used up.
  std::vector<std::int32_t> forced;
};

// Why a sequence ended: a stop id or stop_here (stop), its new tokens limit (length), or its
// constraint failing (error: a grammar that grew past what can be followed at this point of
// the output; SequenceState::error says why). Only that sequence ends; the run goes on.
enum class FinishReason : std::uint8_t { Length, Stop, Error };

// In place of a sampled token: the sequence's constraint failed before it could be drawn (the
// stage with the head of a pipeline hands this on, so that every stage ends it alike).
constexpr std::int32_t kFailedToken = -1;

// One sequence's state in a run (GenerationLog holds one per sequence of the request).
struct SequenceState {
  // Waiting: no token yet (queued or prefilling). Dropped: never started (admission stopped).
  enum class Phase : std::uint8_t { Waiting, Running, Finished, Dropped };

  kernels::SamplingParams sampling;  // its own, else the request's
  std::uint64_t stream = 0;          // its own, else its index in the request
  // Prompt + the inputs after it (a forced token in place of the sampled one), for penalties.
  std::vector<std::int32_t> history;
  // The tokens it sampled, stop token included; their count is the index (sampling step) of
  // its next one.
  std::vector<std::int32_t> tokens;
  // When its sampling asks (logprobs >= 0), per token: the chosen one's log-probability and
  // the top alternatives.
  std::vector<float> logprobs;
  std::vector<std::vector<kernels::TokenLogprob>> top_logprobs;
  std::unique_ptr<TokenConstraint> constraint;  // its constraint's live copy; null: none
  Phase phase = Phase::Waiting;
  FinishReason finish_reason = FinishReason::Length;
  std::string error;  // why its constraint failed ("": it did not)
  double first_token_at = 0, finished_at = 0;  // seconds from the start of the run

  bool ended() const { return phase == Phase::Finished || phase == Phase::Dropped; }
  std::int64_t generated() const { return static_cast<std::int64_t>(tokens.size()); }
};

// One sequence per prompt, in order, with nothing else set.
std::vector<Sequence> sequences_of(std::vector<std::vector<std::int32_t>> prompts);
// The sequences' prompts, in order.
std::vector<std::vector<std::int32_t>> prompts_of(std::span<const Sequence> sequences);

}  // namespace flexh2o::engine
