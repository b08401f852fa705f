#include "engine/model/weights.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <stdexcept>

#include "engine/model/model_shape.h"

namespace flexh2o::engine {

kernels::DType WeightSpec::dtype(const ModelConfig& c) const {
  if (!matrix) return kernels::DType::F32;
  if (kernels::is_quantized(c.dtype))
    if (const auto it = c.stored_group_formats.find(name); it != c.stored_group_formats.end()) return it->second;
  return c.dtype;
}

kernels::DType held_dtype(const policy::TensorSpec& t, const ModelConfig& c, kernels::DType stored,
                          const kernels::Backend& be) {
  using policy::WeightRole;
  const bool gathered = t.role == WeightRole::TokEmbed || t.role == WeightRole::PosEmbed ||
                        (t.role == WeightRole::Head && c.tie_embeddings);
  if (!t.matrix || gathered) return stored;
  const kernels::DType held = be.gemm_weight_dtype(stored, c.compute_dtype);
  if (kernels::row_bytes(held, t.cols) != kernels::row_bytes(stored, t.cols))
    throw std::logic_error(be.name() + ": gemm_weight_dtype changes the bytes of " + t.name + "'s rows");
  return held;
}

void hold_rows(void* rows_data, kernels::DType stored, kernels::DType held, std::int64_t rows, std::int64_t cols) {
  if (held != stored) kernels::convert_rows(rows_data, stored, rows_data, held, rows, cols);
}

std::vector<WeightSpec> weight_specs(const ModelConfig& c) {
  const policy::ModelShape m = tensor_shape(c);
  std::vector<WeightSpec> out;
  auto add = [&](const std::vector<policy::TensorSpec>& tensors) {
    for (const policy::TensorSpec& t : tensors) out.push_back({t});
  };
  add(policy::input_embedding_tensors(m));
  for (std::int64_t i = 0; i < c.n_layers; ++i) {
    add(policy::attention_tensors(m, i));
    if (!c.moe_layer(i)) {
      add(policy::mlp_tensors(m, i));
      continue;
    }
    const auto moe = policy::moe_tensors(m, i);
    const auto after_router = std::ranges::find(moe, policy::WeightRole::Router, &policy::TensorSpec::role) + 1;
    add({moe.begin(), after_router});
    for (std::int64_t e = 0; e < c.moe.experts; ++e) add(policy::expert_tensors(m, i, e));
    add({after_router, moe.end()});
  }
  // A tied head's matrix is the input embedding, listed above.
  for (const policy::TensorSpec& t : policy::head_tensors(m))
    if (!(c.tie_embeddings && t.role == policy::WeightRole::Head)) out.push_back({t});
  return out;
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
