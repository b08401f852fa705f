// Mixture-of-experts on the GPU, with moe_cpu.cc's structure: the router's logits come to the
// host (the routing decides which experts the scheduler loads), and per expert its rows are
// gathered, multiplied by cuBLAS through gemm(), and added back weighted, one thread per
// element of the expert's output (an expert holds a row at most once, so no two threads add
// into the same element within one call).
#include <stdexcept>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_common.cuh"

namespace flexh2o::kernels::cuda {

namespace {

// The expert's rows of x, in fp32 (out) or rounded to bf16 as its GEMMs would round them (out_bf16).
__global__ void gather_rows_kernel(const float* x, const std::int64_t* rows, std::int64_t n, std::int64_t cols, float* out,
                                   std::uint16_t* out_bf16) {
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < n * cols;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[rows[e / cols] * cols + e % cols];
    if (out_bf16)
      out_bf16[e] = f32_to_bf16_bits(v);
    else
      out[e] = v;
  }
}

__global__ void scatter_add_rows_kernel(const float* src, const std::int64_t* rows, const float* weights, std::int64_t n,
                                        std::int64_t cols, float* y) {
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < n * cols;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[rows[e / cols] * cols + e % cols] += weights[e / cols] * src[e];
}

}  // namespace

void CudaBackend::do_route(const RouteArgs& a) {
  graph_interrupt();  // the routing comes to the host
  std::vector<float> logits(static_cast<std::size_t>(a.rows * a.experts));
  copy_to_host(logits.data(), a.logits, logits.size() * sizeof(float));
  route_on_host(logits.data(), a);
}

// Under bf16 compute the gather and the GLU write their rows in bf16 (the GLU in the first half
// of each gate row), which the GEMMs read in place: the roundings the GEMMs would make, without
// a pass each.
void CudaBackend::do_moe_experts(const MoeArgs& a) {
  graph_interrupt();  // its launches follow the host's routing
  const auto by_expert = rows_by_expert(a);
  const std::int64_t H = a.hidden;
  const bool bf16 = a.compute == DType::BF16;
  for (std::size_t e = 0; e < by_expert.size(); ++e) {
    const ExpertRows& r = by_expert[e];
    const std::int64_t n = static_cast<std::int64_t>(r.rows.size());
    if (n == 0) continue;
    const ExpertMatrices& m = a.experts[e];
    const std::int64_t I = m.gate.rows;
    const DeviceBuffer rows = upload(std::span<const std::int64_t>(r.rows));
    const DeviceBuffer weights = upload(std::span<const float>(r.weights));
    const DeviceBuffer xs(*this, static_cast<std::size_t>(n * H) * (bf16 ? 2 : 4));
    const DeviceBuffer gate(*this, static_cast<std::size_t>(n * I) * sizeof(float));
    const DeviceBuffer up(*this, static_cast<std::size_t>(n * I) * sizeof(float));
    const DeviceBuffer out(*this, static_cast<std::size_t>(n * H) * sizeof(float));
    gather_rows_kernel<<<blocks_for(n * H), kThreads, 0, stream_>>>(a.x, rows.as<std::int64_t>(), n, H,
                                                                     bf16 ? nullptr : xs.as<float>(),
                                                                     bf16 ? xs.as<std::uint16_t>() : nullptr);
    FLEXH2O_CUDA_CHECK_LAUNCH();
    GemmArgs in;
    in.m = n;
    in.compute = a.compute;
    if (bf16)
      in.x_bf16 = xs.as<std::uint16_t>();
    else
      in.x = xs.as<float>();
    in.w = m.gate;
    in.y = gate.as<float>();
    gemm(in);
    in.w = m.up;
    in.y = up.as<float>();
    gemm(in);
    BiasActArgs glu;
    glu.act = a.act;
    glu.x = gate.as<float>();
    glu.up = up.as<float>();
    glu.rows = n;
    glu.cols = I;
    GemmArgs down;
    down.m = n;
    down.compute = a.compute;
    down.w = m.down;
    down.y = out.as<float>();
    if (bf16) {
      glu.out_bf16 = gate.as<std::uint16_t>();
      down.x_bf16 = glu.out_bf16;
      glu.out_stride = down.x_stride = 2 * I;
    } else {
      glu.out = gate.as<float>();
      down.x = gate.as<float>();
    }
    bias_act(glu);
    gemm(down);
    scatter_add_rows_kernel<<<blocks_for(n * H), kThreads, 0, stream_>>>(out.as<float>(), rows.as<std::int64_t>(),
                                                                          weights.as<float>(), n, H, a.y);
    FLEXH2O_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace flexh2o::kernels::cuda
