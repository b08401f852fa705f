#include "engine/loaders/gguf_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <stdexcept>

#include "engine/families/family.h"
#include "engine/loaders/gguf_blocks.h"
#include "kernels/option_error.h"

namespace flexh2o::engine {

namespace {

[[noreturn]] void fail(const GgufHeader& h, const std::string& what) { throw std::runtime_error(h.source + ": " + what); }

// The architectures flexh2o runs, as general.architecture names them, and their family.
struct Arch {
  const char* name;
  const char* family;
  kernels::RopeLayout layout;  // llama.cpp's converter permutes llama's q/k rows into pairs
};
constexpr Arch kArchs[] = {
    {"llama", "llama", kernels::RopeLayout::Interleaved},
    {"qwen2", "qwen2", kernels::RopeLayout::RotateHalf},
    {"qwen3", "qwen3", kernels::RopeLayout::RotateHalf},
    {"phi3", "phi3", kernels::RopeLayout::RotateHalf},
    {"gemma2", "gemma2", kernels::RopeLayout::RotateHalf},
};

const Arch& find_arch(const GgufHeader& h) {
  const auto name = h.get_string("general.architecture");
  if (!name) fail(h, "missing metadata key 'general.architecture'");
  std::string known;
  for (const Arch& a : kArchs) {
    if (*name == a.name) return a;
    known += (known.empty() ? "" : ", ") + std::string(a.name);
  }
  fail(h, "metadata key 'general.architecture' = '" + *name + "': architecture not supported (supported: " + known + ")");
}

// A size from the metadata: present (unless it has a fallback) and in [1, 2^31), which keeps
// every product of two of them exact in int64.
std::int64_t dim(const GgufHeader& h, const std::string& key, std::optional<std::int64_t> fallback = std::nullopt) {
  const auto v = h.get_uint(key);
  if (!v) {
    if (!fallback) fail(h, "missing metadata key '" + key + "'");
    return *fallback;
  }
  if (*v < 1 || *v >= (1ull << 31)) h.fail_key(key, "= " + std::to_string(*v) + " is out of range [1, 2^31)");
  return static_cast<std::int64_t>(*v);
}

double number(const GgufHeader& h, const std::string& key, std::optional<double> fallback = std::nullopt) {
  const auto v = h.get_float(key);
  if (!v) {
    if (!fallback) fail(h, "missing metadata key '" + key + "'");
    return *fallback;
  }
  if (!std::isfinite(*v)) h.fail_key(key, "is not a finite number");
  return *v;
}

// The float type of the file's matrices when they share one, else f16 (quantized files).
kernels::DType natural_dtype(const GgufHeader& h) {
  std::optional<std::uint32_t> shared;
  for (const GgufTensor& t : h.tensors) {
    if (t.ne.size() < 2) continue;
    if (shared && *shared != t.type->id) return kernels::DType::F16;
    shared = t.type->id;
  }
  if (shared == 0u) return kernels::DType::F32;
  if (shared == 30u) return kernels::DType::BF16;
  return kernels::DType::F16;
}

// A 1-D tensor of one factor per rotated pair (RoPE scaling tensors).
std::vector<double> pair_factors(const GgufHeader& h, const GgufTensor& t, const ModelConfig& c,
                                 const std::function<std::vector<float>(const GgufTensor&)>& read_f32) {
  const std::int64_t pairs = c.rotary_dim() / 2;
  if (t.ne.size() != 1 || t.ne[0] != pairs || t.type->id != 0)
    fail(h, "tensor '" + t.name + "' must be " + std::to_string(pairs) + " F32 values (one per rotated pair)");
  const std::vector<float> f = read_f32(t);
  for (const float x : f)
    if (!(x > 0) || !std::isfinite(x)) fail(h, "tensor '" + t.name + "' holds a factor that is not a positive number");
  return {f.begin(), f.end()};
}

void read_rope_scaling(const GgufHeader& h, const std::string& arch, ModelConfig& c,
                       const std::function<std::vector<float>(const GgufTensor&)>& read_f32) {
  const std::string k = arch + ".rope.scaling.";
  RopeConfig& r = c.rope;
  std::string type = h.get_string(k + "type").value_or("none");
  if (const auto linear = h.get_float(arch + ".rope.scale_linear"); linear && *linear != 1.0) {  // the older key
    if (type != "none" && type != "linear") h.fail_key(arch + ".rope.scale_linear", "is set with scaling type '" + type + "'");
    type = "linear";
    r.factor = *linear;
  }
  if (const auto orig = h.get_uint(k + "original_context_length")) {
    if (*orig >= (1ull << 31)) h.fail_key(k + "original_context_length", "is out of range");
    r.original_max_positions = static_cast<std::int64_t>(*orig);
  }
  const GgufTensor* freqs = h.find_tensor("rope_freqs.weight");
  const GgufTensor* long_f = h.find_tensor("rope_factors_long.weight");
  const GgufTensor* short_f = h.find_tensor("rope_factors_short.weight");
  if ((freqs || long_f || short_f) && type != "none" && type != "longrope")
    fail(h, "RoPE factor tensors together with scaling type '" + type + "' are not supported");
  if (type == "none") {
    r.type = RopeType::Default;
  } else if (type == "linear") {
    r.type = RopeType::Linear;
    if (r.factor == 0) r.factor = number(h, k + "factor");
  } else if (type == "yarn") {
    r.type = RopeType::Yarn;
    r.factor = number(h, k + "factor");
    r.beta_fast = number(h, k + "yarn_beta_fast", 32.0);
    r.beta_slow = number(h, k + "yarn_beta_slow", 1.0);
    // llama.cpp multiplies its own YaRN magnitude by these; transformers has no such knobs.
    for (const char* key : {"attn_factor", "yarn_attn_factor", "yarn_ext_factor", "yarn_log_multiplier"})
      if (h.find(k + key)) h.fail_key(k + key, "is set: this YaRN variant is not supported");
  } else if (type != "longrope") {
    h.fail_key(k + "type", "= '" + type + "': RoPE scaling not supported (none, linear, yarn, longrope)");
  }
  if (freqs) {
    // Llama-3.x: the converter stores llama3 scaling as one divisor per rotated pair, which
    // is how LongRoPE applies its factor lists (the same list at every length, no magnitude).
    if (long_f || short_f) fail(h, "both rope_freqs and rope_factors_long/short tensors");
    r.type = RopeType::LongRope;
    r.short_factor = pair_factors(h, *freqs, c, read_f32);
    r.long_factor = r.short_factor;
    r.attention_factor = 1.0;
  } else if (long_f || short_f || type == "longrope") {
    // Phi-3 128k / 3.5: short and long factor lists and the magnitude the converter computed.
    if (!long_f || !short_f) fail(h, "LongRoPE needs both tensors rope_factors_long.weight and rope_factors_short.weight");
    r.type = RopeType::LongRope;
    r.long_factor = pair_factors(h, *long_f, c, read_f32);
    r.short_factor = pair_factors(h, *short_f, c, read_f32);
    r.attention_factor = number(h, k + "attn_factor", 0.0);
    // As transformers does for Phi-3 (RopeConfig::reprefill_on_long).
    r.reprefill_on_long = arch == "phi3" && r.original_max_positions > 0;
  }
}

std::vector<std::int32_t> stop_ids(const GgufHeader& h, std::int64_t vocab) {
  std::vector<std::int32_t> ids;
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    const auto id = h.get_uint(key);
    if (!id) continue;
    if (*id >= static_cast<std::uint64_t>(vocab))
      h.fail_key(key, "= " + std::to_string(*id) + " is outside the vocabulary of " + std::to_string(vocab));
    if (std::ranges::find(ids, static_cast<std::int32_t>(*id)) == ids.end()) ids.push_back(static_cast<std::int32_t>(*id));
  }
  return ids;
}

}  // namespace

namespace {

// The decoder's dimensions: layers, widths, heads.
void read_dims(const GgufHeader& h, const std::string& a, ModelConfig& c) {
  c.name = std::filesystem::path(h.source).stem().string();
  c.n_layers = dim(h, a + ".block_count");
  if (static_cast<std::uint64_t>(c.n_layers) > h.tensors.size())
    h.fail_key(a + ".block_count", "= " + std::to_string(c.n_layers) + " is more than the file's " +
                                       std::to_string(h.tensors.size()) + " tensors");
  c.hidden = dim(h, a + ".embedding_length");
  c.ffn = dim(h, a + ".feed_forward_length");
  c.n_heads = dim(h, a + ".attention.head_count");
  c.n_kv_heads = dim(h, a + ".attention.head_count_kv", c.n_heads);
  if (c.n_heads > c.hidden)
    h.fail_key(a + ".attention.head_count", "= " + std::to_string(c.n_heads) + " exceeds the embedding length " +
                                                std::to_string(c.hidden));
  c.head_dim = dim(h, a + ".attention.key_length", c.hidden / c.n_heads);
  if (const auto v = h.get_uint(a + ".attention.value_length"); v && static_cast<std::int64_t>(*v) != c.head_dim)
    h.fail_key(a + ".attention.value_length", "= " + std::to_string(*v) + " differs from the key length " +
                                                  std::to_string(c.head_dim) + ": not supported");
}

// What the architecture changes in the math: llama's optional biases, sliding windows, Gemma 2's
// soft-caps and attention scale.
void read_features(const GgufHeader& h, const std::string& a, ModelConfig& c) {
  // Optional biases as llama.cpp loads them for llama (Qwen2's are part of its preset).
  if (a == "llama") {
    c.qkv_bias = h.find_tensor("blk.0.attn_q.bias") != nullptr;
    c.o_bias = h.find_tensor("blk.0.attn_output.bias") != nullptr;
    c.mlp_bias = h.find_tensor("blk.0.ffn_up.bias") != nullptr;
  }
  const std::int64_t window = static_cast<std::int64_t>(h.get_uint(a + ".attention.sliding_window").value_or(0));
  if (window >= (1ll << 31)) h.fail_key(a + ".attention.sliding_window", "is out of range");
  if (window > 0 && (a == "llama" || a == "phi3")) c.layer_window.assign(static_cast<std::size_t>(c.n_layers), window);
  if (a == "gemma2") {
    c.norm_weight_offset = 0.0f;  // the converter stored 1 + w
    c.attn_softcap = static_cast<float>(number(h, a + ".attn_logit_softcapping", 0.0));
    c.final_softcap = static_cast<float>(number(h, a + ".final_logit_softcapping", 0.0));
    // query_pre_attn_scalar is not in the file; llama.cpp uses hidden / heads for the 27B
    // (46 layers) and head_dim for the others, as their configs say.
    const std::int64_t scalar = c.n_layers == 46 ? c.hidden / c.n_heads : c.head_dim;
    c.attn_scale = 1.0f / std::sqrt(static_cast<float>(scalar));
    if (window > 0) {
      c.layer_window.assign(static_cast<std::size_t>(c.n_layers), 0);
      for (std::int64_t l = 0; l < c.n_layers; l += 2) c.layer_window[static_cast<std::size_t>(l)] = window;
    }
  }
}

}  // namespace

ModelConfig gguf_model_config(const GgufHeader& h, const std::function<std::vector<float>(const GgufTensor&)>& read_f32) {
  const Arch& arch = find_arch(h);
  const std::string a = arch.name;
  const Family& family = find_family(arch.family, h.source);
  if (const auto experts = h.get_uint(a + ".expert_count"); experts && *experts > 0)
    h.fail_key(a + ".expert_count", "= " + std::to_string(*experts) + ": mixture-of-experts models are not supported");
  // Keys other llama.cpp architectures use to change the math (Granite's scales, ...).
  for (const char* key : {".attention.scale", ".logit_scale", ".embedding_scale", ".residual_scale"})
    if (h.find(a + key)) h.fail_key(a + key, "is set: this scaling is not supported");

  const GgufTensor* embed = h.find_tensor("token_embd.weight");
  if (embed == nullptr || embed->ne.size() != 2) fail(h, "missing 2-D tensor 'token_embd.weight'");

  ModelConfig c;
  read_dims(h, a, c);
  c.vocab_size = embed->ne[1];
  c.max_positions = dim(h, a + ".context_length");
  c.dtype = natural_dtype(h);
  try {
    c.check_limits(h.source);  // before anything is allocated per layer
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
  family.preset(c);
  c.family = family.name;

  c.norm_eps = static_cast<float>(number(h, a + ".attention.layer_norm_rms_epsilon"));
  c.rope.layout = arch.layout;
  c.rope.theta = number(h, a + ".rope.freq_base", 10000.0);
  const std::int64_t rot = dim(h, a + ".rope.dimension_count", c.head_dim);
  c.rope.partial_rotary_factor = static_cast<double>(rot) / static_cast<double>(c.head_dim);
  read_rope_scaling(h, a, c, read_f32);
  c.tie_embeddings = h.find_tensor("output.weight") == nullptr;

  read_features(h, a, c);

  if (const auto bos = h.get_uint("tokenizer.ggml.bos_token_id")) {
    if (*bos >= static_cast<std::uint64_t>(c.vocab_size))
      h.fail_key("tokenizer.ggml.bos_token_id", "= " + std::to_string(*bos) + " is outside the vocabulary");
    c.bos_id = static_cast<std::int32_t>(*bos);
  }
  c.stop_ids = stop_ids(h, c.vocab_size);
  try {
    c.validate(h.source);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
  return c;
}

namespace {

// Canonical per-layer suffix -> llama.cpp's, after "blk.N.".
const std::map<std::string, std::string>& layer_names() {
  static const std::map<std::string, std::string> names = {
      {"attn_norm.weight", "attn_norm.weight"},         {"mlp_norm.weight", "ffn_norm.weight"},
      {"attn_out_norm.weight", "post_attention_norm.weight"}, {"mlp_out_norm.weight", "post_ffw_norm.weight"},
      {"wq", "attn_q.weight"},     {"bq", "attn_q.bias"},   {"wk", "attn_k.weight"},       {"bk", "attn_k.bias"},
      {"wv", "attn_v.weight"},     {"bv", "attn_v.bias"},   {"wo", "attn_output.weight"},  {"bo", "attn_output.bias"},
      {"q_norm", "attn_q_norm.weight"},                     {"k_norm", "attn_k_norm.weight"},
      {"w_gate", "ffn_gate.weight"}, {"b_gate", "ffn_gate.bias"}, {"w_up", "ffn_up.weight"}, {"b_up", "ffn_up.bias"},
      {"w_down", "ffn_down.weight"}, {"b_down", "ffn_down.bias"},
  };
  return names;
}

// Where a canonical tensor may be, most common first.
std::vector<HfTensorName> gguf_names(const ModelConfig& c, const std::string& canonical) {
  std::string rest;
  const std::int64_t l = split_layer_name(canonical, rest);
  if (l < 0) {
    if (rest == "tok_embed") return {{"token_embd.weight"}};
    if (rest == "final_norm.weight") return {{"output_norm.weight"}};
    if (rest == "lm_head") return {{"output.weight"}};
    return {};
  }
  const std::string p = "blk." + std::to_string(l) + ".";
  std::vector<HfTensorName> out;
  // Phi-3: q, k, v fused in attn_qkv (or separate); gate and up fused in ffn_up.
  if (c.family == "phi3") {
    const std::int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
    if (rest == "wq") out.push_back({p + "attn_qkv.weight", true, 0});
    if (rest == "wk") out.push_back({p + "attn_qkv.weight", true, q});
    if (rest == "wv") out.push_back({p + "attn_qkv.weight", true, q + kv});
    if (rest == "w_gate") return {{p + "ffn_up.weight", true, 0}};
    if (rest == "w_up") return {{p + "ffn_up.weight", true, c.ffn}};
  }
  const auto it = layer_names().find(rest);
  if (it != layer_names().end()) out.push_back({p + it->second});
  return out;
}

}  // namespace

GgufCheckpoint::GgufCheckpoint(const std::string& path) : file_(path) {
  const GgufHeader& h = file_.header();
  config_ = gguf_model_config(h, [&](const GgufTensor& t) {
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    file_.read(t, 0, v.data(), t.bytes);
    return v;
  });
  for (auto& spec : weight_specs(config_)) specs_.emplace(spec.name, spec);
  for (const auto& [name, spec] : specs_) {
    const auto loc = locate(name);
    if (!loc) continue;  // check_weights names it
    const GgufTensor& t = *loc->tensor;
    if (!ggml_dequantizable(*t.type))
      throw std::runtime_error(path + ": tensor '" + t.name + "' has type " + std::string(t.type->name) +
                               ", which flexh2o does not read (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, "
                               "Q2_K..Q6_K)");
    if (spec.matrix)
      if (const auto format = ggml_group_format(*t.type)) config_.stored_group_formats[name] = *format;
  }
  try {
    check_weights(config_, *this);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
}

std::optional<GgufCheckpoint::Located> GgufCheckpoint::locate(const std::string& canonical) const {
  for (const auto& n : gguf_names(config_, canonical))
    if (const GgufTensor* t = file_.header().find_tensor(n.name)) return Located{t, n.part, n.row_offset};
  return std::nullopt;
}

std::optional<std::vector<std::int64_t>> GgufCheckpoint::shape(const std::string& name) const {
  const auto loc = locate(name);
  if (!loc) return std::nullopt;
  std::vector<std::int64_t> shape = loc->tensor->shape();
  if (!loc->part) return shape;
  const auto spec = specs_.find(name);
  if (spec == specs_.end() || shape.size() != 2 || loc->row_offset + spec->second.rows > shape[0])
    throw std::runtime_error("tensor " + origin(name) + " has shape [" + std::to_string(shape[0]) +
                             ", ...]: too few rows for " + name + " at row " + std::to_string(loc->row_offset) +
                             " of it");
  shape[0] = spec->second.rows;
  return shape;
}

std::string GgufCheckpoint::origin(const std::string& name) const {
  const auto loc = locate(name);
  if (loc) return "'" + loc->tensor->name + "' in " + file_.path();
  const auto names = gguf_names(config_, name);
  return "'" + (names.empty() ? name : names.front().name) + "' in " + file_.path();
}

void GgufCheckpoint::read_rows(const std::string& name, std::int64_t row_begin, std::int64_t row_end, void* dst,
                               kernels::DType to) const {
  const auto loc = locate(name);
  if (!loc) throw std::runtime_error("missing tensor " + origin(name));
  const GgufTensor& t = *loc->tensor;
  const GgmlTypeInfo& type = *t.type;
  // A vector is rows of one value each; a matrix's rows are its ne[0] values.
  const bool vector = t.ne.size() == 1;
  const std::int64_t rows = vector ? t.ne[0] : t.ne[1], cols = vector ? 1 : t.ne[0];
  const std::int64_t first = loc->row_offset + row_begin, last = loc->row_offset + row_end;
  if (row_begin < 0 || row_end < row_begin || last > rows || t.ne.size() > 2)
    throw std::out_of_range(origin(name) + ": rows [" + std::to_string(row_begin) + ", " + std::to_string(row_end) +
                            ") outside the tensor");
  if (vector) {
    // Whole blocks around the range, dequantized, then the range itself.
    const std::int64_t b0 = first / type.block_size, b1 = (last + type.block_size - 1) / type.block_size;
    std::vector<std::byte> raw(static_cast<std::size_t>((b1 - b0) * type.type_size));
    file_.read(t, static_cast<std::uint64_t>(b0 * type.type_size), raw.data(), raw.size());
    std::vector<float> values(static_cast<std::size_t>((b1 - b0) * type.block_size));
    dequantize_ggml(type, raw.data(), static_cast<std::int64_t>(values.size()), values.data());
    kernels::convert_rows(values.data() + (first - b0 * type.block_size), kernels::DType::F32, dst, to,
                          row_end - row_begin, 1);
    return;
  }
  const std::int64_t in_row = cols / type.block_size * type.type_size, out_row = kernels::row_bytes(to, cols);
  const bool repack = ggml_group_format(type) == to;
  // About a million values per read, whole rows.
  const std::int64_t chunk = std::max<std::int64_t>(1, (1 << 20) / std::max<std::int64_t>(cols, 1));
  std::vector<std::byte> raw(static_cast<std::size_t>(std::min(chunk, last - first) * in_row));
  std::vector<float> values(to == kernels::DType::F32 || repack ? 0 : static_cast<std::size_t>(cols));
  for (std::int64_t r = first; r < last; r += chunk) {
    const std::int64_t n = std::min(chunk, last - r);
    file_.read(t, static_cast<std::uint64_t>(r * in_row), raw.data(), static_cast<std::uint64_t>(n * in_row));
    for (std::int64_t i = 0; i < n; ++i) {
      const std::byte* src = raw.data() + i * in_row;
      std::byte* out = static_cast<std::byte*>(dst) + (r - first + i) * out_row;
      if (repack) {
        try {
          repack_ggml_row(type, src, cols, out);
        } catch (const std::range_error& e) {
          throw kernels::OptionRuntimeError{"tensor " + origin(name) + ", row " + std::to_string(r) + ": " + e.what() +
                                                "; it cannot stay compressed (run without ",
                                            kernels::Option::CompressWeight, ")"};
        }
      } else if (to == kernels::DType::F32) {
        dequantize_ggml(type, src, cols, reinterpret_cast<float*>(out));
      } else {
        dequantize_ggml(type, src, cols, values.data());
        kernels::convert_rows(values.data(), kernels::DType::F32, out, to, 1, cols);
      }
    }
  }
}

}  // namespace flexh2o::engine
