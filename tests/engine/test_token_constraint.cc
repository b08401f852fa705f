// The runtime's constraint seam (engine/runtime/token_constraint.h) on stories260K, with a
// constraint of its own (no grammar): in the in-memory Generator, BlockExecutor's fixed blocks
// and continuous batching with n choices forked from one prefill, every token a constrained
// sequence draws is one its state allowed, each ends (finish reason stop) exactly when its state
// says it is finished, unconstrained sequences beside it draw what they draw without it, a
// constraint allowing every token changes nothing, and one that throws ends its sequence alone. Each mask is asked for with the tokens the
// sequence may still draw.
#include <gtest/gtest.h>

#include <atomic>
#include <random>

#include "engine/loaders/model_source.h"
#include "engine/runtime/block_executor.h"
#include "engine/serving/generate.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

using engine::FinishReason;
using engine::GenerationRequest;
using engine::GenerationResult;

// Allows the tokens t with t % modulus == phase, the phase being the sum of the tokens taken so
// far (mod modulus), or every token (modulus 1); finished after `length` tokens. Counts, in
// `wrong_tokens_left` (shared by its clones), the masks asked for and the tokens fed with other
// tokens left than `limit` less the tokens taken.
class ModularConstraint final : public engine::TokenConstraint {
 public:
  ModularConstraint(std::int32_t modulus, std::size_t length, std::int64_t limit = 12)
      : modulus_(modulus), length_(length), limit_(limit) {}
  std::unique_ptr<engine::TokenConstraint> clone() const override { return std::make_unique<ModularConstraint>(*this); }
  void fill_allowed(std::span<std::uint32_t> mask, std::int64_t tokens_left) const override {
    if (tokens_left != limit_ - static_cast<std::int64_t>(taken_)) ++*wrong_tokens_left;
    std::fill(mask.begin(), mask.end(), 0u);
    for (std::size_t t = 0; t < mask.size() * 32; ++t)
      if (allows(static_cast<std::int32_t>(t))) mask[t / 32] |= 1u << (t % 32);
  }
  bool accept(std::int32_t token, std::int64_t tokens_left) override {
    if (tokens_left != limit_ - static_cast<std::int64_t>(taken_)) ++*wrong_tokens_left;
    if (!allows(token)) return false;
    sum_ += token;
    ++taken_;
    return true;
  }
  bool finished() const override { return taken_ >= length_; }
  bool allows(std::int32_t token) const { return token % modulus_ == sum_ % modulus_; }
  std::shared_ptr<std::atomic<int>> wrong_tokens_left = std::make_shared<std::atomic<int>>(0);

 private:
  std::int32_t modulus_;
  std::size_t length_;
  std::int64_t limit_;
  std::int64_t sum_ = 0;
  std::size_t taken_ = 0;
};

// Three lines of n = 3, 1, 2 choices (each choice its own stream), sampled at 0.8 but line 1
// greedy, with log-probabilities; limits of 12 tokens.
GenerationRequest choices_request(const engine::ModelConfig& cfg, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  GenerationRequest req;
  const std::int64_t choices[] = {3, 1, 2};
  for (std::size_t l = 0; l < 3; ++l) {
    std::vector<std::int32_t> prompt(3 + rng() % 6);
    for (auto& t : prompt) t = static_cast<std::int32_t>(3 + rng() % static_cast<std::uint64_t>(cfg.vocab_size - 3));
    const kernels::SamplingParams sampling{.temperature = l == 1 ? 0.0f : 0.8f, .seed = seed, .logprobs = 1};
    for (std::int64_t c = 0; c < choices[l]; ++c)
      req.sequences.push_back({.prompt = prompt,
                               .sampling = sampling,
                               .stream = 10 * l + static_cast<std::uint64_t>(c),
                               .shares_prompt = c > 0});
  }
  req.max_new_tokens = 12;
  return req;
}

// The generators under test: the in-memory run, one fixed block, continuous over 2 and 4 slots.
std::vector<std::pair<std::string, std::function<GenerationResult(GenerationRequest)>>> runners(
    const engine::ModelSource& m, kernels::Backend& be, const engine::HostWeights& host) {
  auto scheduled = [&](std::int64_t gbs, std::int64_t k, std::int64_t slots) {
    return [&, gbs, k, slots](GenerationRequest req) {
      testing::TempDir dir;
      offload::TierOptions to;
      to.offload_dir = dir.path();
      offload::Tiers tiers(be, to);
      policy::Policy p;
      p.gpu_batch_size = gbs;
      p.num_gpu_batches = k;
      p.weights = {1, 0, 0};
      p.cache = {0.5, 0.5, 0};
      p.activations = {1, 0, 0};
      req.slots = slots;
      engine::BlockExecutor sched(be, tiers, m.config, *m.weights, p);
      return serving::generate(sched, req);
    };
  };
  return {{"generator", [&](GenerationRequest req) { return engine::Generator(be, m.config, host).generate(req); }},
          {"fixed block", scheduled(3, 2, 0)},
          {"continuous, 2 slots", scheduled(1, 2, 2)},
          {"continuous, 4 slots", scheduled(2, 2, 4)}};
}

TEST(TokenConstraint, ConstrainedSequencesDrawAllowedTokensAndEndWhenFinished) {
  const engine::ModelSource m = engine::open_model({});
  auto be = kernels::make_cpu_backend();
  const engine::HostWeights host = engine::load_weights(m.config, *m.weights);
  for (const auto& [name, run] : runners(m, *be, host)) {
    SCOPED_TRACE(name);
    GenerationRequest req = choices_request(m.config, 41);
    const GenerationResult plain = run(req);
    // Choices 0 and 2 of line 0 and line 2's first: constrained (others not), finished after 5.
    const std::vector<std::size_t> constrained = {0, 2, 4};
    const auto modular = std::make_shared<ModularConstraint>(3, 5);
    for (const std::size_t b : constrained) req.sequences[b].constraint = modular;
    const GenerationResult got = run(req);
    EXPECT_EQ(*modular->wrong_tokens_left, 0) << "masks or tokens with other tokens left than the limit's";
    for (std::size_t b = 0; b < req.sequences.size(); ++b) {
      if (!req.sequences[b].constraint) {
        EXPECT_EQ(got.tokens[b], plain.tokens[b]) << "unconstrained sequence " << b;
        continue;
      }
      ModularConstraint replay(3, 5);
      for (std::size_t i = 0; i < got.tokens[b].size(); ++i)
        EXPECT_TRUE(replay.accept(got.tokens[b][i], 12 - static_cast<std::int64_t>(i))) << "sequence " << b;
      const bool stop_id = !got.tokens[b].empty() && got.tokens[b].back() == m.config.stop_ids.front();
      EXPECT_TRUE(got.tokens[b].size() == 5 || stop_id) << "sequence " << b << ": " << got.tokens[b].size();
      EXPECT_EQ(got.finish_reasons[b], FinishReason::Stop) << "sequence " << b;
      ASSERT_EQ(got.logprobs[b].size(), got.tokens[b].size());
      for (const float lp : got.logprobs[b]) EXPECT_LE(lp, 0.0f);
    }
    EXPECT_NE(got.tokens[0], plain.tokens[0]) << "a third of the vocabulary allowed changes what is drawn";
    // A constraint allowing everything (never finished within the limit) is no constraint.
    for (const std::size_t b : constrained) req.sequences[b].constraint = std::make_shared<ModularConstraint>(1, 100);
    const GenerationResult open = run(req);
    EXPECT_EQ(open.tokens, plain.tokens);
    EXPECT_EQ(open.finish_reasons, plain.finish_reasons);
    EXPECT_EQ(open.logprobs, plain.logprobs);
  }
}

// Allows every token and throws what a grammar past Automaton::kMaxClosure throws once it has
// taken `after` tokens: when asked for its mask, when fed a token, or when told to prepare.
class FailingConstraint final : public engine::TokenConstraint {
 public:
  enum class At : std::uint8_t { Mask, Accept, Prepare };
  FailingConstraint(At at, std::size_t after) : at_(at), after_(after) {}
  std::unique_ptr<engine::TokenConstraint> clone() const override { return std::make_unique<FailingConstraint>(*this); }
  void fill_allowed(std::span<std::uint32_t> mask, std::int64_t) const override {
    fail_if(At::Mask);
    std::fill(mask.begin(), mask.end(), ~0u);
  }
  bool accept(std::int32_t, std::int64_t) override {
    fail_if(At::Accept);
    ++taken_;
    return true;
  }
  void prepare(std::int64_t) const override { fail_if(At::Prepare); }
  bool finished() const override { return false; }

 private:
  void fail_if(At at) const {
    if (at == at_ && taken_ == after_) throw std::invalid_argument("the grammar keeps too many positions open");
  }
  At at_;
  std::size_t after_;
  std::size_t taken_ = 0;
};

// A constraint that throws (a grammar grown past what can be followed) ends its own sequence
// with FinishReason::Error and the message, keeping the tokens it accepted; every other
// sequence draws what it draws without it, and the run goes on.
TEST(TokenConstraint, AConstraintThatThrowsEndsItsSequenceInErrorAlone) {
  const engine::ModelSource m = engine::open_model({});
  auto be = kernels::make_cpu_backend();
  const engine::HostWeights host = engine::load_weights(m.config, *m.weights);
  using At = FailingConstraint::At;
  struct Case {
    At at;
    std::size_t after, kept;  // fails once `after` tokens were taken, keeping `kept`
  };
  for (const auto& [name, run] : runners(m, *be, host)) {
    SCOPED_TRACE(name);
    GenerationRequest req = choices_request(m.config, 7);
    for (engine::Sequence& s : req.sequences) s.sampling->ignore_eos = true;  // every sequence runs to its limit
    const GenerationResult plain = run(req);
    for (const Case c : {Case{At::Mask, 0, 0}, Case{At::Mask, 4, 4}, Case{At::Accept, 2, 3}, Case{At::Prepare, 0, 0},
                         Case{At::Prepare, 5, 5}}) {
      SCOPED_TRACE("fails at " + std::to_string(static_cast<int>(c.at)) + " after " + std::to_string(c.after));
      GenerationRequest failing = req;
      failing.sequences[1].constraint = std::make_shared<FailingConstraint>(c.at, c.after);
      failing.sequences[3].constraint = std::make_shared<FailingConstraint>(c.at, c.after);  // the first of 2 choices
      const GenerationResult got = run(failing);
      for (std::size_t b = 0; b < req.sequences.size(); ++b) {
        if (b != 1 && b != 3) {
          EXPECT_EQ(got.tokens[b], plain.tokens[b]) << "sequence " << b;
          EXPECT_EQ(got.finish_reasons[b], FinishReason::Length) << "sequence " << b;
          EXPECT_EQ(got.errors[b], "") << "sequence " << b;
          continue;
        }
        EXPECT_EQ(got.finish_reasons[b], FinishReason::Error) << "sequence " << b;
        EXPECT_EQ(got.errors[b], "the grammar keeps too many positions open") << "sequence " << b;
        const std::vector<std::int32_t> kept(plain.tokens[b].begin(),
                                             plain.tokens[b].begin() + static_cast<std::ptrdiff_t>(c.kept));
        EXPECT_EQ(got.tokens[b], kept) << "sequence " << b;
      }
    }
  }
}

TEST(TokenConstraint, AConstrainedSequenceThatIsForcedIsAnError) {
  const engine::ModelSource m = engine::open_model({});
  auto be = kernels::make_cpu_backend();
  const engine::HostWeights host = engine::load_weights(m.config, *m.weights);
  engine::Generator gen(*be, m.config, host);
  GenerationRequest req = choices_request(m.config, 3);
  for (engine::Sequence& seq : req.sequences) seq.constraint = std::make_shared<ModularConstraint>(2, 3);
  EXPECT_NO_THROW(gen.generate(req));
  req.sequences[1].forced = {5, 6};
  EXPECT_THROW(gen.generate(req), std::invalid_argument);
}

}  // namespace
}  // namespace flexh2o
