#include "engine/loaders/dummy_weights.h"

#include "kernels/hash.h"

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

DummyWeights::DummyWeights(const ModelConfig& cfg, std::uint64_t seed) : seed_(seed) {
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
  const bool norm_weight = name.ends_with("norm.weight");
  // Matrices: uniform with std 0.02 (OPT's init); norm weights near 1; biases small.
  const float scale = s.matrix ? 0.02f * 1.7320508f : (norm_weight ? 0.1f : 0.01f);
  const float base = norm_weight ? 1.0f : 0.0f;
  const std::uint64_t key = kernels::splitmix64(seed_ ^ name_hash(name));
  const std::int64_t first = row_begin * s.cols, count = (row_end - row_begin) * s.cols;
  constexpr std::int64_t kChunk = 1 << 16;
  std::vector<float> buf(static_cast<std::size_t>(std::min(count, kChunk)));
  for (std::int64_t i = 0; i < count; i += kChunk) {
    const std::int64_t n = std::min(kChunk, count - i);
    for (std::int64_t e = 0; e < n; ++e) {
      const double u = kernels::unit_interval(kernels::splitmix64(key + static_cast<std::uint64_t>(first + i + e)));
      buf[e] = base + scale * static_cast<float>(2.0 * u - 1.0);
    }
    kernels::convert_from_f32(buf.data(), to, static_cast<char*>(dst) + i * kernels::dtype_size(to),
                              static_cast<std::size_t>(n));
  }
}

}  // namespace flexh2o::engine
