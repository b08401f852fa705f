// The model's weights placed across the tiers: every tensor a TieredTensor split by the
// policy's weight fractions, read from the checkpoint straight into its home tiers, in the
// dtype the tiers' backend holds it in for cfg.compute_dtype (held_dtype, weights.h).
#pragma once
#include <map>
#include <memory>
#include <span>
#include <string>

#include "engine/model/weights.h"
#include "offload/tiered_tensor.h"

namespace flexh2o::engine {

using TieredWeights = std::map<std::string, std::unique_ptr<offload::TieredTensor>>;

// Checks shapes, then loads tensor by tensor in parallel through bounded host buffers (a few
// MiB per task), so the model is never held whole in RAM. Throws naming the tensor. `only`
// (when not empty) names the tensors to load: a pipeline stage holds just its layers' weights.
// `fractions` place the decoder layers' tensors, and the others (embeddings, final norm, head)
// too unless `resident_embeddings` puts those wholly on the gpu tier (Policy::resident_embeddings).
TieredWeights load_tiered_weights(const ModelConfig& cfg, const WeightSource& source, offload::Tiers& tiers,
                                  const offload::TierFractions& fractions, bool resident_embeddings,
                                  std::span<const std::string> only = {});

}  // namespace flexh2o::engine
