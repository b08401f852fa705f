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

__global__ void gather_rows_kernel(const float* x, const std::int64_t* rows, std::int64_t n, std::int64_t cols, float* out) {
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < n * cols;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[e] = x[rows[e / cols] * cols + e % cols];
}

__global__ void scatter_add_rows_kernel(const float* src, const std::int64_t* rows, const float* weights, std::int64_t n,
                                        std::int64_t cols, float* y) {
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < n * cols;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[rows[e / cols] * cols + e % cols] += weights[e / cols] * src[e];
}

}  // namespace

void CudaBackend::do_route(const RouteArgs& a) {
  std::vector<float> logits(static_cast<std::size_t>(a.rows * a.experts));
  copy_to_host(logits.data(), a.logits, logits.size() * sizeof(float));
  route_on_host(logits.data(), a);
}

void CudaBackend::do_moe_experts(const MoeArgs& a) {
  const auto by_expert = rows_by_expert(a);
  const std::int64_t H = a.hidden;
  for (std::size_t e = 0; e < by_expert.size(); ++e) {
    const ExpertRows& r = by_expert[e];
    const std::int64_t n = static_cast<std::int64_t>(r.rows.size());
    if (n == 0) continue;
    const ExpertMatrices& m = a.experts[e];
    const std::int64_t I = m.gate.rows;
    const DeviceBuffer rows = upload(std::span<const std::int64_t>(r.rows));
    const DeviceBuffer weights = upload(std::span<const float>(r.weights));
    const DeviceBuffer xs(*this, static_cast<std::size_t>(n * H) * sizeof(float));
    const DeviceBuffer gate(*this, static_cast<std::size_t>(n * I) * sizeof(float));
    const DeviceBuffer up(*this, static_cast<std::size_t>(n * I) * sizeof(float));
    const DeviceBuffer out(*this, static_cast<std::size_t>(n * H) * sizeof(float));
    gather_rows_kernel<<<blocks_for(n * H), kThreads, 0, stream_>>>(a.x, rows.as<std::int64_t>(), n, H, xs.as<float>());
    FLEXH2O_CUDA_CHECK_LAUNCH();
    gemm({xs.as<float>(), n, m.gate, nullptr, gate.as<float>(), 0.0f, a.compute});
    gemm({xs.as<float>(), n, m.up, nullptr, up.as<float>(), 0.0f, a.compute});
    glu(a.act, gate.as<float>(), up.as<float>(), gate.as<float>(), n * I);
    gemm({gate.as<float>(), n, m.down, nullptr, out.as<float>(), 0.0f, a.compute});
    scatter_add_rows_kernel<<<blocks_for(n * H), kThreads, 0, stream_>>>(out.as<float>(), rows.as<std::int64_t>(),
                                                                          weights.as<float>(), n, H, a.y);
    FLEXH2O_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace flexh2o::kernels::cuda
