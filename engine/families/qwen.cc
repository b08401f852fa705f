// Qwen2/2.5 (model_type qwen2): Llama with q/k/v biases; Qwen3 (qwen3): attention biases as
// configured (default none), RMSNorm of every q and k head before RoPE, head_dim 128 by default.
// Both slide only with use_sliding_window, on the layers from max_window_layers on (or as
// layer_types says). Their mixture-of-experts forms: qwen2_moe (a shared expert gated by
// sigmoid; top-k weights renormalised only with norm_topk_prob; dense layers from
// mlp_only_layers and decoder_sparse_step; qkv_bias as configured) and qwen3_moe (no shared
// expert). Experts as on the Hub (mlp.experts.E.{gate,up,down}_proj) or fused as transformers 5
// can write them (mlp.experts.gate_up_proj [E, 2I, H], gate rows first; down_proj [E, H, I]).
#include "engine/families/families.h"
#include "engine/families/llama_like.h"

namespace flexh2o::engine {

namespace {

bool slides(const HfConfig& j, std::int64_t layer) {
  return j.get<bool>("use_sliding_window", false) && layer >= j.get<std::int64_t>("max_window_layers", 0);
}

void read_windows(const HfConfig& j, ModelConfig& c) {
  // transformers drops the window when use_sliding_window is false, layer_types or not.
  if (j.get<bool>("use_sliding_window", false)) c.layer_window = read_layer_windows(j, c.n_layers, slides);
}

void qwen2_preset(ModelConfig& c) {
  llama_preset(c);
  c.qkv_bias = true;
}

void read_qwen2(const HfConfig& j, ModelConfig& c) {
  read_llama_like(j, c, /*tie_default=*/false);
  c.qkv_bias = true;  // hard-wired in Qwen2Attention, not a config field
  read_windows(j, c);
}

void read_qwen2_moe(const HfConfig& j, ModelConfig& c) {
  read_llama_like(j, c, /*tie_default=*/false, 0, /*experts=*/true);
  c.qkv_bias = j.get<bool>("qkv_bias", true);
  read_windows(j, c);
  c.moe = read_moe(j, c.n_layers, /*norm_default=*/false);
}

void qwen3_preset(ModelConfig& c) {
  llama_preset(c);
  c.qk_norm = true;
}

void read_qwen3(const HfConfig& j, ModelConfig& c) {
  read_llama_like(j, c, /*tie_default=*/false, /*head_dim_default=*/128);
  c.qkv_bias = c.o_bias = j.get<bool>("attention_bias", false);
  c.qk_norm = true;
  read_windows(j, c);
}

void read_qwen3_moe(const HfConfig& j, ModelConfig& c) {
  read_llama_like(j, c, /*tie_default=*/false, /*head_dim_default=*/128, /*experts=*/true);
  c.qkv_bias = c.o_bias = j.get<bool>("attention_bias", false);
  c.qk_norm = true;
  read_windows(j, c);
  c.moe = read_moe(j, c.n_layers, /*norm_default=*/false);
  if (c.moe.shared_ffn > 0) throw j.error("qwen3_moe has no shared expert, but 'shared_expert_intermediate_size' is set");
}

std::vector<HfTensorName> names(const ModelConfig&, const std::string& canonical) {
  return llama_like_names(canonical, llama_layer_names());
}

std::vector<HfTensorName> moe_names(const ModelConfig& c, const std::string& canonical) {
  static const LayerNames table = [] {
    LayerNames t = llama_layer_names();
    t["router"] = "mlp.gate.weight";
    t["shared.w_gate"] = "mlp.shared_expert.gate_proj.weight";
    t["shared.w_up"] = "mlp.shared_expert.up_proj.weight";
    t["shared.w_down"] = "mlp.shared_expert.down_proj.weight";
    t["shared_gate"] = "mlp.shared_expert_gate.weight";
    return t;
  }();
  if (auto expert = expert_names(c, canonical, {"gate_proj", "up_proj", "down_proj"}, "mlp.experts.")) return *expert;
  return llama_like_names(canonical, table);
}

}  // namespace

const Family kQwen2Family{"qwen2", qwen2_preset, read_qwen2, names};
const Family kQwen3Family{"qwen3", qwen3_preset, read_qwen3, names};
const Family kQwen2MoeFamily{"qwen2_moe", qwen2_preset, read_qwen2_moe, moe_names};
const Family kQwen3MoeFamily{"qwen3_moe", qwen3_preset, read_qwen3_moe, moe_names};

}  // namespace flexh2o::engine
