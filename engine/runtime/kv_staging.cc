#include "engine/runtime/kv_staging.h"

#include <algorithm>
#include <stdexcept>

namespace flexh2o::engine {

using offload::CopyPiece;
using offload::Place;

std::vector<CopyPiece> kv_stage_pieces(const offload::TieredTensor& k, const offload::TieredTensor& v,
                                       std::int64_t n_kv_heads, std::int64_t s0, std::span<const KvByteRange> ranges,
                                       std::byte* k_dev, std::byte* v_dev, bool to_tensor) {
  const std::int64_t row = k.row_bytes();
  if (n_kv_heads <= 0 || row % n_kv_heads != 0 || v.row_bytes() != row)
    throw std::invalid_argument("kv_stage_pieces: K and V rows must hold n_kv_heads equal heads");
  const std::int64_t head = row / n_kv_heads;
  const auto n = static_cast<std::int64_t>(ranges.size());
  std::vector<CopyPiece> out;
  auto append = [&](std::vector<CopyPiece> p) { out.insert(out.end(), p.begin(), p.end()); };
  const bool whole = std::all_of(ranges.begin(), ranges.end(), [&](const KvByteRange& r) { return r.from == 0 && r.to == head; });
  if (whole) {
    if (n > 0) {
      append(k.pieces(s0, s0 + n, Place::gpu(k_dev), to_tensor));
      append(v.pieces(s0, s0 + n, Place::gpu(v_dev), to_tensor));
    }
    return out;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const KvByteRange r = ranges[static_cast<std::size_t>(i)];
    if (r.from < 0 || r.to > head || r.from > r.to)
      throw std::out_of_range("kv_stage_pieces: byte range outside a kv head's slots");
    if (r.from == r.to) continue;
    const offload::RowBands bands{r.from, r.to - r.from, n_kv_heads, head};
    append(k.pieces(s0 + i, s0 + i + 1, Place::gpu(k_dev + i * row), to_tensor, bands));
    append(v.pieces(s0 + i, s0 + i + 1, Place::gpu(v_dev + i * row), to_tensor, bands));
  }
  return out;
}

}  // namespace flexh2o::engine
