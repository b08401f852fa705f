#include "engine/model_config.h"

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "engine/embedded.h"

namespace flexh2o::engine {

std::string family_name(Family f) { return f == Family::Opt ? "opt" : "llama"; }

namespace {

Family parse_family(const std::string& s, const std::string& source) {
  if (s == "opt") return Family::Opt;
  if (s == "llama") return Family::Llama;
  throw std::invalid_argument(source + ": unknown model family '" + s + "' (supported: opt, llama)");
}


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

template <class T>
T json_get(const nlohmann::json& j, const char* key, const std::string& source, std::optional<T> fallback) {
  if (!j.contains(key) || j[key].is_null()) {
    if (!fallback) throw std::invalid_argument(source + ": missing field '" + key + "'");
    return *fallback;
  }
  try {
    return j[key].get<T>();
  } catch (const nlohmann::json::exception&) {
    throw std::invalid_argument(source + ": field '" + key + "' has the wrong type");
  }
}

}  // namespace

std::int64_t ModelConfig::weight_bytes() const {
  // Matrices are [out, in] rows in `dtype`; vectors fp32.
  auto mat = [&](std::int64_t rows, std::int64_t cols) { return rows * kernels::row_bytes(dtype, cols); };
  const std::int64_t q = n_heads * head_dim, kv = n_kv_heads * head_dim;
  std::int64_t per_layer = mat(q, hidden) + mat(hidden, q) + 2 * mat(kv, hidden);  // q, o, k, v
  per_layer += (family == Family::Opt ? 1 : 2) * mat(ffn, hidden) + mat(hidden, ffn);
  per_layer += (has_bias() ? 4 : 2) * hidden * 4;  // norms (weight, bias)
  if (has_bias()) per_layer += (q + 2 * kv + hidden + ffn + hidden) * 4;
  std::int64_t total = n_layers * per_layer + mat(vocab_size, hidden) * (tie_embeddings ? 1 : 2);
  total += (has_bias() ? 2 : 1) * hidden * 4;
  if (family == Family::Opt) total += mat(max_positions + 2, hidden);
  return total;
}

void ModelConfig::validate(const std::string& source) const {
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument(source + ": " + what);
  };
  need(n_layers > 0, "num_layers must be positive");
  need(hidden > 0, "hidden_size must be positive");
  need(ffn > 0, "ffn_size must be positive");
  need(n_heads > 0, "num_heads must be positive");
  need(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "num_kv_heads must divide num_heads");
  need(head_dim > 0 && head_dim % 2 == 0, "head_dim must be positive and even");
  need(family == Family::Llama || n_heads * head_dim == hidden, "OPT needs num_heads * head_dim == hidden_size");
  need(family == Family::Llama || n_kv_heads == n_heads, "OPT has no grouped KV heads (num_kv_heads == num_heads)");
  need(vocab_size > 0 && vocab_size < (std::int64_t{1} << 31), "vocab_size must be in [1, 2^31)");
  need(max_positions > 0, "max_positions must be positive");
  need(norm_eps > 0.0f, "norm_eps must be positive");
  need(rope_theta > 0.0f, "rope_theta must be positive");
  need(bos_id < vocab_size, "bos_token_id must be below vocab_size");
  for (auto id : stop_ids) need(id >= 0 && id < vocab_size, "eos_token_id must be inside the vocabulary");
}

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
  c.family = parse_family(yaml_get<std::string>(root, "family", source, std::nullopt), source);
  c.n_layers = yaml_get<std::int64_t>(root, "num_layers", source, std::nullopt);
  c.hidden = yaml_get<std::int64_t>(root, "hidden_size", source, std::nullopt);
  c.ffn = yaml_get<std::int64_t>(root, "ffn_size", source, std::nullopt);
  c.n_heads = yaml_get<std::int64_t>(root, "num_heads", source, std::nullopt);
  c.n_kv_heads = yaml_get<std::int64_t>(root, "num_kv_heads", source, c.n_heads);
  c.head_dim = yaml_get<std::int64_t>(root, "head_dim", source, c.n_heads > 0 ? c.hidden / c.n_heads : 0);
  c.vocab_size = yaml_get<std::int64_t>(root, "vocab_size", source, std::nullopt);
  c.max_positions = yaml_get<std::int64_t>(root, "max_positions", source, std::nullopt);
  c.norm_eps = yaml_get<float>(root, "norm_eps", source, 1e-5f);
  c.rope_theta = yaml_get<float>(root, "rope_theta", source, 10000.0f);
  const std::string layout = yaml_get<std::string>(root, "rope_layout", source, "rotate_half");
  if (layout == "rotate_half") {
    c.rope_layout = kernels::RopeLayout::RotateHalf;
  } else if (layout == "interleaved") {
    c.rope_layout = kernels::RopeLayout::Interleaved;
  } else {
    throw std::invalid_argument(source + ": field 'rope_layout' must be rotate_half or interleaved");
  }
  c.tie_embeddings = yaml_get<bool>(root, "tie_embeddings", source, c.family == Family::Opt);
  try {
    c.dtype = kernels::parse_float_dtype(yaml_get<std::string>(root, "dtype", source, "f16"));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(source + ": field 'dtype': " + e.what());
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

ModelConfig load_hf_config(const std::string& json_text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(source + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw std::invalid_argument(source + ": expected a JSON object");
  const std::string type = json_get<std::string>(j, "model_type", source, std::nullopt);
  ModelConfig c;
  c.name = json_get<std::string>(j, "_name_or_path", source, type);
  c.family = parse_family(type, source);
  c.hidden = json_get<std::int64_t>(j, "hidden_size", source, std::nullopt);
  c.n_layers = json_get<std::int64_t>(j, "num_hidden_layers", source, std::nullopt);
  c.n_heads = json_get<std::int64_t>(j, "num_attention_heads", source, std::nullopt);
  c.vocab_size = json_get<std::int64_t>(j, "vocab_size", source, std::nullopt);
  c.max_positions = json_get<std::int64_t>(j, "max_position_embeddings", source, std::nullopt);
  c.head_dim = c.n_heads > 0 ? c.hidden / c.n_heads : 0;
  const std::string torch_dtype = json_get<std::string>(j, "torch_dtype", source, std::string("float16"));
  try {
    c.dtype = kernels::parse_float_dtype(torch_dtype);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(source + ": field 'torch_dtype': " + e.what());
  }
  auto eos_ids = [&]() -> std::vector<std::int32_t> {
    if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) return {};
    if (j["eos_token_id"].is_array()) return json_get<std::vector<std::int32_t>>(j, "eos_token_id", source, std::nullopt);
    return {json_get<std::int32_t>(j, "eos_token_id", source, std::nullopt)};
  };
  if (c.family == Family::Opt) {
    c.ffn = json_get<std::int64_t>(j, "ffn_dim", source, std::nullopt);
    c.n_kv_heads = c.n_heads;
    if (json_get<std::int64_t>(j, "word_embed_proj_dim", source, c.hidden) != c.hidden)
      throw std::invalid_argument(source + ": field 'word_embed_proj_dim' differs from hidden_size (OPT-350m style "
                                           "projections are not supported)");
    if (!json_get<bool>(j, "do_layer_norm_before", source, true))
      throw std::invalid_argument(source + ": field 'do_layer_norm_before' is false (post-LayerNorm OPT is not supported)");
    if (!json_get<bool>(j, "enable_bias", source, true))
      throw std::invalid_argument(source + ": field 'enable_bias' is false (OPT without biases is not supported)");
    c.tie_embeddings = json_get<bool>(j, "tie_word_embeddings", source, true);
    c.norm_eps = 1e-5f;
  } else {
    c.ffn = json_get<std::int64_t>(j, "intermediate_size", source, std::nullopt);
    c.n_kv_heads = json_get<std::int64_t>(j, "num_key_value_heads", source, c.n_heads);
    c.head_dim = json_get<std::int64_t>(j, "head_dim", source, c.head_dim);
    c.norm_eps = json_get<float>(j, "rms_norm_eps", source, 1e-6f);
    c.rope_theta = json_get<float>(j, "rope_theta", source, 10000.0f);
    c.tie_embeddings = json_get<bool>(j, "tie_word_embeddings", source, false);
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
      throw std::invalid_argument(source + ": field 'rope_scaling' is set; scaled RoPE is not supported");
  }
  c.rope_layout = kernels::RopeLayout::RotateHalf;
  c.bos_id = json_get<std::int32_t>(j, "bos_token_id", source, -1);
  c.stop_ids = eos_ids();
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
