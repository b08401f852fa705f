#include "engine/runtime/tiered_weights.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <vector>

namespace flexh2o::engine {

namespace {
constexpr std::int64_t kChunkBytes = std::int64_t{16} << 20;
}

TieredWeights load_tiered_weights(const ModelConfig& cfg, const WeightSource& source, offload::Tiers& tiers,
                                  const offload::TierFractions& fractions, bool resident_embeddings,
                                  std::span<const std::string> only) {
  check_weights(cfg, source);
  auto specs = weight_specs(cfg);
  if (!only.empty())
    std::erase_if(specs, [&](const WeightSpec& w) { return std::find(only.begin(), only.end(), w.name) == only.end(); });
  TieredWeights out;
  // Placement first (serially, so a budget that does not fit fails before any reading), each
  // tensor in the dtype the backend multiplies it in (held_dtype: converted once, here).
  for (const auto& w : specs) {
    const bool resident = resident_embeddings && w.layer < 0;
    out.emplace(w.name, std::make_unique<offload::TieredTensor>(
                            tiers, w.name, held_dtype(w, cfg, w.dtype(cfg), tiers.backend()), w.rows, w.cols,
                            resident ? offload::TierFractions{1, 0, 0} : fractions));
  }
  tbb::parallel_for(std::size_t{0}, specs.size(), [&](std::size_t i) {
    const kernels::DType stored = specs[i].dtype(cfg);
    offload::TieredTensor& t = *out.at(specs[i].name);
    const std::int64_t chunk_rows = std::max<std::int64_t>(1, kChunkBytes / std::max<std::int64_t>(1, t.row_bytes()));
    std::vector<std::byte> buf(static_cast<std::size_t>(std::min(chunk_rows, t.rows()) * t.row_bytes()));
    offload::Staging staging(&tiers.backend());
    for (std::int64_t r = 0; r < t.rows(); r += chunk_rows) {
      const std::int64_t r1 = std::min(t.rows(), r + chunk_rows);
      source.read_rows(t.name(), r, r1, buf.data(), stored);
      hold_rows(buf.data(), stored, t.dtype(), r1 - r, t.cols());
      t.write_rows(r, r1, buf.data(), staging);
    }
  });
  return out;
}

}  // namespace flexh2o::engine
