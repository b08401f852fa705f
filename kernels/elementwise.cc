// Backend's element-wise ops and rope: the argument checks every device shares, then the
// device's op.
#include <stdexcept>
#include <string>

#include "kernels/backend.h"

namespace flexh2o::kernels {

namespace {
void check_length(std::int64_t n, const char* op) {
  if (n < 0) throw std::invalid_argument(std::string(op) + ": negative length");
}
}  // namespace

void Backend::rope(const RopeArgs& a) {
  check_rope_args(a);
  do_rope(a);
}

void Backend::activation(Activation act, float* x, std::int64_t n) {
  check_length(n, "activation");
  do_activation(act, x, n);
}

void Backend::glu(Activation act, const float* gate, const float* up, float* out, std::int64_t n) {
  check_length(n, "glu");
  do_glu(act, gate, up, out, n);
}

void Backend::bias_act(const BiasActArgs& a) {
  if (a.rows < 0 || a.cols < 0) throw std::invalid_argument("bias_act: negative dimension");
  if ((a.out == nullptr) == (a.out_bf16 == nullptr)) throw std::invalid_argument("bias_act: needs one of out and out_bf16");
  if (a.out_bf16) {
    if (a.out_stride != 0 && a.out_stride < a.cols) throw std::invalid_argument("bias_act: out_stride below cols");
    if (static_cast<const void*>(a.out_bf16) == static_cast<const void*>(a.x) && a.out_stride != 2 * a.cols)
      throw std::invalid_argument("bias_act: out_bf16 in x's memory needs out_stride = 2 * cols");
  } else if (a.out_stride != 0) {
    throw std::invalid_argument("bias_act: out_stride is for out_bf16 only");
  }
  if (a.rows > 0 && a.cols > 0) do_bias_act(a);
}

void Backend::softcap(float* x, std::int64_t n, float cap) {
  check_length(n, "softcap");
  if (!(cap > 0.0f)) throw std::invalid_argument("softcap: the cap must be positive");
  do_softcap(x, n, cap);
}

void Backend::add(float* x, const float* y, std::int64_t n) {
  check_length(n, "add");
  do_add(x, y, n);
}

void Backend::round_to_dtype(DType t, float* x, std::int64_t n) {
  check_length(n, "round_to_dtype");
  if (t != DType::F16 && t != DType::BF16)
    throw std::invalid_argument("round_to_dtype: rounds to f16 or bf16, not " + std::string(dtype_name(t)));
  if (n > 0) do_round_to_dtype(t, x, n);
}

}  // namespace flexh2o::kernels
