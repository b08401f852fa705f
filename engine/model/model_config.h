// A decoder-only transformer described by what changes its math, not by who the model is
// (CTranslate2's decoder spec): norm kind and placement, positions (learned or RoPE with its
// scaling), MLP kind, which projections have biases, q/k norm, attention scale, soft-caps,
// embedding scale, sliding windows and a tied head. A family (engine/families/) is a
// converter that reads one family's config.json and tensor names onto these fields; layers,
// weight sizes and the planner read the fields only.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/rope.h"

namespace flexh2o::engine {

enum class NormKind : std::uint8_t {
  LayerNorm,  // (x - mean) / std * w + b
  RmsNorm,    // x / rms * w (Gemma: * (1 + w), weight_offset 1)
};

// Where a decoder block's norms sit around each of its two sublayers (attention, MLP).
enum class NormPlacement : std::uint8_t {
  Pre,       // h += f(norm(h))                       (LLaMA, OPT)
  Post,      // h = norm(h + f(h))                     (OPT-350m: do_layer_norm_before false)
  Sandwich,  // h += norm_out(f(norm(h)))              (Gemma-2)
};

// RoPE and its context-extension variants (transformers' modeling_rope_utils.py).
enum class RopeType : std::uint8_t { Default, Linear, Dynamic, Llama3, Yarn, LongRope };

struct RopeConfig {
  RopeType type = RopeType::Default;
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;  // rotary_dim = int(head_dim * factor): the rest passes through
  kernels::RopeLayout layout = kernels::RopeLayout::RotateHalf;
  // Scaling parameters, as the config names them; 0 where a type does not use them.
  double factor = 0;                          // linear, dynamic, llama3, yarn, longrope (0: derived)
  double low_freq_factor = 0, high_freq_factor = 0;  // llama3
  std::int64_t original_max_positions = 0;    // llama3, yarn, longrope (0: max_positions)
  double attention_factor = 0;                // yarn, longrope: cos/sin multiplier (0: derived)
  double beta_fast = 32, beta_slow = 1;       // yarn
  double mscale = 0, mscale_all_dim = 0;      // yarn
  bool truncate = true;                       // yarn
  std::vector<double> short_factor, long_factor;  // longrope, one per rotated pair
  // Phi-3: when a sequence first grows past original_max_positions, HF drops its KV cache and
  // prefills the whole sequence again with the long factors (prepare_inputs_for_generation).
  bool reprefill_on_long = false;
};

// Mixture-of-experts MLPs (Mixtral, Qwen2-MoE, Qwen3-MoE): a router picks top_k of `experts`
// gated MLPs per token (softmax over all router logits in fp32, then the top k, renormalised
// when norm_topk); Qwen2-MoE adds an always-on shared expert scaled by sigmoid(gate . x).
struct MoeConfig {
  std::int64_t experts = 0;  // 0: every MLP is dense
  std::int64_t top_k = 0;
  std::int64_t expert_ffn = 0;
  bool norm_topk = true;
  std::int64_t shared_ffn = 0;     // 0: no shared expert
  std::vector<bool> layers;        // which decoder layers are MoE (the others dense, of width ffn)
};

// The largest sizes a model file may give, far above any real model (the largest have ~130
// layers, hidden 16384-25600, 128 heads of 256, 384 experts, vocab 262144, 10M positions).
// A corrupt or hostile value is an error naming the field and its limit before anything is
// allocated, and products of these (weight and KV cache bytes) stay far from 2^63.
struct ModelLimits {
  static constexpr std::int64_t kLayers = 1024;
  static constexpr std::int64_t kHidden = std::int64_t{1} << 17;     // also heads x head_dim
  static constexpr std::int64_t kFfn = std::int64_t{1} << 20;        // dense, expert and shared MLPs
  static constexpr std::int64_t kHeads = 1024;
  static constexpr std::int64_t kHeadDim = 1024;
  static constexpr std::int64_t kVocab = std::int64_t{1} << 22;
  static constexpr std::int64_t kPositions = std::int64_t{1} << 26;  // also windows
  static constexpr std::int64_t kExperts = 1024;
  static constexpr double kRopeFactor = 1024;                        // context-extension factors
  static constexpr std::int64_t kWeightBytes = std::int64_t{1} << 50;  // 1 PiB of weights
};

// Throws std::invalid_argument "`source`: field '`field`' = v is beyond ..." unless
// 0 <= value <= limit.
void check_size_field(const std::string& source, const std::string& field, std::int64_t value, std::int64_t limit);

struct ModelConfig {
  std::string name;
  std::string family;  // the converter that read it (reports only; nothing branches on it)
  std::int64_t n_layers = 0;
  std::int64_t hidden = 0;
  std::int64_t ffn = 0;
  std::int64_t n_heads = 0;
  std::int64_t n_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t vocab_size = 0;
  std::int64_t max_positions = 0;
  std::int64_t embed_dim = 0;  // width of the token embedding when not hidden (OPT-350m: project_in/out); 0 = hidden

  // Norms.
  NormKind norm = NormKind::RmsNorm;
  NormPlacement norm_placement = NormPlacement::Pre;
  float norm_eps = 1e-5f;
  float norm_weight_offset = 0.0f;  // Gemma's RMSNorm multiplies by (1 + w)
  bool final_norm = true;

  // Positions: learned rows added to the embedding (OPT, offset 2), or rotary.
  bool learned_positions = false;
  std::int64_t position_offset = 0;
  RopeConfig rope;

  // Attention.
  bool qkv_bias = false, o_bias = false;
  bool qk_norm = false;          // RMSNorm over head_dim of every q and k head before RoPE (Qwen3)
  float attn_scale = 0.0f;       // 0: 1/sqrt(head_dim)
  float attn_softcap = 0.0f;     // scores -> c * tanh(scores / c) before the softmax; 0: none
  std::vector<std::int64_t> layer_window;  // per layer: keys within the last W positions; 0 = all

  // MLP: down(act(gate(x)) * up(x)) when gated, else down(act(up(x))); or mixture-of-experts.
  bool gated_mlp = true;
  kernels::Activation mlp_act = kernels::Activation::Silu;
  bool mlp_bias = false;
  MoeConfig moe;

  // Embedding and head.
  bool tie_embeddings = false;
  float embed_scale = 1.0f;       // Gemma: sqrt(hidden), rounded to the weight dtype
  float final_softcap = 0.0f;     // logits -> c * tanh(logits / c); 0: none

  kernels::DType dtype = kernels::DType::F16;  // storage dtype of the weight matrices
  // Matrices the checkpoint already stores in one of the engine's group formats (a GGUF file's
  // Q4_0/Q4_1 blocks: q4g32, Q8_0: q8g32), by canonical name. When the matrices are
  // compressed (dtype quantized: compress_weight) these keep that format, read without loss,
  // instead of being quantized a second time; otherwise they are expanded to dtype.
  std::map<std::string, kernels::DType> stored_group_formats;
  // How projections multiply: F32, or BF16 (bf16 inputs, fp32 accumulation); a run setting
  // (--compute-dtype, resolved once per job: job_compute_dtype), not part of the checkpoint.
  // Every projection of every step uses it, whatever the step's rows.
  kernels::DType compute_dtype = kernels::DType::F32;
  std::int32_t bos_id = -1;                    // -1: none
  std::vector<std::int32_t> stop_ids;          // generation ends at any of these

  std::int64_t embedding_width() const { return embed_dim > 0 ? embed_dim : hidden; }
  bool moe_layer(std::int64_t layer) const {
    return moe.experts > 0 && moe.layers[static_cast<std::size_t>(layer)];
  }
  bool norm_has_bias() const { return norm == NormKind::LayerNorm; }
  bool rotary() const { return !learned_positions; }
  std::int64_t rotary_dim() const { return static_cast<std::int64_t>(head_dim * rope.partial_rotary_factor); }
  float attention_scale() const;
  // Positions a sequence may reach: the learned table's rows, the trained context for RoPE,
  // stretched by the factor of linear and YaRN scaling (as vLLM takes it); dynamic NTK
  // rescales to any length.
  std::int64_t position_limit() const;
  // The sliding window of decoder layer `layer` (0: none).
  std::int64_t window(std::int64_t layer) const;
  // Bytes of all weights at `dtype` (matrices) and fp32 (vectors).
  std::int64_t weight_bytes() const;
  // Throws std::invalid_argument naming `source` and the field that is inconsistent.
  // Checks check_limits first.
  void validate(const std::string& source) const;
  // Every size within ModelLimits, and the weights' bytes counted without overflow: called by
  // the readers as soon as the sizes are read, before anything is allocated per layer.
  void check_limits(const std::string& source) const;
};

// The same model with its weight matrices stored as `dtype` (compress_weight: q4; matrices in
// stored_group_formats then keep theirs).
inline ModelConfig with_weight_dtype(ModelConfig c, kernels::DType dtype) {
  c.dtype = dtype;
  return c;
}

}  // namespace flexh2o::engine
