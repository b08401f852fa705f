// Measures this machine's tier capacities, link bandwidths and compute rates with the engine's
// own kernels and copy paths, into a hardware profile (policy/hardware_profile.h) for the
// planner (`flexh2o calibrate` writes it as YAML).
#pragma once
#include <string>

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

}  // namespace flexh2o::job
