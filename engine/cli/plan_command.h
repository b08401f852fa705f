// `flexh2o plan`: the cost-model planner as a dry run (no GPU, no weights needed).
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "engine/job/plan_job.h"

namespace flexh2o::cli {

// plan's flags: the job to plan (engine/job/plan_job.h), and what to show and write.
struct PlanCliOptions : job::PlanJobOptions {
  std::string out_file;  // the chosen policy as YAML
  bool explain = false;
};

CLI::App* add_plan_command(CLI::App& app, PlanCliOptions& opt);
int plan_command(const PlanCliOptions& opt);

}  // namespace flexh2o::cli
