// Mixture-of-experts on the CPU: routing on the host, then per expert its rows gathered, its
// three projections through the backend's GEMM (oneDNN panels over oneTBB), and the result
// added back to each row with its routing weight.
#include <algorithm>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace flexh2o::kernels {

void CpuBackend::do_route(const RouteArgs& a) { route_on_host(a.logits, a); }

void CpuBackend::do_moe_experts(const MoeArgs& a) {
  const auto by_expert = rows_by_expert(a);
  const std::int64_t H = a.hidden;
  std::vector<float> xs, gate, up, out;
  for (std::size_t e = 0; e < by_expert.size(); ++e) {
    const ExpertRows& r = by_expert[e];
    const std::int64_t n = static_cast<std::int64_t>(r.rows.size());
    if (n == 0) continue;
    const ExpertMatrices& m = a.experts[e];
    const std::int64_t I = m.gate.rows;
    xs.resize(static_cast<std::size_t>(n * H));
    for (std::int64_t i = 0; i < n; ++i) std::copy_n(a.x + r.rows[static_cast<std::size_t>(i)] * H, H, xs.data() + i * H);
    gate.resize(static_cast<std::size_t>(n * I));
    up.resize(gate.size());
    out.resize(xs.size());
    gemm({xs.data(), n, m.gate, nullptr, gate.data(), 0.0f, a.compute});
    gemm({xs.data(), n, m.up, nullptr, up.data(), 0.0f, a.compute});
    glu(a.act, gate.data(), up.data(), gate.data(), n * I);
    gemm({gate.data(), n, m.down, nullptr, out.data(), 0.0f, a.compute});
    for (std::int64_t i = 0; i < n; ++i) {
      float* y = a.y + r.rows[static_cast<std::size_t>(i)] * H;
      const float w = r.weights[static_cast<std::size_t>(i)];
      for (std::int64_t c = 0; c < H; ++c) y[c] += w * out[static_cast<std::size_t>(i * H + c)];
    }
  }
}

}  // namespace flexh2o::kernels
