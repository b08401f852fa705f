// Embedding lookup: one thread per output element, reading table rows of any dtype
// (quantized rows dequantized bit for bit as the CPU does). Ids are checked on the host
// with embedding_cpu.cc's message, then uploaded.
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_common.cuh"

namespace flexh2o::kernels::cuda {

namespace {

__global__ void embedding_kernel(const std::int32_t* ids, std::int64_t n, std::int64_t offset,
                                 const std::uint8_t* table, std::int64_t rbytes, DType dtype, std::int64_t cols,
                                 float* out, bool accumulate, float scale) {
  const std::int64_t total = n * cols;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const QuotRem ic = div_rem(e, cols);
    const std::int64_t i = ic.quot, c = ic.rem;
    const std::int64_t row = static_cast<std::int64_t>(ids[i]) + offset;
    const float v = scale * load_elem(table + row * rbytes, dtype, cols, c);
    out[e] = accumulate ? out[e] + v : v;
  }
}

}  // namespace

void CudaBackend::do_embedding(const EmbeddingArgs& a) {
  if (graph_active() &&
      graph_op(signature(a), a, [this](const EmbeddingArgs& e) { do_embedding(e); }, &EmbeddingArgs::ids))
    return;
  const std::int64_t n = static_cast<std::int64_t>(a.ids.size());
  const std::int64_t cols = a.table.cols;
  if (n == 0 || cols <= 0) return;
  const DeviceBuffer ids = upload(a.ids);
  embedding_kernel<<<blocks_for(n * cols), kThreads, 0, stream_>>>(
      ids.as<std::int32_t>(), n, a.offset, static_cast<const std::uint8_t*>(a.table.data),
      row_bytes(a.table.dtype, cols), a.table.dtype, cols, a.out, a.accumulate, a.scale);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

}  // namespace flexh2o::kernels::cuda
