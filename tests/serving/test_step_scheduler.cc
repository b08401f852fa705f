// The StepScheduler alone (engine/serving/step_scheduler.h): no model, no backend. Each test
// plays a request through it step by step, reporting made-up tokens and ends as the executor
// would, and asserts the exact plan of every step: which sequence each slot runs and how
// (prefill, extend after a shared prefix, decode, idle, idle fork), the rows copied before it
// and the sequences dropped. The plans were worked out by hand from the admission rules.
#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "engine/serving/step_scheduler.h"

namespace flexh2o::engine {

void PrintTo(const SlotStep& s, std::ostream* os) {
  static const char* const kinds[] = {"Prefill", "Decode", "Extend", "Idle"};
  *os << "{" << kinds[static_cast<int>(s.kind)] << " seq " << s.seq << " cached " << s.cached << " fork_of "
      << s.fork_of << " prefix_group " << s.prefix_group << " prefix_len " << s.prefix_len << " pool_row " << s.pool_row
      << " base " << s.base << "}";
}

void PrintTo(const StepPlan& p, std::ostream* os) {
  auto copies = [&](const char* what, const std::vector<RowCopy>& cs) {
    *os << what << " [";
    for (const RowCopy& c : cs) *os << " " << c.from << "->" << c.to << " (" << c.tokens << ")";
    *os << " ] ";
  };
  copies("forks", p.forks);
  copies("prefixes", p.prefixes);
  *os << "dropped [";
  for (const std::size_t d : p.dropped) *os << " " << d;
  *os << " ] slots";
  for (const SlotStep& s : p.slots) PrintTo(s, os);
}

namespace {

using serving::StepScheduler;
using Tokens = std::vector<std::int32_t>;

SlotStep idle() { return {}; }
SlotStep prefill(std::int64_t seq) { return {SeqStep::Prefill, seq, 0, -1}; }
SlotStep extend(std::int64_t seq, std::int64_t cached) { return {SeqStep::Extend, seq, cached, -1}; }
SlotStep decode(std::int64_t seq, std::int64_t cached) { return {SeqStep::Decode, seq, cached, -1}; }
SlotStep fork(std::int64_t seq, std::int64_t of) { return {SeqStep::Idle, seq, 0, of}; }
// s reading the first `len` slots of shared prefix `group` (its first slot) with the group's others.
SlotStep shares(SlotStep s, std::int64_t group, std::int64_t len) {
  s.prefix_group = group;
  s.prefix_len = len;
  return s;
}

// s with its first `base` tokens held in pool row `row`.
SlotStep held(SlotStep s, std::int64_t row, std::int64_t base) {
  s.pool_row = row;
  s.base = base;
  return s;
}

// The pool `s` proposes (prefix_pool), then held (hold_prefixes).
PrefixPool hold(StepScheduler& s) {
  const PrefixPool pool = s.prefix_pool();
  s.hold_prefixes();
  return pool;
}

StepPlan plan(std::vector<SlotStep> slots, std::vector<RowCopy> forks = {}, std::vector<RowCopy> prefixes = {},
              std::vector<std::size_t> dropped = {}) {
  return {std::move(forks), std::move(prefixes), std::move(dropped), std::move(slots)};
}

// Tokens first, first + 1, ..., first + n - 1.
Tokens run_of(std::int32_t first, std::int32_t n) {
  Tokens t;
  for (std::int32_t i = 0; i < n; ++i) t.push_back(first + i);
  return t;
}

Tokens join(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Continuous batching over `slots` slots of GPU batches of `gbs`, prompts of the given lengths
// with nothing in common.
GenerationRequest queue(std::vector<std::int32_t> lengths, std::int64_t slots) {
  GenerationRequest req;
  for (std::size_t i = 0; i < lengths.size(); ++i)
    req.sequences.push_back({.prompt = run_of(1000 * static_cast<std::int32_t>(i + 1), lengths[i])});
  req.slots = slots;
  return req;
}

TEST(StepScheduler, AdmitsInOrderAndRefillsFreedSlots) {
  const GenerationRequest req = queue({3, 4, 5, 6, 7}, 2);
  StepScheduler s(req, 2, true);
  ASSERT_EQ(s.slots(), 2u);
  EXPECT_EQ(s.next_step(), plan({prefill(0), prefill(1)}));
  EXPECT_EQ(s.tokens()[1], req.sequences[1].prompt);
  s.record(0, 7, false);
  s.record(1, 8, true);
  EXPECT_EQ(s.next_step(), plan({decode(0, 3), prefill(2)}));
  EXPECT_EQ(s.tokens()[0], join(req.sequences[0].prompt, {7}));
  EXPECT_EQ(s.tokens()[1], req.sequences[2].prompt);
  s.record(0, 9, true);
  s.record(1, 10, false);
  EXPECT_EQ(s.next_step(), plan({prefill(3), decode(2, 5)}));
  s.record(0, 11, false);
  s.record(1, 12, true);
  EXPECT_EQ(s.next_step(), plan({decode(3, 6), prefill(4)}));
  s.record(0, 13, true);
  s.record(1, 14, true);
  EXPECT_EQ(s.next_step(), plan({idle(), idle()}));  // the queue is empty
}

TEST(StepScheduler, FewerPromptsThanSlots) {
  const GenerationRequest req = queue({2}, 4);
  StepScheduler s(req, 2, true);
  ASSERT_EQ(s.slots(), 1u);
  EXPECT_EQ(s.next_step(), plan({prefill(0)}));
}

// A GPU batch's newcomers prefill at most prefill_budget prompt tokens a step: its first one
// whatever its length; after one that does not fit the batch takes no more this step.
TEST(StepScheduler, PrefillBudgetSplitsNewcomersAcrossSteps) {
  GenerationRequest req = queue({6, 6, 3, 12}, 4);
  req.prefill_budget = 10;
  StepScheduler s(req, 4, true);
  EXPECT_EQ(s.next_step(), plan({prefill(0), idle(), idle(), idle()}));  // 6 + 6 > 10
  s.record(0, 1, false);
  EXPECT_EQ(s.next_step(), plan({decode(0, 6), prefill(1), prefill(2), idle()}));  // 6 + 3; + 12 > 10
  s.record(0, 1, false);
  s.record(1, 1, false);
  s.record(2, 1, false);
  EXPECT_EQ(s.next_step(), plan({decode(0, 7), decode(1, 6), decode(2, 3), prefill(3)}));  // 12 > 10 alone
}

TEST(StepScheduler, PrefillBudgetIsPerGpuBatch) {
  GenerationRequest req = queue({6, 6, 6, 6}, 4);
  req.prefill_budget = 8;
  StepScheduler s(req, 2, true);
  // Slot 1 would take 12 tokens into batch 0: prompt 1 goes to slot 2 (batch 1) instead.
  EXPECT_EQ(s.next_step(), plan({prefill(0), idle(), prefill(1), idle()}));
  s.record(0, 1, false);
  s.record(2, 1, false);
  EXPECT_EQ(s.next_step(), plan({decode(0, 6), prefill(2), decode(1, 6), prefill(3)}));
}

// A feed that answers next_sequence as `answer` does (in order when it is null) and stops
// admitting once `stop` is set, counting the polls.
struct TestFeed final : serving::SequenceFeed {
  std::function<std::optional<std::size_t>(std::size_t from, bool idle)> answer;
  bool stop = false;
  int polls = 0;
  bool stop_admitting() override {
    ++polls;
    return stop;
  }
  std::optional<std::size_t> next_sequence(std::size_t from, bool idle) override {
    return answer ? answer(from, idle) : std::optional(from);
  }
};

TEST(StepScheduler, StopAdmittingDropsTheWaitingPrompts) {
  GenerationRequest req = queue({3, 3, 3, 3}, 2);
  TestFeed feed;
  StepScheduler s(req, 2, true, &feed);
  EXPECT_EQ(s.next_step(), plan({prefill(0), prefill(1)}));
  EXPECT_EQ(feed.polls, 1);
  feed.stop = true;
  s.record(0, 1, true);
  s.record(1, 1, false);
  EXPECT_EQ(s.next_step(), plan({idle(), decode(1, 3)}, {}, {}, {2, 3}));
  s.record(1, 1, true);
  EXPECT_EQ(s.next_step(), plan({idle(), idle()}));
  EXPECT_EQ(feed.polls, 2);  // not asked once no prompt waits
}

TEST(StepScheduler, NextSequencePicksSkipsAndWaits) {
  GenerationRequest req = queue({3, 3, 3, 3, 3}, 2);
  std::vector<std::pair<std::size_t, bool>> asked;  // (from, idle)
  std::vector<std::optional<std::size_t>> answers = {0, std::nullopt, 3, 5};
  TestFeed feed;
  feed.answer = [&](std::size_t from, bool idle) -> std::optional<std::size_t> {
    asked.emplace_back(from, idle);
    const auto a = answers.at(asked.size() - 1);
    return a;
  };
  StepScheduler s(req, 2, true, &feed);
  EXPECT_EQ(s.next_step(), plan({prefill(0), idle()}));  // none yet for slot 1
  s.record(0, 1, false);
  // Prompts 1 and 2 are another rank's: dropped on the way to 3.
  EXPECT_EQ(s.next_step(), plan({decode(0, 3), prefill(3)}, {}, {}, {1, 2}));
  s.record(0, 1, true);
  s.record(1, 1, false);
  EXPECT_EQ(s.next_step(), plan({idle(), decode(3, 3)}, {}, {}, {4}));  // none left
  const std::vector<std::pair<std::size_t, bool>> expected = {{0, true}, {1, false}, {1, false}, {4, false}};
  EXPECT_EQ(asked, expected);
  s.record(1, 1, true);
  EXPECT_EQ(s.next_step(), plan({idle(), idle()}));
  EXPECT_EQ(asked.size(), 4u);
}

TEST(StepScheduler, NextSequenceMustAnswerWhenNoSlotRuns) {
  GenerationRequest req = queue({3}, 1);
  TestFeed feed;
  feed.answer = [](std::size_t, bool) -> std::optional<std::size_t> { return std::nullopt; };
  StepScheduler s(req, 1, true, &feed);
  EXPECT_THROW(s.next_step(), std::logic_error);
}

TEST(StepScheduler, NextSequenceMayNotGoBack) {
  GenerationRequest req = queue({3, 3}, 1);
  TestFeed feed;
  feed.answer = [](std::size_t, bool) -> std::optional<std::size_t> { return 0; };
  StepScheduler s(req, 1, true, &feed);
  EXPECT_EQ(s.next_step(), plan({prefill(0)}));
  s.record(0, 1, true);
  EXPECT_THROW(s.next_step(), std::logic_error);  // asked from 1, answered 0
}

// shares_prompt: a run of one prompt's samples prefills once; the others idle as forks of its
// slot (the first other free slots) and copy its row after the step unless they ended at once.
TEST(StepScheduler, SharedPrefillRunsFork) {
  GenerationRequest req = queue({5, 5, 5, 4}, 4);
  req.sequences[1].prompt = req.sequences[2].prompt = req.sequences[0].prompt;
  req.sequences[1].shares_prompt = req.sequences[2].shares_prompt = true;
  StepScheduler s(req, 2, true);
  EXPECT_EQ(s.next_step(), plan({prefill(0), fork(1, 0), fork(2, 0), prefill(3)}));
  s.record(0, 1, false);
  s.record(1, 2, false);
  s.record(2, 3, true);  // ended with its first token: nothing to copy
  s.record(3, 4, false);
  EXPECT_EQ(s.next_step(), plan({decode(0, 5), decode(1, 5), idle(), decode(3, 4)}, {{0, 1, 5}}));
  EXPECT_EQ(s.tokens()[1], join(req.sequences[1].prompt, {2}));
}

TEST(StepScheduler, SharedPrefillRunWaitsForFreeSlots) {
  GenerationRequest req = queue({4, 5, 5}, 2);
  req.sequences[2].prompt = req.sequences[1].prompt;
  req.sequences[2].shares_prompt = true;
  StepScheduler s(req, 2, true);
  EXPECT_EQ(s.next_step(), plan({prefill(0), idle()}));  // the run of 2 needs 2 free slots
  s.record(0, 1, true);
  EXPECT_EQ(s.next_step(), plan({prefill(1), fork(2, 0)}));
}

TEST(StepScheduler, FixedBlockPrefillsThenDecodesAndForks) {
  GenerationRequest req = queue({5, 5, 3}, 0);
  req.sequences[1].prompt = req.sequences[0].prompt;
  req.sequences[1].shares_prompt = true;
  StepScheduler s(req, 2, true);
  ASSERT_EQ(s.slots(), 3u);
  EXPECT_EQ(s.next_step(), plan({prefill(0), fork(1, 0), prefill(2)}));
  const std::vector<std::int32_t> next = {7, 8, 9};
  s.record_all(next);
  EXPECT_EQ(s.next_step(), plan({decode(0, 5), decode(1, 5), decode(2, 3)}, {{0, 1, 5}}));
  s.record_all(next);
  EXPECT_EQ(s.next_step(), plan({decode(0, 6), decode(1, 6), decode(2, 4)}));
  EXPECT_EQ(s.tokens()[2], join(req.sequences[2].prompt, {9, 9}));
}

// Shared prompt prefixes (docs/prefix-sharing.md), at least min_shared_prefix = 16 tokens,
// the longest a row holds, never a whole prompt; a newcomer waits a step when another newcomer
// of this step prefills a prefix of it longer (by 16) than the rows hold. The slots whose rows
// hold copies of one computation (at least 16 slots, cached before the step) read it as a
// group: the prefix all of them hold, led by the group's first slot.
TEST(StepScheduler, SharedPrefixes) {
  const Tokens b = run_of(1, 40);
  auto head = [&](std::int32_t n) { return Tokens(b.begin(), b.begin() + n); };
  GenerationRequest req;
  req.sequences = sequences_of({head(30), join(head(20), {100, 101, 102}), join(head(25), {110, 111}),
                                join(head(15), {120}), head(30), join(head(20), {100, 101, 102})});
  req.slots = 3;
  StepScheduler s(req, 3, true);
  // Prompt 1's first 20 tokens are being prefilled by prompt 0: it waits, and admission stops.
  EXPECT_EQ(s.next_step(), plan({prefill(0), idle(), idle()}));
  s.record(0, 50, false);
  // Row 0 holds prompt 0: prompt 1 takes 20 tokens of it; prompt 2 takes 25 (row 1 holds 20).
  // All three rows hold row 0's first 20 slots.
  EXPECT_EQ(s.next_step(), plan({shares(decode(0, 30), 0, 20), shares(extend(1, 20), 0, 20), shares(extend(2, 25), 0, 20)},
                                {}, {{0, 1, 20}, {0, 2, 25}}));
  s.record(0, 51, true);
  s.record(1, 60, false);
  s.record(2, 61, true);  // its row keeps prompt 2
  // Prompt 3 shares 15 tokens only: it prefills. Prompt 4 takes the 25 its own row holds (no
  // copy) over row 1's 20; rows 1 and 2 still hold the first 20 slots of row 0's old request.
  EXPECT_EQ(s.next_step(), plan({prefill(3), shares(decode(1, 23), 1, 20), shares(extend(4, 25), 1, 20)}));
  s.record(0, 70, false);
  s.record(1, 71, true);
  s.record(2, 72, false);
  // Prompt 5 is prompt 1, whose row holds it whole: its last token is still computed. Row 0's
  // first 15 tokens are those of the others, but computed apart (and fewer than 16): no group.
  EXPECT_EQ(s.next_step(), plan({decode(3, 16), shares(extend(5, 22), 1, 20), shares(decode(4, 30), 1, 20)}));
}

// Equal tokens computed apart are not a shared prefix: only copies of one computation are (their
// KV may differ in the last bits). Groups stay within a GPU batch.
TEST(StepScheduler, SharedPrefixGroupsNeedOneComputation) {
  const Tokens b = run_of(1, 40);
  GenerationRequest req;
  // Prompt 1 shares 18 tokens with prompt 0, under min_shared_prefix 20: it prefills them again.
  req.sequences = sequences_of({Tokens(b.begin(), b.begin() + 30), join(Tokens(b.begin(), b.begin() + 18), {90, 91, 92}),
                                join(Tokens(b.begin(), b.begin() + 25), {93}), join(Tokens(b.begin(), b.begin() + 24), {94})});
  req.slots = 4;
  req.min_shared_prefix = 20;
  StepScheduler s(req, 2, true);
  EXPECT_EQ(s.next_step(), plan({prefill(0), prefill(1), idle(), idle()}));
  s.record(0, 50, false);
  s.record(1, 51, false);
  // Prompts 2 and 3 take 25 and 24 tokens of row 0, in the other GPU batch: they read them as a
  // group there; row 1 holds equal tokens computed apart, and row 0 is in the first batch.
  EXPECT_EQ(s.next_step(), plan({decode(0, 30), decode(1, 21), shares(extend(2, 25), 2, 24), shares(extend(3, 24), 2, 24)},
                                {}, {{0, 2, 25}, {0, 3, 24}}));
}

TEST(StepScheduler, SharedPrefixesOff) {
  GenerationRequest req;
  req.sequences = sequences_of({run_of(1, 30), run_of(1, 31)});
  req.slots = 2;
  StepScheduler off(req, 2, false);
  EXPECT_EQ(off.next_step(), plan({prefill(0), prefill(1)}));
  req.min_shared_prefix = 31;  // more than prompt 1 can share: no wait either
  StepScheduler longer(req, 2, true);
  EXPECT_EQ(longer.next_step(), plan({prefill(0), prefill(1)}));
}

// Prefixes held once (hold_prefixes): families A (40 tokens: prompts 0, 1, 3, 6) and B (30:
// prompts 2, 4), prompt 5 in none; 4 new tokens each. A takes pool row 0 (its request comes
// first), B row 1; rows hold at most 9 slots (prompt 5: 5 + 4), against 47 without a pool. A family's first
// newcomer prefills its prefix into its row, and the others of that step wait for it; then each
// extends after the row's tokens. The slots of a GPU batch reading one row are a group.
TEST(StepScheduler, HeldPrefixes) {
  const Tokens a = run_of(1, 40), b = run_of(500, 30);
  GenerationRequest req;
  req.sequences = sequences_of({join(a, {100, 101}), join(a, {102}), join(b, {200, 201}), join(a, {103, 104, 105}),
                                join(b, {202}), run_of(900, 5), join(a, {106})});
  req.max_new_tokens = 4;
  req.slots = 3;
  StepScheduler s(req, 3, true);
  EXPECT_EQ(hold(s), (PrefixPool{.families = 2, .rows = 2, .capacity = 40, .row_capacity = 9}));
  EXPECT_EQ(s.next_step(), plan({held(prefill(0), 0, 40), idle(), idle()}));
  s.record(0, 50, false);
  EXPECT_EQ(s.next_step(), plan({shares(held(decode(0, 42), 0, 40), 0, 40), shares(held(extend(1, 40), 0, 40), 0, 40),
                                 held(prefill(2), 1, 30)}));
  s.record(0, 51, true);
  s.record(1, 52, false);
  s.record(2, 53, false);
  EXPECT_EQ(s.next_step(), plan({shares(held(extend(3, 40), 0, 40), 0, 40), shares(held(decode(1, 41), 0, 40), 0, 40),
                                 shares(held(decode(2, 32), 1, 30), 2, 30)}));
  for (std::size_t slot = 0; slot < 3; ++slot) s.record(slot, 60, true);
  EXPECT_EQ(s.next_step(), plan({shares(held(extend(4, 30), 1, 30), 0, 30), prefill(5),
                                 shares(held(extend(6, 40), 0, 40), 2, 40)}));
}

// No pool where it would not save memory (as many families running at once as slots: A and B
// in turn in 2 slots), nor with prefix sharing off.
TEST(StepScheduler, HeldPrefixesOnlyWhereTheySaveMemory) {
  const Tokens a = run_of(1, 40), b = run_of(500, 30);
  GenerationRequest req;
  req.sequences = sequences_of({join(a, {100}), join(b, {200}), join(a, {101}), join(b, {201})});
  req.max_new_tokens = 4;
  req.slots = 2;
  EXPECT_EQ(StepScheduler(req, 2, true).prefix_pool().rows, 0);
  req.slots = 3;
  EXPECT_EQ(StepScheduler(req, 3, true).prefix_pool().rows, 2);
  EXPECT_EQ(StepScheduler(req, 3, false).prefix_pool().rows, 0);
}

// Two samples of one prompt sharing its prefill (shares_prompt) behind a held prefix: the
// first fills the pool row, the fork idles, then takes a copy of the first's own row (after the
// prefix: 41 - 40 = 1 slot) and reads the pool like the family's others.
TEST(StepScheduler, HeldPrefixesWithASharedPrefill) {
  const Tokens a = run_of(1, 40);
  GenerationRequest req;
  req.sequences = sequences_of({join(a, {100}), join(a, {100}), join(a, {101})});
  req.sequences[1].shares_prompt = true;
  req.max_new_tokens = 2;
  req.slots = 3;
  StepScheduler s(req, 3, true);
  EXPECT_EQ(hold(s), (PrefixPool{.families = 1, .rows = 1, .capacity = 40, .row_capacity = 3}));
  EXPECT_EQ(s.next_step(), plan({held(prefill(0), 0, 40), fork(1, 0), idle()}));
  s.record(0, 50, false);
  s.record(1, 51, false);
  EXPECT_EQ(s.next_step(),
            plan({shares(held(decode(0, 41), 0, 40), 0, 40), shares(held(decode(1, 41), 0, 40), 0, 40),
                  shares(held(extend(2, 40), 0, 40), 0, 40)},
                 {{0, 1, 1}}));
}

// Families A, B, C (40 tokens each) two requests each, one family after another, then A again;
// 2 slots. Each family's first request makes 3 new tokens and its second, which waits a step
// for the first's prefill of their prefix, 2, so both end together. Admitted as the planner
// admits (policy::Workload::pool_rows), one family runs at a time: one pool row, of 40 slots
// beside rows of 4 (48 slots against 88). A family finding no row of its own takes the free
// one (none of the running requests reads it) and fills it, A twice; its second request waits
// while the row is being filled (steps 0, 3, 6).
TEST(StepScheduler, HeldPrefixesTakeTurnsInThePoolRows) {
  const Tokens a = run_of(1, 40), b = run_of(500, 40), c = run_of(800, 40);
  GenerationRequest req;
  req.sequences = sequences_of({join(a, {100}), join(a, {101}), join(b, {200}), join(b, {201}), join(c, {300}),
                                join(c, {301}), join(a, {102})});
  for (std::size_t i = 0; i < req.sequences.size(); ++i) req.sequences[i].max_new_tokens = i % 2 == 0 ? 3 : 2;
  req.max_new_tokens = 3;
  req.slots = 2;
  StepScheduler s(req, 2, true);
  EXPECT_EQ(hold(s), (PrefixPool{.families = 3, .rows = 1, .capacity = 40, .row_capacity = 4}));
  std::int32_t token = 50;
  for (std::int64_t first = 0; first < 6; first += 2) {  // each family: fill, extend, decode
    EXPECT_EQ(s.next_step(), plan({held(prefill(first), 0, 40), idle()}));
    s.record(0, token++, false);
    EXPECT_EQ(s.next_step(), plan({shares(held(decode(first, 41), 0, 40), 0, 40),
                                   shares(held(extend(first + 1, 40), 0, 40), 0, 40)}));
    s.record(0, token++, false);
    s.record(1, token++, false);
    EXPECT_EQ(s.next_step(), plan({shares(held(decode(first, 42), 0, 40), 0, 40),
                                   shares(held(decode(first + 1, 41), 0, 40), 0, 40)}));
    s.record(0, token++, true);
    s.record(1, token++, true);
  }
  EXPECT_EQ(s.next_step(), plan({held(prefill(6), 0, 40), idle()}));  // A fills it again
}

// A pool the executor did not place (prefix_pool without hold_prefixes): the plans copy
// prefixes between rows, as a planner never asked for one does.
TEST(StepScheduler, APoolNotPlacedPlansAsWithout) {
  const Tokens a = run_of(1, 40), b = run_of(500, 30);
  GenerationRequest req;
  req.sequences = sequences_of({join(a, {100}), join(a, {101}), join(b, {200}), join(b, {201}), join(a, {102})});
  req.max_new_tokens = 2;
  req.slots = 3;
  StepScheduler proposed(req, 3, true), plain(req, 3, true);
  ASSERT_EQ(proposed.prefix_pool().rows, 2);
  bool copied = false;
  for (int step = 0; step < 8; ++step) {
    const StepPlan p = proposed.next_step();
    ASSERT_EQ(p, plain.next_step()) << "step " << step;
    copied = copied || !p.prefixes.empty();
    for (std::size_t slot = 0; slot < p.slots.size(); ++slot) {
      if (p.slots[slot].kind == SeqStep::Idle) continue;
      proposed.record(slot, 7, step % 2 == 1);
      plain.record(slot, 7, step % 2 == 1);
    }
  }
  EXPECT_TRUE(copied);
}

}  // namespace
}  // namespace flexh2o::engine
