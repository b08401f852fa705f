// The planner's rates of this machine for one model, measured on the first run that plans it
// without a hardware profile: the engine's own decoder layer and head by rows (calibrate
// --model's unit curves at --quick sizes, what a step pays beyond its GEMMs' arithmetic) and
// decode attention at the model's heads by cached tokens, kept
// per machine and model shape under $XDG_CACHE_HOME/flexh2o/calibration (~/.cache/...), so
// that later runs plan with them at once (docs/planner.md, "Predictions on this machine").
#pragma once
#include <functional>
#include <string>

#include "engine/job/calibrate_units.h"
#include "engine/model/model_config.h"
#include "kernels/backend.h"
#include "policy/hardware_profile.h"

namespace flexh2o::job {

// What is measured and kept: the unit curves, decode attention by cached tokens and the host's
// work per sequence and step.
struct ModelRates {
  UnitCurves units;
  policy::RateCurve attn_decode_by_len;
  double attn_read_share = 0;  // of decode attention's time, reading the K/V
  double host_row = 0;
};

// The rates are kept for every later run, so one slow pass must not set them: on a shared host
// a neighbour can take a core for a second or more (seen on a 2-core VM: every two-thread rate
// at half speed in 2 of 10 first runs, and once a plan of batch 1 where 128 ran 3x faster).
// Two passes of `measure_pass`, each point kept at the faster; a third where the two differ by
// more than a fifth at any point.
ModelRates faster_of_passes(const std::function<ModelRates()>& measure_pass);

// Where the model's rates of this machine are kept (the directory may not exist yet).
std::string model_rates_dir();

// Adds the rates of `cfg` on `be` to `hw` (layer_by_rows, head_by_rows, the decode attention
// curve and constant; on the CPU backend the cpu tier's too): read from the cache, else
// measured now (faster_of_passes: two or three passes of about a second for a small model) and
// written there; a cache that cannot be read or written is measured around, and says so in
// hw.source, which tells where the curves came from. Not measured (the built-in rates stand,
// and hw.source says why) where a layer and the head would take more than an eighth of the
// memory free now.
void add_model_rates(kernels::Backend& be, const engine::ModelConfig& cfg, policy::HardwareProfile& hw);

}  // namespace flexh2o::job
