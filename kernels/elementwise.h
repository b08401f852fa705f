// Activations and element-wise arithmetic on fp32 vectors.
#pragma once
#include <cstdint>

namespace flexh2o::kernels {

enum class Activation : std::uint8_t {
  Relu,      // OPT
  Gelu,      // exact erf form
  GeluTanh,  // tanh approximation (gelu_pytorch_tanh: Gemma)
  Silu,      // x * sigmoid(x) (SwiGLU: LLaMA)
};

// A projection's bias and activation, and a gated MLP's product, in one pass over `rows` rows
// of `cols`: out[r, c] = act(x[r, c] + bias[c]) * up[r, c], the bias and up optional. Written
// as fp32 (out: may equal x or up), or rounded to bf16 (as kernels::f32_to_bf16 rounds) for the
// bf16 GEMM that reads it next (out_bf16, row r at out_bf16 + r * out_stride). out_bf16 may
// be x's own memory with out_stride = 2 * cols: row r's values then fill the first half of
// x's row r, and the fp32 activation buffer holds its bf16 copy without another buffer.
struct BiasActArgs {
  Activation act = Activation::Relu;
  const float* x = nullptr;     // [rows, cols]
  const float* bias = nullptr;  // optional, [cols]
  const float* up = nullptr;    // optional, [rows, cols]
  std::int64_t rows = 0, cols = 0;
  float* out = nullptr;
  std::uint16_t* out_bf16 = nullptr;  // instead of out
  std::int64_t out_stride = 0;        // of out_bf16 in elements (0: cols)
};

}  // namespace flexh2o::kernels
