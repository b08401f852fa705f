#include "engine/layers.h"

#include "engine/kv_eviction.h"

#include <cmath>
#include <stdexcept>

namespace flexh2o::engine {

namespace {

using kernels::MatrixRef;

const MatrixRef& get(const DeviceWeights& w, const std::string& name) {
  const auto it = w.find(name);
  if (it == w.end()) throw std::logic_error("weight '" + name + "' is not on the compute device");
  return it->second;
}
const float* vec(const DeviceWeights& w, const std::string& name) { return static_cast<const float*>(get(w, name).data); }

void norm(kernels::Backend& be, const ModelConfig& cfg, const DeviceWeights& w, const std::string& prefix,
          const float* x, float* y, std::int64_t rows) {
  kernels::NormArgs a{x, y, rows, cfg.hidden, vec(w, prefix + ".weight"), nullptr, cfg.norm_eps};
  if (cfg.family == Family::Opt) {
    a.bias = vec(w, prefix + ".bias");
    be.layer_norm(a);
  } else {
    be.rms_norm(a);
  }
}

class InputEmbed final : public Layer {
 public:
  explicit InputEmbed(const ModelConfig& cfg) : cfg_(cfg) {}
  std::string name() const override { return "input_embed"; }
  std::vector<std::string> weight_names() const override {
    if (cfg_.family == Family::Opt) return {"tok_embed", "pos_embed"};
    return {"tok_embed"};
  }
  void forward(kernels::Backend& be, const DeviceWeights& w, const StepBatch& s, Activations& act,
               const KvView*) const override {
    float* h = act.hidden;
    be.embedding({s.token_ids, 0, get(w, "tok_embed"), h, false});
    if (cfg_.family == Family::Opt) be.embedding({s.positions, 2, get(w, "pos_embed"), h, true});
  }

 private:
  const ModelConfig& cfg_;
};

class Attention final : public Layer {
 public:
  Attention(const ModelConfig& cfg, std::int64_t layer) : cfg_(cfg), p_("layers." + std::to_string(layer) + "."), layer_(layer) {}
  std::string name() const override { return "attention." + std::to_string(layer_); }
  std::int64_t cache_index() const override { return layer_; }
  std::vector<std::string> weight_names() const override {
    std::vector<std::string> n = {p_ + "attn_norm.weight", p_ + "wq", p_ + "wk", p_ + "wv", p_ + "wo"};
    if (cfg_.has_bias())
      for (const char* b : {"attn_norm.bias", "bq", "bk", "bv", "bo"}) n.push_back(p_ + b);
    return n;
  }
  void forward(kernels::Backend& be, const DeviceWeights& w, const StepBatch& s, Activations& act,
               const KvView* cache) const override {
    if (!cache) throw std::logic_error("attention layer run without a KV cache");
    const std::int64_t rows = s.rows();
    const bool bias = cfg_.has_bias();
    auto b = [&](const char* n) { return bias ? vec(w, p_ + n) : nullptr; };
    float* h = act.hidden;
    float* x = act.normed.as<float>();
    norm(be, cfg_, w, p_ + "attn_norm", h, x, rows);
    float *q = act.q.as<float>(), *k = act.k.as<float>(), *v = act.v.as<float>();
    be.gemm({x, rows, get(w, p_ + "wq"), b("bq"), q, 0.0f});
    be.gemm({x, rows, get(w, p_ + "wk"), b("bk"), k, 0.0f});
    be.gemm({x, rows, get(w, p_ + "wv"), b("bv"), v, 0.0f});
    if (cfg_.family == Family::Llama) {
      be.rope({q, rows, cfg_.n_heads, cfg_.head_dim, s.positions, cfg_.rope_theta, cfg_.rope_layout});
      be.rope({k, rows, cfg_.n_kv_heads, cfg_.head_dim, s.positions, cfg_.rope_theta, cfg_.rope_layout});
    }
    const kernels::AttentionShape shape{cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim,
                                        1.0f / std::sqrt(static_cast<float>(cfg_.head_dim))};
    float* o = act.attn.as<float>();
    const std::int64_t qw = cfg_.n_heads * cfg_.head_dim, kw = cfg_.n_kv_heads * cfg_.head_dim;
    for (const KvPart& part : cache->parts) {
      // Each run of sequences attends over its own part of the cache: rows [r0, ...) of the step.
      const bool whole = part.seq_begin == 0 && part.seq_end == s.batch();
      const StepBatch sub = whole ? StepBatch{} : s.slice(part.seq_begin, part.seq_end);
      const StepBatch& p = whole ? s : sub;
      const std::int64_t r0 = whole ? 0 : s.first_row(part.seq_begin);
      if (KvEvictionLayer* ev = cache->eviction) {
        // The policy picks the slots: writes, attention and evictions go through it.
        const auto run = s.prefill ? &KvEvictionLayer::prefill : &KvEvictionLayer::decode;
        (ev->*run)(be, p, part.seq_begin, shape, q + r0 * qw, k + r0 * kw, v + r0 * kw, o + r0 * qw, part, *cache);
        continue;
      }
      const auto dt = cache->dtype;
      be.kv_write({k + r0 * kw, part.k, cfg_.n_kv_heads, cfg_.head_dim, cache->capacity, p.row_seq, p.row_slot, {}, dt});
      be.kv_write({v + r0 * kw, part.v, cfg_.n_kv_heads, cfg_.head_dim, cache->capacity, p.row_seq, p.row_slot, {}, dt});
      if (s.prefill)
        be.attention_prefill({shape, q + r0 * qw, k + r0 * kw, v + r0 * kw, o + r0 * qw, p.seq_offsets, nullptr, {}});
      else
        be.attention_decode({shape, q + r0 * qw, part.k, part.v, cache->capacity, p.lens, o + r0 * qw, nullptr, dt});
    }
    be.gemm({o, rows, get(w, p_ + "wo"), b("bo"), h, 1.0f});  // residual: h += o @ wo^T
  }

 private:
  const ModelConfig& cfg_;
  std::string p_;
  std::int64_t layer_;
};

class Mlp final : public Layer {
 public:
  Mlp(const ModelConfig& cfg, std::int64_t layer) : cfg_(cfg), p_("layers." + std::to_string(layer) + "."), layer_(layer) {}
  std::string name() const override { return "mlp." + std::to_string(layer_); }
  std::vector<std::string> weight_names() const override {
    if (cfg_.family == Family::Opt)
      return {p_ + "mlp_norm.weight", p_ + "mlp_norm.bias", p_ + "fc1", p_ + "fc1_bias", p_ + "fc2", p_ + "fc2_bias"};
    return {p_ + "mlp_norm.weight", p_ + "w_gate", p_ + "w_up", p_ + "w_down"};
  }
  void forward(kernels::Backend& be, const DeviceWeights& w, const StepBatch& s, Activations& act,
               const KvView*) const override {
    const std::int64_t rows = s.rows();
    float* h = act.hidden;
    float* x = act.normed.as<float>();
    float *a = act.ffn_a.as<float>(), *b = act.ffn_b.as<float>();
    norm(be, cfg_, w, p_ + "mlp_norm", h, x, rows);
    if (cfg_.family == Family::Opt) {
      be.gemm({x, rows, get(w, p_ + "fc1"), vec(w, p_ + "fc1_bias"), a, 0.0f});
      be.activation(kernels::Activation::Relu, a, rows * cfg_.ffn);
      be.gemm({a, rows, get(w, p_ + "fc2"), vec(w, p_ + "fc2_bias"), h, 1.0f});
    } else {
      be.gemm({x, rows, get(w, p_ + "w_gate"), nullptr, a, 0.0f});
      be.gemm({x, rows, get(w, p_ + "w_up"), nullptr, b, 0.0f});
      be.silu_mul(a, b, a, rows * cfg_.ffn);
      be.gemm({a, rows, get(w, p_ + "w_down"), nullptr, h, 1.0f});
    }
  }

 private:
  const ModelConfig& cfg_;
  std::string p_;
  std::int64_t layer_;
};

class OutputEmbed final : public Layer {
 public:
  explicit OutputEmbed(const ModelConfig& cfg) : cfg_(cfg) {}
  std::string name() const override { return "output_embed"; }
  std::vector<std::string> weight_names() const override {
    std::vector<std::string> n = {"final_norm.weight", cfg_.tie_embeddings ? "tok_embed" : "lm_head"};
    if (cfg_.has_bias()) n.push_back("final_norm.bias");
    return n;
  }
  void forward(kernels::Backend& be, const DeviceWeights& w, const StepBatch& s, Activations& act,
               const KvView*) const override {
    const std::int64_t B = s.batch(), H = cfg_.hidden;
    const float* h = act.hidden;
    float* last = act.last.as<float>();
    for (std::int64_t b = 0; b < B; ++b)
      be.copy_on_device(last + b * H, h + s.last_rows[b] * H, static_cast<std::size_t>(H) * sizeof(float));
    norm(be, cfg_, w, "final_norm", last, last, B);
    be.gemm({last, B, get(w, cfg_.tie_embeddings ? "tok_embed" : "lm_head"), nullptr, act.logits.as<float>(), 0.0f});
  }

 private:
  const ModelConfig& cfg_;
};

}  // namespace

Activations::Activations(kernels::Backend& be, const ModelConfig& c, std::int64_t rows, std::int64_t batch)
    : max_rows(rows), max_batch(batch) {
  const auto f = sizeof(float);
  const auto r = static_cast<std::size_t>(rows);
  normed = {be, r * c.hidden * f};
  q = {be, r * c.n_heads * c.head_dim * f};
  attn = {be, r * c.n_heads * c.head_dim * f};
  k = {be, r * c.n_kv_heads * c.head_dim * f};
  v = {be, r * c.n_kv_heads * c.head_dim * f};
  ffn_a = {be, r * c.ffn * f};
  ffn_b = {be, c.family == Family::Llama ? r * c.ffn * f : 0};
  last = {be, static_cast<std::size_t>(batch) * c.hidden * f};
  logits = {be, static_cast<std::size_t>(batch) * c.vocab_size * f};
}

std::int64_t Activations::bytes(const ModelConfig& c, std::int64_t rows, std::int64_t batch) {
  const std::int64_t per_row = 2 * c.hidden + 2 * c.n_heads * c.head_dim + 2 * c.n_kv_heads * c.head_dim +
                               (c.family == Family::Llama ? 2 : 1) * c.ffn;
  return static_cast<std::int64_t>(sizeof(float)) * (rows * per_row + batch * (c.hidden + c.vocab_size));
}

KvCache::KvCache(kernels::Backend& be, const ModelConfig& cfg, std::int64_t batch, std::int64_t capacity,
                 kernels::DType dtype) {
  const auto bytes = static_cast<std::size_t>(batch * cfg.n_kv_heads * capacity * kernels::kv_slot_bytes(dtype, cfg.head_dim));
  k = {be, bytes};
  v = {be, bytes};
  view = {capacity, dtype, {{0, batch, k.data(), v.data()}}};
}

std::vector<std::unique_ptr<Layer>> build_layers(const ModelConfig& cfg) {
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<InputEmbed>(cfg));
  for (std::int64_t i = 0; i < cfg.n_layers; ++i) {
    layers.push_back(std::make_unique<Attention>(cfg, i));
    layers.push_back(std::make_unique<Mlp>(cfg, i));
  }
  layers.push_back(std::make_unique<OutputEmbed>(cfg));
  return layers;
}

}  // namespace flexh2o::engine
