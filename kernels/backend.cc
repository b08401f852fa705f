// Backend's default copy_regions: one copy per contiguous region, else one per row.
#include "kernels/backend.h"

namespace flexh2o::kernels {

void Backend::copy_regions(CopyDirection dir, std::span<const CopyRegion> regions, const Fence* /*after*/) {
  auto one = [&](void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    if (dir == CopyDirection::ToDevice)
      copy_to_device(dst, src, bytes);
    else
      copy_to_host(dst, src, bytes);
  };
  for (const CopyRegion& r : regions) {
    if (r.rows == 1 || (r.dst_pitch == r.width && r.src_pitch == r.width)) {
      one(r.dst, r.src, r.width * r.rows);
      continue;
    }
    for (std::size_t i = 0; i < r.rows; ++i)
      one(static_cast<std::byte*>(r.dst) + i * r.dst_pitch, static_cast<const std::byte*>(r.src) + i * r.src_pitch,
          r.width);
  }
}

}  // namespace flexh2o::kernels
