// Backend::sample: the argument checks every device shares, then the device's do_sample.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/backend.h"

namespace flexh2o::kernels {

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("sample: " + what);
}

bool rows_or_empty(std::size_t n, std::int64_t batch) { return n == 0 || static_cast<std::int64_t>(n) == batch; }

}  // namespace

void check_sampling_params(const SamplingParams& p, std::int64_t vocab) {
  require(std::isfinite(p.temperature), "temperature must be finite (<= 0: greedy)");
  require(p.top_p > 0.0f && p.top_p <= 1.0f, "top_p must be in (0, 1]");
  require(p.top_k >= 0, "top_k must be >= 0 (0: off)");
  require(p.min_p >= 0.0f && p.min_p <= 1.0f, "min_p must be in [0, 1]");
  require(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f,
          "repetition_penalty must be finite and > 0");
  require(std::isfinite(p.presence_penalty) && std::isfinite(p.frequency_penalty), "penalties must be finite");
  require(p.min_tokens >= 0, "min_tokens must be >= 0");
  require(p.logprobs >= -1 && p.logprobs <= vocab, "logprobs must be -1 (none), 0 or a count up to the vocabulary");
  for (std::size_t i = 0; i < p.logit_bias.size(); ++i) {
    const LogitBias& b = p.logit_bias[i];
    require(b.token >= 0 && b.token < vocab, "logit_bias token " + std::to_string(b.token) + " is outside the vocabulary");
    require(std::isfinite(b.bias), "logit_bias of token " + std::to_string(b.token) + " is not finite");
    require(i == 0 || p.logit_bias[i - 1].token < b.token, "logit_bias must be sorted by token, each token once");
  }
  for (const std::int32_t id : p.stop_token_ids)
    require(id >= 0 && id < vocab, "stop token id " + std::to_string(id) + " is outside the vocabulary");
}

void Backend::sample(const SampleArgs& a) {
  const auto rows = [&](std::size_t n) { return static_cast<std::int64_t>(n) == a.batch; };
  require(rows(a.out.size()) && rows(a.streams.size()) && rows(a.steps.size()) && rows(a.params.size()),
          "out, params, streams and steps need one entry per row");
  require(rows_or_empty(a.history.size(), a.batch) && rows_or_empty(a.chosen_logprob.size(), a.batch) &&
              rows_or_empty(a.top_logprobs.size(), a.batch),
          "history, chosen_logprob and top_logprobs need one entry per row, or none");
  require(a.vocab > 0, "empty vocabulary");
  require(a.allowed.empty() || static_cast<std::int64_t>(a.allowed.size()) == a.batch * mask_words(a.vocab),
          "the allowed-token mask needs ceil(vocab / 32) words per row, or none");
  for (std::int64_t r = 0; r < a.batch; ++r) {
    const SamplingParams& p = a.params[static_cast<std::size_t>(r)];
    check_sampling_params(p, a.vocab);
    const bool penalised = p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
    require(!penalised || !a.history.empty(), "penalties need each row's history");
    require(a.history.empty() || a.steps[static_cast<std::size_t>(r)] <= a.history[static_cast<std::size_t>(r)].size(),
            "a row's history is shorter than its generated tokens");
  }
  do_sample(a);
}

}  // namespace flexh2o::kernels
