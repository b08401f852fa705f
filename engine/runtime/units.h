// The scheduling units of a block schedule: the layers whose weights are fetched together and
// computed for every GPU batch before the next unit's. With sep_layer on, a decoder layer's
// attention and MLP are two units; off, one.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/layers.h"

namespace flexh2o::engine {

// A tensor of a unit and which of the unit's layers reads it.
struct UnitTensor {
  std::size_t layer = 0;
  policy::TensorSpec spec;
};

struct SchedulingUnit {
  std::string name;
  std::vector<const Layer*> layers;
  std::vector<UnitTensor> weights;  // all but the experts'
  std::int64_t cache_layer = -1;     // the decoder layer whose KV cache it attends, or -1
  bool first = false;                // its input is the embedding, not hidden states
  bool last = false;                 // its output leaves the scheduler
  // Mixture-of-experts: the layer that routes and each expert's weights.
  const Layer* moe = nullptr;
  std::vector<std::vector<UnitTensor>> experts;
  // The MoE layer comes first, so the unit before routes for it.
  bool routed_before = false;
};

struct UnitList {
  std::vector<SchedulingUnit> units;
  std::vector<std::int64_t> cache_layers;  // decoder layers whose KV caches the units attend
  std::vector<std::string> weight_names;   // every weight of the units, experts' included
};

// Units over layers [begin, end) of `layers`; `first` is set when begin is 0 (the embedding).
UnitList make_units(const std::vector<std::unique_ptr<Layer>>& layers, std::int64_t begin, std::int64_t end,
                    bool sep_layer);

}  // namespace flexh2o::engine
