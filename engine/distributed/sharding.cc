#include "engine/distributed/sharding.h"

#include <stdexcept>
#include <string>

namespace flexh2o::distributed {

DealQueue::DealQueue(std::vector<bool> starts_group) : starts_(std::move(starts_group)) {
  if (!starts_.empty()) starts_.front() = true;
}

std::vector<std::size_t> DealQueue::deal(std::size_t want) {
  std::vector<std::size_t> dealt;
  while (next_ < starts_.size() && (dealt.size() < want || !starts_[next_])) dealt.push_back(next_++);
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
