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
  if (r0 < 0 || r1 > rows_ || r0 > r1 || b0 < 0 || b1 > row_bytes_ || b0 > b1)
    throw std::out_of_range("row range [" + std::to_string(r0) + ", " + std::to_string(r1) + ") outside tensor " + name_);
  std::vector<CopyPiece> out;
  const bool whole_rows = b0 == 0 && b1 == row_bytes_;
  for (int t = 0; t < 3; ++t) {
    const std::int64_t lo = std::max(r0, split_.begin[t]), hi = std::min(r1, split_.end[t]);
    if (lo >= hi) continue;
    // Whole rows are contiguous in both places; a column band is one piece per row.
    const std::int64_t n = whole_rows ? 1 : hi - lo;
    const std::int64_t per = whole_rows ? (hi - lo) * row_bytes_ : b1 - b0;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t row = lo + i;
      const Place mine = place(row, b0);
      const Place theirs = other.advanced((row - r0) * row_bytes_ + b0);
      out.push_back(to_tensor ? CopyPiece{mine, theirs, per} : CopyPiece{theirs, mine, per});
    }
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
