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

}  // namespace flexh2o::kernels
