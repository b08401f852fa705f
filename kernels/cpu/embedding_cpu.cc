#include <tbb/parallel_for.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace flexh2o::kernels {

void CpuBackend::do_embedding(const EmbeddingArgs& a) {
  const std::int64_t n = static_cast<std::int64_t>(a.ids.size());
  const std::int64_t cols = a.table.cols;
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
