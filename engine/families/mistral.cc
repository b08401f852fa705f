// Mistral (model_type mistral): Llama with a sliding window on every layer when set.
#include "engine/families/families.h"
#include "engine/families/llama_like.h"

namespace flexh2o::engine {

namespace {

void read(const HfConfig& j, ModelConfig& c) {
  read_llama_like(j, c, /*tie_default=*/false);
  c.layer_window = read_layer_windows(j, c.n_layers, [](const HfConfig&, std::int64_t) { return true; });
}

std::vector<HfTensorName> names(const ModelConfig&, const std::string& canonical) {
  return llama_like_names(canonical, llama_layer_names());
}

}  // namespace

const Family kMistralFamily{"mistral", llama_preset, read, names};

}  // namespace flexh2o::engine
