#include "offload/tiered_tensor.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace flexh2o::offload {

void TierFractions::validate(std::string_view what) const {
  for (Tier t : {Tier::Gpu, Tier::Cpu, Tier::Disk}) {
    const double f = of(t);
    if (!(f >= 0.0 && f <= 1.0))
      throw std::invalid_argument(std::string(what) + ": the " + std::string(tier_name(t)) + " fraction " +
                                  std::to_string(f) + " is outside [0, 1]");
  }
  const double sum = gpu + cpu + disk;
  if (std::abs(sum - 1.0) > 1e-6)
    throw std::invalid_argument(std::string(what) + ": the gpu, cpu and disk fractions sum to " + std::to_string(sum) +
                                ", not 1");
}

RowSplit RowSplit::of(std::int64_t rows, const TierFractions& f) {
  auto at = [&](double frac) {
    return std::clamp<std::int64_t>(std::llround(static_cast<double>(rows) * frac), 0, rows);
  };
  // Fractions sum to 1 only within validate()'s tolerance: a tier whose fraction is 0 gets
  // no row, even where rounding the others would leave one over.
  const std::int64_t g = f.cpu == 0 && f.disk == 0 ? rows : at(f.gpu);
  const std::int64_t c = f.disk == 0 ? rows : std::max(g, at(f.gpu + f.cpu));
  RowSplit s;
  s.begin = {0, g, c};
  s.end = {g, c, rows};
  return s;
}

Tier RowSplit::tier_of(std::int64_t row) const {
  if (row < end[0]) return Tier::Gpu;
  if (row < end[1]) return Tier::Cpu;
  return Tier::Disk;
}

TieredTensor::TieredTensor(Tiers& tiers, std::string name, kernels::DType dtype, std::int64_t rows, std::int64_t cols,
                           const TierFractions& fractions, std::int64_t row_bytes)
    : tiers_(tiers),
      name_(std::move(name)),
      dtype_(dtype),
      rows_(rows),
      cols_(cols),
      row_bytes_(row_bytes >= 0 ? row_bytes : kernels::row_bytes(dtype, cols)) {
  if (rows < 0 || cols < 0) throw std::invalid_argument("tensor " + name_ + " has a negative shape");
  fractions.validate("placement of " + name_);
  split_ = RowSplit::of(rows, fractions);
  if (const auto b = bytes_on(Tier::Gpu); b > 0) {
    gpu_reserved_ = tiers.budget(Tier::Gpu).reserve_scoped(b, name_);
    gpu_ = kernels::DeviceBuffer(tiers.backend(), static_cast<std::size_t>(b));
  }
  if (const auto b = bytes_on(Tier::Cpu); b > 0) {
    cpu_reserved_ = tiers.budget(Tier::Cpu).reserve_scoped(b, name_);
    cpu_ = HostBuffer(static_cast<std::size_t>(b), tiers.options().pin_host ? &tiers.backend() : nullptr);
  }
  if (const auto b = bytes_on(Tier::Disk); b > 0) disk_ = tiers.disk().allocate(b, name_);
}

TieredTensor::~TieredTensor() {
  if (disk_.bytes > 0) tiers_.disk().free(disk_);
}

Place TieredTensor::place(std::int64_t row, std::int64_t byte_in_row) const {
  const Tier t = split_.tier_of(row);
  const std::int64_t off = (row - split_.begin[static_cast<int>(t)]) * row_bytes_ + byte_in_row;
  switch (t) {
    case Tier::Gpu: return Place::gpu(static_cast<std::byte*>(gpu_.data()) + off);
    case Tier::Cpu: return Place::cpu(static_cast<std::byte*>(cpu_.data()) + off);
    case Tier::Disk: return Place::disk(disk_, off);
  }
  return {};
}

std::vector<CopyPiece> TieredTensor::pieces(std::int64_t r0, std::int64_t r1, Place other, bool to_tensor,
                                            std::int64_t b0, std::int64_t b1) const {
  if (b1 < 0) b1 = row_bytes_;
  if (b0 < 0 || b1 > row_bytes_ || b0 > b1)
    throw std::out_of_range("bytes [" + std::to_string(b0) + ", " + std::to_string(b1) + ") outside a row of tensor " +
                            name_);
  return pieces(r0, r1, other, to_tensor, RowBands{b0, b1 - b0, 1, 0});
}

std::vector<CopyPiece> TieredTensor::pieces(std::int64_t r0, std::int64_t r1, Place other, bool to_tensor,
                                            RowBands bands) const {
  if (r0 < 0 || r1 > rows_ || r0 > r1)
    throw std::out_of_range("row range [" + std::to_string(r0) + ", " + std::to_string(r1) + ") outside tensor " + name_);
  if (bands.width < 0) bands = {0, row_bytes_, 1, 0};
  if (bands.count > 1 && bands.pitch == bands.width) bands = {bands.offset, bands.width * bands.count, 1, 0};
  const std::int64_t span = bands.count < 1 ? 0 : (bands.count - 1) * bands.pitch + bands.width;
  if (bands.offset < 0 || bands.count < 1 || (bands.count > 1 && bands.pitch < bands.width) ||
      bands.offset + span > row_bytes_)
    throw std::out_of_range("bands of " + std::to_string(bands.count) + " x " + std::to_string(bands.width) +
                            " bytes at " + std::to_string(bands.offset) + " (pitch " + std::to_string(bands.pitch) +
                            ") outside a row of tensor " + name_);
  std::vector<CopyPiece> out;
  auto add = [&](Place mine, Place theirs, std::int64_t bytes, std::int64_t rows, std::int64_t pitch) {
    out.push_back(to_tensor ? CopyPiece{mine, theirs, bytes, rows, pitch, pitch}
                            : CopyPiece{theirs, mine, bytes, rows, pitch, pitch});
  };
  const bool whole_rows = bands.count == 1 && bands.offset == 0 && bands.width == row_bytes_;
  for (int t = 0; t < 3; ++t) {
    const std::int64_t lo = std::max(r0, split_.begin[t]), hi = std::min(r1, split_.end[t]);
    if (lo >= hi) continue;
    const Place mine = place(lo, bands.offset);
    const Place theirs = other.advanced((lo - r0) * row_bytes_ + bands.offset);
    if (whole_rows)  // contiguous in both places
      add(mine, theirs, (hi - lo) * row_bytes_, 1, 0);
    else if (bands.count == 1)  // a column band: one row per tensor row
      add(mine, theirs, bands.width, hi - lo, row_bytes_);
    else  // separate bands: a row per band, per tensor row
      for (std::int64_t row = lo; row < hi; ++row)
        add(mine.advanced((row - lo) * row_bytes_), theirs.advanced((row - lo) * row_bytes_), bands.width, bands.count,
            bands.pitch);
  }
  return out;
}

void TieredTensor::write_rows(std::int64_t r0, std::int64_t r1, const void* host_src, Staging& staging) {
  copy_pieces_now(tiers_, pieces(r0, r1, Place::cpu(const_cast<void*>(host_src)), true), staging);
}

void TieredTensor::read_rows(std::int64_t r0, std::int64_t r1, void* host_dst, Staging& staging) const {
  copy_pieces_now(tiers_, pieces(r0, r1, Place::cpu(host_dst), false), staging);
}

}  // namespace flexh2o::offload
