// A device buffer charged to the gpu tier's budget for as long as it lives: the scheduler's
// staging slots and ring buffers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/backend.h"
#include "offload/tiers.h"

namespace flexh2o::engine {

struct GpuBuffer {
  GpuBuffer() = default;
  GpuBuffer(offload::Tiers& tiers, std::int64_t bytes, const std::string& what)
      : reserved(tiers.budget(offload::Tier::Gpu).reserve_scoped(bytes, what)),
        buf(tiers.backend(), static_cast<std::size_t>(bytes)) {}
  offload::Reservation reserved;
  kernels::DeviceBuffer buf;
  std::byte* data() const { return static_cast<std::byte*>(buf.data()); }
};

}  // namespace flexh2o::engine
