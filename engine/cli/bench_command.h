// `flexh2o bench`: one workload under the schedules of the systems users know (HF Accelerate,
// DeepSpeed ZeRO-Inference, FlexGen, FlexGen + H2O), on the same engine and memory limits,
// each with the batch and policy chosen for it; prints a table and writes CSV and a PNG chart.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace flexh2o::cli {

struct BenchOptions {
  std::string model = "opt-125m";
  bool dummy = false;
  std::string dtype = "f16";
  std::int64_t prompt_len = 64;
  std::int64_t gen_len = 8;
  std::string gpu_mem = "256MiB", cpu_mem, disk_mem;
  std::string systems = "accelerate,zero,flexgen,flexgen+h2o,flexgen+4bit";
  std::string hardware = "ci-cpu";
  std::string out_dir = "bench-out";
  std::int64_t max_batch = 64;
  std::string backend = "auto";
  std::string compute_dtype = "auto";
};

CLI::App* add_bench_command(CLI::App& app, BenchOptions& opt);
int bench_command(const BenchOptions& opt);

}  // namespace flexh2o::cli
