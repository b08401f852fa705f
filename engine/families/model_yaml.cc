#include "engine/families/model_yaml.h"

#include <yaml-cpp/yaml.h>

#include <optional>
#include <stdexcept>

#include "engine/families/family.h"
#include "engine/model/embedded.h"
#include "kernels/option_error.h"

namespace flexh2o::engine {

namespace {

template <class T>
T yaml_get(const YAML::Node& root, const char* key, const std::string& source, std::optional<T> fallback) {
  const YAML::Node n = root[key];
  if (!n) {
    if (!fallback) throw std::invalid_argument(source + ": missing field '" + key + "'");
    return *fallback;
  }
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    throw std::invalid_argument(source + ": field '" + key + "' has the wrong type (line " +
                                std::to_string(n.Mark().line + 1) + ")");
  }
}

}  // namespace

ModelConfig load_model_yaml(const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw std::invalid_argument(source + ": not valid YAML: " + e.what());
  }
  if (!root.IsMap()) throw std::invalid_argument(source + ": expected a mapping of model fields");
  ModelConfig c;
  c.name = yaml_get<std::string>(root, "name", source, std::nullopt);
  const Family& family = find_family(yaml_get<std::string>(root, "family", source, std::nullopt), source);
  c.n_layers = yaml_get<std::int64_t>(root, "num_layers", source, std::nullopt);
  c.hidden = yaml_get<std::int64_t>(root, "hidden_size", source, std::nullopt);
  c.ffn = yaml_get<std::int64_t>(root, "ffn_size", source, std::nullopt);
  c.n_heads = yaml_get<std::int64_t>(root, "num_heads", source, std::nullopt);
  c.n_kv_heads = yaml_get<std::int64_t>(root, "num_kv_heads", source, c.n_heads);
  c.head_dim = yaml_get<std::int64_t>(root, "head_dim", source, c.n_heads > 0 ? c.hidden / c.n_heads : 0);
  c.vocab_size = yaml_get<std::int64_t>(root, "vocab_size", source, std::nullopt);
  c.max_positions = yaml_get<std::int64_t>(root, "max_positions", source, std::nullopt);
  c.check_limits(source);  // before the family's preset and the MoE layer list allocate per layer
  try {
    c.dtype = kernels::parse_float_dtype(yaml_get<std::string>(root, "dtype", source, "f16"));
  } catch (const kernels::OptionError& e) {
    throw kernels::OptionError(source + ": field 'dtype': ", e);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(source + ": field 'dtype': " + e.what());
  }
  family.preset(c);  // the family's features at this shape and dtype
  c.family = family.name;
  c.norm_eps = yaml_get<float>(root, "norm_eps", source, c.norm_eps);
  c.rope.theta = yaml_get<double>(root, "rope_theta", source, c.rope.theta);
  const std::string layout = yaml_get<std::string>(root, "rope_layout", source, "rotate_half");
  if (layout == "rotate_half") {
    c.rope.layout = kernels::RopeLayout::RotateHalf;
  } else if (layout == "interleaved") {
    c.rope.layout = kernels::RopeLayout::Interleaved;
  } else {
    throw std::invalid_argument(source + ": field 'rope_layout' must be rotate_half or interleaved");
  }
  c.tie_embeddings = yaml_get<bool>(root, "tie_embeddings", source, c.tie_embeddings);
  c.moe.experts = yaml_get<std::int64_t>(root, "num_experts", source, 0);
  if (c.moe.experts > 0) {
    c.moe.top_k = yaml_get<std::int64_t>(root, "experts_per_token", source, std::nullopt);
    c.moe.expert_ffn = yaml_get<std::int64_t>(root, "expert_ffn_size", source, std::nullopt);
    c.moe.norm_topk = yaml_get<bool>(root, "norm_topk_prob", source, true);
    c.moe.shared_ffn = yaml_get<std::int64_t>(root, "shared_expert_ffn_size", source, 0);
    c.check_limits(source);
    c.moe.layers.assign(static_cast<std::size_t>(c.n_layers), true);
  }
  c.bos_id = yaml_get<std::int32_t>(root, "bos_token_id", source, -1);
  const YAML::Node eos = root["eos_token_id"];
  if (eos && eos.IsSequence()) {
    c.stop_ids = yaml_get<std::vector<std::int32_t>>(root, "eos_token_id", source, {});
  } else if (eos) {
    c.stop_ids = {yaml_get<std::int32_t>(root, "eos_token_id", source, 0)};
  }
  c.validate(source);
  return c;
}

std::vector<std::string> builtin_model_names() {
  std::vector<std::string> names;
  for (const auto& e : embedded_model_configs()) names.emplace_back(e.name);
  return names;
}

ModelConfig builtin_model(const std::string& name) {
  for (const auto& e : embedded_model_configs())
    if (e.name == name) return load_model_yaml(std::string(e.yaml), "configs/models/" + name + ".yaml");
  std::string known;
  for (const auto& n : builtin_model_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown model '" + name + "' (built-in: " + known + "; or give a directory or file)");
}

}  // namespace flexh2o::engine
