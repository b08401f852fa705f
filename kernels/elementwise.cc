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

void Backend::softcap(float* x, std::int64_t n, float cap) {
  check_length(n, "softcap");
  if (!(cap > 0.0f)) throw std::invalid_argument("softcap: the cap must be positive");
  do_softcap(x, n, cap);
}

void Backend::add(float* x, const float* y, std::int64_t n) {
  check_length(n, "add");
  do_add(x, y, n);
}

}  // namespace flexh2o::kernels
