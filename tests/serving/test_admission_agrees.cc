// The planner's admission against the engine's (issue 62): for random continuous jobs (prompt
// and new-token lengths, n choices sharing a prefill, prefix families shared through the rows or
// held once in a pool, slots, GPU batches, prefill budgets), the steps the planner predicts
// from the job's lengths (policy::job_steps, what slot_step sums) are the steps the engine's
// StepScheduler plans from its tokens, step by step: the same count and, in each, the same
// prompt rows and decode rows. Both run policy::admit_step; this checks what each side says of
// a request (its rows, whether it waits). The prompts share nothing but their family's prefix,
// where the planner's family-level model of the rows is exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/runtime/prefix_match.h"
#include "engine/serving/step_scheduler.h"
#include "policy/workload.h"

namespace flexh2o::policy {

void PrintTo(const StepRows& s, std::ostream* os) { *os << "{prefill " << s.prefill << ", decode " << s.decode << "}"; }

namespace {

enum class Sharing { Off, Rows, Pool };

struct Job {
  engine::GenerationRequest req;
  std::int64_t gpu_batch = 1;
};

// A random job: requests alone (a prompt of its own) or in one of a few prefix families (the
// family's prefix, then tokens of its own); some alone ones with n choices (copies sharing its
// prefill). Every token not in a family prefix appears once, so prompts share only those.
Job random_job(std::mt19937& rng) {
  auto pick = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  Job job;
  engine::GenerationRequest& req = job.req;
  req.max_new_tokens = 1;
  req.min_shared_prefix = 2;
  req.slots = pick(1, 10);
  job.gpu_batch = pick(1, req.slots);
  req.prefill_budget = std::vector<std::int64_t>{1, 8, 20, 64, 512}[static_cast<std::size_t>(pick(0, 4))];
  std::vector<std::vector<std::int32_t>> families(static_cast<std::size_t>(pick(0, 3)));
  std::int32_t fresh = 1000;
  for (auto& prefix : families)
    for (std::int64_t i = pick(2, 12); i > 0; --i) prefix.push_back(fresh++);
  for (std::int64_t r = pick(1, 28); r > 0; --r) {
    const std::int64_t family = families.empty() ? -1 : pick(-1, static_cast<std::int64_t>(families.size()) - 1);
    std::vector<std::int32_t> prompt = family < 0 ? std::vector<std::int32_t>{} : families[static_cast<std::size_t>(family)];
    for (std::int64_t i = pick(1, 10); i > 0; --i) prompt.push_back(fresh++);
    const std::int64_t choices = family < 0 && pick(0, 3) == 0 ? pick(2, 4) : 1;
    const std::int64_t limit = pick(1, 9);
    for (std::int64_t c = 0; c < choices; ++c)
      req.sequences.push_back({.prompt = prompt, .max_new_tokens = limit, .shares_prompt = c > 0});
    req.max_new_tokens = std::max(req.max_new_tokens, limit);
  }
  return job;
}

// The engine's steps: the StepScheduler's plans, each slot's rows (a prefill or extension its
// prompt less what it took, a decode one), with every sequence ending at its limit.
std::vector<StepRows> engine_steps(const Job& job, Sharing sharing, std::int64_t& pool_rows) {
  const engine::GenerationRequest& req = job.req;
  serving::StepScheduler sched(req, job.gpu_batch, sharing != Sharing::Off);
  pool_rows = 0;
  if (sharing == Sharing::Pool) {
    pool_rows = sched.prefix_pool().rows;
    if (pool_rows > 0) sched.hold_prefixes();
  }
  std::vector<std::int64_t> generated(req.sequences.size(), 0);
  std::size_t ended = 0;
  std::int32_t token = 1'000'000;  // generated tokens appear once too
  std::vector<StepRows> steps;
  while (ended < req.sequences.size()) {
    const engine::StepPlan plan = sched.next_step();
    StepRows rows;
    for (const engine::SlotStep& s : plan.slots) {
      if (s.kind == engine::SeqStep::Prefill || s.kind == engine::SeqStep::Extend)
        rows.prefill += static_cast<std::int64_t>(req.sequences[static_cast<std::size_t>(s.seq)].prompt.size()) - s.cached;
      if (s.kind == engine::SeqStep::Decode) ++rows.decode;
    }
    steps.push_back(rows);
    for (std::size_t slot = 0; slot < plan.slots.size(); ++slot) {
      const engine::SlotStep& s = plan.slots[slot];
      if (s.seq < 0 || (s.kind == engine::SeqStep::Idle && s.fork_of < 0)) continue;
      const auto seq = static_cast<std::size_t>(s.seq);
      const bool end = ++generated[seq] == *req.sequences[seq].max_new_tokens;
      ended += end ? 1 : 0;
      sched.record(slot, token++, end);
    }
    if (steps.size() > 10'000) break;  // a scheduler that never ends fails below
  }
  return steps;
}

// The job as the planner sees it (engine/job/job_setup.cc's job_workload): lengths, n choices,
// and under sharing the prefix families.
Workload planned_job(const engine::GenerationRequest& req, Sharing sharing) {
  std::vector<RequestLength> lengths;
  std::vector<std::span<const std::int32_t>> prompts;
  for (const engine::Sequence& s : req.sequences) {
    lengths.push_back({.prompt = static_cast<std::int64_t>(s.prompt.size()),
                       .gen = *s.max_new_tokens,
                       .shares_prompt = s.shares_prompt});
    prompts.emplace_back(s.prompt);
  }
  Workload w = continuous_workload(std::move(lengths), req.prefill_budget);
  if (sharing != Sharing::Off) engine::add_families(engine::prefix_families(prompts, req.min_shared_prefix), w.requests);
  return w;
}

TEST(AdmissionAgrees, ThePlannersStepsAreTheEnginesOnRandomJobs) {
  std::mt19937 rng(62);
  int pooled = 0, forked = 0, shared = 0;
  for (int shape = 0; shape < 20; ++shape) {
    const Job job = random_job(rng);
    forked += std::ranges::any_of(job.req.sequences, &engine::Sequence::shares_prompt) ? 1 : 0;
    for (const Sharing sharing : {Sharing::Off, Sharing::Rows, Sharing::Pool}) {
      SCOPED_TRACE(testing::Message() << "shape " << shape << ", sharing " << static_cast<int>(sharing) << ": "
                                      << job.req.sequences.size() << " sequences, " << job.req.slots << " slots, GPU batch "
                                      << job.gpu_batch << ", budget " << job.req.prefill_budget);
      std::int64_t pool_rows = 0;
      const std::vector<StepRows> engine = engine_steps(job, sharing, pool_rows);
      const Workload w = planned_job(job.req, sharing);
      const std::vector<StepRows> planned = job_steps(w, job.req.slots, job.gpu_batch, pool_rows);
      EXPECT_EQ(planned, engine);
      EXPECT_EQ(slot_step(w, job.req.slots, job.gpu_batch, pool_rows).steps, static_cast<double>(engine.size()));
      pooled += pool_rows > 0 ? 1 : 0;
      shared += sharing == Sharing::Rows && std::ranges::any_of(w.requests, [](const RequestLength& r) { return r.family >= 0; });
    }
  }
  // The shapes reach what they are meant to test.
  EXPECT_GE(pooled, 3);
  EXPECT_GE(forked, 5);
  EXPECT_GE(shared, 10);
}

}  // namespace
}  // namespace flexh2o::policy
