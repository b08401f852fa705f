// A logical row-major tensor [rows, cols] whose rows are split across tiers by fractions:
// rows [0, g) on gpu, [g, g + c) on cpu, the rest on disk, exact to the row (FlexGen rounds
// whole tensors to one tier instead). Each part is charged to its tier's Budget.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dtype.h"
#include "offload/copy_engine.h"
#include "offload/host_memory.h"
#include "offload/tiers.h"

namespace flexh2o::offload {

struct TierFractions {
  double gpu = 1, cpu = 0, disk = 0;
  // Throws std::invalid_argument naming `what` unless each is in [0, 1] and they sum to 1.
  void validate(std::string_view what) const;
  double of(Tier t) const { return t == Tier::Gpu ? gpu : t == Tier::Cpu ? cpu : disk; }
};

// Row ranges per tier: the gpu count is round(rows * gpu), the cpu range ends at
// round(rows * (gpu + cpu)), disk takes the rest.
struct RowSplit {
  std::array<std::int64_t, 3> begin{}, end{};
  static RowSplit of(std::int64_t rows, const TierFractions& f);
  std::int64_t rows(Tier t) const { return end[static_cast<int>(t)] - begin[static_cast<int>(t)]; }
  Tier tier_of(std::int64_t row) const;
};

// The bytes of each row a copy moves: `count` bands of `width` bytes at `offset`, offset +
// pitch, ... (a KV row's kv heads, each with its valid slots). width < 0: the whole row.
struct RowBands {
  std::int64_t offset = 0, width = -1, count = 1, pitch = 0;
};

class TieredTensor {
 public:
  // A row is `cols` values of `dtype` (kernels::row_bytes), or `row_bytes` when given: a row
  // holding several separately quantized vectors (a KV row: kv_heads x capacity slots).
  TieredTensor(Tiers& tiers, std::string name, kernels::DType dtype, std::int64_t rows, std::int64_t cols,
               const TierFractions& fractions, std::int64_t row_bytes = -1);
  TieredTensor(const TieredTensor&) = delete;
  TieredTensor& operator=(const TieredTensor&) = delete;
  ~TieredTensor();

  const std::string& name() const { return name_; }
  kernels::DType dtype() const { return dtype_; }
  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }
  std::int64_t row_bytes() const { return row_bytes_; }
  std::int64_t bytes() const { return rows_ * row_bytes_; }
  const RowSplit& split() const { return split_; }
  std::int64_t bytes_on(Tier t) const { return split_.rows(t) * row_bytes_; }
  bool entirely_on(Tier t) const { return split_.rows(t) == rows_; }

  // Where byte `byte_in_row` of row r lives.
  Place place(std::int64_t row, std::int64_t byte_in_row = 0) const;
  // The copies between rows [r0, r1) (bytes [b0, b1) of each row; b1 < 0 means the whole row)
  // and memory laid out like those rows at `other`: to_tensor false reads the tensor into
  // `other`, true writes `other` into the tensor. Per tier: whole rows are one piece, a band of
  // each row one 2-D piece (a row per tensor row).
  std::vector<CopyPiece> pieces(std::int64_t r0, std::int64_t r1, Place other, bool to_tensor,
                                std::int64_t b0 = 0, std::int64_t b1 = -1) const;
  // The same for several bands per row: bands that touch are merged; otherwise one 2-D piece
  // per row (a row per band), so a KV row's heads move as one strided copy.
  std::vector<CopyPiece> pieces(std::int64_t r0, std::int64_t r1, Place other, bool to_tensor, RowBands bands) const;
  // Synchronous copies of rows [r0, r1) from/to host memory (loading, tests).
  void write_rows(std::int64_t r0, std::int64_t r1, const void* host_src, Staging& staging);
  void read_rows(std::int64_t r0, std::int64_t r1, void* host_dst, Staging& staging) const;

 private:
  Tiers& tiers_;
  std::string name_;
  kernels::DType dtype_;
  std::int64_t rows_, cols_, row_bytes_;
  RowSplit split_;
  Reservation gpu_reserved_, cpu_reserved_;
  kernels::DeviceBuffer gpu_;
  HostBuffer cpu_;
  Extent disk_{};
};

}  // namespace flexh2o::offload
