#include "policy/unit_weights.h"

#include <algorithm>

namespace flexh2o::policy {

namespace {

// Appends a unit's tensors: matrices [rows, cols], fp32 vectors, norms (weight, and bias for
// LayerNorm), all named under `prefix`.
struct TensorList {
  const ModelShape& m;
  std::string prefix;
  std::int64_t layer = -1, expert = -1;
  std::vector<TensorSpec> tensors;

  void matrix(WeightRole role, const std::string& name, std::int64_t rows, std::int64_t cols) {
    tensors.push_back({prefix + name, role, rows, cols, true, layer, expert});
  }
  void vector(WeightRole role, const std::string& name, std::int64_t n) {
    tensors.push_back({prefix + name, role, n, 1, false, layer, expert});
  }
  void norm(WeightRole weight, WeightRole bias, const std::string& name) {
    vector(weight, name + ".weight", m.hidden);
    if (m.biases.norm) vector(bias, name + ".bias", m.hidden);
  }
};

std::string layer_prefix(std::int64_t layer) { return "layers." + std::to_string(layer) + "."; }

}  // namespace

std::int64_t TensorSpec::bytes(kernels::DType matrix_dtype) const {
  return matrix ? rows * kernels::row_bytes(matrix_dtype, cols) : numel() * static_cast<std::int64_t>(sizeof(float));
}

std::vector<TensorSpec> input_embedding_tensors(const ModelShape& m) {
  TensorList t{m, ""};
  t.matrix(WeightRole::TokEmbed, "tok_embed", m.vocab, m.width());
  if (m.extra_embedding_rows > 0) t.matrix(WeightRole::PosEmbed, "pos_embed", m.extra_embedding_rows, m.hidden);
  if (m.width() != m.hidden) t.matrix(WeightRole::ProjectIn, "project_in", m.hidden, m.width());
  return t.tensors;
}

std::vector<TensorSpec> attention_tensors(const ModelShape& m, std::int64_t layer) {
  using R = WeightRole;
  const std::int64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim, h = m.hidden;
  TensorList t{m, layer_prefix(layer), layer};
  t.norm(R::AttnNorm, R::AttnNormBias, "attn_norm");
  t.matrix(R::Wq, "wq", q, h);
  t.matrix(R::Wk, "wk", kv, h);
  t.matrix(R::Wv, "wv", kv, h);
  t.matrix(R::Wo, "wo", h, q);
  if (m.biases.qkv) {
    t.vector(R::Bq, "bq", q);
    t.vector(R::Bk, "bk", kv);
    t.vector(R::Bv, "bv", kv);
  }
  if (m.biases.o) t.vector(R::Bo, "bo", h);
  if (m.qk_norm) {
    t.vector(R::QNorm, "q_norm", m.head_dim);
    t.vector(R::KNorm, "k_norm", m.head_dim);
  }
  if (m.sandwich_norms) t.norm(R::AttnOutNorm, R::AttnOutNormBias, "attn_out_norm");
  return t.tensors;
}

std::vector<TensorSpec> mlp_tensors(const ModelShape& m, std::int64_t layer) {
  using R = WeightRole;
  const std::int64_t h = m.hidden;
  TensorList t{m, layer_prefix(layer), layer};
  t.norm(R::MlpNorm, R::MlpNormBias, "mlp_norm");
  if (m.gated_mlp) t.matrix(R::WGate, "w_gate", m.ffn, h);
  t.matrix(R::WUp, "w_up", m.ffn, h);
  t.matrix(R::WDown, "w_down", h, m.ffn);
  if (m.biases.mlp) {
    if (m.gated_mlp) t.vector(R::BGate, "b_gate", m.ffn);
    t.vector(R::BUp, "b_up", m.ffn);
    t.vector(R::BDown, "b_down", h);
  }
  if (m.sandwich_norms) t.norm(R::MlpOutNorm, R::MlpOutNormBias, "mlp_out_norm");
  return t.tensors;
}

std::vector<TensorSpec> moe_tensors(const ModelShape& m, std::int64_t layer) {
  using R = WeightRole;
  const std::int64_t h = m.hidden, s = m.shared_ffn;
  TensorList t{m, layer_prefix(layer), layer};
  t.norm(R::MlpNorm, R::MlpNormBias, "mlp_norm");
  t.matrix(R::Router, "router", m.experts, h);
  if (s > 0) {
    t.matrix(R::SharedGate, "shared.w_gate", s, h);
    t.matrix(R::SharedUp, "shared.w_up", s, h);
    t.matrix(R::SharedDown, "shared.w_down", h, s);
    t.matrix(R::SharedExpertGate, "shared_gate", 1, h);
  }
  return t.tensors;  // MoE layers norm before each sublayer only (engine::ModelConfig::validate)
}

std::vector<TensorSpec> expert_tensors(const ModelShape& m, std::int64_t layer, std::int64_t expert) {
  using R = WeightRole;
  TensorList t{m, layer_prefix(layer) + "experts." + std::to_string(expert) + ".", layer, expert};
  t.matrix(R::ExpertGate, "w_gate", m.expert_ffn, m.hidden);
  t.matrix(R::ExpertUp, "w_up", m.expert_ffn, m.hidden);
  t.matrix(R::ExpertDown, "w_down", m.hidden, m.expert_ffn);
  return t.tensors;
}

std::vector<TensorSpec> head_tensors(const ModelShape& m) {
  using R = WeightRole;
  TensorList t{m, ""};
  if (m.final_norm) t.norm(R::FinalNorm, R::FinalNormBias, "final_norm");
  if (m.width() != m.hidden) t.matrix(R::ProjectOut, "project_out", m.width(), m.hidden);
  t.matrix(R::Head, m.tied_embeddings ? "tok_embed" : "lm_head", m.vocab, m.width());
  return t.tensors;
}

std::int64_t ActivationBuffers::total() const {
  return normed + q + k + v + attn + ffn_a + ffn_b + embed + router + last + logits;
}

ActivationBuffers activation_buffers(const ModelShape& m, std::int64_t rows, std::int64_t batch) {
  ActivationBuffers a;
  a.normed = rows * m.hidden;
  a.q = a.attn = rows * m.heads * m.head_dim;
  a.k = a.v = rows * m.kv_heads * m.head_dim;
  a.ffn_a = rows * m.ffn;
  a.ffn_b = m.gated_mlp ? rows * m.ffn : 0;
  a.embed = m.width() != m.hidden ? std::max(rows, batch) * m.width() : 0;
  a.router = rows * m.experts;
  a.last = batch * m.hidden;
  a.logits = batch * m.vocab;
  return a;
}

std::int64_t moe_expert_scratch_bytes(const ModelShape& m, std::int64_t rows) {
  if (m.experts == 0) return 0;
  const auto f = static_cast<std::int64_t>(sizeof(float));
  return rows * (f * (2 * m.hidden + 2 * m.expert_ffn) + 12);
}

}  // namespace flexh2o::policy
