// Engine::step over several flights (a pipeline stage's micro-batches; here each over the
// whole model) against Engine::run's one flight: every request runs in exactly one flight and
// gets the tokens the one-flight run gives it, under continuous batching and with fixed blocks,
// and a stop the job's feed asks for stops taking requests in every flight. The flights' blocks
// are laid out as the one flight's (one slot each; fixed blocks of the same requests), so the
// tokens must be equal, not only close.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "engine/serving/engine.h"
#include "engine/loaders/dummy_weights.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

using Tokens = std::vector<std::int32_t>;

std::vector<serving::Request> random_requests(std::size_t n, std::uint64_t seed, std::int64_t vocab) {
  std::mt19937_64 rng(seed);
  std::vector<serving::Request> out;
  for (std::size_t i = 0; i < n; ++i) {
    serving::Request r;
    r.id_json = std::to_string(i);
    r.prompt = testing::random_tokens(rng, 2 + rng() % 7, vocab);
    r.max_tokens = 1 + static_cast<std::int64_t>(rng() % 6);
    r.sampling.temperature = 0.8f;
    r.sampling.seed = seed;
    r.stream = i;
    out.push_back(std::move(r));
  }
  return out;
}

struct Fixture {
  explicit Fixture(std::int64_t gbs, bool continuous) : cfg(testing::tiny_llama_config()), weights(cfg, 7) {
    options.policy.gpu_batch_size = gbs;
    options.policy.num_gpu_batches = 1;
    options.tiers.offload_dir = dir.path();
    options.continuous = continuous;
  }
  testing::TempDir dir;
  std::unique_ptr<kernels::Backend> be = kernels::make_cpu_backend();
  engine::ModelConfig cfg;
  engine::DummyWeights weights;
  serving::EngineOptions options;
};

// Each finished request's tokens by index; a request finished twice fails the test.
struct Finished {
  std::map<std::size_t, Tokens> tokens;
  serving::RequestsFinished callback() {
    return [this](std::span<const std::size_t> at, const engine::GenerationResult& r) {
      ASSERT_EQ(at.size(), r.tokens.size());
      for (std::size_t t = 0; t < at.size(); ++t) EXPECT_TRUE(tokens.emplace(at[t], r.tokens[t]).second) << at[t];
    };
  }
};

// The job through `flights` flights, stepped in turn round after round until none has work.
serving::JobOutcome step_flights(serving::Engine& engine, std::span<const serving::Request> requests, serving::JobFeed feed,
                             Finished& finished) {
  const std::size_t flights = feed.flights;
  engine.start(requests, finished.callback(), std::move(feed));
  for (bool any = true; any;) {
    any = false;
    for (std::size_t f = 0; f < flights; ++f) any = engine.step(f) || any;
  }
  return engine.end();
}

void expect_flights_match_one(std::int64_t gbs, bool continuous) {
  const std::vector<serving::Request> requests = random_requests(11, 5, testing::tiny_llama_config().vocab_size);
  Fixture one_fx(gbs, continuous);
  serving::Engine one(*one_fx.be, one_fx.cfg, one_fx.weights, one_fx.options, nullptr);
  Finished alone;
  const serving::JobOutcome one_done = one.run(requests, alone.callback());
  ASSERT_EQ(alone.tokens.size(), requests.size());
  EXPECT_EQ(one_done.finished_requests, requests.size());

  for (const std::size_t flights : {2u, 3u}) {
    Fixture fx(gbs, continuous);
    serving::Engine engine(*fx.be, fx.cfg, fx.weights, fx.options, nullptr);
    Finished got;
    const serving::JobOutcome done = step_flights(engine, requests, {.flights = flights}, got);
    EXPECT_EQ(done.finished_requests, requests.size());
    EXPECT_FALSE(done.stopped);
    EXPECT_EQ(done.total.generated_tokens, one_done.total.generated_tokens);
    EXPECT_EQ(got.tokens, alone.tokens) << flights << " flights";
  }
}

TEST(EngineStep, ContinuousFlightsShareTheQueue) { expect_flights_match_one(1, true); }

TEST(EngineStep, FixedFlightsTakeTheJobsBlocksInOrder) { expect_flights_match_one(2, false); }

// Fixed blocks: the feed's stop is asked as each block would start; the second says stop.
TEST(EngineStep, FixedStopEndsEveryFlightAfterTheBlocksBegun) {
  const std::vector<serving::Request> requests = random_requests(9, 6, testing::tiny_llama_config().vocab_size);
  Fixture fx(2, false);
  serving::Engine engine(*fx.be, fx.cfg, fx.weights, fx.options, nullptr);
  Finished got;
  int asked = 0;
  const serving::JobOutcome done =
      step_flights(engine, requests, {.flights = 3, .stop = [&] { return ++asked >= 2; }}, got);
  EXPECT_EQ(asked, 2);  // asked no more once stopped
  EXPECT_TRUE(done.stopped);
  EXPECT_EQ(done.finished_requests, 2u);
  ASSERT_EQ(got.tokens.size(), 2u);
  EXPECT_TRUE(got.tokens.count(0) && got.tokens.count(1));
}

// Continuous batching: a stop asked before the first admission leaves every request unrun.
TEST(EngineStep, ContinuousStopBeforeAdmissionRunsNothing) {
  const std::vector<serving::Request> requests = random_requests(5, 8, testing::tiny_llama_config().vocab_size);
  Fixture fx(1, true);
  serving::Engine engine(*fx.be, fx.cfg, fx.weights, fx.options, nullptr);
  Finished got;
  const serving::JobOutcome done = step_flights(engine, requests, {.flights = 2, .stop = [] { return true; }}, got);
  EXPECT_TRUE(done.stopped);
  EXPECT_EQ(done.finished_requests, 0u);
  EXPECT_TRUE(got.tokens.empty());
}

}  // namespace
}  // namespace flexh2o
