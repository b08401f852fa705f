// What a generation is asked (a request of sequences), what its driver is told between steps
// (hooks) and what it gives (its result), with the checks a request passes before it runs.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/runtime/sequence.h"
#include "engine/runtime/token_constraint.h"
#include "kernels/backend.h"
#include "policy/eviction/kv_policy.h"
#include "policy/gen_len.h"

namespace flexh2o::engine {

struct GenerationResult;

struct GenerationRequest {
  std::vector<Sequence> sequences;  // in order: sequence b is sequences[b]
  // The most new tokens of any sequence: its default limit, and what sizes the cache and activations.
  std::int64_t max_new_tokens = policy::kDefaultGenLen;
  kernels::SamplingParams sampling;  // of every sequence that sets none
  // KV eviction (null: the full cache). The budget of a sequence is taken of its prompt + its
  // new tokens limit (+ its forced tokens instead, when forced).
  const policy::KvPolicy* kv = nullptr;
  // Continuous batching (BlockExecutor only), when slots > 0: the sequences are a queue
  // served by this many slots (at most the policy's block size). A sequence that ends frees its
  // slot; at the next step the next one takes it and its prompt is prefilled beside the other
  // slots' decode rows. Each sequence samples with its own token index as the step, so its tokens do not
  // depend on which others share a step. 0: a fixed block, every sequence in from the start.
  std::int64_t slots = 0;
  // Continuous batching: the most prompt tokens one GPU batch's step prefills for newcomers, so
  // that a long prompt does not stall the decode rows (a step with no newcomer yet takes one
  // whatever its length).
  std::int64_t prefill_budget = 512;
  // Continuous batching (BlockExecutor only): a newcomer whose prompt begins with tokens a
  // slot's cache row holds (another request's prompt or its own slot's last request) copies
  // that row's KV of the longest such prefix of at least min_shared_prefix tokens and computes
  // only the rest (docs/prefix-sharing.md). Tokens do not depend on it. Off under KV eviction
  // and with RoPE frequencies that follow a sequence's length.
  bool share_prefixes = true;
  // Shared prefixes held once where the run allows (serving::StepScheduler::hold_prefixes); false: each
  // row holds its own copy of its prefix (the ablation, --prefix-sharing copy).
  bool hold_prefixes = true;
  std::int64_t min_shared_prefix = 16;
  // Decode steps wholly on a CUDA device (every weight, cache and hidden state on the gpu tier,
  // dense, no KV eviction) run as CUDA graphs (docs/backends.md, "CUDA graphs"); the tokens
  // and logits are the same either way. No effect on the CPU.
  bool cuda_graphs = false;
};

// What the driver of a generation (Generator::generate, serving::generate, the serving
// Engine) tells its caller and asks of it between steps. The executor sees none of it: its
// steps return tokens (and logits when asked), the driver records them in a GenerationLog,
// which calls these.
struct GenerationHooks {
  // Called after each new token of sequence b with all its generated tokens; returning true
  // ends the sequence there (finish reason stop): stop strings, which need the tokenizer.
  std::function<bool(std::size_t b, std::span<const std::int32_t> generated)> stop_here;
  // A fixed block: called after every step with that step's logits [batch, vocab] (host
  // copy), for tests and quality evaluation; step 0 is the prefill.
  std::function<void(std::int64_t step, std::span<const float> logits)> on_logits;
  // Continuous batching: called with the logits (host copy, [vocab]) that sampled token
  // `index` of sequence b.
  std::function<void(std::size_t b, std::int64_t index, std::span<const float> logits)> on_sequence_logits;
  // Called after every step (0 is the prefill) with the number of steps the request can take;
  // progress reports, and cancellation by throwing.
  std::function<void(std::int64_t step, std::int64_t max_steps)> on_step;
  // Called when sequence b has ended (in the order sequences end), with its own result (as
  // GenerationResult::sequence gives it): its tokens, finish reason and log-probabilities.
  std::function<void(std::size_t b, const GenerationResult& own)> on_finished;
  // Whether a step's logits must come back to the driver.
  bool wants_logits() const { return on_logits || on_sequence_logits; }
};

struct GenerationResult {
  std::vector<std::vector<std::int32_t>> tokens;  // generated tokens, stop token included
  std::vector<FinishReason> finish_reasons;       // per sequence
  std::vector<std::string> errors;                // per sequence: why it failed ("" unless FinishReason::Error)
  // Per sequence whose sampling asks (logprobs >= 0; else empty), per generated token: the
  // chosen token's log-probability and the top alternatives (sampling.h).
  std::vector<std::vector<float>> logprobs;
  std::vector<std::vector<std::vector<kernels::TokenLogprob>>> top_logprobs;
  // The steps that prefilled (fixed blocks: the first; continuous batching: every step with a
  // newcomer's prompt rows, the other slots' decode rows in it included) and those that only
  // decoded: their time, their count, and the tokens the decode-only steps gave.
  double prefill_seconds = 0;
  double decode_seconds = 0;
  std::int64_t prefill_steps = 0;
  std::int64_t decode_steps = 0;
  std::int64_t decode_tokens = 0;
  std::int64_t prompt_tokens = 0;     // sum of prompt lengths
  // Prompt tokens the prefills computed: prompt_tokens less the prompts taken from a shared prefill.
  std::int64_t prompt_tokens_computed = 0;
  // Requests that took a shared prompt prefix from another cache row, and its tokens in all.
  std::int64_t prefix_hits = 0;
  std::int64_t prefix_shared_tokens = 0;
  std::int64_t generated_tokens = 0;  // sum of generated lengths
  std::int64_t sequences = 0;
  // Sequence rows computed over all steps: a fixed block computes its finished sequences until
  // its last ends; generated_tokens / sequence_steps is the slot utilisation.
  std::int64_t sequence_steps = 0;
  // Per sequence, seconds from the start of the generation to its first token and its last.
  std::vector<double> first_token_at, finished_at;

  // Tokens/s as FlexGen reports them (docs/benchmarks.md): prompt tokens over the prefill,
  // the decode-only steps' tokens (fixed blocks: those after each sequence's first) over the
  // decode, all generated tokens over both.
  double prefill_throughput() const;
  double decode_throughput() const;
  double total_throughput() const;
  double slot_utilisation() const;  // generated_tokens / sequence_steps (0 before any step)
  // Adds another block's counts and times (a run's totals); tokens are not kept.
  void add(const GenerationResult& r);
  // Sequence b's tokens, finish reason and log-probabilities as a result of its own.
  GenerationResult sequence(std::size_t b) const;
};

// The new tokens sequence b may generate: its own limit, else the request's.
std::int64_t new_tokens_limit(const GenerationRequest& req, std::size_t b);
// Sequence b's sampling: its own, else the request's.
const kernels::SamplingParams& sampling_of(const GenerationRequest& req, std::size_t b);
// Tokens sequence b of a request holds at most: its prompt plus its forced tokens when forced,
// else plus its new tokens limit. A KV eviction budget is a fraction of this.
std::int64_t sequence_tokens(const GenerationRequest& req, std::size_t b);
// The longest prompt of the request's sequences (0: none).
std::int64_t longest_prompt(const GenerationRequest& req);

// Throws naming the reason when a KV eviction policy cannot run this model over sequences of
// `tokens` tokens: a sliding window shorter than them (the cache then keeps slot = position),
// or Phi-3's re-prefill past the original context.
void check_kv_policy_fits(const ModelConfig& cfg, std::int64_t tokens);

// Throws a clear error when a prompt is empty, holds an id outside the vocabulary, or
// prompt + max_new_tokens exceeds the model's positions. `names` (optional, one per
// prompt) say which prompt in the message; otherwise its index does.
void check_prompts(const ModelConfig& cfg, std::span<const std::vector<std::int32_t>> prompts,
                   std::int64_t max_new_tokens, std::span<const std::string> names = {});

}  // namespace flexh2o::engine
