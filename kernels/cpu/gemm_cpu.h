// The CPU GEMM's paths and the choice between them (gemm_cpu.cc). Benchmarks run each path on
// the same problem to measure where one overtakes another.
#pragma once
#include <string_view>

#include "kernels/cpu/gemm_int8_cpu.h"
#include "kernels/gemm.h"

namespace flexh2o::kernels {

enum class CpuGemmPath {
  FewRows,       // gemv_cpu.h: weights read in place, few activation rows
  Tiled,         // gemm_tiled_cpu.h: weight tiles widened in L1, register-blocked FMA
  TiledInt8,     // gemm_int8_cpu.h: q4/q8 tiles times activations quantized per 32-block
  TiledBf16,     // gemm_tiled_bf16_cpu.h: under bf16 compute, f16/bf16 tiles by AVX-512 BF16 dot products
  OnednnPanels,  // weight panels brought to the compute dtype, oneDNN matmul per panel
};
std::string_view cpu_gemm_path_name(CpuGemmPath p);

// Which paths CpuBackend::gemm may take, from the environment variable FLEXH2O_CPU_GEMM:
//   int8 (default): q4/q8 weights (k a multiple of 32) by integer dot products with activations
//                quantized per 32-block, as llama.cpp multiplies GGUF blocks; other weights as
//                weight-only. Not exact: on SmolLM2-135M (`eval --kv full --compress weight
//                --chunks 64 --batch 16`), the Q4_1 file kept as q4g32: top-1 0.954 and KL
//                0.0040 against the same weights computed exactly; the HF model compressed to
//                4 bits: KL 0.4392 and top-1 0.621 against 0.4335 and 0.620 weight-only, i.e.
//                1.3% on top of what the 4-bit weights themselves cost; to 8 bits: KL 0.0054
//                and top-1 0.952 against 0.0014 and 0.977 (there the activations cost more
//                than the weights);
//   weight-only: the fastest measured of the paths that multiply the stored weights' exact
//                values with fp32 activations;
//   previous:    the paths before the tiled kernels (few-row kernel, else oneDNN panels), for
//                before/after measurements.
// Any other value is an error naming the variable.
enum class CpuGemmMode { WeightOnly, Int8, Previous };
CpuGemmMode cpu_gemm_mode();

// Whether path p can compute `a` on this CPU (OnednnPanels always can).
bool cpu_gemm_path_supported(CpuGemmPath p, const GemmArgs& a);
// The path CpuBackend::gemm takes for `a` in mode `mode`.
CpuGemmPath choose_cpu_gemm_path(const GemmArgs& a, CpuGemmMode mode = cpu_gemm_mode());
// Runs `a` by path p over the backend's threads; throws std::invalid_argument where p cannot.
void run_cpu_gemm_path(CpuGemmPath p, const GemmArgs& a);
// The int8 path with a given kernel (TiledInt8 takes int8_best_kernel()), for benchmarks and tests.
void run_cpu_gemm_int8(const GemmArgs& a, Int8Kernel kernel);

}  // namespace flexh2o::kernels
