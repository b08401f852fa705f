// LayerNorm and RMSNorm: one block per row, sums in double as norm_cpu.cc does (warp shuffles,
// then across warps), then the same fp32 formula per element, written as NormArgs says (stored,
// added into y, or rounded to bf16). A thread holds a RowPart of the row (device_common.cuh),
// so a row of up to kThreads * 4 * kRowUnroll values (8192) is read from memory once, with all
// its loads in flight together, and stays in registers for the passes; longer rows are read
// again per pass. y may equal x: every thread reads its elements for the reductions before any
// thread writes (block_sum synchronises), and each writes only the elements it read.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_common.cuh"

namespace flexh2o::kernels::cuda {

namespace {

struct NormRows {
  const float* x = nullptr;
  float* y = nullptr;
  std::uint16_t* y_bf16 = nullptr;
  const float* weight = nullptr;
  const float* bias = nullptr;  // LayerNorm's, optional
  std::int64_t rows = 0, cols = 0;
  float eps = 0.0f, offset = 0.0f;
  bool accumulate = false;
};

template <int V>
__device__ void write_part(const NormRows& a, std::int64_t r, std::int64_t c0, float (&out)[V], int u) {
  const std::int64_t c = RowPart<V>::col(c0, u), at = r * a.cols + c;
  if (a.y_bf16) return store_bf16<V>(a.y_bf16 + at, out);
  if (a.accumulate) {
    float y[V];
    load_floats<V>(a.y + at, y);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = y[i] + out[i];
  }
  store_floats<V>(a.y + at, out);
}

template <bool kLayer, int V>
__global__ void norm_kernel(NormRows a) {
  __shared__ double scratch[32];
  const std::int64_t step = RowPart<V>::span();
  const bool whole = a.cols <= step;  // the row stays in registers between the passes
  const auto n = static_cast<double>(a.cols);
  for (std::int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const float* xr = a.x + r * a.cols;
    RowPart<V> p;
    float mean = 0.0f;
    if constexpr (kLayer) {
      double sum = 0.0;
      for (std::int64_t c0 = 0; c0 < a.cols; c0 += step) {
        p.load(xr, a.cols, c0);
#pragma unroll
        for (int u = 0; u < kRowUnroll; ++u)
          if (p.col(c0, u) < a.cols)
            for (int i = 0; i < V; ++i) sum += p.v[u][i];
      }
      mean = static_cast<float>(block_sum(sum, scratch) / n);
    }
    double ss = 0.0;  // LayerNorm: two passes, E[(x-mean)^2] does not cancel like E[x^2]-mean^2
    for (std::int64_t c0 = 0; c0 < a.cols; c0 += step) {
      if (!(kLayer && whole)) p.load(xr, a.cols, c0);
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u)
        if (p.col(c0, u) < a.cols)
          for (int i = 0; i < V; ++i) {
            const float d = p.v[u][i] - mean;
            ss += static_cast<double>(d) * d;
          }
    }
    const float inv = 1.0f / sqrtf(static_cast<float>(block_sum(ss, scratch) / n) + a.eps);
    for (std::int64_t c0 = 0; c0 < a.cols; c0 += step) {
      if (!whole) p.load(xr, a.cols, c0);
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const std::int64_t c = p.col(c0, u);
        if (c >= a.cols) continue;
        float w[V], out[V];
        load_floats<V>(a.weight + c, w);
        for (int i = 0; i < V; ++i)
          out[i] = kLayer ? (p.v[u][i] - mean) * inv * (w[i] + a.offset) : p.v[u][i] * inv * (w[i] + a.offset);
        if (kLayer && a.bias) {
          float b[V];
          load_floats<V>(a.bias + c, b);
          for (int i = 0; i < V; ++i) out[i] += b[i];
        }
        write_part<V>(a, r, c0, out, u);
      }
    }
  }
}

template <bool kLayer>
void launch_norm(const NormArgs& a, cudaStream_t stream) {
  if (a.rows <= 0 || a.cols <= 0) return;
  const NormRows rows{a.x, a.y, a.y_bf16, a.weight, a.bias, a.rows, a.cols, a.eps, a.weight_offset, a.accumulate};
  const bool vec = a.cols % 4 == 0 && aligned_to(a.x, 16) && aligned_to(a.weight, 16) &&
                   (!a.bias || aligned_to(a.bias, 16)) && (a.y_bf16 ? aligned_to(a.y_bf16, 8) : aligned_to(a.y, 16));
  if (vec)
    norm_kernel<kLayer, 4><<<blocks_for(a.rows, 1), kThreads, 0, stream>>>(rows);
  else
    norm_kernel<kLayer, 1><<<blocks_for(a.rows, 1), kThreads, 0, stream>>>(rows);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

}  // namespace

void CudaBackend::do_layer_norm(const NormArgs& a) {
  if (graph_active() &&
      graph_op(signature(GraphOp::LayerNorm, a), a, [this](const NormArgs& n) { do_layer_norm(n); }))
    return;
  launch_norm<true>(a, stream_);
}

void CudaBackend::do_rms_norm(const NormArgs& a) {
  if (graph_active() && graph_op(signature(GraphOp::RmsNorm, a), a, [this](const NormArgs& n) { do_rms_norm(n); }))
    return;
  launch_norm<false>(a, stream_);
}

}  // namespace flexh2o::kernels::cuda
