// The copies that stage one layer's KV cache between its homes (a TieredTensor per K and V,
// a row per sequence holding kv_heads x capacity slots) and a device slot laid out like those
// rows: before attention the valid slots come in, after it the new ones go back. Per sequence
// and K/V, the same byte range of every kv head moves as one 2-D piece (a row per head), so a
// device backend makes one strided copy where it would make one per head; ranges that cover
// whole heads move as whole rows, one piece per tier for all the sequences.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "offload/copy_engine.h"
#include "offload/tiered_tensor.h"

namespace flexh2o::engine {

// Bytes [from, to) of each kv head's slots of one sequence.
struct KvByteRange {
  std::int64_t from = 0, to = 0;
};

// Sequences [s0, s0 + ranges.size()) of k and v, sequence s0 + i at k_dev/v_dev + i * row
// bytes: to_tensor false reads the homes into the device slot, true writes it back.
std::vector<offload::CopyPiece> kv_stage_pieces(const offload::TieredTensor& k, const offload::TieredTensor& v,
                                                std::int64_t n_kv_heads, std::int64_t s0,
                                                std::span<const KvByteRange> ranges, std::byte* k_dev,
                                                std::byte* v_dev, bool to_tensor);

}  // namespace flexh2o::engine
