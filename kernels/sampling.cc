// Backend::sample: the argument checks every device shares, then the device's do_sample.
#include <stdexcept>

#include "kernels/backend.h"

namespace flexh2o::kernels {

void Backend::sample(const SampleArgs& a) {
  if (static_cast<std::int64_t>(a.out.size()) != a.batch || static_cast<std::int64_t>(a.streams.size()) != a.batch)
    throw std::invalid_argument("sample: out and streams need one entry per row");
  if (a.vocab <= 0) throw std::invalid_argument("sample: empty vocabulary");
  do_sample(a);
}

}  // namespace flexh2o::kernels
