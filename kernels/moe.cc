#include "kernels/moe.h"

#include "kernels/backend.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace flexh2o::kernels {

void Backend::route(const RouteArgs& a) {
  if (a.top_k < 1 || a.top_k > a.experts) throw std::invalid_argument("route: top_k must be in [1, experts]");
  if (static_cast<std::int64_t>(a.expert_of.size()) != a.rows * a.top_k ||
      static_cast<std::int64_t>(a.weight_of.size()) != a.rows * a.top_k)
    throw std::invalid_argument("route: outputs need rows * top_k entries");
  do_route(a);
}

void Backend::moe_experts(const MoeArgs& a) {
  if (static_cast<std::int64_t>(a.expert_of.size()) != a.rows * a.top_k ||
      static_cast<std::int64_t>(a.weight_of.size()) != a.rows * a.top_k)
    throw std::invalid_argument("moe_experts: routing needs rows * top_k entries");
  const auto n_experts = static_cast<std::int32_t>(a.experts.size());
  for (const std::int32_t e : a.expert_of) {
    if (e < 0 || e >= n_experts)
      throw std::out_of_range("moe_experts: expert " + std::to_string(e) + " outside [0, " +
                              std::to_string(n_experts) + ")");
    const ExpertMatrices& m = a.experts[static_cast<std::size_t>(e)];
    if (e >= a.expert_begin && e < a.expert_end && (!m.gate.data || !m.up.data || !m.down.data))
      throw std::logic_error("moe_experts: expert " + std::to_string(e) + " is routed to but not loaded");
  }
  do_moe_experts(a);
}

// Arguments checked by Backend::route.
void route_on_host(const float* logits, const RouteArgs& a) {
  std::vector<float> p(static_cast<std::size_t>(a.experts));
  std::vector<std::int32_t> order(p.size());
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const float* l = logits + r * a.experts;
    const float mx = *std::max_element(l, l + a.experts);
    float sum = 0.0f;
    for (std::int64_t e = 0; e < a.experts; ++e) sum += p[static_cast<std::size_t>(e)] = std::exp(l[e] - mx);
    for (float& v : p) v /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + a.top_k, order.end(), [&](std::int32_t x, std::int32_t y) {
      return p[static_cast<std::size_t>(x)] > p[static_cast<std::size_t>(y)] ||
             (p[static_cast<std::size_t>(x)] == p[static_cast<std::size_t>(y)] && x < y);
    });
    float top = 0.0f;
    for (std::int64_t j = 0; j < a.top_k; ++j) top += p[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])];
    for (std::int64_t j = 0; j < a.top_k; ++j) {
      const std::int32_t e = order[static_cast<std::size_t>(j)];
      a.expert_of[static_cast<std::size_t>(r * a.top_k + j)] = e;
      a.weight_of[static_cast<std::size_t>(r * a.top_k + j)] = a.renormalize ? p[static_cast<std::size_t>(e)] / top
                                                                             : p[static_cast<std::size_t>(e)];
    }
  }
}

// Arguments checked by Backend::moe_experts.
std::vector<ExpertRows> rows_by_expert(const MoeArgs& a) {
  std::vector<ExpertRows> out(a.experts.size());
  for (std::int64_t r = 0; r < a.rows; ++r)
    for (std::int64_t j = 0; j < a.top_k; ++j) {
      const std::int32_t e = a.expert_of[static_cast<std::size_t>(r * a.top_k + j)];
      if (e < a.expert_begin || e >= a.expert_end) continue;
      out[static_cast<std::size_t>(e)].rows.push_back(r);
      out[static_cast<std::size_t>(e)].weights.push_back(a.weight_of[static_cast<std::size_t>(r * a.top_k + j)]);
    }
  return out;
}

}  // namespace flexh2o::kernels
