#include <tbb/parallel_for.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace flexh2o::kernels {

void CpuBackend::embedding(const EmbeddingArgs& a) {
  const std::int64_t n = static_cast<std::int64_t>(a.ids.size());
  const std::int64_t cols = a.table.cols;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t row = a.ids[i] + a.offset;
    if (row < 0 || row >= a.table.rows)
      throw std::out_of_range("embedding: id " + std::to_string(a.ids[i]) + " (row " + std::to_string(row) +
                              ") outside a table of " + std::to_string(a.table.rows) + " rows");
  }
  const std::int64_t rbytes = row_bytes(a.table.dtype, cols);
  tbb::parallel_for(std::int64_t{0}, n, [&](std::int64_t i) {
    const auto* src = static_cast<const char*>(a.table.data) + (a.ids[i] + a.offset) * rbytes;
    float* out = a.out + i * cols;
    if (!a.accumulate) {
      convert_rows(src, a.table.dtype, out, DType::F32, 1, cols);
      if (a.scale != 1.0f)
        for (std::int64_t c = 0; c < cols; ++c) out[c] *= a.scale;
      return;
    }
    std::vector<float> row(static_cast<std::size_t>(cols));
    convert_rows(src, a.table.dtype, row.data(), DType::F32, 1, cols);
    for (std::int64_t c = 0; c < cols; ++c) out[c] += a.scale * row[c];
  });
}

}  // namespace flexh2o::kernels
