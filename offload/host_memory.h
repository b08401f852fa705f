// Host memory for the cpu tier and for staging transfers: page-aligned (O_DIRECT needs
// 4 KiB alignment) and, when asked, pinned by the compute backend so device copies from it
// run asynchronously. Pinning costs RAM the OS can no longer page out, hence the switch.
#pragma once
#include <cstddef>

#include "kernels/backend.h"

namespace flexh2o::offload {

class HostBuffer {
 public:
  HostBuffer() = default;
  // Throws std::bad_alloc naming nothing: callers charge a Budget first and say what it was for.
  HostBuffer(std::size_t bytes, kernels::Backend* pin_with = nullptr);
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  HostBuffer(HostBuffer&& o) noexcept { *this = std::move(o); }
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  ~HostBuffer() { reset(); }

  void reset() noexcept;
  void* data() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const { return bytes_; }
  bool pinned() const { return pinned_by_ != nullptr; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  kernels::Backend* pinned_by_ = nullptr;
};

}  // namespace flexh2o::offload
