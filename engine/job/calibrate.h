// Measures this machine's tier capacities, link bandwidths and compute rates with the engine's
// own kernels and copy paths, into a hardware profile (policy/hardware_profile.h) for the
// planner (`flexh2o calibrate` writes it as YAML).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "kernels/backend.h"

#include "policy/hardware_profile.h"

namespace flexh2o::job {

struct CalibrateOptions {
  std::string backend = "cpu";  // cpu | cuda
  std::string offload_dir;      // where the disk tier is measured; empty: a fresh temp directory
  std::string name;             // profile name; empty: "<hostname>-<backend>"
  bool quick = false;           // smaller sizes and shorter timings (a few seconds)
  std::string model;            // measure GEMMs at this model's width (default 2048)
};

// The profile measured now; progress lines on stderr as each part is measured.
policy::HardwareProfile calibrate(const CalibrateOptions& o);

// Seconds one call of fn takes: one warm-up call, then three windows of calls, each until a
// third of min_seconds has passed; the fastest window counts (on a shared machine the others
// measure the neighbours).
double seconds_per_call(const std::function<void()>& fn, double min_seconds);

// The decode attention rate (flop/s, HardwareProfile::gpu_attn_decode_by_len) of `cfg`'s heads
// and KV dtype on `be` over `lens` cached tokens (ascending), each timed over `seconds`;
// silent.
policy::RateCurve decode_attention_curve(kernels::Backend& be, const engine::ModelConfig& cfg,
                                         std::vector<std::int64_t> lens, double seconds);

// The share of `cfg`'s decode attention time on `be` that reading its K/V takes, from
// sequences reading one shared prefix once and plainly over 256 cached tokens
// (HardwareProfile::gpu_attn_decode_read_share), timed over `seconds`; silent.
double decode_attention_read_share(kernels::Backend& be, const engine::ModelConfig& cfg, double seconds);

}  // namespace flexh2o::job
