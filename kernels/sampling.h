// Next-token choice from logits: greedy, temperature and nucleus (top-p) sampling.
#pragma once
#include <cstdint>
#include <span>

namespace flexh2o::kernels {

struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy (argmax, lowest id on ties)
  float top_p = 1.0f;        // keep the smallest set of tokens whose probability reaches top_p
  std::uint64_t seed = 0;
};

// Sampling is counter-based: the random draw u of row r is a hash of (seed, streams[r], step),
// so a sequence's tokens do not depend on which batch it ran in or on the backend. Every
// backend maps u to a token the same way: walk the nucleus in descending probability (lowest
// id first on ties) and take the first token whose cumulative mass exceeds u * nucleus mass.
struct SampleArgs {
  const float* logits = nullptr;  // [batch, vocab]
  std::int64_t batch = 0;
  std::int64_t vocab = 0;
  SamplingParams params;
  std::span<const std::uint64_t> streams;  // host, [batch]
  std::uint64_t step = 0;
  std::span<std::int32_t> out;  // host, [batch]
};

// The uniform draw in [0, 1) that row `stream` uses at `step`.
double sampling_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t step);

}  // namespace flexh2o::kernels
