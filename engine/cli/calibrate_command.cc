#include "engine/cli/calibrate_command.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <stdexcept>

#include "offload/text_file.h"
#include "policy/hardware_profile.h"

namespace flexh2o::cli {

CLI::App* add_calibrate_command(CLI::App& app, CalibrateCliOptions& o) {
  auto* cal = app.add_subcommand("calibrate", "Measure this machine and write a hardware profile YAML for the planner");
  cal->add_option("--backend", o.backend, "compute backend to measure")->check(CLI::IsMember({"cpu", "cuda"}));
  cal->add_option("--offload-dir", o.offload_dir, "directory whose disk is measured (default: a fresh temp directory)");
  cal->add_option("--out", o.out_file, "write the profile here (default: stdout)");
  cal->add_option("--name", o.name, "profile name (default: <hostname>-<backend>)");
  cal->add_flag("--quick", o.quick, "smaller sizes and shorter timings (a few seconds, rougher numbers)");
  cal->add_option("--model", o.model,
                  "measure GEMMs at this model's width and attention at its heads and KV dtype (default: width 2048, "
                  "16 heads of 128, f16 KV)");
  return cal;
}

int calibrate_command(const CalibrateCliOptions& o) {
  if (!o.out_file.empty()) {  // fail before measuring, not after
    const std::filesystem::path dir = std::filesystem::path(o.out_file).parent_path();
    if (!dir.empty() && !std::filesystem::is_directory(dir))
      throw std::invalid_argument("--out " + o.out_file + ": directory " + dir.string() + " does not exist");
  }
  const auto started = std::chrono::steady_clock::now();
  const std::string yaml = policy::hardware_to_yaml(job::calibrate(o));
  // What we write must load; a failure here is a bug, caught before the file exists.
  policy::load_hardware_yaml(yaml, "calibrate output");
  if (o.out_file.empty())
    fmt::print("{}", yaml);
  else
    offload::write_file_atomically(o.out_file, yaml);
  fmt::print(stderr, "calibrate: done in {:.1f} s{}\n",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
             o.out_file.empty() ? "" : ", wrote " + o.out_file);
  return 0;
}

}  // namespace flexh2o::cli
