// What `flexh2o calibrate --model` measures of the engine's own units of that model: one
// decoder layer (its attention and MLP units) by rows, and the output head by sequences, each
// as the scheduler runs them (norms, projections, biases, activation, residual adds, KV
// writes, the final norm, the head GEMM and sampling), so that the planner charges what a
// step pays beyond its GEMMs' arithmetic.
#pragma once
#include <functional>
#include <string>

#include "engine/model/model_config.h"
#include "kernels/backend.h"
#include "policy/hardware_profile.h"

namespace flexh2o::job {

struct UnitCurves {
  policy::RateCurve layer_by_rows;  // flop/s of decoder layer 0, counted as 2 x its matrix elements per row
  policy::RateCurve head_by_rows;   // flop/s of the output head, counted as 2 x vocab x hidden per sequence
};

// Seconds one call of the function takes (calibrate's timing: warm-up, fastest window).
using TimeCall = std::function<double(const std::function<void()>&)>;

// Times the units of `cfg` (weights random, in the model's dtype, on `be`) at growing rows,
// up to `max_rows` (the head to a quarter of it) and what fits `max_bytes` of activations; at
// each, in the compute dtype --compute-dtype auto settles for GPU batches of that many rows.
// The layer runs a prefill of one-token sequences, so its attention covers one key each (the
// planner charges attention by its own rates); the head runs over one row per sequence, as
// every step does.
// `progress(what, result)` reports each measurement.
UnitCurves measure_unit_curves(kernels::Backend& be, const engine::ModelConfig& cfg, std::int64_t max_rows,
                               std::int64_t max_bytes, const TimeCall& time_call,
                               const std::function<void(const std::string&, const std::string&)>& progress);

// Seconds of host work per sequence and step under continuous batching (HardwareProfile::
// host_row): the engine's StepScheduler planning a block of 64 one-token prompts, each slot's
// token sampled in a call of its own (greedy, over logits of `cfg`'s vocabulary already on the
// host) and recorded by the GenerationLog, as BlockRun and the executor do around the units.
double host_seconds_per_row(kernels::Backend& be, const engine::ModelConfig& cfg, const TimeCall& time_call);

}  // namespace flexh2o::job
