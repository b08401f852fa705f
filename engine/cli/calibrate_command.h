// `flexh2o calibrate`: measures this machine (engine/job/calibrate.h) and writes a hardware
// profile YAML (policy/hardware_profile.h) for the planner.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "engine/job/calibrate.h"

namespace flexh2o::cli {

struct CalibrateCliOptions : job::CalibrateOptions {
  std::string out_file;  // empty: stdout
};

CLI::App* add_calibrate_command(CLI::App& app, CalibrateCliOptions& opt);
int calibrate_command(const CalibrateCliOptions& opt);

}  // namespace flexh2o::cli
