#include "offload/host_memory.h"

#include <unistd.h>

#include <cstdlib>
#include <new>
#include <utility>

namespace flexh2o::offload {

namespace {
std::size_t page_size() {
  static const std::size_t p = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return p;
}
}  // namespace

HostBuffer::HostBuffer(std::size_t bytes, kernels::Backend* pin_with) : bytes_(bytes) {
  if (bytes == 0) return;
  const std::size_t page = page_size();
  ptr_ = std::aligned_alloc(page, (bytes + page - 1) / page * page);
  if (ptr_ == nullptr) throw std::bad_alloc();
  if (pin_with != nullptr && pin_with->pin_host(ptr_, bytes)) pinned_by_ = pin_with;
}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    pinned_by_ = std::exchange(o.pinned_by_, nullptr);
  }
  return *this;
}

void HostBuffer::reset() noexcept {
  if (pinned_by_ != nullptr) pinned_by_->unpin_host(ptr_);
  std::free(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
  pinned_by_ = nullptr;
}

}  // namespace flexh2o::offload
