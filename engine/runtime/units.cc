#include "engine/runtime/units.h"

#include <algorithm>

namespace flexh2o::engine {

namespace {

void add_unique(std::vector<std::string>& to, const std::string& name) {
  if (std::find(to.begin(), to.end(), name) == to.end()) to.push_back(name);
}

// With sep_layer off, an MLP joins the attention unit of its decoder layer.
bool joins_previous(const std::vector<SchedulingUnit>& units, const Layer& l, bool sep_layer) {
  return !sep_layer && !units.empty() && units.back().cache_layer >= 0 && units.back().layers.size() == 1 &&
         l.cache_index() < 0 && l.name().rfind("mlp.", 0) == 0;
}

}  // namespace

UnitList make_units(const std::vector<std::unique_ptr<Layer>>& layers, std::int64_t begin, std::int64_t end,
                    bool sep_layer) {
  UnitList out;
  auto& units = out.units;
  for (std::int64_t i = begin; i < end; ++i) {
    const Layer* l = layers[static_cast<std::size_t>(i)].get();
    if (joins_previous(units, *l, sep_layer)) {
      units.back().name = "layer." + std::to_string(units.back().cache_layer);
    } else {
      units.emplace_back();
      units.back().name = l->name();
      units.back().cache_layer = l->cache_index();
    }
    SchedulingUnit& u = units.back();
    if (l->cache_index() >= 0) out.cache_layers.push_back(l->cache_index());
    const std::size_t at = u.layers.size();
    u.layers.push_back(l);
    for (const auto& t : l->tensors()) {
      u.weights.push_back({at, t});
      add_unique(out.weight_names, t.name);
    }
    if (!l->expert_tensors().empty()) u.moe = l;
    for (const auto& expert : l->expert_tensors()) {
      auto& tensors = u.experts.emplace_back();
      for (const auto& t : expert) {
        tensors.push_back({at, t});
        add_unique(out.weight_names, t.name);
      }
    }
  }
  for (std::size_t i = 1; i < units.size(); ++i)
    units[i].routed_before = units[i].moe && units[i].moe == units[i].layers.front();
  units.front().first = begin == 0;
  units.back().last = true;
  return out;
}

}  // namespace flexh2o::engine
