// GEMM on the CPU: the weight's output rows are cut into panels; each oneTBB task converts
// its panel to fp32 (when stored as fp16/bf16, or dequantizes it when stored as q4/q8) into
// thread-local scratch and multiplies it
// with a single-threaded OpenBLAS call. Conversion thus happens once per panel and stays
// in cache, and the weight is never expanded whole.
#include <cblas.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace flexh2o::kernels {

namespace {

// Rows per panel. Few activation rows (decode): ~256 KiB of fp32 weight, so a converted
// panel stays in L2 while BLAS streams it. Many rows (prefill): BLAS re-packs x for every
// panel, so use few large panels (about four per thread, at most 16 MiB of scratch).
std::int64_t panel_rows(std::int64_t m, std::int64_t n, std::int64_t k) {
  k = std::max<std::int64_t>(k, 1);
  if (m <= 16) return std::min(n, std::max<std::int64_t>(16, (256 * 1024 / 4) / k));
  const std::int64_t threads = tbb::this_task_arena::max_concurrency();
  const std::int64_t even = (n + 4 * threads - 1) / (4 * threads);
  const std::int64_t cap = std::max<std::int64_t>(16, (16 << 20) / 4 / k);
  return std::min(n, std::clamp<std::int64_t>(even, 64, cap));
}

}  // namespace

void CpuBackend::gemm(const GemmArgs& a) {
  const std::int64_t m = a.m, n = a.w.rows, k = a.w.cols;
  if (m < 0 || n < 0 || k < 0) throw std::invalid_argument("gemm: negative dimension");
  if (m == 0 || n == 0) return;
  const std::int64_t panel = panel_rows(m, n, k);
  const std::int64_t panels = (n + panel - 1) / panel;
  const std::int64_t wrow = row_bytes(a.w.dtype, k);
  static tbb::enumerable_thread_specific<std::vector<float>> scratch_tls;

  tbb::parallel_for(std::int64_t{0}, panels, [&](std::int64_t p) {
    const std::int64_t n0 = p * panel;
    const std::int64_t rows = std::min(panel, n - n0);
    const char* wsrc = static_cast<const char*>(a.w.data) + n0 * wrow;
    const float* w = reinterpret_cast<const float*>(wsrc);
    if (a.w.dtype != DType::F32) {
      auto& scratch = scratch_tls.local();
      scratch.resize(static_cast<std::size_t>(rows * k));
      convert_rows(wsrc, a.w.dtype, scratch.data(), DType::F32, rows, k);
      w = scratch.data();
    }
    float* y = a.y + n0;
    if (a.beta == 0.0f) {
      for (std::int64_t i = 0; i < m; ++i) std::fill_n(y + i * n, rows, 0.0f);
    }
    if (m == 1) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(rows), static_cast<int>(k), 1.0f, w,
                  static_cast<int>(k), a.x, 1, a.beta, y, 1);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(rows),
                  static_cast<int>(k), 1.0f, a.x, static_cast<int>(k), w, static_cast<int>(k),
                  a.beta, y, static_cast<int>(n));
    }
    if (a.bias) {
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < rows; ++j) y[i * n + j] += a.bias[n0 + j];
    }
  });
}

}  // namespace flexh2o::kernels
