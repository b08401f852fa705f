#include "policy/workload.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <queue>
#include <optional>
#include <set>
#include <span>

#include "policy/admission.h"

namespace flexh2o::policy {

std::int64_t Workload::sequence_capacity() const {
  if (!continuous || requests.empty()) return prompt_len + gen_len;
  std::int64_t most = 0;
  for (const RequestLength& r : requests) most = std::max(most, r.prompt + r.gen);
  return most;
}

Workload continuous_workload(std::vector<RequestLength> requests, std::int64_t prefill_budget) {
  Workload w;
  w.continuous = true;
  w.prefill_budget = prefill_budget;
  w.prompt_len = w.gen_len = 0;
  double prompts = 0, gens = 0;
  for (const RequestLength& r : requests) {
    w.prompt_len = std::max(w.prompt_len, r.prompt);
    w.gen_len = std::max(w.gen_len, r.gen);
    prompts += static_cast<double>(r.prompt);
    gens += static_cast<double>(r.gen);
  }
  const double count = static_cast<double>(std::max<std::size_t>(requests.size(), 1));
  w.mean_prompt_len = prompts / count;
  w.mean_gen_len = gens / count;
  w.requests = std::move(requests);
  return w;
}

std::int64_t default_prefill_budget(const HardwareProfile& hw, const Workload& w, std::int64_t gpu_batch) {
  if (hw.gpu_is_host_memory) return kHostPrefillBudget;
  const double mean_prompt = w.mean_prompt_len > 0 ? w.mean_prompt_len : static_cast<double>(w.prompt_len);
  const auto batch = static_cast<std::int64_t>(std::ceil(static_cast<double>(std::max<std::int64_t>(gpu_batch, 1)) * mean_prompt));
  return std::max(kHostPrefillBudget, batch);
}

Workload with_prefill_budget(Workload w, const HardwareProfile& hw, std::int64_t gpu_batch) {
  if (w.prefill_budget <= 0) w.prefill_budget = default_prefill_budget(hw, w, gpu_batch);
  return w;
}

namespace {

// A continuous job's admission (JobAdmission): its steps, the most prefix families its running
// requests hold at once, each request's computed prompt rows, and the prefix tokens a GPU
// batch's decode rows of one family leave to one of them (summed over steps and batches).
struct Admission {
  std::int64_t steps = 0, families = 0;
  std::vector<std::int64_t> computed;
  double prefix_read_by_others = 0;
};

// Pool rows taken in turn by the families of admitted requests, as StepScheduler gives them.
class PoolRows {
 public:
  explicit PoolRows(std::int64_t rows) : rows_(static_cast<std::size_t>(rows)) {}
  bool held() const { return !rows_.empty(); }
  // The row a newcomer of `family` would have: its family's (running, or still filled), or the
  // free one (none of whose requests runs) taken least recently; -1: none is free.
  std::int64_t row_for(std::int64_t family, const std::map<std::int64_t, std::int64_t>& running) const {
    std::int64_t free = -1;
    for (std::size_t i = 0; i < rows_.size(); ++i) {
      const Row& r = rows_[i];
      if (r.family == family) return static_cast<std::int64_t>(i);
      const bool busy = r.family >= 0 && running.contains(r.family);
      if (!busy && (free < 0 || r.taken < rows_[static_cast<std::size_t>(free)].taken)) free = static_cast<std::int64_t>(i);
    }
    return free;
  }
  // Whether `row` is being filled at step t (its family's newcomers wait a step).
  bool filling(std::int64_t row, std::int64_t t) const { return rows_[static_cast<std::size_t>(row)].filled_at == t; }
  // Whether a newcomer of `family` fills `row` (it is not its family's yet).
  bool fills(std::int64_t row, std::int64_t family) const { return rows_[static_cast<std::size_t>(row)].family != family; }
  // A newcomer of `family` takes `row` at step t: every newcomer marks it taken, as StepScheduler does.
  void take(std::int64_t row, std::int64_t family, std::int64_t t) {
    Row& r = rows_[static_cast<std::size_t>(row)];
    if (r.family != family) r = {.family = family, .filled_at = t};
    r.taken = ++takes_;
  }

 private:
  struct Row {
    std::int64_t family = -1, taken = 0, filled_at = -1;
  };
  std::vector<Row> rows_;
  std::int64_t takes_ = 0;
};

// The running requests of each prefix family in one GPU batch: in a step its decode rows read
// the family's prefix once for all.
class FamilyRows {
 public:
  explicit FamilyRows(const std::vector<double>& prefix) : prefix_(&prefix) {}
  void admit(std::int64_t family) {
    if (family < 0) return;
    ++running_[family];
    ++admitted_[family];
  }
  void leave(std::int64_t family) {
    if (family >= 0 && --running_[family] == 0) running_.erase(family);
  }
  void next_step() { admitted_.clear(); }
  // The prefix tokens all but one of each family's decode rows leave to that one, over `steps`
  // steps from now (in the first the requests admitted in it prefill).
  double read_by_others(std::int64_t steps) const {
    double tokens = 0;
    for (const auto& [family, running] : running_) {
      const auto it = admitted_.find(family);
      const std::int64_t newcomers = it == admitted_.end() ? 0 : it->second;
      const double prefix = (*prefix_)[static_cast<std::size_t>(family)];
      tokens += prefix * static_cast<double>(std::max<std::int64_t>(running - newcomers - 1, 0) +
                                             (steps - 1) * std::max<std::int64_t>(running - 1, 0));
    }
    return tokens;
  }

 private:
  const std::vector<double>* prefix_;
  std::map<std::int64_t, std::int64_t> running_, admitted_;
};

// Per family (RequestLength::family), the longest prefix one of its requests takes.
std::vector<double> family_prefixes(const Workload& w) {
  std::vector<double> prefix;
  for (const RequestLength& r : w.requests) {
    if (r.family < 0) continue;
    const auto f = static_cast<std::size_t>(r.family);
    if (f >= prefix.size()) prefix.resize(f + 1, 0.0);
    prefix[f] = std::max(prefix[f], static_cast<double>(r.shared));
  }
  return prefix;
}

// A continuous job admitted step by step as the engine admits it (policy::admit_step), on its
// lengths: a request holds its slot for its max_tokens steps (its prefill gives the first token).
// What the engine decides from tokens is decided here from prefix families (RequestLength::
// family), exactly where prompts share nothing but their family's prefix:
//  - a request takes its family's prefix where a cache row holds it now (a running or ended
//    request of the family, a newcomer of this step that took it; a row another request took
//    holds it no more), and waits a step where only a newcomer of this step prefills it;
//  - with `pool_rows` > 0 the families take turns in that many pool rows: a newcomer whose
//    family holds no row takes the free one taken least recently and computes its whole
//    prompt (a fill), one whose family's row is being filled waits a step, as does one that
//    finds no row free;
//  - a run of requests sharing one prefill (RequestLength::shares_prompt) takes a slot each, the
//    forks computing no prompt rows.
// Steps where nothing is admitted or ends are skipped over.
class JobAdmission {
 public:
  JobAdmission(const Workload& w, std::int64_t slots, std::int64_t gpu_batch, std::int64_t pool_rows);
  // The job's steps; per step its rows into `trace` when given.
  Admission run(std::vector<StepRows>* trace);

 private:
  // The next request as a free slot would take it (admit_step's `next`).
  std::optional<Newcomer> next();
  void take(std::size_t slot, std::span<const std::size_t> forks);
  // Request i starts in `slot` at step t_ (computing `computed` prompt rows).
  void start(std::size_t i, std::size_t slot, std::int64_t computed);
  // At step t_: the slots whose requests ended are free; the rows filled last step hold their prefixes.
  void free_ended();
  void set_row(std::size_t slot, std::int64_t family, bool now);
  // Runs steps [t_, until) (their rows into `trace`).
  void advance(std::int64_t until, std::vector<StepRows>* trace);

  const Workload& w_;
  std::size_t slots_, gpu_batch_;
  std::int64_t t_ = 0;
  std::size_t next_ = 0;  // the first request not admitted
  std::vector<double> family_prefix_;
  std::vector<FamilyRows> batches_;
  std::vector<std::int64_t> slot_request_;  // per slot: its running request (-1: free)
  std::set<std::size_t> free_;
  std::priority_queue<std::pair<std::int64_t, std::size_t>, std::vector<std::pair<std::int64_t, std::size_t>>,
                      std::greater<>>
      ends_;  // (the step a slot frees at, the slot)
  std::map<std::int64_t, std::int64_t> running_;  // per family: its requests running
  // Shared prefixes: per slot the family whose prefix its row holds (-1: none) and whether
  // from this step or the next; per family its rows holding it now and from the next step.
  std::vector<std::int64_t> row_family_;
  std::vector<bool> row_next_;
  std::map<std::int64_t, std::int64_t> holding_, filling_;
  PoolRows pool_;
  // This step: the rows its newcomers compute and the slots it started; what next() said last.
  std::int64_t prefilled_ = 0, started_ = 0;
  Newcomer offered_;
  Admission a_;
};

JobAdmission::JobAdmission(const Workload& w, std::int64_t slots, std::int64_t gpu_batch, std::int64_t pool_rows)
    : w_(w),
      slots_(static_cast<std::size_t>(std::clamp<std::int64_t>(slots, 1, std::max<std::int64_t>(
                                                                            static_cast<std::int64_t>(w.requests.size()), 1)))),
      gpu_batch_(static_cast<std::size_t>(std::clamp<std::int64_t>(gpu_batch, 1, std::max<std::int64_t>(slots, 1)))),
      family_prefix_(family_prefixes(w)),
      slot_request_(slots_, -1),
      row_family_(slots_, -1),
      row_next_(slots_, false),
      pool_(pool_rows) {
  for (std::size_t s = 0; s < slots_; s += gpu_batch_) batches_.emplace_back(family_prefix_);
  for (std::size_t s = 0; s < slots_; ++s) free_.insert(s);
  a_.computed.assign(w.requests.size(), 0);
}

std::optional<Newcomer> JobAdmission::next() {
  if (next_ >= w_.requests.size()) return std::nullopt;
  const RequestLength& r = w_.requests[next_];
  std::int64_t run = 1;
  while (next_ + static_cast<std::size_t>(run) < w_.requests.size() &&
         w_.requests[next_ + static_cast<std::size_t>(run)].shares_prompt)
    ++run;
  run = std::min(run, static_cast<std::int64_t>(slots_));
  bool takes_prefix = true;  // a prefix given without a family is taken as given
  if (r.family >= 0 && pool_.held()) {
    const std::int64_t row = pool_.row_for(r.family, running_);
    if (row < 0 || pool_.filling(row, t_)) return std::nullopt;
    takes_prefix = !pool_.fills(row, r.family);
  } else if (r.family >= 0) {
    if (holding_[r.family] == 0 && filling_[r.family] > 0) return std::nullopt;  // a newcomer of this step prefills it
    takes_prefix = holding_[r.family] > 0;
  }
  offered_ = {.computed = takes_prefix ? r.prompt - r.shared : r.prompt, .run = run};
  return offered_;
}

void JobAdmission::take(std::size_t slot, std::span<const std::size_t> forks) {
  const RequestLength& r = w_.requests[next_];
  const std::int64_t computed = offered_.computed;
  if (pool_.held() && r.family >= 0) pool_.take(pool_.row_for(r.family, running_), r.family, t_);
  // Its row holds the family's prefix now where it took it, after this step where it computes it.
  set_row(slot, r.family, r.family >= 0 && !pool_.held() && computed < r.prompt);
  start(next_, slot, computed);
  prefilled_ += computed;
  for (const std::size_t fork : forks) {
    const RequestLength& f = w_.requests[next_];
    set_row(fork, f.gen > 1 ? f.family : -1, false);  // a fork that ends with its first token keeps nothing
    start(next_, fork, 0);
  }
}

void JobAdmission::start(std::size_t i, std::size_t slot, std::int64_t computed) {
  const RequestLength& r = w_.requests[i];
  a_.computed[i] = computed;
  slot_request_[slot] = static_cast<std::int64_t>(i);
  free_.erase(slot);
  const std::int64_t end = t_ + std::max<std::int64_t>(r.gen, 1);
  ends_.emplace(end, slot);
  a_.steps = std::max(a_.steps, end);
  batches_[slot / gpu_batch_].admit(r.family);
  if (r.family >= 0) ++running_[r.family];
  ++started_;
  ++next_;
}

void JobAdmission::set_row(std::size_t slot, std::int64_t family, bool now) {
  if (const std::int64_t old = row_family_[slot]; old >= 0) --(row_next_[slot] ? filling_ : holding_)[old];
  row_family_[slot] = family;
  row_next_[slot] = !now;
  if (family >= 0) ++(now ? holding_ : filling_)[family];
}

void JobAdmission::free_ended() {
  for (auto& [family, rows] : filling_) holding_[family] += rows;
  filling_.clear();
  std::fill(row_next_.begin(), row_next_.end(), false);
  for (FamilyRows& b : batches_) b.next_step();
  for (; !ends_.empty() && ends_.top().first <= t_; ends_.pop()) {
    const std::size_t slot = ends_.top().second;
    const std::int64_t family = w_.requests[static_cast<std::size_t>(slot_request_[slot])].family;
    batches_[slot / gpu_batch_].leave(family);
    if (family >= 0 && --running_[family] == 0) running_.erase(family);
    slot_request_[slot] = -1;
    free_.insert(slot);
  }
  prefilled_ = started_ = 0;
}

void JobAdmission::advance(std::int64_t until, std::vector<StepRows>* trace) {
  for (const FamilyRows& b : batches_) a_.prefix_read_by_others += b.read_by_others(until - t_);
  if (trace) {
    const auto busy = static_cast<std::int64_t>(slots_ - free_.size());
    trace->push_back({prefilled_, busy - started_});
    trace->resize(static_cast<std::size_t>(until), StepRows{0, busy});
  }
  t_ = until;
}

Admission JobAdmission::run(std::vector<StepRows>* trace) {
  while (next_ < w_.requests.size()) {
    free_ended();
    const std::vector<std::size_t> free(free_.begin(), free_.end());
    admit_step(free, gpu_batch_, w_.prefill_budget, [&](std::size_t) { return next(); },
               [&](std::size_t slot, std::span<const std::size_t> forks) { take(slot, forks); });
    a_.families = std::max(a_.families, static_cast<std::int64_t>(running_.size()));
    advance(next_ < w_.requests.size() && !free_.empty() ? t_ + 1 : std::max(ends_.top().first, t_ + 1), trace);
  }
  for (free_ended(); !ends_.empty(); free_ended()) advance(ends_.top().first, trace);  // the rest decode to their ends
  return a_;
}

Admission admit_in_order(const Workload& w, std::int64_t slots, std::int64_t gpu_batch, std::int64_t pool_rows = 0,
                         std::vector<StepRows>* trace = nullptr) {
  return JobAdmission(w, slots, gpu_batch, pool_rows).run(trace);
}

}  // namespace

std::vector<StepRows> job_steps(const Workload& w, std::int64_t slots, std::int64_t gpu_batch, std::int64_t pool_rows) {
  std::vector<StepRows> steps;
  admit_in_order(w, slots, gpu_batch, pool_rows, &steps);
  return steps;
}

SlotStep slot_step(const Workload& w, std::int64_t slots, std::int64_t gpu_batch, std::int64_t pool_rows) {
  SlotStep s;
  // A request of prompt p and g new tokens: one prefill step of p rows (its first token; c of
  // them when it takes p - c from a shared prefix), then g - 1 decode rows attending over
  // p + 1, ..., p + g - 1 cached tokens and the new one.
  double prefill = 0, decode = 0, attended = 0, squares = 0, tokens = 0, slot_steps = 0, read_by_others = 0;
  auto add = [&](double p, double c, double g) {
    prefill += c;
    decode += g - 1;
    attended += (g - 1) * p + g * (g - 1) / 2;
    squares += c * (2 * p - c);  // causal attention of c rows after p - c cached: p * p when c = p
    tokens += g;
  };
  if (w.requests.empty()) {  // steady state at the means: every slot busy
    const double g = std::max(w.mean_gen_len > 0 ? w.mean_gen_len : static_cast<double>(w.gen_len), 1.0);
    const double p = w.mean_prompt_len > 0 ? w.mean_prompt_len : static_cast<double>(w.prompt_len);
    add(p, p - w.mean_shared, g);
    slot_steps = g;
    // The held families spread evenly over a GPU batch's slots (one family where none is held).
    const double batch = static_cast<double>(std::clamp<std::int64_t>(gpu_batch, 1, std::max<std::int64_t>(slots, 1)));
    const double families = std::min(static_cast<double>(std::max<std::int64_t>(w.held.families, 1)), batch);
    read_by_others = (g - 1) * w.mean_shared * (1 - families / batch);
  } else {
    const Admission a = admit_in_order(w, slots, gpu_batch, pool_rows);
    for (std::size_t i = 0; i < w.requests.size(); ++i) {
      const RequestLength& r = w.requests[i];
      add(static_cast<double>(r.prompt), static_cast<double>(a.computed[i]),
          static_cast<double>(std::max<std::int64_t>(r.gen, 1)));
    }
    s.steps = static_cast<double>(a.steps);
    slot_steps = s.steps * static_cast<double>(std::max<std::int64_t>(slots, 1));
    read_by_others = a.prefix_read_by_others;
  }
  s.busy = tokens / slot_steps;
  s.prefill_rows = prefill / slot_steps;
  s.decode_rows = decode / slot_steps;
  s.kv_attended = attended / slot_steps;
  s.kv_prefix_read_by_others = read_by_others / slot_steps;
  s.prompt_sq = squares / slot_steps;
  return s;
}

std::int64_t Workload::pool_rows(std::int64_t slots, std::int64_t gpu_batch) const {
  if (!continuous || held.families == 0) return 0;
  const std::int64_t rows =
      requests.empty() ? std::min(held.families, slots) : admit_in_order(*this, slots, gpu_batch).families;
  return held.saves_memory(rows, slots, sequence_capacity()) ? rows : 0;
}

}  // namespace flexh2o::policy
