// Mixture-of-experts MLPs: routing each row to its top-k experts, and the experts' gated MLPs
// over the rows routed to them (tokens gathered per expert, one GEMM per expert and matrix,
// scattered back weighted).
#pragma once
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/gemm.h"

namespace flexh2o::kernels {

// Softmax over each row's router logits in fp32, its top_k experts (larger probability first,
// ties to the lower index), renormalised to sum 1 when `renormalize` (Mixtral, Qwen3-MoE;
// Qwen2-MoE as configured).
struct RouteArgs {
  const float* logits = nullptr;  // device, [rows, experts]
  std::int64_t rows = 0;
  std::int64_t experts = 0;
  std::int64_t top_k = 0;
  bool renormalize = true;
  std::span<std::int32_t> expert_of;  // host, [rows * top_k]
  std::span<float> weight_of;         // host, [rows * top_k]
};

// One expert's gated MLP: down(act(gate x) * up x).
struct ExpertMatrices {
  MatrixRef gate, up, down;
};

// y[r, :] += sum over j of weight_of[r * top_k + j] * expert(expert_of[r * top_k + j])(x[r, :]),
// the experts' terms added in ascending expert order. Only the experts in [expert_begin,
// expert_end) that some row is routed to run and are read: a caller that holds only a chunk of
// the experts runs the chunks in ascending order and gets the same sums as one call.
struct MoeArgs {
  const float* x = nullptr;  // device, [rows, hidden]
  std::int64_t rows = 0;
  std::int64_t hidden = 0;
  std::int64_t top_k = 0;
  std::span<const std::int32_t> expert_of;  // host
  std::span<const float> weight_of;         // host
  std::span<const ExpertMatrices> experts;  // host array of device matrices, [experts]
  Activation act = Activation::Silu;
  DType compute = DType::F32;
  float* y = nullptr;  // device, [rows, hidden]
  std::int64_t expert_begin = 0, expert_end = std::numeric_limits<std::int64_t>::max();
};

// route() on logits already in host memory (both backends use it).
void route_on_host(const float* logits, const RouteArgs& a);

// The rows routed to each expert in [expert_begin, expert_end), in row order, with their
// weights (none for the experts outside).
struct ExpertRows {
  std::vector<std::int64_t> rows;
  std::vector<float> weights;
};
std::vector<ExpertRows> rows_by_expert(const MoeArgs& a);

}  // namespace flexh2o::kernels
