#include "engine/model/weights.h"

#include <tbb/parallel_for.h>

#include <stdexcept>

namespace flexh2o::engine {

kernels::DType WeightSpec::dtype(const ModelConfig& c) const {
  if (!matrix) return kernels::DType::F32;
  if (kernels::is_quantized(c.dtype))
    if (const auto it = c.stored_group_formats.find(name); it != c.stored_group_formats.end()) return it->second;
  return c.dtype;
}

std::vector<WeightSpec> weight_specs(const ModelConfig& c) {
  std::vector<WeightSpec> s;
  const std::int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim, width = c.embedding_width();
  auto mat = [&](std::string name, std::int64_t rows, std::int64_t cols, std::int64_t layer) {
    s.push_back({std::move(name), rows, cols, true, layer});
  };
  auto vec = [&](std::string name, std::int64_t n, std::int64_t layer) { s.push_back({std::move(name), n, 1, false, layer}); };
  auto norm = [&](const std::string& name, std::int64_t layer) {
    vec(name + ".weight", c.hidden, layer);
    if (c.norm_has_bias()) vec(name + ".bias", c.hidden, layer);
  };
  mat("tok_embed", c.vocab_size, width, -1);
  if (c.learned_positions) mat("pos_embed", c.max_positions + c.position_offset, c.hidden, -1);
  if (width != c.hidden) mat("project_in", c.hidden, width, -1);
  const bool sandwich = c.norm_placement == NormPlacement::Sandwich;
  for (std::int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    norm(p + "attn_norm", i);
    mat(p + "wq", q, c.hidden, i);
    mat(p + "wk", kv, c.hidden, i);
    mat(p + "wv", kv, c.hidden, i);
    mat(p + "wo", c.hidden, q, i);
    if (c.qkv_bias) {
      vec(p + "bq", q, i);
      vec(p + "bk", kv, i);
      vec(p + "bv", kv, i);
    }
    if (c.o_bias) vec(p + "bo", c.hidden, i);
    if (c.qk_norm) {
      vec(p + "q_norm", c.head_dim, i);
      vec(p + "k_norm", c.head_dim, i);
    }
    if (sandwich) norm(p + "attn_out_norm", i);
    norm(p + "mlp_norm", i);
    if (c.moe_layer(i)) {
      mat(p + "router", c.moe.experts, c.hidden, i);
      for (std::int64_t e = 0; e < c.moe.experts; ++e) {
        const std::string x = p + "experts." + std::to_string(e) + ".";
        mat(x + "w_gate", c.moe.expert_ffn, c.hidden, i);
        mat(x + "w_up", c.moe.expert_ffn, c.hidden, i);
        mat(x + "w_down", c.hidden, c.moe.expert_ffn, i);
      }
      if (c.moe.shared_ffn > 0) {
        mat(p + "shared.w_gate", c.moe.shared_ffn, c.hidden, i);
        mat(p + "shared.w_up", c.moe.shared_ffn, c.hidden, i);
        mat(p + "shared.w_down", c.hidden, c.moe.shared_ffn, i);
        mat(p + "shared_gate", 1, c.hidden, i);
      }
      if (sandwich) norm(p + "mlp_out_norm", i);
      continue;
    }
    if (c.gated_mlp) mat(p + "w_gate", c.ffn, c.hidden, i);
    mat(p + "w_up", c.ffn, c.hidden, i);
    mat(p + "w_down", c.hidden, c.ffn, i);
    if (c.mlp_bias) {
      if (c.gated_mlp) vec(p + "b_gate", c.ffn, i);
      vec(p + "b_up", c.ffn, i);
      vec(p + "b_down", c.hidden, i);
    }
    if (sandwich) norm(p + "mlp_out_norm", i);
  }
  if (c.final_norm) norm("final_norm", -1);
  if (width != c.hidden) mat("project_out", width, c.hidden, -1);
  if (!c.tie_embeddings) mat("lm_head", c.vocab_size, width, -1);
  return s;
}

std::string matrix_dtypes_text(const ModelConfig& c) {
  if (c.stored_group_formats.empty() || !kernels::is_quantized(c.dtype)) return std::string(kernels::dtype_name(c.dtype));
  std::map<kernels::DType, int> count;
  for (const WeightSpec& w : weight_specs(c))
    if (w.matrix) ++count[w.dtype(c)];
  std::string text;
  for (const auto& [t, n] : count) text += (text.empty() ? "" : ", ") + std::string(kernels::dtype_name(t)) + " x " + std::to_string(n);
  return text;
}

namespace {

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

void check_one(const WeightSpec& w, const WeightSource& source) {
  const auto shape = source.shape(w.name);
  if (!shape) throw std::runtime_error("missing tensor " + source.origin(w.name));
  const std::vector<std::int64_t> want = w.matrix ? std::vector<std::int64_t>{w.rows, w.cols} : std::vector<std::int64_t>{w.rows};
  if (*shape != want)
    throw std::runtime_error("tensor " + source.origin(w.name) + " has shape " + shape_str(*shape) +
                             ", the model config needs " + shape_str(want));
}

}  // namespace

void check_weights(const ModelConfig& cfg, const WeightSource& source) {
  for (const auto& w : weight_specs(cfg)) check_one(w, source);
}

HostWeights load_weights(const ModelConfig& cfg, const WeightSource& source) {
  const auto specs = weight_specs(cfg);
  for (const auto& w : specs) check_one(w, source);
  HostWeights out;
  for (const auto& w : specs) {
    HostTensor t{w.dtype(cfg), w.rows, w.cols, nullptr};
    t.data = std::shared_ptr<std::byte[]>(new std::byte[static_cast<std::size_t>(w.rows * kernels::row_bytes(t.dtype, w.cols))]);
    out.emplace(w.name, std::move(t));
  }
  tbb::parallel_for(std::size_t{0}, specs.size(), [&](std::size_t i) {
    const auto& w = specs[i];
    HostTensor& t = out.at(w.name);
    source.read_rows(w.name, 0, w.rows, t.data.get(), t.dtype);
  });
  return out;
}

}  // namespace flexh2o::engine
