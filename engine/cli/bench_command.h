// `flexh2o bench`: one workload under the schedules of the systems users know
// (engine/job/bench.h); prints a table and writes CSV and a PNG chart.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "engine/job/bench.h"

namespace flexh2o::cli {

struct BenchCliOptions : job::BenchOptions {
  std::string out_dir = "bench-out";
};

CLI::App* add_bench_command(CLI::App& app, BenchCliOptions& opt);
int bench_command(const BenchCliOptions& opt);

}  // namespace flexh2o::cli
