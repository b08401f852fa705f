#include "engine/distributed/sharding.h"

#include <algorithm>
#include <functional>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

namespace flexh2o::distributed {

namespace {

// FNV-1a over the first `n` tokens; 0 for a prompt that cannot give that many (a cache row
// gives at most all but its last token).
std::uint64_t prefix_family(std::span<const std::int32_t> prompt, std::int64_t n) {
  if (n <= 0 || static_cast<std::int64_t>(prompt.size()) <= n) return 0;
  std::uint64_t h = 14695981039346656037ull;
  for (const std::int32_t t : prompt.first(static_cast<std::size_t>(n))) {
    h ^= static_cast<std::uint32_t>(t);
    h *= 1099511628211ull;
  }
  return h == 0 ? 1 : h;
}

}  // namespace

DealQueue::DealQueue(std::vector<bool> starts_group, int runners, PrefixDealing prefer)
    : starts_(std::move(starts_group)), prefer_(std::move(prefer)), runners_(static_cast<std::size_t>(std::max(runners, 1))) {
  if (!starts_.empty()) starts_.front() = true;
  for (std::size_t i = 0; i < starts_.size(); ++i)
    if (starts_[i]) waiting_.push_back(i);
  if (prefer_.prompts.size() != starts_.size()) prefer_.min_tokens = 0;
  for (const auto& p : prefer_.prompts) family_.push_back(prefix_family(p, prefer_.min_tokens));
  if (!family_.empty()) give_families();
}

// Each family of two or more groups to a runner: the largest first, to the runner given the
// fewest groups so far (the lowest on a tie); a family of one has nothing to share (family 0).
void DealQueue::give_families() {
  std::unordered_map<std::uint64_t, std::size_t> groups;
  std::vector<std::uint64_t> order;  // families by their first request
  for (const std::size_t g : waiting_)
    if (family_[g] != 0 && groups[family_[g]]++ == 0) order.push_back(family_[g]);
  for (std::uint64_t& f : family_)
    if (f != 0 && groups[f] < 2) f = 0;
  std::erase_if(order, [&](std::uint64_t f) { return groups[f] < 2; });
  std::ranges::stable_sort(order, std::greater<>(), [&](std::uint64_t f) { return groups[f]; });
  std::vector<std::size_t> load(runners_.size(), 0);
  for (const std::uint64_t f : order) {
    const auto r = static_cast<std::size_t>(std::ranges::min_element(load) - load.begin());
    runner_of_[f] = static_cast<int>(r);
    load[r] += groups[f];
  }
}

std::size_t DealQueue::group_end(std::size_t begin) const {
  std::size_t end = begin + 1;
  while (end < starts_.size() && !starts_[end]) ++end;
  return end;
}

bool DealQueue::another_may_take(int runner, std::size_t begin) const {
  for (std::size_t r = 0; r < runners_.size(); ++r)
    if (static_cast<int>(r) != runner && runners_[r].taking && may_take(runners_[r], begin)) return true;
  return false;
}

bool DealQueue::holds_family(const Runner& r, std::uint64_t family) const {
  return std::ranges::any_of(r.recent, [&](std::size_t q) { return family_[q] == family; });
}

DealQueue::Fit DealQueue::fit(int runner, std::size_t begin) const {
  const std::uint64_t family = family_[begin];
  if (family == 0) return Fit::Free;
  if (runner_of_.at(family) == runner || holds_family(runners_[static_cast<std::size_t>(runner)], family))
    return Fit::Own;
  return Fit::Others;
}

// The waiting group to deal `runner` next (PrefixDealing). The first waiting group is passed
// over only while another runner may still take it.
std::optional<std::size_t> DealQueue::pick(int runner) const {
  const Runner& r = runners_[static_cast<std::size_t>(runner)];
  if (waiting_.empty()) return std::nullopt;
  if (!another_may_take(runner, waiting_.front())) {
    if (!may_take(r, waiting_.front()))
      throw std::logic_error("request " + std::to_string(waiting_.front()) + " was left to no runner");
    return 0;
  }
  const auto first = static_cast<std::size_t>(
      r.last ? std::ranges::upper_bound(waiting_, *r.last) - waiting_.begin() : 0);
  if (first == waiting_.size()) return std::nullopt;
  if (prefer_.min_tokens <= 0) return first;
  std::size_t best = first;
  Fit best_fit = fit(runner, waiting_[first]);
  for (std::size_t i = first + 1; best_fit != Fit::Own && i < std::min(waiting_.size(), prefer_.lookahead); ++i) {
    const Fit f = fit(runner, waiting_[i]);
    if (f < best_fit) {
      best = i;
      best_fit = f;
    }
  }
  return best;
}

std::vector<std::size_t> DealQueue::deal(std::size_t want, int runner) {
  Runner& r = runners_.at(static_cast<std::size_t>(runner));
  std::vector<std::size_t> dealt;
  while (dealt.size() < std::max<std::size_t>(want, 1)) {
    const std::optional<std::size_t> at = pick(runner);
    if (!at) break;
    const std::size_t begin = waiting_[*at];
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(*at));
    for (std::size_t i = begin, end = group_end(begin); i < end; ++i) dealt.push_back(i);
    r.last = dealt.back();
    r.recent.push_back(begin);
    if (r.recent.size() > prefer_.recent) r.recent.pop_front();
  }
  dealt_ += dealt.size();
  if (dealt.empty()) r.taking = false;
  return dealt;
}

void Hand::add(std::span<const std::size_t> dealt) {
  for (const std::size_t i : dealt) {
    if (last_ && i <= *last_)
      throw std::logic_error("request " + std::to_string(i) + " dealt after " + std::to_string(*last_));
    held_.push_back(i);
    last_ = i;
  }
}

std::optional<std::size_t> Hand::next(std::size_t from) {
  while (!held_.empty() && held_.front() < from) held_.pop_front();
  if (held_.empty()) return std::nullopt;
  return held_.front();
}

}  // namespace flexh2o::distributed
