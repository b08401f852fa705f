// Backend::layer_norm / rms_norm: the argument checks every device shares, then the device's op.
#include <stdexcept>
#include <string>

#include "kernels/backend.h"

namespace flexh2o::kernels {

namespace {
void check_norm(const NormArgs& a, const char* op) {
  if (a.rows < 0 || a.cols < 0) throw std::invalid_argument(std::string(op) + ": negative dimension");
  if (a.rows > 0 && (a.cols == 0 || !a.weight)) throw std::invalid_argument(std::string(op) + ": needs cols > 0 and a weight");
  if ((a.y == nullptr) == (a.y_bf16 == nullptr)) throw std::invalid_argument(std::string(op) + ": needs one of y and y_bf16");
  if (a.accumulate && (!a.y || a.y == a.x)) throw std::invalid_argument(std::string(op) + ": accumulate needs a y that is not x");
  if (a.y_bf16 && static_cast<const void*>(a.y_bf16) == static_cast<const void*>(a.x))
    throw std::invalid_argument(std::string(op) + ": y_bf16 must not overlap x");
}
}  // namespace

void Backend::layer_norm(const NormArgs& a) {
  check_norm(a, "layer_norm");
  do_layer_norm(a);
}

void Backend::rms_norm(const NormArgs& a) {
  check_norm(a, "rms_norm");
  do_rms_norm(a);
}

}  // namespace flexh2o::kernels
