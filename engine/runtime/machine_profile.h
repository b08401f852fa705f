// The hardware profile a run plans with: a --hardware file or built-in name, or this machine.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "kernels/backend.h"
#include "policy/hardware_profile.h"

namespace flexh2o::engine {

// A profile file, or a built-in one by name (configs/hardware/*.yaml: t4-gcp, ci-cpu, ...).
policy::HardwareProfile hardware_profile(const std::string& name_or_path);

// Memory this process may use now: MemAvailable, or what its cgroups can still give (their
// limit less their working set: cgroup_memory.h) where that is lower.
std::int64_t available_memory();

// Bytes per second the backend reads a weight matrix at in a one-row GEMM (decode at batch 1):
// an f16 matrix larger than a CPU's last-level cache, the median of a few calls (~50 ms on a CPU).
double weight_read_rate(kernels::Backend& be);

// The dtype the engine multiplies a GEMM of `rows` activation rows in (a job whose GPU batches
// hold that many sequences, under the run's --compute-dtype).
using GemmDtypeAt = std::function<kernels::DType(std::int64_t rows)>;

// This machine as the planner sees it: the rates of the built-in profile of the backend's kind
// (ci-cpu for the CPU, h100-pcie for CUDA; `flexh2o calibrate` measures better ones), and the
// capacities it has now: on the CPU backend, where the gpu and cpu tiers are both host
// memory, both are planned into available_memory(); on CUDA the device's memory and the host's;
// disk the free space where the offload directory goes. Its GEMMs are measured now (over 64
// MiB of f16 weights, each row count in the dtype `dtype_at` gives it, the median of 3
// interleaved rounds: on the CPU 1 to 256 rows, about 0.5 s; on a GPU 1 to 16384, whose rate
// still climbs past a few hundred): the built-in curves, from a small model whose weights stay
// in cache on another CPU, are scaled to them (h100-pcie has none: the measured curve is the
// GEMM curve), and the weight read rate (one row) bounds every GEMM over few rows, once per
// GPU batch, where the built-in profile gives none. The GEMMs are measured once per process
// (per backend kind and dtypes); the capacities each call.
policy::HardwareProfile this_machine_profile(kernels::Backend& be, const std::string& offload_dir,
                                             const GemmDtypeAt& dtype_at);

}  // namespace flexh2o::engine
