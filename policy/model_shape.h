// The model as the planner and the weight tables see it (engine::model_shape provides it from a
// ModelConfig): sizes and the features that decide which tensors each unit has.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "kernels/dtype.h"

namespace flexh2o::policy {

// Which projections and norms have bias vectors (fp32, like the norms' weights).
struct Biases {
  bool qkv = false, o = false, mlp = false, norm = false;
  Biases() = default;
  // true: biases everywhere (OPT).
  Biases(bool all) : qkv(all), o(all), mlp(all), norm(all) {}  // NOLINT(google-explicit-constructor)
  bool any() const { return qkv || o || mlp || norm; }
};

struct ModelShape {
  std::string name;
  std::int64_t layers = 0, hidden = 0, ffn = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
  bool gated_mlp = false;        // LLaMA: gate, up, down; OPT: fc1, fc2
  bool tied_embeddings = false;  // the output head reuses the input embedding
  kernels::DType weight_dtype = kernels::DType::F16;  // storage of the matrices (q4: compress_weight)
  kernels::DType cache_dtype = kernels::DType::F16;   // storage of the KV cache (with_compression sets it)
  std::int64_t extra_embedding_rows = 0;  // OPT's learned positions
  Biases biases{};
  // A pipeline stage (policy/pipeline.h) holds `layers` decoder layers and maybe neither end.
  bool input_embedding = true;  // holds the input embedding (and positions)
  bool output_head = true;      // holds the output head (a copy of a tied embedding on a later stage)
  // Under compress_weight, matrices a checkpoint already stores in one of the engine's group
  // formats keep it (GGUF Q4_0/Q4_1/Q8_0 blocks: q4g32/q8g32) instead of taking the policy's.
  // Per part (decoder layers, input embedding, output head): the widest such format, and
  // whether some matrices of the part have none (those take the policy's).
  struct KeptFormat {
    std::optional<kernels::DType> widest;
    bool partial = false;
  };
  KeptFormat kept_layers{}, kept_embedding{}, kept_head{};
  // Storage of the embedding (+ positions) and of the head where it is not weight_dtype
  // (with_compression sets them from the kept formats).
  std::optional<kernels::DType> embedding_dtype{}, head_dtype{};
  // Mixture-of-experts: `moe_layers` of the layers have `experts` gated experts of width
  // expert_ffn (top_k per token), a router and a shared expert of width shared_ffn (0: none)
  // in place of the dense MLP.
  std::int64_t moe_layers = 0, experts = 0, top_k = 0, expert_ffn = 0, shared_ffn = 0;
  // Per-head q/k norms (Qwen3), norms after each sublayer as well as before (sandwich: Gemma 2),
  // a final norm before the head.
  bool qk_norm = false, sandwich_norms = false, final_norm = true;
  // The embedding's width where it is narrower than hidden, with projections in and out
  // (OPT-350m); 0: hidden.
  std::int64_t embedding_width = 0;
  std::int64_t width() const { return embedding_width > 0 ? embedding_width : hidden; }
};

}  // namespace flexh2o::policy
