// GEMM on the CPU: the paths of gemm_cpu.h and the choice between them. q4/q8 weights take the
// int8 kernels (gemm_int8_cpu.h) at every row count unless FLEXH2O_CPU_GEMM says otherwise.
// Under bf16 compute, float weights take the bf16 tiled kernel (gemm_tiled_bf16_cpu.h) at every
// row count where the CPU has AVX-512 BF16. Otherwise: few activation rows (decode at small
// batch) take gemv_cpu.h's kernel, a few tens (decode at larger batch) the tiled kernel
// (gemm_tiled_cpu.h), which read the weights as stored; more rows (prefill) and CPUs without
// AVX2/FMA/F16C take oneDNN: the weight's output rows are cut into panels; each oneTBB task
// brings its panel into the compute dtype in thread-local scratch where it is stored in another
// (fp16/bf16 converted, q4/q8 dequantized; fp32 weights and bf16 weights under bf16 compute are
// used in place) and multiplies it with a single-threaded oneDNN matmul, so the weight is never
// expanded whole.
// bf16 compute runs natively where oneDNN has AVX-512 BF16 or AMX; elsewhere the same products
// are formed in fp32 from bf16-rounded inputs (exact: 8-bit significands).
#include <tbb/enumerable_thread_specific.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <functional>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cpu/gemm_int8_cpu.h"
#include "kernels/cpu/gemm_tiled_bf16_cpu.h"
#include "kernels/cpu/gemm_tiled_cpu.h"
#include "kernels/cpu/gemv_cpu.h"
#include "kernels/cpu/onednn_matmul.h"

namespace flexh2o::kernels {

namespace {

// Rows per panel. Weights used in place: a few large panels per thread (each panel is a
// oneDNN call, whose fixed cost matters for one-row GEMVs). Converted weights with few
// activation rows (decode): ~512 KiB of converted weight, so a panel stays in L2 while the
// matmul streams it. Many rows (prefill): each panel re-packs x, so use few large panels
// (about four per thread, at most 16 MiB of scratch).
std::int64_t panel_rows(std::int64_t m, std::int64_t n, std::int64_t k, bool converted) {
  k = std::max<std::int64_t>(k, 1);
  const std::int64_t threads = tbb::this_task_arena::max_concurrency();
  const std::int64_t even = (n + 4 * threads - 1) / (4 * threads);
  if (!converted) return std::min(n, std::max<std::int64_t>(even, 16));
  if (m <= 16) return std::min(n, std::max<std::int64_t>(16, (512 * 1024 / 4) / k));
  const std::int64_t cap = std::max<std::int64_t>(16, (16 << 20) / 4 / k);
  return std::min(n, std::clamp<std::int64_t>(even, 64, cap));
}

// Where one path overtakes another, measured with bench_gemm_paths and per-core CPU time (n 8192
// x k 2048, 2-core Zen 4): the few-row kernel up to 8 activation rows for float weights (at 16
// rows f16 runs 1.5x faster tiled) and up to its limit of 16 for q8 ones (the two are within
// noise there), the tiled kernel from there to 128 (f16 at 64 rows: 1.5x oneDNN on converted
// panels), oneDNN's blocked GEMM beyond (the tiled kernel's chunks of k shrink as x grows; at
// 256 rows it is 0.6-0.8x oneDNN);
std::int64_t few_rows_max(DType t) { return is_quantized(t) ? 16 : 8; }
std::int64_t tiled_max_rows() { return 128; }
// The int8 path (the default for q4/q8 weights) from one row, with no upper limit: with the
// AVX-512 kernel 3-10x the weight-only paths at 1-16 rows (a GEMV reads the 4-bit codes and
// skips the fp32 expansion), 1.5-3x from 16 to 1024; and one path for every row count keeps a
// sequence's tokens independent of how many others share its step.
std::int64_t int8_min_rows() { return 1; }

// v rounded to bf16, kept in fp32 (the emulated bf16 path).
void round_to_bf16(float* v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) v[i] = bf16_to_f32(f32_to_bf16(v[i]));
}

void gemm_onednn_panels(const GemmArgs& a) {
  const std::int64_t m = a.m, n = a.w.rows, k = a.w.cols;
  const bool bf16 = a.compute == DType::BF16, native_bf16 = bf16 && onednn_native_bf16();
  const DType inputs = native_bf16 ? DType::BF16 : DType::F32;
  // x in the dtype the matmul reads: as given, or rounded to bf16 once for all panels.
  const void* x = a.x;
  std::vector<std::uint16_t> x_bf16;
  std::vector<float> x_rounded;
  if (native_bf16) {
    x_bf16.resize(static_cast<std::size_t>(m * k));
    convert_from_f32(a.x, DType::BF16, x_bf16.data(), x_bf16.size());
    x = x_bf16.data();
  } else if (bf16) {
    x_rounded.assign(a.x, a.x + m * k);
    round_to_bf16(x_rounded.data(), x_rounded.size());
    x = x_rounded.data();
  }
  const bool converted = a.w.dtype != inputs || (bf16 && !native_bf16);
  const std::int64_t panel = panel_rows(m, n, k, converted);
  const std::int64_t panels = (n + panel - 1) / panel;
  const std::int64_t wrow = row_bytes(a.w.dtype, k);
  static tbb::enumerable_thread_specific<std::vector<float>> scratch_tls;

  tbb::parallel_for(std::int64_t{0}, panels, [&](std::int64_t p) {
    const std::int64_t n0 = p * panel;
    const std::int64_t rows = std::min(panel, n - n0);
    const char* wsrc = static_cast<const char*>(a.w.data) + n0 * wrow;
    const void* w = wsrc;
    if (converted) {
      auto& scratch = scratch_tls.local();  // fp32 floats, or bf16 pairs packed in them
      scratch.resize(static_cast<std::size_t>(rows * k));
      convert_rows(wsrc, a.w.dtype, scratch.data(), inputs, rows, k);
      if (bf16 && !native_bf16 && a.w.dtype != DType::BF16) round_to_bf16(scratch.data(), scratch.size());
      w = scratch.data();
    }
    PanelShape shape{m, rows, k, n, inputs, a.bias != nullptr, a.beta != 0.0f};
    onednn_matmul(shape, x, w, a.bias ? a.bias + n0 : nullptr, a.y + n0);
  });
}

// x rounded to bf16 once (as the oneDNN path rounds it), then tasks of whole weight row blocks.
void run_cpu_gemm_tiled_bf16(const GemmArgs& a) {
  using Range = tbb::blocked_range<std::int64_t>;
  const std::int64_t k = a.w.cols, stride = tiled_bf16_x_stride(k);
  std::vector<std::uint16_t> x(static_cast<std::size_t>(a.m * stride));
  tbb::parallel_for(Range(0, a.m, 16), [&](const Range& r) {
    for (std::int64_t i = r.begin(); i < r.end(); ++i)
      convert_from_f32(a.x + i * k, DType::BF16, x.data() + i * stride, static_cast<std::size_t>(k));
  });
  tbb::parallel_for(
      Range(0, a.w.rows, kTiledTaskRows), [&](const Range& r) { gemm_tiled_bf16(a, x.data(), r.begin(), r.end()); },
      tbb::simple_partitioner());
}

}  // namespace

std::string_view cpu_gemm_path_name(CpuGemmPath p) {
  switch (p) {
    case CpuGemmPath::FewRows: return "few-row";
    case CpuGemmPath::Tiled: return "tiled";
    case CpuGemmPath::TiledInt8: return "tiled int8";
    case CpuGemmPath::TiledBf16: return "tiled bf16";
    case CpuGemmPath::OnednnPanels: return "oneDNN panels";
  }
  return "?";
}

bool cpu_gemm_path_supported(CpuGemmPath p, const GemmArgs& a) {
  switch (p) {
    case CpuGemmPath::FewRows: return gemv_small_m_applies(a);
    case CpuGemmPath::Tiled: return gemm_tiled_supported(a);
    case CpuGemmPath::TiledInt8: return gemm_int8_supported(a);
    case CpuGemmPath::TiledBf16: return gemm_tiled_bf16_supported(a);
    case CpuGemmPath::OnednnPanels: return true;
  }
  return false;
}

CpuGemmMode cpu_gemm_mode() {
  static const CpuGemmMode mode = [] {
    const char* v = std::getenv("FLEXH2O_CPU_GEMM");
    const std::string s = v ? v : "int8";
    if (s == "weight-only") return CpuGemmMode::WeightOnly;
    if (s == "int8") return CpuGemmMode::Int8;
    if (s == "previous") return CpuGemmMode::Previous;
    throw std::invalid_argument("FLEXH2O_CPU_GEMM=" + s + ": expected int8 (the default), weight-only or previous");
  }();
  return mode;
}

CpuGemmPath choose_cpu_gemm_path(const GemmArgs& a, CpuGemmMode mode) {
  if (mode == CpuGemmMode::Previous) return gemv_small_m_applies(a) ? CpuGemmPath::FewRows : CpuGemmPath::OnednnPanels;
  if (mode == CpuGemmMode::Int8 && gemm_int8_supported(a) && a.m >= int8_min_rows())
    return CpuGemmPath::TiledInt8;
  if (gemm_tiled_bf16_supported(a)) return CpuGemmPath::TiledBf16;
  if (gemv_small_m_applies(a) && a.m <= few_rows_max(a.w.dtype)) return CpuGemmPath::FewRows;
  if (gemm_tiled_supported(a) && a.m <= tiled_max_rows()) return CpuGemmPath::Tiled;
  return CpuGemmPath::OnednnPanels;
}

void run_cpu_gemm_int8(const GemmArgs& a, Int8Kernel kernel) {
  using Range = tbb::blocked_range<std::int64_t>;
  Int8Rows q;  // per call: a task nested in this one may run another GEMM on this thread
  resize_int8_rows(a.m, a.w.cols, q, kernel, a.w.dtype);
  tbb::parallel_for(Range(0, a.m, 8), [&](const Range& r) { quantize_int8_rows(a.x, r.begin(), r.end(), q); });
  // Tasks of whole tiles: 4 rows, or 32 for the AVX-512 kernel (two of them a task).
  const std::int64_t tile = kernel == Int8Kernel::Avx512Vnni ? kInt8Avx512TileRows : 4;
  const std::int64_t tiles = (a.w.rows + tile - 1) / tile, grain = std::max<std::int64_t>(1, kTiledTaskRows / tile);
  tbb::parallel_for(
      Range(0, tiles, grain),
      [&](const Range& r) { gemm_int8(a, q, r.begin() * tile, std::min(a.w.rows, r.end() * tile), kernel); },
      tbb::simple_partitioner());
}

void run_cpu_gemm_path(CpuGemmPath p, const GemmArgs& a) {
  if (!cpu_gemm_path_supported(p, a))
    throw std::invalid_argument("gemm: the " + std::string(cpu_gemm_path_name(p)) + " path cannot run " +
                                std::string(dtype_name(a.w.dtype)) + " weights, " + std::string(dtype_name(a.compute)) +
                                " compute, m = " + std::to_string(a.m) + " on this CPU");
  using Range = tbb::blocked_range<std::int64_t>;
  switch (p) {
    case CpuGemmPath::FewRows:
      tbb::parallel_for(Range(0, a.w.rows, 64), [&](const Range& r) { gemv_small_m(a, r.begin(), r.end()); });
      return;
    case CpuGemmPath::Tiled:
      tbb::parallel_for(Range(0, a.w.rows, kTiledTaskRows), [&](const Range& r) { gemm_tiled(a, r.begin(), r.end()); },
                        tbb::simple_partitioner());
      return;
    case CpuGemmPath::TiledInt8: return run_cpu_gemm_int8(a, int8_best_kernel());
    case CpuGemmPath::TiledBf16: return run_cpu_gemm_tiled_bf16(a);
    case CpuGemmPath::OnednnPanels: return gemm_onednn_panels(a);
  }
}

bool CpuBackend::native_bf16() const { return onednn_native_bf16(); }

// Measured with bench_gemm_paths (n 8192 x k 2048, 2-core Zen 4 with AVX-512 BF16, one run):
// oneDNN's native bf16 GEMM against the fastest weight-only f32 path is 0.1-0.3x at 1-4 rows,
// 0.6-0.75x at 16, 0.7-0.9x at 32, 1.0-1.16x at 64 and 1.45-1.9x from 128 rows, for f16, q8g32,
// q4g32, q8 and q4 weights alike. Where the f32 kernels cannot run (no AVX2/FMA/F16C) bf16 wins
// at every size. Quantized weights under the int8 mode never take bf16: the int8 path (f32
// compute) measured 1.5-3x oneDNN's bf16 at 16-256 rows and on par or ahead at 1024.
// The bf16 tiled kernel (AVX-512 BF16; same bench, f16 weights, quiet) is 0.8x the best fp32
// path at one row, 1.4x at 4, 1.8x at 16, 1.9x at 32 and 2.0x from 64: bf16 from 4 rows there.
std::optional<std::int64_t> CpuBackend::bf16_faster_from_rows(DType weights) const {
  GemmArgs f32_decode;
  f32_decode.m = 16;
  f32_decode.w = {nullptr, weights, 1, kInt8Block};
  if (cpu_gemm_mode() == CpuGemmMode::Int8 && gemm_int8_supported(f32_decode)) return std::nullopt;
  GemmArgs bf16_decode = f32_decode;
  bf16_decode.compute = DType::BF16;
  if (gemm_tiled_bf16_supported(bf16_decode)) return 4;
  return gemm_tiled_supported(f32_decode) ? 64 : 1;
}

// The path `a` takes, counted (kernel_use), then run.
void CpuBackend::run_gemm(const GemmArgs& a) {
  const CpuGemmPath p = choose_cpu_gemm_path(a);
  const auto i = static_cast<std::size_t>(p);
  gemm_calls_[i].fetch_add(1, std::memory_order_relaxed);
  gemm_flops_[i].fetch_add(2 * a.m * a.w.rows * a.w.cols, std::memory_order_relaxed);
  run_cpu_gemm_path(p, a);
}

void CpuBackend::do_gemm(const GemmArgs& a) {
  if (a.m == 0 || a.w.rows == 0) return;
  if (a.compute == DType::F16) {
    // x rounded to fp16, then fp32 arithmetic: the f16 products are exact in fp32.
    std::vector<float> x(a.x, a.x + a.m * a.w.cols);
    for (float& v : x) v = round_to(DType::F16, v);
    GemmArgs rounded = a;
    rounded.x = x.data();
    rounded.compute = DType::F32;
    return run_gemm(rounded);
  }
  if (!a.x_bf16) return run_gemm(a);
  // x already rounded to bf16: widened to fp32 (exactly), every path rounds it to itself again.
  const std::int64_t k = a.w.cols, stride = a.x_stride ? a.x_stride : k;
  std::vector<float> x(static_cast<std::size_t>(a.m * k));
  for (std::int64_t i = 0; i < a.m; ++i)
    for (std::int64_t c = 0; c < k; ++c) x[static_cast<std::size_t>(i * k + c)] = bf16_to_f32(a.x_bf16[i * stride + c]);
  GemmArgs widened = a;
  widened.x = x.data();
  widened.x_bf16 = nullptr;
  widened.x_stride = 0;
  run_gemm(widened);
}

static_assert(static_cast<int>(CpuGemmPath::OnednnPanels) == 4, "gemm_calls_ has a counter per path");

KernelUse CpuBackend::kernel_use() const {
  KernelUse u{.isa = onednn_isa_name(), .gemm = {}, .primitives = onednn_impls_used()};
  for (std::size_t i = 0; i < gemm_calls_.size(); ++i)
    if (const std::int64_t calls = gemm_calls_[i].load(std::memory_order_relaxed); calls > 0)
      u.gemm.push_back({std::string(cpu_gemm_path_name(static_cast<CpuGemmPath>(i))), calls,
                        gemm_flops_[i].load(std::memory_order_relaxed)});
  std::ranges::sort(u.gemm, std::greater{}, &KernelUse::Path::flops);
  return u;
}

}  // namespace flexh2o::kernels
