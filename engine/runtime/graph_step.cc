#include "engine/runtime/graph_step.h"

namespace flexh2o::engine {

std::optional<std::uint64_t> decode_graph_key(const StepBatch& s) {
  if (s.prefill || s.rows() == 0) return std::nullopt;
  std::uint64_t key = 1469598103934665603ull;  // FNV-1a over the rows and the idle pattern
  auto mix = [&key](std::uint64_t v) {
    key ^= v;
    key *= 1099511628211ull;
  };
  mix(static_cast<std::uint64_t>(s.rows()));
  for (const SeqStep k : s.kinds) {
    if (k != SeqStep::Decode && k != SeqStep::Idle) return std::nullopt;
    mix(k == SeqStep::Idle ? 1 : 2);
  }
  return key;
}

}  // namespace flexh2o::engine
