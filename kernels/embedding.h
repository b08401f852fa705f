// Row lookup in an embedding table (token and learned position embeddings).
#pragma once
#include <cstdint>
#include <span>

#include "kernels/gemm.h"

namespace flexh2o::kernels {

// out[i, :] (+)= scale * float(table[ids[i] + offset, :]); every index must be inside the table.
struct EmbeddingArgs {
  std::span<const std::int32_t> ids;  // host
  std::int64_t offset = 0;            // OPT's learned positions start at row 2
  MatrixRef table;
  float* out = nullptr;  // [ids.size(), table.cols]
  bool accumulate = false;
  float scale = 1.0f;  // Gemma multiplies embeddings by sqrt(hidden)
};

}  // namespace flexh2o::kernels
