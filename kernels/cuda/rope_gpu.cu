// Rotary position embedding in place, with the host's inverse frequencies (rope_cpu.cc's
// formula); one thread per (token, pair) rotates that pair in every head.

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_common.cuh"

namespace flexh2o::kernels::cuda {

namespace {

__global__ void rope_kernel(float* x, std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
                            std::int64_t rotary_dim, const std::int32_t* positions, const float* inv_freq,
                            float attention_factor, bool interleaved) {
  const std::int64_t half = rotary_dim / 2, total = tokens * half;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const QuotRem ti = div_rem(e, half);
    const std::int64_t t = ti.quot, i = ti.rem;
    const float angle = static_cast<float>(positions[t]) * inv_freq[i];
    // cos/sin of the fp32 angle in double, rounded to fp32: the correctly rounded values
    // that the CPU's std::cos/std::sin(float) return.
    double sd = 0.0, cd = 0.0;
    sincos(static_cast<double>(angle), &sd, &cd);
    const float c = static_cast<float>(cd) * attention_factor, s = static_cast<float>(sd) * attention_factor;
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

void CudaBackend::do_rope(const RopeArgs& a) {
  if (graph_active() && graph_op(signature(a), a, [this](const RopeArgs& r) { do_rope(r); }, &RopeArgs::positions,
                                 &RopeArgs::inv_freq))
    return;
  const std::int64_t half = a.rotary_dim / 2;
  if (a.tokens <= 0 || a.heads <= 0) return;
  const DeviceBuffer freq = upload(a.inv_freq);
  const DeviceBuffer pos = upload(a.positions);
  rope_kernel<<<blocks_for(a.tokens * half), kThreads, 0, stream_>>>(
      a.x, a.tokens, a.heads, a.head_dim, a.rotary_dim, pos.as<std::int32_t>(), freq.as<float>(), a.attention_factor,
      a.layout == RopeLayout::Interleaved);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

}  // namespace flexh2o::kernels::cuda
