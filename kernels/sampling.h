// Next-token choice from logits, per row: penalties, logit bias, stop-id masking, temperature,
// top-k / top-p / min-p truncation, a seeded draw, and the chosen token's log-probability with
// the top alternatives.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace flexh2o::kernels {

struct LogitBias {
  std::int32_t token = 0;
  float bias = 0.0f;  // added to the token's logit
};

// One sequence's sampling. The defaults are greedy decoding with nothing else applied.
struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy (argmax, lowest id on ties)
  float top_p = 1.0f;        // keep the smallest set of tokens whose probability reaches top_p
  std::int32_t top_k = 0;    // keep the k most probable tokens (0: all)
  float min_p = 0.0f;        // drop tokens less probable than min_p x the most probable one
  std::uint64_t seed = 0;
  // HF's: over prompt + generated tokens, a positive logit is divided by it, a negative one
  // multiplied (1: off).
  float repetition_penalty = 1.0f;
  // OpenAI's, over generated tokens: logit -= presence x [count > 0] + frequency x count.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<LogitBias> logit_bias;  // sorted by token, each token once
  // Stop ids (the model's unless ignore_eos, and stop_token_ids) cannot be drawn before the
  // sequence has min_tokens new tokens.
  std::int64_t min_tokens = 0;
  bool ignore_eos = false;                  // the model's stop ids do not end the sequence
  std::vector<std::int32_t> stop_token_ids;  // further ids that end it (the id is kept in the output)
  // Log-probabilities: -1 none; 0 the chosen token's; k > 0 also the k most likely tokens'.
  std::int32_t logprobs = -1;

  bool greedy() const { return temperature <= 0.0f; }
  // Whether anything but the plain logits decides the token (penalties, bias, masking).
  bool adjusts_logits() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f ||
           !logit_bias.empty() || min_tokens > 0;
  }
};

struct TokenLogprob {
  std::int32_t token = 0;
  float logprob = 0.0f;
};

// Sampling is counter-based: the random draw u of row r is a hash of (params[r].seed,
// streams[r], steps[r]), where steps[r] is the index of the new token the row is drawing, so a
// sequence's tokens do not depend on which batch, or which step of it, it ran in, or on the
// backend. Every backend maps u to a token the same way: walk the kept tokens in descending
// probability (lowest id first on ties) and take the first whose cumulative mass exceeds
// u * kept mass.
//
// The logits a row samples from ("final logits"): the model's with the tokens its allowed-token
// mask leaves out set to -inf, then the repetition penalty, presence/frequency penalties, logit
// bias, stop ids masked below min_tokens, then divided by the temperature (when > 0).
// Log-probabilities are the log-softmax of those, before truncation: under a mask, the
// distribution over the allowed tokens (as vLLM reports them, its structured-output bitmask
// being applied to the logits before its sampler), a masked token's log-probability -inf.
struct SampleArgs {
  const float* logits = nullptr;  // device, [batch, vocab] (host where logits_on_host)
  // logits is host memory: what Backend::logits_on_host returned for them.
  bool logits_on_host = false;
  std::int64_t batch = 0;
  std::int64_t vocab = 0;
  std::span<const SamplingParams> params;  // host, [batch]
  std::span<const std::uint64_t> streams;  // host, [batch]
  std::span<const std::uint64_t> steps;    // host, [batch]: each row's new-token index
  // host, [batch] or empty: each row's prompt + generated tokens; its last steps[r] are the
  // generated ones (presence/frequency penalties). Needed when a row adjusts_logits().
  std::span<const std::span<const std::int32_t>> history;
  std::span<const std::int32_t> eos_ids;  // the model's stop ids (min_tokens masks them)
  // host, empty or [batch, mask_words(vocab)]: row r may draw token t only where bit t % 32 of
  // word t / 32 of its row is set (constrained decoding); bits past the vocabulary are ignored.
  // A row that allows no token is an error.
  std::span<const std::uint32_t> allowed;
  std::span<std::int32_t> out;            // host, [batch]
  // Optional (empty, or [batch]): the chosen token's log-probability, and the params[r].logprobs
  // most likely tokens (descending, lowest id first on ties) of rows that ask.
  std::span<float> chosen_logprob;
  std::span<std::vector<TokenLogprob>> top_logprobs;
};

// The 32-bit words of one row of an allowed-token mask.
inline std::int64_t mask_words(std::int64_t vocab) { return (vocab + 31) / 32; }
inline bool mask_allows(std::span<const std::uint32_t> row, std::int32_t token) {
  return (row[static_cast<std::size_t>(token) >> 5] >> (token & 31)) & 1u;
}

// The uniform draw in [0, 1) that row `stream` uses at `step`.
double sampling_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t step);

// The checks every backend shares; throws std::invalid_argument naming the field.
void check_sampling_params(const SamplingParams& p, std::int64_t vocab);

}  // namespace flexh2o::kernels
