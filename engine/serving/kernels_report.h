// The run report's `kernels:` line and --metrics "kernels": which instruction set and GEMM paths
// the backend ran (kernels/kernel_use.h), so that a slow path (a conversion per call, a
// reference primitive) shows in the report.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

#include "kernels/kernel_use.h"

namespace flexh2o::serving {

// "kernels: avx512_core_bf16 | GEMMs: tiled bf16 96% of FLOPs (1,204 calls), ... | oneDNN
// brg:avx512_core_bf16\n"; empty where the backend says nothing.
std::string kernels_text(const kernels::KernelUse& u);
nlohmann::json kernels_json(const kernels::KernelUse& u);

}  // namespace flexh2o::serving
