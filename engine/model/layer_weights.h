// Each layer's weights as typed fields (as llama.cpp's llama_layer), resolved once from where
// they live (the resident set, or a fetch into a weight staging slot) by the role
// policy/unit_weights gives each tensor; forward() reads fields, never names. A field a model
// lacks stays empty (vectors null).
#pragma once
#include <functional>
#include <variant>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/moe.h"
#include "policy/unit_weights.h"

namespace flexh2o::engine {

using kernels::MatrixRef;

struct NormWeights {
  const float* weight = nullptr;
  const float* bias = nullptr;  // LayerNorm
};

struct EmbeddingWeights {
  MatrixRef tokens, positions, project_in;
  void set(policy::WeightRole role, const MatrixRef& ref);
};

struct AttentionWeights {
  NormWeights norm, out_norm;  // out_norm: sandwich norms
  MatrixRef wq, wk, wv, wo;
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr, *bo = nullptr;
  const float *q_norm = nullptr, *k_norm = nullptr;
  void set(policy::WeightRole role, const MatrixRef& ref);
};

struct MlpWeights {
  NormWeights norm, out_norm;
  MatrixRef gate, up, down;  // gate: gated MLPs
  const float *b_gate = nullptr, *b_up = nullptr, *b_down = nullptr;
  void set(policy::WeightRole role, const MatrixRef& ref);
};

// A mixture-of-experts MLP. An expert whose gate is empty is not on the device (staged
// experts arrive as batches route to them).
struct MoeWeights {
  NormWeights norm;
  MatrixRef router, shared_gate;
  kernels::ExpertMatrices shared;
  std::vector<kernels::ExpertMatrices> experts;
  void set(policy::WeightRole role, const MatrixRef& ref, std::int64_t expert);
};

struct HeadWeights {
  NormWeights norm;
  MatrixRef project_out, head;  // head: the input embedding when tied
  void set(policy::WeightRole role, const MatrixRef& ref);
};

using LayerWeights = std::variant<EmbeddingWeights, AttentionWeights, MlpWeights, MoeWeights, HeadWeights>;

// Puts `ref` in the field of tensor `t` (an empty ref clears it). Throws std::logic_error for a
// role the layer kind does not have.
void set_weight(LayerWeights& w, const policy::TensorSpec& t, const MatrixRef& ref);

}  // namespace flexh2o::engine
