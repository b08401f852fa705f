// A per-sequence constraint on the tokens a generation may sample (constrained decoding: a JSON
// schema, a regex, a grammar). The runtime sees only this seam; engine/serving implements it with
// engine/grammar's matchers (docs/structured-output.md). GenerationLog starts one state per
// sequence from the request's prototype, fills the sampler's allowed-token mask from it before
// each draw (telling it the tokens left, so that an output can close by its limit), feeds it
// each token drawn, tells it to prepare the next mask, and ends the sequence (finish reason
// stop) when it says the output is finished.
#pragma once
#include <cstdint>
#include <memory>
#include <span>

namespace flexh2o::engine {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // A copy in the same state: each sequence (and each of a request's n choices) walks its own.
  virtual std::unique_ptr<TokenConstraint> clone() const = 0;
  // The tokens allowed next: bit t % 32 of word t / 32 (kernels::SampleArgs::allowed), every
  // word of `mask` written. A stop token is allowed exactly where the output may end.
  // `tokens_left`: the tokens the sequence may still draw, this one included (its limit): a
  // constraint may narrow the mask so that the output is complete by then.
  virtual void fill_allowed(std::span<std::uint32_t> mask, std::int64_t tokens_left) const = 0;
  // Feeds the token drawn with `tokens_left` (as fill_allowed was told for this draw; a
  // pipeline's other stages only feed); false (and no change) when fill_allowed would not
  // allow it.
  virtual bool accept(std::int32_t token, std::int64_t tokens_left) = 0;
  // The sequence goes on to draw with `tokens_left`: a constraint may start computing that
  // mask now (on a thread of its own, while the step computes); fill_allowed must give the
  // same mask whether or not it did.
  virtual void prepare(std::int64_t tokens_left) const { (void)tokens_left; }
  // Whether the output is finished: a stop token was accepted, or nothing may follow it.
  virtual bool finished() const = 0;
  // Whether the tokens left ever narrowed the mask of a draw accepted: the output was closed
  // early to fit its limit (its finish reason is then length, as a cut output's).
  virtual bool closed_by_limit() const { return false; }
};

}  // namespace flexh2o::engine
