// `flexh2o run`: batched offline generation.
#pragma once
#include <CLI/CLI.hpp>

#include "engine/job/job_options.h"

namespace flexh2o::cli {

CLI::App* add_run_command(CLI::App& app, job::JobOptions& opt);
int run_command(const job::JobOptions& opt);

}  // namespace flexh2o::cli
