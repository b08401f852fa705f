// The weights a model needs, where they come from, and how they are loaded. Which tensors
// exist, their canonical names and shapes: policy/unit_weights.h (one list per unit, for the
// loader, the layers, the staging slots and the cost model alike). Matrices are stored in
// ModelConfig::dtype (compressed: or in the group format the checkpoint has,
// ModelConfig::stored_group_formats), vectors in fp32.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "kernels/backend.h"
#include "kernels/gemm.h"
#include "policy/unit_weights.h"

namespace flexh2o::engine {

// A tensor of the model (policy::TensorSpec) and its storage under a config.
struct WeightSpec : policy::TensorSpec {
  kernels::DType dtype(const ModelConfig& c) const;
};

// The dtype a backend holds tensor `t`, stored as `stored`, in for a run of config `c`: a matrix
// the model only multiplies (every one but the embedding tables, which are gathered, the token
// table also when a tied head multiplies it) in what the backend's GEMMs multiply under
// c.compute_dtype (Backend::gemm_weight_dtype), converted once when loaded; the rest as stored.
// Same bytes per row either way.
kernels::DType held_dtype(const policy::TensorSpec& t, const ModelConfig& c, kernels::DType stored,
                          const kernels::Backend& be);
// Converts `rows` rows of `cols` elements in place from `stored` to `held` (held_dtype).
void hold_rows(void* rows_data, kernels::DType stored, kernels::DType held, std::int64_t rows, std::int64_t cols);

// Every tensor of the model once, in load order: the input embedding, then per decoder layer
// its attention and MLP (a MoE layer's experts after its router), then the head.
std::vector<WeightSpec> weight_specs(const ModelConfig& cfg);
// The storage of the matrices for reports: the dtype, or where kept formats mix in, each
// with its count (e.g. "q4g32 x 210, q8g32 x 1").
std::string matrix_dtypes_text(const ModelConfig& cfg);

// A checkpoint (or a generator of random weights) that can read any row range of a
// canonical tensor, converted to the requested dtype.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Shape of the tensor as stored; nullopt when the source does not have it.
  virtual std::optional<std::vector<std::int64_t>> shape(const std::string& name) const = 0;
  // Where the tensor lives, for messages (e.g. "model.layers.0.mlp.up_proj.weight in DIR/x.safetensors").
  virtual std::string origin(const std::string& name) const = 0;
  // Reads rows [row_begin, row_end) (rows of the first dimension) into dst as `to`.
  virtual void read_rows(const std::string& name, std::int64_t row_begin, std::int64_t row_end, void* dst,
                         kernels::DType to) const = 0;
};

// A tensor in host memory.
struct HostTensor {
  kernels::DType dtype = kernels::DType::F32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::shared_ptr<std::byte[]> data;
  kernels::MatrixRef ref() const { return {data.get(), dtype, rows, cols}; }
  const float* f32() const { return reinterpret_cast<const float*>(data.get()); }
};

using HostWeights = std::map<std::string, HostTensor>;

// Checks that every tensor the config needs is in the source with the expected shape,
// then reads them (in parallel, tensor by tensor). Throws naming the tensor and origin.
HostWeights load_weights(const ModelConfig& cfg, const WeightSource& source);
// Only the shape checks of load_weights.
void check_weights(const ModelConfig& cfg, const WeightSource& source);

}  // namespace flexh2o::engine
