// Rotary position embedding in place. The inverse frequencies are computed on the host
// exactly as rope_cpu.cc does; one thread per (token, pair) rotates that pair in every head.
#include <cmath>
#include <stdexcept>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_common.cuh"

namespace flexh2o::kernels::cuda {

namespace {

__global__ void rope_kernel(float* x, std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
                            const std::int32_t* positions, const float* inv_freq, bool interleaved) {
  const std::int64_t half = head_dim / 2, total = tokens * half;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = e / half, i = e % half;
    const float angle = static_cast<float>(positions[t]) * inv_freq[i];
    // cos/sin of the fp32 angle in double, rounded to fp32: the correctly rounded values
    // that the CPU's std::cos/std::sin(float) return.
    double sd = 0.0, cd = 0.0;
    sincos(static_cast<double>(angle), &sd, &cd);
    const float c = static_cast<float>(cd), s = static_cast<float>(sd);
    const std::int64_t i0 = interleaved ? 2 * i : i;
    const std::int64_t i1 = interleaved ? 2 * i + 1 : i + half;
    for (std::int64_t h = 0; h < heads; ++h) {
      float* xh = x + (t * heads + h) * head_dim;
      const float x0 = xh[i0], x1 = xh[i1];
      xh[i0] = x0 * c - x1 * s;
      xh[i1] = x0 * s + x1 * c;
    }
  }
}

}  // namespace

void CudaBackend::rope(const RopeArgs& a) {
  if (a.head_dim % 2 != 0) throw std::invalid_argument("rope: head_dim must be even");
  if (static_cast<std::int64_t>(a.positions.size()) != a.tokens)
    throw std::invalid_argument("rope: positions must have one entry per token");
  const std::int64_t half = a.head_dim / 2;
  if (a.tokens <= 0 || half <= 0 || a.heads <= 0) return;
  std::vector<float> inv_freq(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i)
    inv_freq[static_cast<std::size_t>(i)] =
        static_cast<float>(std::pow(static_cast<double>(a.theta), -2.0 * static_cast<double>(i) / static_cast<double>(a.head_dim)));
  const DeviceBuffer freq = upload(std::span<const float>(inv_freq));
  const DeviceBuffer pos = upload(a.positions);
  rope_kernel<<<blocks_for(a.tokens * half), kThreads, 0, stream_>>>(a.x, a.tokens, a.heads, a.head_dim,
                                                                      pos.as<std::int32_t>(), freq.as<float>(),
                                                                      a.layout == RopeLayout::Interleaved);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

}  // namespace flexh2o::kernels::cuda
