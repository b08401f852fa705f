// The one description of each scheduling unit's weights: which tensors it has (canonical
// names, shapes, matrix or fp32 vector), how a staging slot places them (256-byte aligned) and
// the activation buffers a step of it needs. The loader (engine/model/weights), the layers
// (engine/model/layers, which resolve their typed weights by role), the weight staging and the
// cost model all read it. Canonical names, following the shape's features:
//   tok_embed [vocab, width]     pos_embed [extra_embedding_rows, hidden] (learned positions)
//   project_in [hidden, width], project_out [width, hidden] (width != hidden)
//   layers.N.attn_norm.{weight,bias}       layers.N.attn_out_norm.{weight,bias} (sandwich norms)
//   layers.N.{wq,wk,wv,wo}, {bq,bk,bv} (qkv bias), bo (o bias), q_norm, k_norm [head_dim] (q/k norm)
//   layers.N.mlp_norm.{weight,bias}        layers.N.mlp_out_norm.{weight,bias} (sandwich norms)
//   layers.N.{w_gate (gated), w_up, w_down}, {b_gate, b_up, b_down} (mlp bias)
//   MoE layers instead: layers.N.router [experts, hidden], layers.N.experts.E.{w_gate, w_up, w_down},
//   layers.N.shared.{w_gate, w_up, w_down} and layers.N.shared_gate [1, hidden] (shared expert)
//   final_norm.{weight,bias}               lm_head [vocab, width] (untied; tied: tok_embed)
// Norm biases exist for LayerNorm. Matrices are [output rows, input cols]; quantization groups
// run along a row.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "policy/model_shape.h"

namespace flexh2o::policy {

// What a tensor is to the layer that reads it (the engine fills its typed weights by role).
enum class WeightRole {
  TokEmbed, PosEmbed, ProjectIn,
  AttnNorm, AttnNormBias, Wq, Wk, Wv, Wo, Bq, Bk, Bv, Bo, QNorm, KNorm, AttnOutNorm, AttnOutNormBias,
  MlpNorm, MlpNormBias, WGate, WUp, WDown, BGate, BUp, BDown, MlpOutNorm, MlpOutNormBias,
  Router, ExpertGate, ExpertUp, ExpertDown, SharedGate, SharedUp, SharedDown, SharedExpertGate,
  FinalNorm, FinalNormBias, ProjectOut, Head,
};

struct TensorSpec {
  std::string name;
  WeightRole role = WeightRole::TokEmbed;
  std::int64_t rows = 0;  // vectors: rows = length, cols = 1
  std::int64_t cols = 1;
  bool matrix = true;
  std::int64_t layer = -1;   // decoder layer, -1 for embeddings and the head
  std::int64_t expert = -1;  // the routed expert it belongs to, -1 for the others
  std::int64_t numel() const { return rows * cols; }
  // Bytes with matrices stored as `matrix_dtype` (vectors are fp32).
  std::int64_t bytes(kernels::DType matrix_dtype) const;
};

// The tensors of each kind of unit: the input embedding, a decoder layer's attention, its dense
// MLP, its MoE MLP without the routed experts, one routed expert, the output head.
std::vector<TensorSpec> input_embedding_tensors(const ModelShape& m);
std::vector<TensorSpec> attention_tensors(const ModelShape& m, std::int64_t layer);
std::vector<TensorSpec> mlp_tensors(const ModelShape& m, std::int64_t layer);
std::vector<TensorSpec> moe_tensors(const ModelShape& m, std::int64_t layer);
std::vector<TensorSpec> expert_tensors(const ModelShape& m, std::int64_t layer, std::int64_t expert);
std::vector<TensorSpec> head_tensors(const ModelShape& m);

// A staging slot places each tensor at a multiple of this (vector loads stay aligned).
constexpr std::int64_t kWeightAlign = 256;
constexpr std::int64_t slot_bytes(std::int64_t tensor_bytes) {
  return (tensor_bytes + kWeightAlign - 1) / kWeightAlign * kWeightAlign;
}

// The activation buffers of one step of `rows` rows over `batch` sequences, in elements (the
// engine holds them in fp32; engine::Activations allocates exactly these).
struct ActivationBuffers {
  std::int64_t normed = 0;            // [rows, hidden]
  std::int64_t q = 0, k = 0, v = 0, attn = 0;  // [rows, heads x head_dim] (k, v: kv heads)
  std::int64_t ffn_a = 0, ffn_b = 0;  // [rows, ffn] (ffn_b: gated MLPs)
  std::int64_t embed = 0;             // [max(rows, batch), width] where width != hidden
  std::int64_t router = 0;            // [rows, experts] (MoE)
  std::int64_t last = 0;              // [batch, hidden]
  std::int64_t logits = 0;            // [batch, vocab]
  std::int64_t total() const;
};
ActivationBuffers activation_buffers(const ModelShape& m, std::int64_t rows, std::int64_t batch);
// What a MoE layer's expert kernel holds beside its GEMMs' scratch for `rows` rows: an
// expert's gathered rows, gate, up and output in fp32 and each row's index and weight.
std::int64_t moe_expert_scratch_bytes(const ModelShape& m, std::int64_t rows);

}  // namespace flexh2o::policy
