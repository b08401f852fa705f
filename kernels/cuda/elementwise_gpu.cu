// Activations and element-wise arithmetic, with the formulas of elementwise_cpu.cc.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_common.cuh"

namespace flexh2o::kernels::cuda {

namespace {

// One activation of x, as elementwise_cpu.cc computes it.
__device__ float activate(Activation act, float x) {
  switch (act) {
    case Activation::Relu: return x > 0.0f ? x : 0.0f;
    case Activation::Gelu: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case Activation::GeluTanh: return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case Activation::Silu: return x / (1.0f + expf(-x));
  }
  return x;
}

__global__ void activation_kernel(Activation act, float* x, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    x[i] = activate(act, x[i]);
}

__global__ void glu_kernel(Activation act, const float* gate, const float* up, float* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[i] = activate(act, gate[i]) * up[i];
}

struct ActRows {
  Activation act = Activation::Relu;
  const float* x = nullptr;
  const float* bias = nullptr;
  const float* up = nullptr;
  float* out = nullptr;
  std::uint16_t* out_bf16 = nullptr;
  std::int64_t rows = 0, cols = 0, out_stride = 0;
};

// One block per row, a RowPart (device_common.cuh) at a time. A bf16 output may be x's own
// memory (BiasActArgs): a part's values land in fp32 elements below the part's end, all read
// once every thread has loaded its share of the part (the barrier), and below the next parts'
// elements, so no value is overwritten before it is read.
template <int V>
__global__ void bias_act_kernel(ActRows a) {
  const std::int64_t step = RowPart<V>::span();
  for (std::int64_t r = blockIdx.x; r < a.rows; r += gridDim.x)
    for (std::int64_t c0 = 0; c0 < a.cols; c0 += step) {
      RowPart<V> x, up;
      x.load(a.x + r * a.cols, a.cols, c0);
      if (a.up) up.load(a.up + r * a.cols, a.cols, c0);
      if (a.out_bf16) __syncthreads();
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const std::int64_t c = x.col(c0, u);
        if (c >= a.cols) continue;
        if (a.bias) {
          float b[V];
          load_floats<V>(a.bias + c, b);
          for (int i = 0; i < V; ++i) x.v[u][i] += b[i];
        }
        for (int i = 0; i < V; ++i) x.v[u][i] = activate(a.act, x.v[u][i]);
        if (a.up)
          for (int i = 0; i < V; ++i) x.v[u][i] *= up.v[u][i];
        if (a.out_bf16)
          store_bf16<V>(a.out_bf16 + r * a.out_stride + c, x.v[u]);
        else
          store_floats<V>(a.out + r * a.cols + c, x.v[u]);
      }
    }
}

__global__ void softcap_kernel(float* x, std::int64_t n, float cap) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    x[i] = cap * tanhf(x[i] / cap);
}

__global__ void add_kernel(float* x, const float* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

// As kernels::round_to: through the 16-bit type's bits and back.
__global__ void round_to_dtype_kernel(bool bf16, float* x, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    x[i] = bf16 ? bf16_bits_to_f32(f32_to_bf16_bits(x[i])) : f16_bits_to_f32(f32_to_f16_bits(x[i]));
}

}  // namespace

void CudaBackend::do_activation(Activation act, float* x, std::int64_t n) {
  const ActivationCall call{act, x, n};
  if (graph_active() &&
      graph_op(signature(call), call, [this](const ActivationCall& c) { do_activation(c.act, c.x, c.n); }))
    return;
  if (n <= 0) return;
  activation_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(act, x, n);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

void CudaBackend::do_glu(Activation act, const float* gate, const float* up, float* out, std::int64_t n) {
  const GluCall call{act, gate, up, out, n};
  if (graph_active() &&
      graph_op(signature(call), call, [this](const GluCall& c) { do_glu(c.act, c.gate, c.up, c.out, c.n); }))
    return;
  if (n <= 0) return;
  glu_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(act, gate, up, out, n);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

void CudaBackend::do_bias_act(const BiasActArgs& a) {
  if (graph_active() && graph_op(signature(a), a, [this](const BiasActArgs& b) { do_bias_act(b); })) return;
  const ActRows rows{a.act,  a.x,    a.bias, a.up, a.out, a.out_bf16, a.rows, a.cols,
                     a.out_stride ? a.out_stride : a.cols};
  const bool vec = a.cols % 4 == 0 && aligned_to(a.x, 16) && (!a.bias || aligned_to(a.bias, 16)) &&
                   (!a.up || aligned_to(a.up, 16)) &&
                   (a.out_bf16 ? rows.out_stride % 4 == 0 && aligned_to(a.out_bf16, 8) : aligned_to(a.out, 16));
  if (vec)
    bias_act_kernel<4><<<blocks_for(a.rows, 1), kThreads, 0, stream_>>>(rows);
  else
    bias_act_kernel<1><<<blocks_for(a.rows, 1), kThreads, 0, stream_>>>(rows);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

void CudaBackend::do_softcap(float* x, std::int64_t n, float cap) {
  const SoftcapCall call{x, n, cap};
  if (graph_active() && graph_op(signature(call), call, [this](const SoftcapCall& c) { do_softcap(c.x, c.n, c.cap); }))
    return;
  if (n <= 0) return;
  softcap_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(x, n, cap);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

void CudaBackend::do_add(float* x, const float* y, std::int64_t n) {
  const AddCall call{x, y, n};
  if (graph_active() && graph_op(signature(call), call, [this](const AddCall& c) { do_add(c.x, c.y, c.n); })) return;
  if (n <= 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(x, y, n);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

void CudaBackend::do_round_to_dtype(DType t, float* x, std::int64_t n) {
  graph_interrupt();  // prompt rows' K/V before prefill attention: not in a graph
  round_to_dtype_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(t == DType::BF16, x, n);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

}  // namespace flexh2o::kernels::cuda
