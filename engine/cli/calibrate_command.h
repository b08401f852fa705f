// `flexh2o calibrate`: measures this machine's tier capacities, link bandwidths and compute
// rates with the engine's own kernels and copy paths, and writes a hardware profile YAML
// (policy/hardware_profile.h) for the planner.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace flexh2o::cli {

struct CalibrateOptions {
  std::string backend = "cpu";  // cpu | cuda
  std::string offload_dir;      // where the disk tier is measured; empty: a fresh temp directory
  std::string out_file;         // empty: stdout
  std::string name;             // profile name; empty: "<hostname>-<backend>"
  bool quick = false;           // smaller sizes and shorter timings (a few seconds)
  std::string model;            // measure GEMMs at this model's width (default 2048)
};

CLI::App* add_calibrate_command(CLI::App& app, CalibrateOptions& opt);
int calibrate_command(const CalibrateOptions& opt);

}  // namespace flexh2o::cli
