// The planner's rates of this machine for one model, measured on the first run that plans it
// without a hardware profile: the engine's own decoder layer and head by rows (calibrate
// --model's unit curves at --quick sizes, what a step pays beyond its GEMMs' arithmetic) and
// decode attention at the model's heads by cached tokens, kept
// per machine and model shape under $XDG_CACHE_HOME/flexh2o/calibration (~/.cache/...), so
// that later runs plan with them at once (docs/planner.md, "Predictions on this machine").
#pragma once
#include <string>

#include "engine/model/model_config.h"
#include "kernels/backend.h"
#include "policy/hardware_profile.h"

namespace flexh2o::job {

// Where the model's rates of this machine are kept (the directory may not exist yet).
std::string model_rates_dir();

// Adds the rates of `cfg` on `be` to `hw` (layer_by_rows, head_by_rows, the decode attention
// curve and constant; on the CPU backend the cpu tier's too): read from the
// cache, else measured now (about a second for a small model) and written there; a cache that
// cannot be read or written is measured around, and says so in hw.source, which tells where
// the curves came from. Not measured (the built-in rates stand, and hw.source says why) where
// a layer and the head would take more than an eighth of the memory free now.
void add_model_rates(kernels::Backend& be, const engine::ModelConfig& cfg, policy::HardwareProfile& hw);

}  // namespace flexh2o::job
