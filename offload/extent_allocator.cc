#include "offload/extent_allocator.h"

#include <algorithm>
#include <iterator>

namespace flexh2o::offload {

std::int64_t ExtentAllocator::allocate(std::int64_t size) {
  const auto fit = std::find_if(free_ranges_.begin(), free_ranges_.end(), [&](const auto& r) { return r.second >= size; });
  if (fit == free_ranges_.end()) {
    end_ += size;
    return end_ - size;
  }
  const std::int64_t offset = fit->first, rest = fit->second - size;
  free_ranges_.erase(fit);
  if (rest > 0) free_ranges_.emplace(offset + size, rest);
  return offset;
}

void ExtentAllocator::free(std::int64_t offset, std::int64_t size) {
  auto next = free_ranges_.lower_bound(offset);
  if (next != free_ranges_.end() && offset + size == next->first) {
    size += next->second;
    next = free_ranges_.erase(next);
  }
  if (next != free_ranges_.begin()) {
    const auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      size += prev->second;
      free_ranges_.erase(prev);
    }
  }
  if (offset + size == end_)
    end_ = offset;
  else
    free_ranges_.emplace(offset, size);
}

}  // namespace flexh2o::offload
