// What `flexh2o bench` runs: one workload under the schedules of the systems users know (HF
// Accelerate, DeepSpeed ZeRO-Inference, FlexGen, FlexGen + H2O), on the same engine and memory
// limits, each with the batch and policy chosen for it.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/runtime/generator.h"
#include "policy/hardware_profile.h"
#include "policy/policy.h"

namespace flexh2o::job {

struct BenchOptions {
  std::string model = "opt-125m";
  bool dummy = false;
  std::string dtype = "f16";
  std::int64_t prompt_len = 64;
  std::int64_t gen_len = 8;
  std::string gpu_mem = "256MiB", cpu_mem, disk_mem;
  std::string systems = "accelerate,zero,flexgen,flexgen+h2o,flexgen+4bit";
  std::string hardware = "ci-cpu";
  std::int64_t max_batch = 64;
  std::string backend = "auto";
  std::string compute_dtype = "auto";
};

// One system's run: its policy, what it generated and its rates, each tier's peak bytes.
struct SystemRun {
  std::string system;
  policy::Policy policy;
  engine::GenerationResult result;
  std::array<std::int64_t, 3> peak{};
  double prefill_tput = 0, decode_tput = 0, total_tput = 0;
};

struct BenchRuns {
  std::string model;    // the model's name
  std::string backend;  // the backend's name
  policy::HardwareProfile hw;  // the limits every system ran within
  std::vector<SystemRun> runs;  // in the order of `systems`
};

// Runs each system of o.systems in turn (a progress line on stderr for each).
BenchRuns bench_systems(const BenchOptions& o);

}  // namespace flexh2o::job
