// The one description of each unit's weights (policy/unit_weights) as the loader, the layers,
// the cost model and the activation sizes read it: the same tensors and bytes everywhere, for
// every feature that adds tensors.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "engine/model/layers.h"
#include "engine/model/model_shape.h"
#include "engine/model/weights.h"
#include "kernels/backend.h"
#include "policy/cost_model.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

using engine::ModelConfig;

// The tiny test models, and the features that add tensors, each on its own.
std::map<std::string, ModelConfig> variants() {
  std::map<std::string, ModelConfig> v;
  v["opt"] = testing::tiny_opt_config();
  v["llama"] = testing::tiny_llama_config();
  v["moe"] = testing::tiny_moe_config();
  ModelConfig c = testing::tiny_llama_config();
  c.qkv_bias = true;  // Qwen2: q/k/v biases only
  v["qkv_bias"] = c;
  c = testing::tiny_llama_config();
  c.mlp_bias = true;  // a gated MLP with biases: b_gate too
  v["gated_mlp_bias"] = c;
  c = testing::tiny_llama_config();
  c.qk_norm = true;
  v["qk_norm"] = c;
  c = testing::tiny_llama_config();
  c.norm_placement = engine::NormPlacement::Sandwich;
  v["sandwich"] = c;
  c = testing::tiny_llama_config();
  c.final_norm = false;
  v["no_final_norm"] = c;
  c = testing::tiny_opt_config();
  c.embed_dim = c.hidden / 2;  // OPT-350m: a narrower embedding, projected in and out
  v["narrow_embedding"] = c;
  c = testing::tiny_llama_config();
  c.tie_embeddings = !c.tie_embeddings;
  v["tying_flipped"] = c;
  return v;
}

std::int64_t stored_bytes(const ModelConfig& c) {
  std::int64_t b = 0;
  for (const auto& w : engine::weight_specs(c)) b += w.rows * kernels::row_bytes(w.dtype(c), w.cols);
  return b;
}

TEST(UnitWeights, TheCostModelSizesTheTensorsTheLoaderLoads) {
  for (const auto& [name, c] : variants()) {
    SCOPED_TRACE(name);
    const policy::ModelSizes z = policy::model_sizes(engine::model_shape(c));
    if (c.moe.experts == 0) {
      EXPECT_EQ(z.total_weights, stored_bytes(c));
    } else {  // per-layer sizes are the mean over dense and MoE layers, rounded down
      EXPECT_LE(z.total_weights, stored_bytes(c));
      EXPECT_GT(z.total_weights, stored_bytes(c) - c.n_layers);
    }
  }
}

TEST(UnitWeights, EveryTensorBelongsToOneLayerAndTheSlotsHoldThem) {
  for (const auto& [name, c] : variants()) {
    SCOPED_TRACE(name);
    std::multiset<std::string> in_layers;
    for (const auto& layer : engine::build_layers(c)) {
      for (const auto& t : layer->tensors()) in_layers.insert(t.name);
      for (const auto& expert : layer->expert_tensors())
        for (const auto& t : expert) in_layers.insert(t.name);
    }
    std::multiset<std::string> loaded;
    for (const auto& w : engine::weight_specs(c)) loaded.insert(w.name);
    if (c.tie_embeddings) loaded.insert("tok_embed");  // the input embedding and the head read it
    EXPECT_EQ(in_layers, loaded);

    // The attention unit as a staging slot holds it: each tensor 256-byte aligned.
    const auto layers = engine::build_layers(c);
    std::int64_t slot = 0;
    for (const auto& t : layers[1]->tensors()) slot += policy::slot_bytes(t.bytes(c.dtype));
    EXPECT_EQ(policy::model_sizes(engine::model_shape(c)).attention_unit, slot);
  }
}

TEST(UnitWeights, ActivationsAllocateWhatTheirSizeSays) {
  auto be = kernels::make_cpu_backend();
  for (const auto& [name, c] : variants()) {
    SCOPED_TRACE(name);
    for (const auto& [rows, batch] : {std::pair<std::int64_t, std::int64_t>{7, 3}, {2, 5}}) {
      const engine::Activations act(*be, c, rows, batch);
      const std::int64_t allocated =
          static_cast<std::int64_t>(act.normed.bytes() + act.q.bytes() + act.k.bytes() + act.v.bytes() + act.attn.bytes() +
                                    act.ffn_a.bytes() + act.ffn_b.bytes() + act.embed.bytes() + act.router.bytes() +
                                    act.last.bytes() + act.logits.bytes());
      EXPECT_EQ(engine::Activations::buffer_bytes(c, rows, batch), allocated);
      EXPECT_EQ(4 * policy::activation_buffers(engine::model_shape(c), rows, batch).total(), allocated);
    }
  }
}

// Every tensor lands in a field of its layer's typed weights: a feature's tensors are set,
// the others left empty.
TEST(UnitWeights, ResolvedWeightsHaveAFieldPerTensor) {
  ModelConfig c = testing::tiny_llama_config();
  c.qkv_bias = true;
  const auto layers = engine::build_layers(c);
  std::map<std::string, float> storage;  // a distinct address per name
  auto find = [&](const policy::TensorSpec& t) { return kernels::MatrixRef{&storage[t.name], c.dtype, t.rows, t.cols}; };
  const auto attention = std::get<engine::AttentionWeights>(engine::resolve_weights(*layers[1], find));
  EXPECT_EQ(attention.wq.data, &storage.at("layers.0.wq"));
  EXPECT_EQ(attention.bq, &storage.at("layers.0.bq"));
  EXPECT_EQ(attention.bo, nullptr);  // qkv biases only
  EXPECT_EQ(attention.q_norm, nullptr);
  const auto mlp = std::get<engine::MlpWeights>(engine::resolve_weights(*layers[2], find));
  EXPECT_EQ(mlp.gate.data, &storage.at("layers.0.w_gate"));
  EXPECT_EQ(mlp.b_up, nullptr);
  // A role of another kind of layer is a programming error, not a silent no-op.
  engine::LayerWeights w = engine::MlpWeights{};
  EXPECT_THROW(engine::set_weight(w, layers[1]->tensors()[1], {}), std::logic_error);
}

}  // namespace
}  // namespace flexh2o
