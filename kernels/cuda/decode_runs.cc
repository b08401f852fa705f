#include "kernels/cuda/decode_runs.h"

#include <cstdint>

namespace flexh2o::kernels::cuda {

bool mma_head_dim(std::int64_t head_dim) {
  return head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128 || head_dim == 256;
}

bool decode_runs_on_tensor_cores(const AttentionDecodeArgs& a) {
  auto aligned = [](const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; };
  const bool half_cache = a.cache_dtype == DType::F16 || a.cache_dtype == DType::BF16;
  return a.compute == DType::BF16 && half_cache && mma_head_dim(a.shape.head_dim) && !a.cache_rows.empty() &&
         a.probs == nullptr && a.slot_bias == nullptr && aligned(a.q, 16) && aligned(a.k_cache, 16) &&
         aligned(a.v_cache, 16) && aligned(a.out, 8);
}

}  // namespace flexh2o::kernels::cuda
