// The planner's view of a model config (policy sees models only as a ModelShape).
#pragma once
#include "engine/model/model_config.h"
#include "policy/cost_model.h"

namespace flexh2o::engine {

policy::ModelShape model_shape(const ModelConfig& cfg);
// The sizes and the features that decide the tensors (what policy/unit_weights reads), without
// the kept group formats (which need the tensor list).
policy::ModelShape tensor_shape(const ModelConfig& cfg);

}  // namespace flexh2o::engine
