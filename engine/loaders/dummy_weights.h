// Seeded random weights of any configured shape, without a file: how FlexGen benchmarks
// models whose weights one does not have (OPT-175B). Any row range can be generated on
// its own and always gives the same values, so tiers can fill their parts in parallel.
#pragma once
#include "engine/model/weights.h"

namespace flexh2o::engine {

class DummyWeights final : public WeightSource {
 public:
  DummyWeights(const ModelConfig& cfg, std::uint64_t seed);

  std::optional<std::vector<std::int64_t>> shape(const std::string& name) const override;
  std::string origin(const std::string& name) const override { return "'" + name + "' (dummy weights)"; }
  void read_rows(const std::string& name, std::int64_t row_begin, std::int64_t row_end, void* dst,
                 kernels::DType to) const override;

 private:
  std::map<std::string, WeightSpec> specs_;
  std::uint64_t seed_;
  float norm_weight_offset_;  // (1 + w) norms: stored w near 0 so the scale is near 1
};

}  // namespace flexh2o::engine
