// File space of the disk store: first fit over freed ranges (coalesced with their neighbours),
// else the end of the file; space freed at the end shrinks it. Sizes and offsets are aligned
// by the caller. Not thread-safe: the store calls it under its lock.
#pragma once
#include <cstdint>
#include <map>

namespace flexh2o::offload {

class ExtentAllocator {
 public:
  // The offset of `size` free bytes.
  std::int64_t allocate(std::int64_t size);
  // Returns [offset, offset + size), which allocate gave out.
  void free(std::int64_t offset, std::int64_t size);
  // File bytes in use, up to the last allocated range.
  std::int64_t end() const { return end_; }

 private:
  std::int64_t end_ = 0;
  std::map<std::int64_t, std::int64_t> free_ranges_;  // offset -> size, coalesced
};

}  // namespace flexh2o::offload
