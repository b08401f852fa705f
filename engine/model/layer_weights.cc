#include "engine/model/layer_weights.h"

#include <stdexcept>
#include <string>

namespace flexh2o::engine {

namespace {

using R = policy::WeightRole;

const float* vec(const MatrixRef& ref) { return static_cast<const float*>(ref.data); }

[[noreturn]] void no_such_role(const char* kind, R role) {
  throw std::logic_error(std::string(kind) + " weights have no tensor of role " + std::to_string(static_cast<int>(role)));
}

}  // namespace

void EmbeddingWeights::set(R role, const MatrixRef& ref) {
  switch (role) {
    case R::TokEmbed: tokens = ref; return;
    case R::PosEmbed: positions = ref; return;
    case R::ProjectIn: project_in = ref; return;
    default: no_such_role("input embedding", role);
  }
}

void AttentionWeights::set(R role, const MatrixRef& ref) {
  switch (role) {
    case R::AttnNorm: norm.weight = vec(ref); return;
    case R::AttnNormBias: norm.bias = vec(ref); return;
    case R::Wq: wq = ref; return;
    case R::Wk: wk = ref; return;
    case R::Wv: wv = ref; return;
    case R::Wo: wo = ref; return;
    case R::Bq: bq = vec(ref); return;
    case R::Bk: bk = vec(ref); return;
    case R::Bv: bv = vec(ref); return;
    case R::Bo: bo = vec(ref); return;
    case R::QNorm: q_norm = vec(ref); return;
    case R::KNorm: k_norm = vec(ref); return;
    case R::AttnOutNorm: out_norm.weight = vec(ref); return;
    case R::AttnOutNormBias: out_norm.bias = vec(ref); return;
    default: no_such_role("attention", role);
  }
}

void MlpWeights::set(R role, const MatrixRef& ref) {
  switch (role) {
    case R::MlpNorm: norm.weight = vec(ref); return;
    case R::MlpNormBias: norm.bias = vec(ref); return;
    case R::WGate: gate = ref; return;
    case R::WUp: up = ref; return;
    case R::WDown: down = ref; return;
    case R::BGate: b_gate = vec(ref); return;
    case R::BUp: b_up = vec(ref); return;
    case R::BDown: b_down = vec(ref); return;
    case R::MlpOutNorm: out_norm.weight = vec(ref); return;
    case R::MlpOutNormBias: out_norm.bias = vec(ref); return;
    default: no_such_role("MLP", role);
  }
}

void MoeWeights::set(R role, const MatrixRef& ref, std::int64_t expert) {
  auto routed = [&]() -> kernels::ExpertMatrices& {
    if (expert < 0 || expert >= static_cast<std::int64_t>(experts.size()))
      throw std::logic_error("expert " + std::to_string(expert) + " is not one of the layer's " +
                             std::to_string(experts.size()));
    return experts[static_cast<std::size_t>(expert)];
  };
  switch (role) {
    case R::MlpNorm: norm.weight = vec(ref); return;
    case R::MlpNormBias: norm.bias = vec(ref); return;
    case R::Router: router = ref; return;
    case R::ExpertGate: routed().gate = ref; return;
    case R::ExpertUp: routed().up = ref; return;
    case R::ExpertDown: routed().down = ref; return;
    case R::SharedGate: shared.gate = ref; return;
    case R::SharedUp: shared.up = ref; return;
    case R::SharedDown: shared.down = ref; return;
    case R::SharedExpertGate: shared_gate = ref; return;
    default: no_such_role("MoE MLP", role);
  }
}

void HeadWeights::set(R role, const MatrixRef& ref) {
  switch (role) {
    case R::FinalNorm: norm.weight = vec(ref); return;
    case R::FinalNormBias: norm.bias = vec(ref); return;
    case R::ProjectOut: project_out = ref; return;
    case R::Head: head = ref; return;
    default: no_such_role("output head", role);
  }
}

void set_weight(LayerWeights& w, const policy::TensorSpec& t, const MatrixRef& ref) {
  if (auto* moe = std::get_if<MoeWeights>(&w)) return moe->set(t.role, ref, t.expert);
  std::visit(
      [&](auto& typed) {
        if constexpr (!std::is_same_v<std::decay_t<decltype(typed)>, MoeWeights>) typed.set(t.role, ref);
      },
      w);
}

}  // namespace flexh2o::engine
