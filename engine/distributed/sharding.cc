#include "engine/distributed/sharding.h"

#include <algorithm>
#include <stdexcept>

namespace flexh2o::distributed {

std::vector<int> deal_balanced(std::span<const std::int64_t> costs, int ranks) {
  if (ranks < 1) throw std::invalid_argument("dealing prompts needs at least one rank");
  std::vector<std::int64_t> load(static_cast<std::size_t>(ranks), 0);
  std::vector<int> owner;
  owner.reserve(costs.size());
  for (const std::int64_t c : costs) {
    const auto r = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += c;
    owner.push_back(static_cast<int>(r));
  }
  return owner;
}

void InOrder::put(std::size_t position, std::string text) {
  if (position >= count_ || position < next_ || waiting_.count(position))
    throw std::logic_error("result " + std::to_string(position) + " of " + std::to_string(count_) +
                           " is out of range or arrived twice");
  waiting_.emplace(position, std::move(text));
}

std::vector<std::string> InOrder::take_ready() {
  std::vector<std::string> ready;
  for (auto it = waiting_.begin(); it != waiting_.end() && it->first == next_; it = waiting_.erase(it), ++next_)
    ready.push_back(std::move(it->second));
  return ready;
}

}  // namespace flexh2o::distributed
