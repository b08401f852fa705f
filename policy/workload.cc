#include "policy/workload.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <queue>
#include <set>

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

// A continuous job admitted as StepScheduler::admit admits: at each step each GPU batch in
// turn gives its free slots to the waiting requests in order, while their prompts fit the
// prefill budget (the first newcomer of a batch always joins); a request holds its slot for
// its max_tokens steps (its prefill gives the first token). The steps the job takes, and the
// most prefix families (RequestLength::family) its running requests hold at once. With
// `pool_rows` > 0 the families take turns in that many pool rows as StepScheduler gives them: a
// newcomer whose family holds no row takes the free row (none of whose requests runs) taken
// least recently (by a newcomer of its family), computing its whole prompt where the row is not still its family's (a fill
// again: `refills`), and waits, with admission, where no row is free. In each step a GPU
// batch's decode rows of one family read its prefix (the longest a request of the family takes)
// once for all: `prefix_read_by_others` sums, over steps and batches, the prefix tokens of all
// but one of each family's decode rows.
struct Admission {
  std::int64_t steps = 0, families = 0;
  std::vector<bool> refills;  // per request, with pool rows: it fills a row again
  double prefix_read_by_others = 0;
};

// Pool rows taken in turn by the families of admitted requests (admit_in_order).
class PoolRows {
 public:
  explicit PoolRows(std::int64_t rows) : rows_(static_cast<std::size_t>(rows)) {}
  bool held() const { return !rows_.empty(); }
  // The row a newcomer of `family` would have: its family's (running, or still filled), or the
  // free one taken least recently; -1: none is free.
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
  // Whether taking `row` fills it again: its family filled one before and this is not still it.
  bool refills(std::int64_t row, std::int64_t family) const {
    return rows_[static_cast<std::size_t>(row)].family != family && filled_.contains(family);
  }
  // A newcomer of `family` takes `row`: every newcomer marks it taken, as StepScheduler does.
  void take(std::int64_t row, std::int64_t family) {
    rows_[static_cast<std::size_t>(row)] = {family, ++takes_};
    filled_.insert(family);
  }

 private:
  struct Row {
    std::int64_t family = -1, taken = -1;
  };
  std::vector<Row> rows_;
  std::int64_t takes_ = 0;
  std::set<std::int64_t> filled_;  // families that filled a row
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

// The running requests of each prefix family in one GPU batch (admit_in_order): in a step its
// decode rows read the family's prefix once for all.
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

Admission admit_in_order(const Workload& w, std::int64_t slots, std::int64_t gpu_batch, std::int64_t pool_rows = 0) {
  gpu_batch = std::clamp<std::int64_t>(gpu_batch, 1, std::max<std::int64_t>(slots, 1));
  using Busy = std::pair<std::int64_t, std::int64_t>;  // the step a slot frees at, its request's family
  using Heap = std::priority_queue<Busy, std::vector<Busy>, std::greater<>>;
  struct Batch {
    std::int64_t free = 0;
    Heap busy;
    FamilyRows families;
  };
  const std::vector<double> prefix = family_prefixes(w);
  std::vector<Batch> batches;
  for (std::int64_t s0 = 0; s0 < std::max<std::int64_t>(slots, 1); s0 += gpu_batch)
    batches.push_back({std::min(gpu_batch, slots - s0), {}, FamilyRows(prefix)});
  std::map<std::int64_t, std::int64_t> running;  // per family: its requests running
  std::size_t next = 0;
  std::int64_t t = 0;
  Admission a;
  a.refills.assign(w.requests.size(), false);
  PoolRows pool(pool_rows);
  auto free_ended = [&] {  // at step t
    for (Batch& b : batches) {
      b.families.next_step();
      for (; !b.busy.empty() && b.busy.top().first <= t; b.busy.pop(), ++b.free) {
        const std::int64_t family = b.busy.top().second;
        b.families.leave(family);
        if (family >= 0 && --running[family] == 0) running.erase(family);
      }
    }
  };
  auto run_until = [&](std::int64_t until) {  // steps [t, until)
    for (const Batch& b : batches) a.prefix_read_by_others += b.families.read_by_others(until - t);
    t = until;
  };
  while (next < w.requests.size()) {
    bool blocked = false;  // a batch has a free slot the budget kept empty
    std::int64_t soonest = std::numeric_limits<std::int64_t>::max();
    free_ended();
    for (Batch& b : batches) {
      std::int64_t admitted = 0;
      while (b.free > 0 && next < w.requests.size()) {
        const RequestLength& r = w.requests[next];
        const bool in_pool = pool.held() && r.family >= 0;
        const std::int64_t row = in_pool ? pool.row_for(r.family, running) : -1;
        if (in_pool && row < 0) break;  // no free pool row: it waits
        const bool refill = in_pool && pool.refills(row, r.family);
        const std::int64_t computed = refill ? r.prompt : r.prompt - r.shared;
        if (admitted > 0 && admitted + computed > w.prefill_budget) break;
        if (in_pool) pool.take(row, r.family);
        a.refills[next] = refill;
        admitted += computed;
        --b.free;
        const std::int64_t at = t + std::max<std::int64_t>(r.gen, 1);
        b.busy.emplace(at, r.family);
        b.families.admit(r.family);
        if (r.family >= 0) ++running[r.family];
        a.steps = std::max(a.steps, at);
        ++next;
      }
      blocked = blocked || b.free > 0;
      if (!b.busy.empty()) soonest = std::min(soonest, b.busy.top().first);
    }
    a.families = std::max(a.families, static_cast<std::int64_t>(running.size()));
    run_until(blocked ? t + 1 : soonest);
  }
  // The requests still running decode to their ends.
  for (free_ended(); t < a.steps; free_ended()) {
    std::int64_t soonest = a.steps;
    for (const Batch& b : batches)
      if (!b.busy.empty()) soonest = std::min(soonest, b.busy.top().first);
    run_until(soonest);
  }
  return a;
}

}  // namespace

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
      add(static_cast<double>(r.prompt), static_cast<double>(a.refills[i] ? r.prompt : r.prompt - r.shared),
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
