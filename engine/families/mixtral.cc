// Mixtral (model_type mixtral): Mistral with mixture-of-experts MLPs: softmax over all router
// logits in fp32, top-k, always renormalised; experts w1 (gate), w3 (up), w2 (down) under
// block_sparse_moe as on the Hub, or fused as transformers 5 can write them.
#include "engine/families/families.h"
#include "engine/families/llama_like.h"

namespace flexh2o::engine {

namespace {

void preset(ModelConfig& c) { llama_preset(c); }

void read(const HfConfig& j, ModelConfig& c) {
  read_llama_like(j, c, /*tie_default=*/false, 0, /*experts=*/true);
  c.layer_window = read_layer_windows(j, c.n_layers, [](const HfConfig&, std::int64_t) { return true; });
  c.moe = read_moe(j, c.n_layers, /*norm_default=*/true);
  c.moe.norm_topk = true;  // MixtralTopKRouter always renormalises
}

std::vector<HfTensorName> names(const ModelConfig& c, const std::string& canonical) {
  if (auto expert = expert_names(c, canonical, {"w1", "w3", "w2"}, "block_sparse_moe.experts.")) return *expert;
  std::string rest;
  const std::int64_t l = split_layer_name(canonical, rest);
  if (rest == "router")
    return {{"model.layers." + std::to_string(l) + ".block_sparse_moe.gate.weight"},
            {"model.layers." + std::to_string(l) + ".mlp.gate.weight"}};
  return llama_like_names(canonical, llama_layer_names());
}

}  // namespace

const Family kMixtralFamily{"mixtral", preset, read, names};

}  // namespace flexh2o::engine
