#include "engine/serving/step_scheduler.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <utility>

#include "engine/runtime/prefill_fork.h"
#include "policy/admission.h"

namespace flexh2o::serving {

using engine::common_prefix;
using engine::GenerationRequest;
using engine::longest_prefix;
using engine::PrefixMatch;
using engine::RowCopy;
using engine::SeqStep;
using engine::shared_prompt_run;
using engine::SlotStep;
using engine::StepPlan;

namespace {

// `feed`, or SequenceFeed's defaults (every sequence, in order) without one.
SequenceFeed& feed_or_in_order(SequenceFeed* feed) {
  static SequenceFeed in_order;  // stateless: one serves every scheduler
  return feed ? *feed : in_order;
}

}  // namespace

StepScheduler::StepScheduler(const GenerationRequest& req, std::int64_t gpu_batch_size, bool share_prefixes,
                             SequenceFeed* feed)
    : req_(req),
      feed_(feed_or_in_order(feed)),
      gpu_batch_size_(static_cast<std::size_t>(gpu_batch_size)),
      continuous_(req.slots > 0),
      sharing_(continuous_ && share_prefixes) {
  if (gpu_batch_size < 1) throw std::invalid_argument("a GPU batch holds at least one sequence");
  const std::size_t prompts = req.sequences.size();
  const std::size_t n = continuous_ ? std::min(static_cast<std::size_t>(req.slots), prompts) : prompts;
  tokens_.resize(n);
  slot_seq_.assign(n, -1);
  fork_of_.assign(n, -1);
  held_.assign(n, 0);
  prefix_.assign(n, 0);
  kv_runs_.resize(n);
  if (continuous_) return;
  // A fixed block: each run of prompts sharing a prefill forks its first one's slot after step 0.
  for (std::size_t s = 0; s < n; ++s) {
    tokens_[s] = req.sequences[s].prompt;
    slot_seq_[s] = static_cast<std::int64_t>(s);
    if (s > 0 && req.sequences[s].shares_prompt)
      fork_of_[s] = fork_of_[s - 1] >= 0 ? fork_of_[s - 1] : static_cast<std::int64_t>(s - 1);
  }
}

StepPlan StepScheduler::next_step() {
  StepPlan plan;
  const bool first = !planned_;
  if (planned_) plan.forks = take_forks();
  planned_ = true;
  for (PoolRow& row : pool_)  // the last step's prefills filled them
    if (row.state == RowState::Filling) row.state = RowState::Filled;
  std::vector<bool> newcomer(slots(), first && !continuous_);
  if (continuous_) {
    if (waiting_ < req_.sequences.size() && feed_.stop_admitting())
      for (; waiting_ < req_.sequences.size(); ++waiting_) plan.dropped.push_back(waiting_);
    newcomer = admit(plan);
  }
  lay_out(plan, newcomer);
  return plan;
}

void StepScheduler::lay_out(StepPlan& plan, const std::vector<bool>& newcomer) const {
  plan.slots.resize(slots());
  for (std::size_t slot = 0; slot < slots(); ++slot) {
    SlotStep& s = plan.slots[slot];
    s.seq = slot_seq_[slot];
    s.fork_of = fork_of_[slot];
    // No request, or a fork waiting for the prefill of this step it shares.
    if (s.seq < 0 || s.fork_of >= 0) continue;
    if (newcomer[slot]) {
      s.kind = prefix_[slot] > 0 ? SeqStep::Extend : SeqStep::Prefill;
      s.cached = prefix_[slot];
    } else {
      s.kind = SeqStep::Decode;
      s.cached = static_cast<std::int64_t>(tokens_[slot].size()) - 1;
    }
    if (holding_) {
      const auto seq = static_cast<std::size_t>(s.seq);
      s.pool_row = pool_row_of(seq);
      s.base = held_tokens(seq);
    }
  }
  if (sharing_) group_prefixes(plan);
}

void StepScheduler::copy_kv_runs(std::size_t to, std::size_t from, std::int64_t tokens) {
  std::vector<KvRun> runs;
  for (const KvRun& r : kv_runs_[from])
    if (r.begin < tokens) runs.push_back(r);
  runs.push_back({next_origin_++, tokens});
  kv_runs_[to] = std::move(runs);
}

std::int64_t StepScheduler::same_kv(std::size_t a, std::size_t b) const {
  const std::vector<KvRun>&x = kv_runs_[a], &y = kv_runs_[b];
  constexpr std::int64_t kOpen = std::numeric_limits<std::int64_t>::max();
  std::int64_t same = 0;
  for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
    if (x[i].origin != y[i].origin || x[i].begin != y[i].begin) break;
    const std::int64_t end_x = i + 1 < x.size() ? x[i + 1].begin : kOpen;
    const std::int64_t end_y = i + 1 < y.size() ? y[i + 1].begin : kOpen;
    same = std::min(end_x, end_y);
    if (end_x != end_y) break;
  }
  return same;
}

// Within each GPU batch, a slot that reads its cache joins the first group whose first slot's
// row holds the same bytes as its own for at least min_shared_prefix slots, both cached before
// the step; the group's prefix is the shortest of its members'. (A member sharing a longer
// prefix with some of the others still reads the rest on its own.)
// Held prefixes: the slots of a GPU batch reading one pool row are a group (of one, too: its
// prefix is read from the pool either way).
void StepScheduler::group_prefixes(StepPlan& plan) const {
  const std::int64_t least = std::max<std::int64_t>(req_.min_shared_prefix, 1);
  auto reads_cache = [&](std::size_t s) {
    return plan.slots[s].kind == SeqStep::Decode || plan.slots[s].kind == SeqStep::Extend;
  };
  if (holding_) {
    for (std::size_t s = 0; s < slots(); ++s) {
      SlotStep& step = plan.slots[s];
      if (!reads_cache(s) || step.pool_row < 0) continue;
      const std::size_t batch_first = s - s % gpu_batch_size_;
      std::size_t lead = batch_first;
      while (!reads_cache(lead) || plan.slots[lead].pool_row != step.pool_row) ++lead;
      step.prefix_group = static_cast<std::int64_t>(lead);
      step.prefix_len = step.base;
    }
    return;
  }
  for (std::size_t first = 0; first < slots(); first += gpu_batch_size_) {
    const std::size_t end = std::min(slots(), first + gpu_batch_size_);
    std::vector<std::vector<std::size_t>> groups;  // each led by its first slot
    std::vector<std::int64_t> lens;
    for (std::size_t s = first; s < end; ++s) {
      if (!reads_cache(s)) continue;
      const std::int64_t cached = plan.slots[s].cached;
      std::size_t g = 0;
      for (; g < groups.size(); ++g) {
        const std::size_t lead = groups[g].front();
        const std::int64_t same = std::min({same_kv(s, lead), cached, plan.slots[lead].cached});
        if (same < least) continue;
        groups[g].push_back(s);
        lens[g] = std::min(lens[g], same);
        break;
      }
      if (g == groups.size()) {
        groups.push_back({s});
        lens.push_back(cached);
      }
    }
    for (std::size_t g = 0; g < groups.size(); ++g) {
      if (groups[g].size() < 2) continue;
      for (const std::size_t s : groups[g]) {
        plan.slots[s].prefix_group = static_cast<std::int64_t>(groups[g].front());
        plan.slots[s].prefix_len = lens[g];
      }
    }
  }
}

std::vector<RowCopy> StepScheduler::take_forks() {
  std::vector<RowCopy> forks;
  for (std::size_t s = 0; s < slots(); ++s) {
    const std::int64_t from = std::exchange(fork_of_[s], -1);
    const std::int64_t seq = slot_seq_[s];
    if (from < 0 || seq < 0) continue;  // not a fork, or it ended with its first token
    const auto b = static_cast<std::size_t>(seq);
    const auto prompt = static_cast<std::int64_t>(req_.sequences[b].prompt.size());
    // A row after a held prefix holds the prompt's slots from its base on.
    forks.push_back({from, static_cast<std::int64_t>(s), prompt - (holding_ ? held_tokens(b) : 0)});
    copy_kv_runs(s, static_cast<std::size_t>(from), prompt);
  }
  return forks;
}

void StepScheduler::record(std::size_t slot, std::int32_t token, bool ended) {
  if (!continuous_) throw std::logic_error("StepScheduler::record is for continuous batching; a fixed block records all");
  auto& tokens = tokens_[slot];
  // The row holds every input so far (a fork's once its copy is made, which a fork that ends
  // here skips); the tokens stay for a later prompt that starts with them.
  if (ended) {
    slot_seq_[slot] = -1;  // free for the next prompt
    held_[slot] = fork_of_[slot] >= 0 ? 0 : static_cast<std::int64_t>(tokens.size());
  } else {
    tokens.push_back(token);
    held_[slot] = static_cast<std::int64_t>(tokens.size()) - 1;
  }
}

void StepScheduler::record_all(std::span<const std::int32_t> next) {
  if (continuous_ || next.size() != slots())
    throw std::logic_error("StepScheduler::record_all takes one token per slot of a fixed block");
  for (std::size_t s = 0; s < slots(); ++s) tokens_[s].push_back(next[s]);
}

bool StepScheduler::prompt_waiting(bool idle, StepPlan& plan) {
  const std::size_t queued = req_.sequences.size();
  if (waiting_ >= queued) return false;
  const std::optional<std::size_t> next = feed_.next_sequence(waiting_, idle);
  if (!next && idle) throw std::logic_error("the sequence feed gave no answer while no slot runs");
  if (!next) return false;
  if (*next < waiting_) throw std::logic_error("the sequence feed went back in the queue");
  for (const std::size_t to = std::min(*next, queued); waiting_ < to; ++waiting_) plan.dropped.push_back(waiting_);
  return waiting_ < queued;
}

// Free slots take the waiting prompts as policy::admit_step admits them (the planner runs the
// same rule on the job's lengths). A newcomer computes its prompt less the prefix it takes from
// a cache row (copied before the step) or from its family's pool row. A prompt whose longest
// prefix is being prefilled in this step by another newcomer waits for the next step, when that
// row holds it, as does one whose family's pool row is being filled or finds none free. The
// prompts sharing its prefill (shared_prompt_run, at most the block's slots) are its forks.
std::vector<bool> StepScheduler::admit(StepPlan& plan) {
  const std::size_t n = slots();
  std::vector<bool> newcomer(n, false);
  std::vector<std::size_t> free;
  for (std::size_t s = 0; s < n; ++s)
    if (slot_seq_[s] < 0) free.push_back(s);
  std::ranges::fill(prefix_, 0);
  bool idle = free.size() == n;
  struct Start {
    PoolStart pool = PoolStart::Alone;
    PrefixMatch match;
    std::int64_t taken = 0;  // from its family's pool row
  } start;  // of the newcomer next() described last
  auto next = [&](std::size_t f) -> std::optional<policy::Newcomer> {
    if (!prompt_waiting(idle, plan)) return std::nullopt;
    const std::vector<std::int32_t>& prompt = req_.sequences[waiting_].prompt;
    start.pool = holding_ ? pool_start(waiting_) : PoolStart::Alone;
    if (start.pool == PoolStart::Waits) return std::nullopt;
    const bool matching = sharing_ && !holding_;
    start.match = matching ? longest_prefix(prompt, held_rows(), static_cast<std::int64_t>(f), req_.min_shared_prefix)
                           : PrefixMatch{};
    if (matching && prefix_in_flight(prompt, start.match, newcomer)) return std::nullopt;
    start.taken = start.pool == PoolStart::Extends ? held_tokens(waiting_) : 0;
    const std::int64_t run = std::min<std::int64_t>(shared_prompt_run(req_, waiting_), static_cast<std::int64_t>(n));
    return policy::Newcomer{.computed = static_cast<std::int64_t>(prompt.size()) - start.match.tokens - start.taken,
                            .run = run};
  };
  auto take = [&](std::size_t f, std::span<const std::size_t> forks) {
    newcomer[f] = true;
    if (holding_) take_pool_row(waiting_, start.pool);
    take_slot(f, -1);
    if (start.match.tokens > 0) {  // copied before the step computes (none when its own row holds it)
      prefix_[f] = held_[f] = start.match.tokens;
      if (start.match.slot != static_cast<std::int64_t>(f))
        plan.prefixes.push_back({start.match.slot, static_cast<std::int64_t>(f), start.match.tokens});
    }
    if (start.taken > 0) prefix_[f] = start.taken;  // it extends after its family's pool row
    copy_kv_runs(f, start.match.tokens > 0 ? static_cast<std::size_t>(start.match.slot) : f, start.match.tokens);
    idle = false;
    for (const std::size_t fork : forks) take_slot(fork, static_cast<std::int64_t>(f));
  };
  policy::admit_step(free, gpu_batch_size_, req_.prefill_budget, next, take);
  return newcomer;
}

void StepScheduler::take_slot(std::size_t slot, std::int64_t fork_of) {
  slot_seq_[slot] = static_cast<std::int64_t>(waiting_);
  fork_of_[slot] = fork_of;
  tokens_[slot] = req_.sequences[waiting_].prompt;
  held_[slot] = 0;  // its row is rewritten (or copied into) from here on
  ++waiting_;
}

engine::PrefixPool StepScheduler::prefix_pool() {
  if (!sharing_) return {};
  std::vector<std::span<const std::int32_t>> prompts;
  std::vector<policy::RequestLength> lengths;
  for (std::size_t b = 0; b < req_.sequences.size(); ++b) {
    const auto prompt = static_cast<std::int64_t>(req_.sequences[b].prompt.size());
    prompts.emplace_back(req_.sequences[b].prompt);
    lengths.push_back({.prompt = prompt,
                       .gen = engine::sequence_tokens(req_, b) - prompt,
                       .shares_prompt = req_.sequences[b].shares_prompt});
  }
  engine::PrefixFamilies families = engine::prefix_families(prompts, req_.min_shared_prefix);
  policy::Workload w = policy::continuous_workload(std::move(lengths), req_.prefill_budget);
  engine::add_families(families, w.requests);
  w.held = engine::held_prefixes(families, w.requests);
  const std::int64_t rows = w.pool_rows(static_cast<std::int64_t>(slots()), static_cast<std::int64_t>(gpu_batch_size_));
  if (rows == 0) return {};
  families_ = std::move(families);
  pool_rows_ = rows;
  return {.families = w.held.families, .rows = rows, .capacity = w.held.prefix, .row_capacity = w.held.rest};
}

void StepScheduler::hold_prefixes() {
  if (pool_rows_ == 0) throw std::logic_error("hold_prefixes without a pool (prefix_pool)");
  holding_ = true;
  pool_.assign(static_cast<std::size_t>(pool_rows_), PoolRow{});
  family_row_.assign(families_.prefix.size(), -1);
}

StepScheduler::PoolStart StepScheduler::pool_start(std::size_t seq) const {
  const std::int64_t family = families_.family_of[seq];
  if (family < 0) return PoolStart::Alone;
  const std::int64_t row = family_row_[static_cast<std::size_t>(family)];
  if (row < 0) return free_pool_row() >= 0 ? PoolStart::Fills : PoolStart::Waits;
  return pool_[static_cast<std::size_t>(row)].state == RowState::Filled ? PoolStart::Extends : PoolStart::Waits;
}

std::int64_t StepScheduler::free_pool_row() const {
  std::vector<bool> read(pool_.size(), false);
  for (const std::int64_t seq : slot_seq_)
    if (const std::int64_t row = seq < 0 ? -1 : pool_row_of(static_cast<std::size_t>(seq)); row >= 0)
      read[static_cast<std::size_t>(row)] = true;
  std::int64_t best = -1;
  for (std::size_t r = 0; r < pool_.size(); ++r)
    if (!read[r] && (best < 0 || pool_[r].taken < pool_[static_cast<std::size_t>(best)].taken))
      best = static_cast<std::int64_t>(r);
  return best;
}

void StepScheduler::take_pool_row(std::size_t seq, PoolStart start) {
  if (start == PoolStart::Alone) return;
  const std::int64_t family = families_.family_of[seq];
  if (start == PoolStart::Fills) {
    const std::int64_t row = free_pool_row();
    PoolRow& r = pool_[static_cast<std::size_t>(row)];
    if (r.family >= 0) family_row_[static_cast<std::size_t>(r.family)] = -1;  // it refills when it comes back
    r = {.family = family, .state = RowState::Filling};
    family_row_[static_cast<std::size_t>(family)] = row;
  }
  pool_[static_cast<std::size_t>(pool_row_of(seq))].taken = ++takes_;
}

std::int64_t StepScheduler::pool_row_of(std::size_t seq) const {
  const std::int64_t family = families_.family_of[seq];
  return family < 0 ? -1 : family_row_[static_cast<std::size_t>(family)];
}

std::int64_t StepScheduler::held_tokens(std::size_t seq) const {
  const std::int64_t family = families_.family_of[seq];
  return family < 0 ? 0 : families_.prefix[static_cast<std::size_t>(family)];
}

std::vector<std::span<const std::int32_t>> StepScheduler::held_rows() const {
  std::vector<std::span<const std::int32_t>> rows;
  for (std::size_t s = 0; s < slots(); ++s)
    rows.push_back(std::span(tokens_[s]).first(static_cast<std::size_t>(held_[s])));
  return rows;
}

// Whether a newcomer of this step prefills a longer prefix of `prompt` (by at least the
// fewest worth sharing) than the rows hold now: the prompt then waits a step for it.
bool StepScheduler::prefix_in_flight(std::span<const std::int32_t> prompt, const PrefixMatch& now,
                                     const std::vector<bool>& newcomer) const {
  const std::int64_t least = std::max<std::int64_t>(req_.min_shared_prefix, 1);
  const auto shareable = prompt.first(prompt.size() - 1);
  for (std::size_t s = 0; s < newcomer.size(); ++s) {
    if (!newcomer[s]) continue;
    const std::int64_t n = common_prefix(shareable, tokens_[s]);
    if (n >= least && n >= now.tokens + least) return true;
  }
  return false;
}

}  // namespace flexh2o::serving
