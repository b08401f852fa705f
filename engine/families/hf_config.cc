#include "engine/families/hf_config.h"

#include <algorithm>
#include <map>

#include "engine/io/json_input.h"
#include "kernels/option_error.h"

namespace flexh2o::engine {

std::optional<std::int64_t> HfConfig::size_limit(const std::string& key) {
  using L = ModelLimits;
  static const std::map<std::string, std::int64_t> limits = {
      {"num_hidden_layers", L::kLayers},
      {"hidden_size", L::kHidden},
      {"word_embed_proj_dim", L::kHidden},
      {"intermediate_size", L::kFfn},
      {"ffn_dim", L::kFfn},
      {"moe_intermediate_size", L::kFfn},
      {"shared_expert_intermediate_size", L::kFfn},
      {"num_attention_heads", L::kHeads},
      {"num_key_value_heads", L::kHeads},
      {"head_dim", L::kHeadDim},
      {"vocab_size", L::kVocab},
      {"max_position_embeddings", L::kPositions},
      {"original_max_position_embeddings", L::kPositions},
      {"sliding_window", L::kPositions},
      {"num_local_experts", L::kExperts},
      {"num_experts", L::kExperts},
      {"num_experts_per_tok", L::kExperts},
      {"decoder_sparse_step", L::kLayers},
  };
  const auto it = limits.find(key);
  if (it == limits.end()) return std::nullopt;
  return it->second;
}

std::int64_t HfConfig::integer(const char* key, std::int64_t lo, std::int64_t hi) const {
  const nlohmann::json& v = j_[key];
  if (!v.is_number_integer()) throw error("field '" + std::string(key) + "' must be an integer, got " + json_excerpt(v));
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi))
    throw error("field '" + std::string(key) + "' = " + v.dump() + " is out of range");
  const auto x = v.get<std::int64_t>();
  if (x < lo || x > hi) throw error("field '" + std::string(key) + "' = " + v.dump() + " is out of range");
  if (const auto limit = size_limit(key)) check_size_field(source_, key, x, *limit);
  return x;
}

kernels::DType read_dtype(const HfConfig& j) {
  const std::string name =
      j.has("dtype") ? j.get<std::string>("dtype") : j.get<std::string>("torch_dtype", std::string("float16"));
  try {
    return kernels::parse_float_dtype(name);
  } catch (const kernels::OptionError& e) {
    throw kernels::OptionError(j.error(std::string("field '") + (j.has("dtype") ? "dtype" : "torch_dtype") + "': ").what(),
                               e);
  } catch (const std::invalid_argument& e) {
    throw j.error(std::string("field '") + (j.has("dtype") ? "dtype" : "torch_dtype") + "': " + e.what());
  }
}

void read_special_ids(const HfConfig& j, ModelConfig& c) {
  c.bos_id = j.get<std::int32_t>("bos_token_id", -1);
  c.stop_ids.clear();
  if (!j.has("eos_token_id")) return;
  if (j.raw()["eos_token_id"].is_array())
    c.stop_ids = j.get<std::vector<std::int32_t>>("eos_token_id");
  else
    c.stop_ids = {j.get<std::int32_t>("eos_token_id")};
}

namespace {

// A number of the scaling object, or the top-level field of the same name.
double param(const HfConfig& j, const nlohmann::json& p, const char* key, double fallback) {
  try {
    if (p.contains(key) && !p[key].is_null()) return p[key].get<double>();
  } catch (const nlohmann::json::exception&) {
    throw j.error("rope field '" + std::string(key) + "' is not a number");
  }
  return j.get<double>(key, fallback);
}

std::vector<double> factors(const HfConfig& j, const nlohmann::json& p, const char* key) {
  if (!p.contains(key) || !p[key].is_array()) throw j.error("longrope needs the list '" + std::string(key) + "'");
  try {
    return p[key].get<std::vector<double>>();
  } catch (const nlohmann::json::exception&) {
    throw j.error("rope field '" + std::string(key) + "' must be a list of numbers");
  }
}

}  // namespace

RopeConfig read_rope(const HfConfig& j, double default_theta) {
  RopeConfig r;
  nlohmann::json p = nlohmann::json::object();
  const bool v5 = j.has("rope_parameters");
  if (v5) {
    p = j.raw()["rope_parameters"];
    if (!p.is_object()) throw j.error("field 'rope_parameters' must be an object");
    for (const auto& [key, value] : p.items())
      if (value.is_object())
        throw j.error("field 'rope_parameters' holds per-layer-type parameters ('" + key +
                      "'): RoPE that differs between layers is not supported");
  } else if (j.has("rope_scaling")) {
    p = j.raw()["rope_scaling"];
    if (!p.is_object()) throw j.error("field 'rope_scaling' must be an object or null");
  }
  r.theta = param(j, p, "rope_theta", default_theta);
  r.partial_rotary_factor = param(j, p, "partial_rotary_factor", 1.0);
  std::string type = "default";
  if (p.contains("rope_type") && p["rope_type"].is_string()) {
    type = p["rope_type"].get<std::string>();
  } else if (p.contains("type") && p["type"].is_string()) {
    type = p["type"].get<std::string>();
  } else if (!p.empty() && !v5) {
    throw j.error("field 'rope_scaling' names no 'rope_type' (or 'type')");
  }
  r.original_max_positions = static_cast<std::int64_t>(param(j, p, "original_max_position_embeddings", 0));
  r.factor = param(j, p, "factor", 0);
  r.attention_factor = param(j, p, "attention_factor", 0);
  if (type == "default") {
    r.type = RopeType::Default;
  } else if (type == "linear") {
    r.type = RopeType::Linear;
  } else if (type == "dynamic") {
    r.type = RopeType::Dynamic;
  } else if (type == "llama3") {
    r.type = RopeType::Llama3;
    r.low_freq_factor = param(j, p, "low_freq_factor", 0);
    r.high_freq_factor = param(j, p, "high_freq_factor", 0);
  } else if (type == "yarn") {
    r.type = RopeType::Yarn;
    r.beta_fast = param(j, p, "beta_fast", 32);
    r.beta_slow = param(j, p, "beta_slow", 1);
    r.mscale = param(j, p, "mscale", 0);
    r.mscale_all_dim = param(j, p, "mscale_all_dim", 0);
    if (p.contains("truncate") && p["truncate"].is_boolean()) r.truncate = p["truncate"].get<bool>();
  } else if (type == "longrope" || type == "su") {  // Phi-3's early configs call it su
    r.type = RopeType::LongRope;
    r.short_factor = factors(j, p, "short_factor");
    r.long_factor = factors(j, p, "long_factor");
    // transformers 4 takes max_position_embeddings / original_max_position_embeddings over
    // `factor` whenever the top level names the original length; 5 takes `factor` first.
    if (!v5 && j.has("original_max_position_embeddings")) r.factor = 0;
  } else {
    throw j.error("RoPE type '" + type + "' is not supported (default, linear, dynamic, llama3, yarn, longrope)");
  }
  return r;
}

std::vector<std::int64_t> read_layer_windows(const HfConfig& j, std::int64_t layers,
                                             bool (*is_sliding)(const HfConfig&, std::int64_t)) {
  std::vector<std::int64_t> windows(static_cast<std::size_t>(layers), 0);
  const std::int64_t w = j.get<std::int64_t>("sliding_window", 0);
  if (j.has("layer_types")) {
    const auto types = j.get<std::vector<std::string>>("layer_types");
    if (static_cast<std::int64_t>(types.size()) != layers)
      throw j.error("field 'layer_types' needs one entry per layer (" + std::to_string(layers) + ")");
    for (std::int64_t l = 0; l < layers; ++l) {
      const std::string& t = types[static_cast<std::size_t>(l)];
      if (t == "sliding_attention") {
        if (w <= 0) throw j.error("layer " + std::to_string(l) + " is sliding_attention but 'sliding_window' is not set");
        windows[static_cast<std::size_t>(l)] = w;
      } else if (t != "full_attention") {
        throw j.error("layer type '" + t + "' is not supported (full_attention, sliding_attention)");
      }
    }
    return windows;
  }
  if (w > 0)
    for (std::int64_t l = 0; l < layers; ++l)
      if (is_sliding(j, l)) windows[static_cast<std::size_t>(l)] = w;
  return windows;
}

kernels::Activation read_activation(const HfConfig& j, const char* key, const std::string& fallback) {
  const std::string a = j.get<std::string>(key, fallback);
  if (a == "silu" || a == "swish") return kernels::Activation::Silu;
  if (a == "gelu") return kernels::Activation::Gelu;
  if (a == "gelu_pytorch_tanh" || a == "gelu_new" || a == "gelu_fast") return kernels::Activation::GeluTanh;
  if (a == "relu") return kernels::Activation::Relu;
  throw j.error("field '" + std::string(key) + "' = '" + a + "': activation not supported (silu, gelu, gelu_pytorch_tanh, relu)");
}

MoeConfig read_moe(const HfConfig& j, std::int64_t layers, bool norm_default) {
  MoeConfig m;
  m.experts = j.has("num_local_experts") ? j.get<std::int64_t>("num_local_experts") : j.get<std::int64_t>("num_experts", 0);
  if (m.experts <= 0) throw j.error("a mixture-of-experts family needs 'num_local_experts' or 'num_experts'");
  m.top_k = j.get<std::int64_t>("num_experts_per_tok");
  m.expert_ffn = j.has("moe_intermediate_size") ? j.get<std::int64_t>("moe_intermediate_size")
                                                : j.get<std::int64_t>("intermediate_size");
  m.norm_topk = j.get<bool>("norm_topk_prob", norm_default);
  m.shared_ffn = j.get<std::int64_t>("shared_expert_intermediate_size", 0);
  const auto dense = j.get<std::vector<std::int64_t>>("mlp_only_layers", std::vector<std::int64_t>{});
  const std::int64_t step = j.get<std::int64_t>("decoder_sparse_step", 1);
  if (step < 1) throw j.error("field 'decoder_sparse_step' must be at least 1");
  for (std::int64_t l = 0; l < layers; ++l)
    m.layers.push_back(std::ranges::find(dense, l) == dense.end() && (l + 1) % step == 0);
  return m;
}

void refuse_unimplemented(const HfConfig& j, bool experts) {
  if (j.has("quantization_config"))
    throw kernels::OptionError{
        j.error("field 'quantization_config' is set: pre-quantized checkpoints are not supported (use a float "
                "checkpoint with ")
            .what(),
        kernels::Option::CompressWeight, ", or its GGUF file)"};
  for (const char* key : {"num_local_experts", "num_experts"})
    if (!experts && j.has(key) && j.get<std::int64_t>(key) > 0)
      throw j.error("field '" + std::string(key) + "' is set: mixture-of-experts layers are not supported");
}

}  // namespace flexh2o::engine
