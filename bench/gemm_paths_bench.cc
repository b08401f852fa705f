// The CPU GEMM's paths side by side (kernels/cpu/gemm_cpu.h) on the decode shapes of a
// Llama-3.2-1B-sized model, for every stored weight dtype and batches of m activation rows,
// in GFLOP/s: the few-row kernel (up to 8 or 16 rows), oneDNN on converted weight panels (the
// path for more rows before the tiled kernel), the tiled kernel, the path the backend now
// picks by default (weight-only), and the int8 path (FLEXH2O_CPU_GEMM=int8; q4/q8 weights) with
// this CPU's best kernel ("int8") and with the 256-bit kernel ("int8 256", VNNI or AVX2) where
// the best is the AVX-512 one.
// "ratio" is picked / what the backend took before (the few-row kernel where it applies, else
// oneDNN panels), "int8 ratio" the same for the int8 kernel: how much faster the backend got,
// measured interleaved in one run. "oneDNN bf16" is oneDNN on the same panels under bf16 compute
// (what --compute-dtype auto picks for 16-bit and quantized weights where the CPU has native
// bf16 units; "-" elsewhere), "tiled bf16" the bf16 tiled kernel (f16/bf16 weights, AVX-512 BF16),
// and "bf16 / best f32" the faster bf16 path's speed over the fastest weight-only path.
// Usage: bench_gemm_paths [reps] [n k] [dtype ...]
#include <fmt/format.h>
#include <tbb/info.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cpu/onednn_matmul.h"
#include "kernels/dtype.h"

using namespace flexh2o;
using kernels::CpuGemmPath;
using kernels::DType;

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{8192, 2048}, {2048, 8192}};
  if (argc > 3) shapes = {{std::atoll(argv[2]), std::atoll(argv[3])}};
  std::vector<DType> dtypes = {DType::F16, DType::BF16, DType::Q8G32, DType::Q4G32, DType::Q8, DType::Q4, DType::F32};
  if (argc > 4) {
    dtypes.clear();
    for (int i = 4; i < argc; ++i) dtypes.push_back(kernels::parse_dtype(argv[i]));
  }
  const std::vector<std::int64_t> ms = {1, 4, 16, 32, 64, 128, 256, 1024};
  const std::vector<CpuGemmPath> paths = {CpuGemmPath::FewRows, CpuGemmPath::OnednnPanels, CpuGemmPath::Tiled,
                                          CpuGemmPath::TiledInt8};
  fmt::print("CPU GEMM paths, {} threads, median of {} interleaved runs, GFLOP/s\n\n", tbb::info::default_concurrency(),
             reps);
  fmt::print("| weights | n x k | m | few-row | oneDNN panels | tiled | int8 | int8 256 | picked | ratio | int8 ratio | "
             "oneDNN bf16 | tiled bf16 | bf16 / best f32 |\n"
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const auto& [n, k] : shapes) {
    std::vector<float> w(static_cast<std::size_t>(n * k));
    for (auto& e : w) e = u(rng) * 0.05f;
    for (const DType t : dtypes) {
      std::vector<std::uint8_t> stored(static_cast<std::size_t>(n * kernels::row_bytes(t, k)));
      kernels::convert_rows(w.data(), DType::F32, stored.data(), t, n, k);
      for (const std::int64_t m : ms) {
        std::vector<float> x(static_cast<std::size_t>(m * k)), y(static_cast<std::size_t>(m * n));
        for (auto& e : x) e = u(rng);
        const kernels::GemmArgs a{x.data(), m, {stored.data(), t, n, k}, nullptr, y.data(), 0.0f, DType::F32};
        std::vector<std::function<void()>> variants;
        std::vector<int> slot;  // variants' index per path, -1 where it cannot run
        for (const CpuGemmPath p : paths) {
          if (!kernels::cpu_gemm_path_supported(p, a)) {
            slot.push_back(-1);
            continue;
          }
          slot.push_back(static_cast<int>(variants.size()));
          variants.emplace_back([&a, p] { kernels::run_cpu_gemm_path(p, a); });
        }
        // The 256-bit int8 kernel beside the AVX-512 one.
        const kernels::Int8Kernel narrow =
            kernels::int8_kernel_available(kernels::Int8Kernel::Vnni256) ? kernels::Int8Kernel::Vnni256 : kernels::Int8Kernel::Avx2;
        int narrow_at = -1;
        if (slot[3] >= 0 && kernels::int8_best_kernel() == kernels::Int8Kernel::Avx512Vnni) {
          narrow_at = static_cast<int>(variants.size());
          variants.emplace_back([&a, narrow] { kernels::run_cpu_gemm_int8(a, narrow); });
        }
        const CpuGemmPath picked = kernels::choose_cpu_gemm_path(a, kernels::CpuGemmMode::WeightOnly);
        const CpuGemmPath before = kernels::choose_cpu_gemm_path(a, kernels::CpuGemmMode::Previous);
        variants.emplace_back([&a, picked] { kernels::run_cpu_gemm_path(picked, a); });
        const std::size_t picked_at = variants.size() - 1;
        kernels::GemmArgs a_bf16 = a;
        a_bf16.compute = DType::BF16;
        int onednn_bf16_at = -1, tiled_bf16_at = -1;
        if (kernels::onednn_native_bf16() && t != DType::F32) {
          onednn_bf16_at = static_cast<int>(variants.size());
          variants.emplace_back([&a_bf16] { kernels::run_cpu_gemm_path(CpuGemmPath::OnednnPanels, a_bf16); });
        }
        if (kernels::cpu_gemm_path_supported(CpuGemmPath::TiledBf16, a_bf16)) {
          tiled_bf16_at = static_cast<int>(variants.size());
          variants.emplace_back([&a_bf16] { kernels::run_cpu_gemm_path(CpuGemmPath::TiledBf16, a_bf16); });
        }
        const std::vector<double> sec = bench::interleaved_medians(variants, reps);
        const double flop = 2.0 * static_cast<double>(m * n * k);
        auto cell = [&](int i) { return i < 0 ? std::string("-") : fmt::format("{:.1f}", flop / sec[i] / 1e9); };
        const double old = sec[slot[before == CpuGemmPath::FewRows ? 0 : 1]];
        double best_f32 = sec[picked_at], best_bf16 = 0;
        for (int i : slot)
          if (i >= 0 && i != slot[3]) best_f32 = std::min(best_f32, sec[static_cast<std::size_t>(i)]);
        for (int i : {onednn_bf16_at, tiled_bf16_at})
          if (i >= 0) best_bf16 = best_bf16 == 0 ? sec[i] : std::min(best_bf16, sec[i]);
        const std::string bf16_cells = fmt::format("{} | {} | {}", cell(onednn_bf16_at), cell(tiled_bf16_at),
                                                   best_bf16 == 0 ? "-" : fmt::format("{:.2f}", best_f32 / best_bf16));
        const std::string int8_ratio = slot[3] < 0 ? "-" : fmt::format("{:.2f}", old / sec[slot[3]]);
        fmt::print("| {} | {} x {} | {} | {} | {} | {} | {} | {} | {} | {:.2f} | {} | {} |\n", kernels::dtype_name(t), n, k,
                   m, cell(slot[0]), cell(slot[1]), cell(slot[2]), cell(slot[3]), cell(narrow_at),
                   cell(static_cast<int>(picked_at)),
                   old / sec[picked_at], int8_ratio, bf16_cells);
      }
    }
  }
  return 0;
}
