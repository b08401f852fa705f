// The progress line: its rates over the window, the time left from the requests' limits and the
// share of them finished requests generated, the planner's rate before a measurement, and when a
// plain line is written.
#include <gtest/gtest.h>

#include <cmath>

#include <cstdio>
#include <memory>
#include <utility>
#include <string>

#include "engine/serving/progress.h"

namespace flexh2o::serving {
namespace {

// The text `p` wrote to `f` so far.
std::string written(std::FILE* f) {
  std::fflush(f);
  std::string s(static_cast<std::size_t>(std::ftell(f)), '\0');
  std::rewind(f);
  EXPECT_EQ(std::fread(s.data(), 1, s.size(), f), s.size());
  return s;
}

TEST(Progress, ClockText) {
  EXPECT_EQ(clock_text(0), "00:00");
  EXPECT_EQ(clock_text(65.4), "01:05");
  EXPECT_EQ(clock_text(3725), "1:02:05");
}

TEST(Progress, TimeLeftFromTheWindowsRateAndTheLimitsLeft) {
  // 10 requests of 100 new tokens each; 4 slots generate 40 tok/s.
  Progress p({.requests = 10, .limits = std::vector<std::int64_t>(10, 100), .window_seconds = 5}, std::tmpfile());
  p.sampled(0, 0.0);  // a step that only decoded: measured from here on
  for (int s = 1; s <= 20; ++s) p.sampled(4, s * 0.1);  // 2 s, 80 tokens
  // Two requests ended by a stop after 20 of their 100, their 40 tokens among the 80 + 40
  // sampled. Too few requests reached any length to say where stops come: a stop every 60
  // tokens, so each of the other 8 is expected to generate sum over t = 1..100 of (59/60)^(t-1)
  // = 60 (1 - (59/60)^100) within its limit; the running ones not known, less the 80 the
  // unfinished sampled; at 120 / 2 s.
  p.sampled(40, 2.0);
  p.finished(30, 20, 100, 2.0);
  p.finished(30, 20, 100, 2.0);
  ProgressFigures f = p.figures(2.0);
  EXPECT_EQ(f.done, 2u);
  EXPECT_FALSE(f.planned);
  ASSERT_TRUE(f.seconds_left);
  EXPECT_NEAR(f.generated_rate, 60.0, 1e-9);
  EXPECT_NEAR(f.prompt_rate, 30.0, 1e-9);
  EXPECT_NEAR(*f.seconds_left, (8 * 60 * (1 - std::pow(59.0 / 60, 100)) - 80) / 60.0, 1e-9);
  // Requests that run to their limits (no stop): what the limits leave.
  Progress full({.requests = 10, .limits = std::vector<std::int64_t>(10, 100)}, std::tmpfile());
  full.sampled(0, 0.0);
  full.sampled(300, 2.0);
  full.finished(1, 100, 100, 2.0);
  f = full.figures(2.0);
  EXPECT_NEAR(*f.seconds_left, (900.0 - 200.0) / 150.0, 1e-9);
}

// Where stops come by length: 50 requests of limit 100, 30 ended by a stop at their 10th token,
// 20 running at 50 tokens, 50 waiting. At lengths 1-50, 50 or 20 requests reached each: the
// chance of a stop is 30/50 at the 10th token, none elsewhere; past 50 none reached, and the
// chance over lengths 26-50 stands in: none stopped there, so they run to their limits. A
// running request is expected to generate 50 more, a waiting one 10 + 0.4 x 90 (the 2 of 5
// that pass the 10th token go on to 100). At 100 tok/s. With the job's chance per token past
// 50 instead (30 stops in 1,300 tokens), the short requests' stops would cut the long ones.
TEST(Progress, TimeLeftFromWhereStopsComeByLength) {
  ProgressOptions o{.requests = 100, .limits = std::vector<std::int64_t>(100, 100), .window_seconds = 100};
  o.running = [] { return std::vector<engine::RunningSequence>(20, {.generated = 50, .limit = 100}); };
  Progress p(std::move(o), std::tmpfile());
  p.sampled(0, 0.0);
  p.sampled(1300, 13.0);
  for (int i = 0; i < 30; ++i) p.finished(5, 10, 100, 13.0);
  const ProgressFigures f = p.figures(13.0);
  ASSERT_TRUE(f.seconds_left);
  EXPECT_NEAR(*f.seconds_left, (50 * (10 + 0.4 * 90) + 20 * 50) / 100.0, 1e-9);
}

// 10 requests of 200 prompt tokens and 100 new (no stop seen: each runs to its limit), 4
// running at 10 tokens. Steps at 0.01 s a prompt row and 0.05 s a sampled row: two that
// prefilled 400 rows beside 2 and 4 sampled, eight that sampled 4. The time left is the 6
// waiting requests' 1,200 prompt rows and the 6 x 100 + 4 x 90 tokens to come at those costs;
// at the rate of the tokens alone (38 in 9.9 s) it would be 250 s.
TEST(Progress, TimeLeftPricesPromptRowsAndSampledRowsApart) {
  auto job = [](double computed_share) {
    ProgressOptions o{.requests = 10, .limits = std::vector<std::int64_t>(10, 100), .prompt_tokens = 2000};
    o.running = [] { return std::vector<engine::RunningSequence>(4, {.generated = 10, .limit = 100, .prompt = 200}); };
    auto p = std::make_unique<Progress>(std::move(o), std::tmpfile());
    p->sampled(0, 0.0);  // the steady state from here
    const double rows = 400 * computed_share;  // the rest of the 800 taken from shared prefixes
    double at = 0;
    for (const auto& [prompt, sampled] : {std::pair{rows, 2}, {rows, 4}, {0.0, 4}, {0.0, 4}, {0.0, 4}, {0.0, 4}, {0.0, 4}, {0.0, 4}, {0.0, 4}, {0.0, 4}}) {
      at += 0.01 * prompt + 0.05 * sampled;
      p->sampled(sampled, at, static_cast<std::int64_t>(prompt));
    }
    return p->figures(at);
  };
  ProgressFigures f = job(1.0);
  ASSERT_TRUE(f.seconds_left);
  EXPECT_FALSE(f.planned);
  EXPECT_NEAR(*f.seconds_left, 0.01 * 1200 + 0.05 * 960, 1e-6);
  // Where the started requests computed half their prompt tokens, the waiting ones are expected to.
  f = job(0.5);
  EXPECT_NEAR(*f.seconds_left, 0.01 * 600 + 0.05 * 960, 1e-6);
}

// A step's time also grows with the context its rows attend over: 0.001 s a token here. With
// 40 steps whose contexts vary apart from their rows, the time left adds the context to come:
// 4 running requests (20 prompt tokens, 10 generated of 100) attend over 20 + t at their t-th
// token, t = 11..100 (6,795 tokens each); the 6 waiting ones (at the 20 prompt tokens the 120
// left make each) over 20 + t, t = 1..100 (7,050 each).
// Steps that only decoded since the steady state price no prompt row: the steps that
// prefilled before do (12 s for 4 prompts of 3,000 rows beside their first tokens: 1 ms a
// row), not the decodes' 0.1 s a token (a long context each). 4 waiting requests of 3,000
// prompt tokens and 4 running at 1 of 2 tokens.
TEST(Progress, APromptRowCostsWhatTheStepsThatPrefilledTookWhenTheRecentOnesDidNot) {
  ProgressOptions o{.requests = 8, .limits = std::vector<std::int64_t>(8, 2), .prompt_tokens = 24000};
  std::size_t running = 0;
  o.running = [&] { return std::vector<engine::RunningSequence>(running, {.generated = 1, .limit = 2, .prompt = 3000}); };
  Progress p(std::move(o), std::tmpfile());
  for (running = 1; running <= 4; ++running) p.sampled(1, 3.0 * static_cast<double>(running), 3000);  // the slots fill
  running = 4;
  p.sampled(4, 12.4);  // decode-only: the steady state from here
  for (int s = 1; s <= 20; ++s) p.sampled(4, 12.4 + 0.4 * s);  // as the running ones (a test's stand-in)
  const ProgressFigures f = p.figures(20.4);
  ASSERT_TRUE(f.seconds_left);
  EXPECT_NEAR(*f.seconds_left, 12000 * (12.0 / 12000) + (4 * 2 + 4 * 1) * 0.1, 1e-9);
}

TEST(Progress, TimeLeftCountsTheContextTheTokensToComeAttendOver) {
  ProgressOptions o{.requests = 10, .limits = std::vector<std::int64_t>(10, 100), .prompt_tokens = 200, .window_seconds = 1000};
  std::int64_t generated = 10;
  o.running = [&] { return std::vector<engine::RunningSequence>(4, {.generated = generated, .limit = 100, .prompt = 20}); };
  Progress p(std::move(o), std::tmpfile());
  p.sampled(0, 0.0);
  double at = 0;
  for (int i = 0; i < 40; ++i) {
    const std::int64_t prompt = i < 2 ? 40 : 0, sampled = 4 + i % 5;
    generated = 10 + i % 3;  // the context the step sees: 4 x (20 + generated)
    at += 0.01 * static_cast<double>(prompt) + 0.05 * static_cast<double>(sampled) + 0.001 * 4.0 * static_cast<double>(20 + generated);
    p.sampled(sampled, at, prompt);
  }
  generated = 10;
  const ProgressFigures f = p.figures(at);
  ASSERT_TRUE(f.seconds_left);
  EXPECT_NEAR(*f.seconds_left, 0.01 * 120 + 0.05 * 960 + 0.001 * (4 * 6795 + 6 * 7050), 1e-6);
}

// Fewer steps than the context's cost is fitted from: the planner's cost per token of context
// stands for it, and the rows are priced from what it leaves of the steps' times. Without it the
// rows would carry the context's cost, and the tokens to come attend over more context than the
// ones the steps sampled.
TEST(Progress, TheContextCostsWhatThePlannerSaysUntilTheStepsShowIt) {
  std::int64_t generated = 10;
  auto run = [&](double planned_context) {
    ProgressOptions o{.requests = 10, .limits = std::vector<std::int64_t>(10, 100), .prompt_tokens = 200,
                      .planned_context_seconds = planned_context, .window_seconds = 1000};
    o.running = [&] { return std::vector<engine::RunningSequence>(4, {.generated = generated, .limit = 100, .prompt = 20}); };
    Progress p(std::move(o), std::tmpfile());
    p.sampled(0, 0.0);
    double at = 0;
    for (int i = 0; i < 10; ++i) {
      const std::int64_t sampled = 4 + i % 5;
      generated = 10 + i % 3;
      at += 0.05 * static_cast<double>(sampled) + 0.002 * 4.0 * static_cast<double>(20 + generated);
      p.sampled(sampled, at);
    }
    generated = 10;
    return p.figures(at).seconds_left;
  };
  const std::optional<double> planned = run(0.002), unplanned = run(0);
  ASSERT_TRUE(planned && unplanned);
  // As TimeLeftCountsTheContextTheTokensToComeAttendOver: 960 tokens over that context.
  const double context = 4 * 6795 + 6 * 7050;
  EXPECT_NEAR(*planned, 0.05 * 960 + 0.002 * context, 1e-6);
  EXPECT_LT(*unplanned, 0.9 * *planned);
}

TEST(Progress, TheWindowForgetsWhatCameBeforeIt) {
  Progress p({.requests = 100, .limits = std::vector<std::int64_t>(100, 1000), .window_seconds = 10}, std::tmpfile());
  for (int s = 0; s <= 100; ++s) p.sampled(s <= 50 ? 100 : 10, s * 1.0);  // 100 tok/s, then 10
  EXPECT_NEAR(p.figures(100.0).generated_rate, 10.0, 1e-9);
}

TEST(Progress, ThePlannersRateUntilTheSteadyStateIsMeasured) {
  Progress p({.requests = 4, .limits = std::vector<std::int64_t>(4, 100), .planned_tokens_per_second = 100}, std::tmpfile());
  ProgressFigures f = p.figures(0.5);
  ASSERT_TRUE(f.seconds_left);
  EXPECT_TRUE(f.planned);
  EXPECT_NEAR(*f.seconds_left, 4.0, 1e-9);
  Progress unplanned({.requests = 4, .limits = std::vector<std::int64_t>(4, 100)}, std::tmpfile());
  EXPECT_FALSE(unplanned.figures(0.5).seconds_left);
  EXPECT_NE(Progress::text(unplanned.figures(0.5)).find("? left"), std::string::npos);
  // The first prompts' prefill: 3 s of steps with prompt rows sample 3 tokens, which says
  // nothing of the decode to come (the planner's rate stands).
  for (int s = 1; s <= 3; ++s) p.sampled(1, s * 1.0, 30);
  f = p.figures(3.0);
  EXPECT_TRUE(f.planned);
  EXPECT_NEAR(*f.seconds_left, 397.0 / 100.0, 1e-9);
  p.sampled(4, 3.5);  // the first step that only decoded: measured from here on
  EXPECT_TRUE(p.figures(4.0).planned) << "not 2 s of it yet";
  p.sampled(50, 5.5);  // 50 tokens in the 2 s since
  f = p.figures(5.5);
  EXPECT_FALSE(f.planned);
  EXPECT_NEAR(*f.seconds_left, (400.0 - 57.0) / 25.0, 1e-9);
  // A request that ends also starts the measured window (the steady state of a job whose
  // every step admits a newcomer).
  Progress busy({.requests = 4, .limits = std::vector<std::int64_t>(4, 100), .planned_tokens_per_second = 100}, std::tmpfile());
  busy.sampled(50, 1.0, 5);
  busy.finished(5, 50, 100, 1.0);
  busy.sampled(40, 3.0, 10);
  f = busy.figures(3.0);
  EXPECT_FALSE(f.planned);
  // One stop in 90 tokens: each of the other 3 would generate 90 (1 - (89/90)^100) within its
  // limit, less the 40 they sampled. One step since 1 s cannot tell a prompt row's cost from a
  // sampled row's: 2 s over its 50 rows each.
  EXPECT_NEAR(*f.seconds_left, (3 * 90 * (1 - std::pow(89.0 / 90, 100)) - 40) * 2.0 / 50.0, 1e-9);
  // Where the running requests are known, the steady state is the first step after which no
  // more ran than after the one before (the slots as full as they get), not the first request
  // that ended while they were filling.
  std::size_t running = 1;
  ProgressOptions o{.requests = 4, .limits = std::vector<std::int64_t>(4, 100), .planned_tokens_per_second = 100};
  o.running = [&] { return std::vector<engine::RunningSequence>(running, {.generated = 10, .limit = 100}); };
  Progress filling(std::move(o), std::tmpfile());
  filling.sampled(50, 1.0, 50);
  filling.finished(5, 5, 100, 1.0);
  running = 3;
  filling.sampled(40, 4.0, 40);
  EXPECT_TRUE(filling.figures(4.0).planned);
  filling.sampled(10, 5.0, 10);  // still 3
  filling.sampled(40, 7.0, 40);
  f = filling.figures(7.0);
  EXPECT_FALSE(f.planned);
  EXPECT_NEAR(f.generated_rate, 140.0 / 7.0, 1e-9);
}

TEST(Progress, TextNamesEveryFigure) {
  const ProgressFigures f{.done = 90, .requests = 200, .elapsed = 10, .prompt_rate = 512.4, .generated_rate = 12.34,
                          .seconds_left = 12.0};
  EXPECT_EQ(Progress::text(f),
            "requests 90/200 (45%) | prompt 512 tok/s, generated 12.3 tok/s | 00:10 elapsed, 00:12 left");
  EXPECT_EQ(Progress::bar_text(f, 10).substr(0, 13), "|####      | ");
}

TEST(Progress, PlainLinesAtEachTenthAndAfterThePeriodOnly) {
  std::FILE* f = std::tmpfile();
  Progress p({.requests = 20, .limits = std::vector<std::int64_t>(20, 100), .line_seconds = 30}, f);
  p.show(0.0);  // the first line
  p.show(1.0);  // neither a tenth nor 30 s on
  p.finished(1, 1, 100, 2.0);
  p.show(2.0);  // 1/20: still the first tenth
  p.finished(1, 1, 100, 3.0);
  p.show(3.0);  // 2/20: the second tenth
  p.show(40.0);  // 30 s on
  p.close(41.0);  // the last line
  const std::string out = written(f);
  std::size_t lines = 0;
  for (const char c : out) lines += c == '\n';
  EXPECT_EQ(lines, 4u) << out;
  EXPECT_EQ(out.find('\r'), std::string::npos);
  std::fclose(f);
}

TEST(Progress, ALogGetsTheLastLineOnce) {
  std::FILE* f = std::tmpfile();
  Progress p({.requests = 1, .limits = {10}}, f);
  p.finished(1, 10, 10, 1.0);
  p.show(1.0);  // the last tenth
  p.close(1.1);
  EXPECT_EQ(written(f), "requests 1/1 (100%) | prompt 1.0 tok/s, generated 0.0 tok/s | 00:01 elapsed, 00:00 left\n");
  std::fclose(f);
}

TEST(Progress, ATerminalRedrawsOneLine) {
  std::FILE* f = std::tmpfile();
  Progress p({.requests = 2, .limits = {10, 10}, .terminal = true}, f);
  p.show(0.0);
  p.show(0.1);
  p.close(0.2);
  const std::string out = written(f);
  EXPECT_EQ(out.find('\n'), out.size() - 1) << out;
  EXPECT_EQ(out.rfind("\r\033[K|", 0), 0u);
  std::fclose(f);
}

}  // namespace
}  // namespace flexh2o::serving
