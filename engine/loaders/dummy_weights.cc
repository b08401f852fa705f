#include "engine/loaders/dummy_weights.h"

#include "kernels/hash.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace flexh2o::engine {

namespace {
// FNV-1a: a name hash that is the same with every standard library.
std::uint64_t name_hash(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}
}  // namespace

DummyWeights::DummyWeights(const ModelConfig& cfg, std::uint64_t seed)
    : seed_(seed), norm_weight_offset_(cfg.norm_weight_offset) {
  for (auto& s : weight_specs(cfg)) specs_.emplace(s.name, s);
}

std::optional<std::vector<std::int64_t>> DummyWeights::shape(const std::string& name) const {
  const auto it = specs_.find(name);
  if (it == specs_.end()) return std::nullopt;
  const auto& s = it->second;
  return s.matrix ? std::vector<std::int64_t>{s.rows, s.cols} : std::vector<std::int64_t>{s.rows};
}

void DummyWeights::read_rows(const std::string& name, std::int64_t row_begin, std::int64_t row_end, void* dst,
                             kernels::DType to) const {
  const auto it = specs_.find(name);
  if (it == specs_.end()) throw std::runtime_error("missing tensor " + origin(name));
  const WeightSpec& s = it->second;
  if (row_begin < 0 || row_end < row_begin || row_end > s.rows) throw std::out_of_range("dummy weights: bad row range");
  const bool norm_weight = name.ends_with("norm.weight") || name.ends_with("_norm");
  // Matrices: uniform with std 0.02 (OPT's init); norm scales near 1; biases small.
  const float scale = s.matrix ? 0.02f * 1.7320508f : (norm_weight ? 0.1f : 0.01f);
  const float base = norm_weight ? 1.0f - norm_weight_offset_ : 0.0f;
  const std::uint64_t key = kernels::splitmix64(seed_ ^ name_hash(name));
  // Whole rows at a time (a quantized row is converted as one).
  const std::int64_t chunk = std::max<std::int64_t>(1, (1 << 16) / s.cols), out_row = kernels::row_bytes(to, s.cols);
  std::vector<float> buf(static_cast<std::size_t>(std::min(row_end - row_begin, chunk) * s.cols));
  for (std::int64_t r = row_begin; r < row_end; r += chunk) {
    const std::int64_t n = std::min(chunk, row_end - r);
    for (std::int64_t e = 0; e < n * s.cols; ++e) {
      const auto index = static_cast<std::uint64_t>(r * s.cols + e);
      const double u = kernels::unit_interval(kernels::splitmix64(key + index));
      buf[static_cast<std::size_t>(e)] = base + scale * static_cast<float>(2.0 * u - 1.0);
    }
    kernels::convert_rows(buf.data(), kernels::DType::F32, static_cast<std::byte*>(dst) + (r - row_begin) * out_row, to,
                          n, s.cols);
  }
}

}  // namespace flexh2o::engine
