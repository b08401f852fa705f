#include "engine/model/layers.h"

#include <algorithm>
#include <cmath>
#include <array>
#include <utility>
#include <optional>
#include <span>
#include <stdexcept>
#include <vector>

#include "engine/model/kv_eviction.h"
#include "engine/model/model_shape.h"
#include "engine/model/rope_scaling.h"
#include "engine/model/weights.h"

namespace flexh2o::engine {

namespace {

// The shared prefixes of one decode call's queries (kernels::AttentionDecodeArgs): query i
// reads the cache row of sequence query_seq[i] of `p` (the call's rows are p's sequences); a
// group's prefix is read from the row of its first sequence in `p`, the run the call is part
// of, whichever of its rows the call takes (the staging loads a group's prefix into that row
// only: CacheRing::prefix_read_elsewhere). A held prefix is read from its pool row, the query's
// own row starting after it (row_base). Empty when none.
struct CallPrefixes {
  std::vector<kernels::SharedPrefix> prefixes;
  std::vector<std::int64_t> prefix_of, row_base;
  bool held = false;  // the prefixes are pool rows
};
CallPrefixes call_prefixes(const StepBatch& p, std::span<const std::int64_t> query_seq) {
  CallPrefixes c;
  std::vector<std::int64_t> ids;  // per prefix: its group, or -2 - its pool row
  for (const std::int64_t seq : query_seq) {
    const auto b = static_cast<std::size_t>(seq);
    const std::int64_t group = p.prefix_group[b], row = p.pool_row[b];
    c.row_base.push_back(p.base[b]);
    c.held = c.held || row >= 0;
    if (group < 0 && row < 0) {
      c.prefix_of.push_back(-1);
      continue;
    }
    const std::int64_t id = row >= 0 ? -2 - row : group;
    const auto at = std::ranges::find(ids, id);
    c.prefix_of.push_back(at - ids.begin());
    if (at != ids.end()) continue;
    ids.push_back(id);
    const auto holder = std::ranges::find(p.prefix_group, group) - p.prefix_group.begin();
    c.prefixes.push_back(row >= 0 ? kernels::SharedPrefix{row, p.base[b]} : kernels::SharedPrefix{holder, p.prefix_len[b]});
  }
  if (c.prefixes.empty()) c.prefix_of.clear();
  if (!c.held) c.row_base.clear();
  return c;
}

// The pool of a call that reads held prefixes.
kernels::AttentionDecodeArgs::PrefixCache pool_of(const CallPrefixes& c, const KvView& cache) {
  if (!c.held) return {};
  return {cache.pool.k, cache.pool.v, cache.pool.capacity};
}

// The input of projections: fp32, or already rounded to bf16 by the op that wrote it where the
// backend takes bf16 GEMM inputs under bf16 compute (the rounding the GEMM would do, saving
// it a pass of its own), row i at bf16 + i * stride.
struct GemmInput {
  const float* f32 = nullptr;
  const std::uint16_t* bf16 = nullptr;
  std::int64_t stride = 0;
};

bool bf16_gemm_inputs(const kernels::Backend& be, const ModelConfig& cfg) {
  return cfg.compute_dtype == kernels::DType::BF16 && be.takes_bf16_gemm_inputs();
}

// A projection, in the run's compute dtype.
void linear(kernels::Backend& be, const ModelConfig& cfg, kernels::GemmArgs a) {
  a.compute = cfg.compute_dtype;
  be.gemm(a);
}

// A projection of `in` (a.x unset).
void linear(kernels::Backend& be, const ModelConfig& cfg, const GemmInput& in, kernels::GemmArgs a) {
  a.x = in.f32;
  a.x_bf16 = in.bf16;
  a.x_stride = in.bf16 ? in.stride : 0;
  linear(be, cfg, a);
}

// norm(x) (rows of cfg.hidden), into y (x may equal y) or added to it.
void norm(kernels::Backend& be, const ModelConfig& cfg, const NormWeights& n, kernels::NormArgs a) {
  a.cols = cfg.hidden;
  a.weight = n.weight;
  a.eps = cfg.norm_eps;
  a.weight_offset = cfg.norm_weight_offset;
  if (cfg.norm_has_bias()) {
    a.bias = n.bias;
    be.layer_norm(a);
  } else {
    be.rms_norm(a);
  }
}

void norm(kernels::Backend& be, const ModelConfig& cfg, const NormWeights& n, const float* x, float* y,
          std::int64_t rows) {
  norm(be, cfg, n, {.x = x, .y = y, .rows = rows});
}

// norm(h) as the input of the projections after it, in `buffer` (rows of cfg.hidden fp32).
GemmInput norm_for_gemm(kernels::Backend& be, const ModelConfig& cfg, const NormWeights& n, const float* h,
                        kernels::DeviceBuffer& buffer, std::int64_t rows) {
  if (!bf16_gemm_inputs(be, cfg)) {
    norm(be, cfg, n, h, buffer.as<float>(), rows);
    return {buffer.as<float>()};
  }
  norm(be, cfg, n, {.x = h, .rows = rows, .y_bf16 = buffer.as<std::uint16_t>()});
  return {nullptr, buffer.as<std::uint16_t>(), cfg.hidden};
}

// A sublayer's output `out` (rows of hidden, from `project`) joins the residual stream h as
// the norm placement says: h += out (pre); h = norm(h + out) (post); h += norm(out) (sandwich).
// `scratch` holds `out` when it must be normed before the add.
template <class Project>
void add_to_stream(kernels::Backend& be, const ModelConfig& cfg, const NormWeights& in_norm, const NormWeights& out_norm,
                   float* h, float* scratch, std::int64_t rows, Project project) {
  switch (cfg.norm_placement) {
    case NormPlacement::Pre:
      project(h, 1.0f);
      return;
    case NormPlacement::Post:
      project(h, 1.0f);
      norm(be, cfg, in_norm, h, h, rows);
      return;
    case NormPlacement::Sandwich:
      project(scratch, 0.0f);
      norm(be, cfg, out_norm, {.x = scratch, .y = h, .rows = rows, .accumulate = true});
      return;
  }
}

class InputEmbed final : public Layer {
 public:
  InputEmbed(const ModelConfig& cfg, const policy::ModelShape& m) : Layer(policy::input_embedding_tensors(m)), cfg_(cfg) {}
  std::string name() const override { return "input_embed"; }
  LayerWeights empty_weights() const override { return EmbeddingWeights{}; }
  void forward(kernels::Backend& be, const LayerWeights& lw, const StepBatch& s, Activations& act,
               const KvView*) const override {
    const auto& w = std::get<EmbeddingWeights>(lw);
    float* h = act.hidden;
    if (cfg_.embedding_width() != cfg_.hidden) {  // a narrower embedding, projected in (OPT-350m)
      float* e = act.embed.as<float>();
      be.embedding({.ids = s.token_ids, .table = w.tokens, .out = e, .scale = cfg_.embed_scale});
      linear(be, cfg_, {e, s.rows(), w.project_in, nullptr, h, 0.0f});
    } else {
      be.embedding({.ids = s.token_ids, .table = w.tokens, .out = h, .scale = cfg_.embed_scale});
    }
    if (cfg_.learned_positions)
      be.embedding({.ids = s.positions, .offset = cfg_.position_offset, .table = w.positions, .out = h,
                    .accumulate = true});
  }

 private:
  const ModelConfig& cfg_;
};

class Attention final : public Layer {
 public:
  Attention(const ModelConfig& cfg, const policy::ModelShape& m, std::int64_t layer)
      : Layer(policy::attention_tensors(m, layer)), cfg_(cfg), layer_(layer) {
    if (cfg_.rotary() && !rope_depends_on_length(cfg_.rope)) fixed_rope_ = rope_frequencies(cfg_, 0);
  }
  std::string name() const override { return "attention." + std::to_string(layer_); }
  std::int64_t cache_index() const override { return layer_; }
  LayerWeights empty_weights() const override { return AttentionWeights{}; }
  void forward(kernels::Backend& be, const LayerWeights& lw, const StepBatch& s, Activations& act,
               const KvView* cache) const override {
    if (!cache) throw std::logic_error("attention layer run without a KV cache");
    const auto& w = std::get<AttentionWeights>(lw);
    const std::int64_t rows = s.rows();
    float* h = act.hidden;
    // OPT-350m norms after the residual add: the sublayer reads the stream itself.
    const GemmInput x = cfg_.norm_placement == NormPlacement::Post ? GemmInput{h}
                                                                  : norm_for_gemm(be, cfg_, w.norm, h, act.normed, rows);
    float *q = act.q.as<float>(), *k = act.k.as<float>(), *v = act.v.as<float>();
    linear(be, cfg_, x, {.m = rows, .w = w.wq, .bias = w.bq, .y = q});
    linear(be, cfg_, x, {.m = rows, .w = w.wk, .bias = w.bk, .y = k});
    linear(be, cfg_, x, {.m = rows, .w = w.wv, .bias = w.bv, .y = v});
    if (cfg_.qk_norm) {  // per head, before RoPE (Qwen3)
      be.rms_norm({.x = q, .y = q, .rows = rows * cfg_.n_heads, .cols = cfg_.head_dim, .weight = w.q_norm,
                   .eps = cfg_.norm_eps, .weight_offset = cfg_.norm_weight_offset});
      be.rms_norm({.x = k, .y = k, .rows = rows * cfg_.n_kv_heads, .cols = cfg_.head_dim, .weight = w.k_norm,
                   .eps = cfg_.norm_eps, .weight_offset = cfg_.norm_weight_offset});
    }
    if (cfg_.rotary()) {
      rope(be, s, q, cfg_.n_heads);
      rope(be, s, k, cfg_.n_kv_heads);
    }
    const kernels::AttentionShape shape{cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim, cfg_.attention_scale(),
                                        cfg_.attn_softcap, cfg_.window(layer_)};
    float* o = act.attn.as<float>();
    const Rows projected{q, k, v, o, s.batch()};
    for (const KvPart& part : cache->parts)
      for_each_run(s, part, *cache, [&](const StepBatch& p, std::int64_t r0, const KvPart& run) {
        attend(be, p, r0, run, *cache, shape, projected);
      });
    add_to_stream(be, cfg_, w.norm, w.out_norm, h, act.normed.as<float>(), rows,
                  [&](float* y, float beta) { linear(be, cfg_, {o, rows, w.wo, w.bo, y, beta}); });
  }

 private:
  // The runs of consecutive sequences of one kind (prefill, extend or decode; idle ones skipped) within
  // `part`, each as a batch of its own with its first row and its own part of the cache.
  template <class Run>
  void for_each_run(const StepBatch& s, const KvPart& part, const KvView& cache, Run run) const {
    const std::int64_t row_bytes = cfg_.n_kv_heads * cache.capacity * kernels::kv_slot_bytes(cache.dtype, cfg_.head_dim);
    for (std::int64_t b0 = part.seq_begin; b0 < part.seq_end;) {
      const SeqStep kind = s.kinds[static_cast<std::size_t>(b0)];
      std::int64_t b1 = b0 + 1;
      while (b1 < part.seq_end && s.kinds[static_cast<std::size_t>(b1)] == kind) ++b1;
      if (kind != SeqStep::Idle) {
        const bool whole = b0 == 0 && b1 == s.batch();
        const StepBatch sub = whole ? StepBatch{} : s.slice(b0, b1);
        const std::int64_t skip = (b0 - part.seq_begin) * row_bytes;
        const KvPart sub_part{b0, b1, static_cast<std::byte*>(part.k) + skip, static_cast<std::byte*>(part.v) + skip};
        run(whole ? s : sub, s.first_row(b0), sub_part);
      }
      b0 = b1;
    }
  }
  // The step's projected rows, and the sequences of its batch (the most queries one decode
  // call may take: the op scratch reserved for the step counts that many).
  struct Rows {
    const float* q;
    float *k, *v;  // rounded in place to a 16-bit cache's dtype for prompt rows
    float* out;
    std::int64_t batch;
  };
  // One run of sequences of one kind (`p`, rows [r0, ...) of the step) attends over `part`.
  void attend(kernels::Backend& be, const StepBatch& p, std::int64_t r0, const KvPart& part, const KvView& cache,
              const kernels::AttentionShape& shape, const Rows& step) const {
    const std::int64_t qw = cfg_.n_heads * cfg_.head_dim, kw = cfg_.n_kv_heads * cfg_.head_dim;
    const float* q = step.q;
    float *k = step.k, *v = step.v;
    float* o = step.out;
    const bool extends = p.kinds.front() == SeqStep::Extend;
    if (KvEvictionLayer* ev = cache.eviction) {
      if (extends) throw std::logic_error("a shared prompt prefix under KV eviction (sharing needs the full cache)");
      // The policy picks the slots: writes, attention and evictions go through it.
      const auto run = p.prefill ? &KvEvictionLayer::prefill : &KvEvictionLayer::decode;
      (ev->*run)(be, p, part.seq_begin, shape, q + r0 * qw, k + r0 * kw, v + r0 * kw, o + r0 * qw, part, cache);
      return;
    }
    const auto dt = cache.dtype;
    write_kv(be, p, part, cache, k + r0 * kw, v + r0 * kw);
    // Prompt rows attend over their K/V as the cache stores them, as every later step reads
    // them: a prompt's tokens then do not depend on whether a prefix of it was computed in
    // this step or taken from another row (docs/prefix-sharing.md). A compressed cache's are
    // read back from it; a 16-bit cache's are the step's rows rounded to its dtype.
    if (extends || (p.prefill && kernels::is_quantized(dt))) {
      extend(be, p, part, cache, shape, q + r0 * qw, o + r0 * qw, step.batch);
    } else if (p.prefill) {
      if (dt == kernels::DType::F16 || dt == kernels::DType::BF16) {
        be.round_to_dtype(dt, k + r0 * kw, p.rows() * kw);
        be.round_to_dtype(dt, v + r0 * kw, p.rows() * kw);
      }
      be.attention_prefill({.shape = shape, .q = q + r0 * qw, .k = k + r0 * kw, .v = v + r0 * kw, .out = o + r0 * qw,
                            .seq_offsets = p.seq_offsets, .compute = cfg_.compute_dtype});
    } else {
      std::vector<std::int64_t> seqs(static_cast<std::size_t>(p.batch()));
      for (std::size_t b = 0; b < seqs.size(); ++b) seqs[b] = static_cast<std::int64_t>(b);
      const CallPrefixes shared = call_prefixes(p, seqs);
      be.attention_decode({.shape = shape, .q = q + r0 * qw, .k_cache = part.k, .v_cache = part.v,
                           .capacity = cache.capacity, .lens = p.lens, .out = o + r0 * qw, .cache_dtype = dt,
                           .shared_prefixes = shared.prefixes, .prefix_of = shared.prefix_of,
                           .prefix_cache = pool_of(shared, cache), .row_base = shared.row_base});
    }
  }
  // The step's new K/V (k and v: its rows of `p`) into their slots: the sequences' rows of
  // `part`, and a prefill's rows before its held base into its pool row (then two writes of all
  // the rows, each dropping the other's: slot -1).
  void write_kv(kernels::Backend& be, const StepBatch& p, const KvPart& part, const KvView& cache, const float* k,
                const float* v) const {
    const std::int64_t H = cfg_.n_kv_heads;
    auto write = [&](void* k_cache, void* v_cache, std::int64_t capacity, std::span<const std::int64_t> seq,
                     std::span<const std::int64_t> head_slot) {
      for (const auto& [src, dst] : {std::pair{k, k_cache}, std::pair{v, v_cache}})
        be.kv_write({.src = src, .cache = dst, .n_kv_heads = H, .head_dim = cfg_.head_dim, .capacity = capacity,
                     .seq = seq, .slot = p.row_slot, .head_slot = head_slot, .cache_dtype = cache.dtype});
    };
    bool pool = false;
    for (std::int64_t r = 0; r < p.rows() && !pool; ++r) pool = p.writes_pool(r);
    if (!pool) return write(part.k, part.v, cache.capacity, p.row_seq, {});
    std::vector<std::int64_t> own(static_cast<std::size_t>(p.rows() * H)), held(own.size());
    std::vector<std::int64_t> pool_seq(static_cast<std::size_t>(p.rows()), 0);
    for (std::int64_t r = 0; r < p.rows(); ++r) {
      const auto i = static_cast<std::size_t>(r);
      const bool to_pool = p.writes_pool(r);
      if (to_pool) pool_seq[i] = p.pool_row[static_cast<std::size_t>(p.row_seq[i])];
      std::fill_n(own.begin() + r * H, H, to_pool ? -1 : p.row_slot[i]);
      std::fill_n(held.begin() + r * H, H, to_pool ? p.row_slot[i] : -1);
    }
    write(cache.pool.k, cache.pool.v, cache.pool.capacity, pool_seq, held);
    write(part.k, part.v, cache.capacity, p.row_seq, own);
  }
  // Prompt rows whose K/V are written at their positions (after a cached prefix, or from the
  // start): each row is a decode query over its sequence's cache row, seeing the slots up to
  // its own; at most `batch` queries a call where the backend reserves op scratch for that many.
  // A prefill's rows before its held base attend over its pool row as their own cache row (no
  // shared prefix: the pool then holds what a prefill of its own would, bit for bit).
  void extend(kernels::Backend& be, const StepBatch& p, const KvPart& part, const KvView& cache,
              const kernels::AttentionShape& shape, const float* q, float* o, std::int64_t batch) const {
    const std::int64_t qw = cfg_.n_heads * cfg_.head_dim;
    const bool scratch = be.attention_scratch_bytes(shape, 0, batch, cache.capacity, false) > 0;
    const std::int64_t per_call = scratch ? batch : std::max<std::int64_t>(p.rows(), 1);
    std::vector<std::int64_t> lens(p.positions.size()), pool_rows(p.positions.size());
    for (std::size_t r = 0; r < lens.size(); ++r) {
      lens[r] = p.positions[r] + 1;
      pool_rows[r] = p.pool_row[static_cast<std::size_t>(p.row_seq[r])];
    }
    for (std::int64_t r0 = 0; r0 < p.rows();) {
      const bool to_pool = p.writes_pool(r0);
      std::int64_t r1 = r0 + 1;
      while (r1 < p.rows() && r1 - r0 < per_call && p.writes_pool(r1) == to_pool) ++r1;
      const auto first = static_cast<std::size_t>(r0), n = static_cast<std::size_t>(r1 - r0);
      const auto row_lens = std::span(lens).subspan(first, n);
      if (to_pool) {
        be.attention_decode({.shape = shape, .q = q + r0 * qw, .k_cache = cache.pool.k, .v_cache = cache.pool.v,
                             .capacity = cache.pool.capacity, .lens = row_lens, .out = o + r0 * qw,
                             .cache_dtype = cache.dtype, .cache_rows = std::span(pool_rows).subspan(first, n),
                             .compute = cfg_.compute_dtype});
      } else {
        const auto rows = std::span(p.row_seq).subspan(first, n);
        const CallPrefixes shared = call_prefixes(p, rows);
        be.attention_decode({.shape = shape, .q = q + r0 * qw, .k_cache = part.k, .v_cache = part.v,
                             .capacity = cache.capacity, .lens = row_lens, .out = o + r0 * qw,
                             .cache_dtype = cache.dtype, .cache_rows = rows, .compute = cfg_.compute_dtype,
                             .shared_prefixes = shared.prefixes, .prefix_of = shared.prefix_of,
                             .prefix_cache = pool_of(shared, cache), .row_base = shared.row_base});
      }
      r0 = r1;
    }
  }
  // RoPE on rows of `heads` heads. Frequencies that depend on a sequence's length (dynamic,
  // LongRoPE) follow each sequence's longest position in this step, as transformers takes
  // max(position_ids) + 1 of its batch of one; runs of sequences that share them go together.
  void rope(kernels::Backend& be, const StepBatch& s, float* x, std::int64_t heads) const {
    auto apply = [&](std::int64_t r0, std::int64_t r1, const RopeFrequencies& f) {
      be.rope({.x = x + r0 * heads * cfg_.head_dim,
               .tokens = r1 - r0,
               .heads = heads,
               .head_dim = cfg_.head_dim,
               .rotary_dim = cfg_.rotary_dim(),
               .positions = std::span(s.positions).subspan(static_cast<std::size_t>(r0), static_cast<std::size_t>(r1 - r0)),
               .inv_freq = f.inv_freq,
               .attention_factor = f.attention_factor,
               .layout = cfg_.rope.layout});
    };
    if (fixed_rope_) return apply(0, s.rows(), *fixed_rope_);
    std::int64_t run_begin = 0, run_len = -1;
    RopeFrequencies run_freq;
    for (std::int64_t b = 0; b < s.batch(); ++b) {
      const std::int64_t r0 = s.first_row(b), r1 = b + 1 < s.batch() ? s.first_row(b + 1) : s.rows();
      if (r0 == r1) continue;
      // Sequences whose lengths give the same frequencies share a call.
      const std::int64_t len = rope_length_class(s.positions[static_cast<std::size_t>(r1 - 1)] + 1);
      if (len != run_len) {
        if (run_len >= 0) apply(run_begin, r0, run_freq);
        run_begin = r0;
        run_len = len;
        run_freq = rope_frequencies(cfg_, len);
      }
    }
    if (run_len >= 0) apply(run_begin, s.rows(), run_freq);
  }
  // A length that gives the same frequencies as seq_len (every length up to the point where
  // the frequencies start to change maps to that point).
  std::int64_t rope_length_class(std::int64_t seq_len) const {
    if (cfg_.rope.type == RopeType::LongRope) return rope_uses_long_factors(cfg_, seq_len) ? cfg_.max_positions + 1 : 0;
    return std::max(seq_len, cfg_.max_positions);  // dynamic NTK
  }

  const ModelConfig& cfg_;
  std::int64_t layer_;
  std::optional<RopeFrequencies> fixed_rope_;
};

// The activation `f` (x and out unset) of `x` in place, as the input of the projection after
// it: in fp32, or in bf16 in the first half of each of x's rows (BiasActArgs) where the
// backend takes bf16 GEMM inputs.
GemmInput activate_for_gemm(kernels::Backend& be, const ModelConfig& cfg, float* x, kernels::BiasActArgs f) {
  f.x = x;
  if (!bf16_gemm_inputs(be, cfg)) {
    f.out = x;
    be.bias_act(f);
    return {x};
  }
  f.out_bf16 = reinterpret_cast<std::uint16_t*>(x);
  f.out_stride = 2 * f.cols;
  be.bias_act(f);
  return {nullptr, f.out_bf16, f.out_stride};
}

class Mlp final : public Layer {
 public:
  Mlp(const ModelConfig& cfg, const policy::ModelShape& m, std::int64_t layer)
      : Layer(policy::mlp_tensors(m, layer)), cfg_(cfg), layer_(layer) {}
  std::string name() const override { return "mlp." + std::to_string(layer_); }
  LayerWeights empty_weights() const override { return MlpWeights{}; }
  void forward(kernels::Backend& be, const LayerWeights& lw, const StepBatch& s, Activations& act,
               const KvView*) const override {
    const auto& w = std::get<MlpWeights>(lw);
    const std::int64_t rows = s.rows();
    float* h = act.hidden;
    const GemmInput x = cfg_.norm_placement == NormPlacement::Post ? GemmInput{h}
                                                                  : norm_for_gemm(be, cfg_, w.norm, h, act.normed, rows);
    float *a = act.ffn_a.as<float>(), *b = act.ffn_b.as<float>();
    // act(gate) * up, or act(up + bias) (the bias joins the activation's pass instead of one
    // after the GEMM).
    kernels::BiasActArgs f{.act = cfg_.mlp_act, .rows = rows, .cols = cfg_.ffn};
    if (cfg_.gated_mlp) {
      linear(be, cfg_, x, {.m = rows, .w = w.gate, .bias = w.b_gate, .y = a});
      linear(be, cfg_, x, {.m = rows, .w = w.up, .bias = w.b_up, .y = b});
      f.up = b;
    } else {
      linear(be, cfg_, x, {.m = rows, .w = w.up, .y = a});
      f.bias = w.b_up;
    }
    const GemmInput down_in = activate_for_gemm(be, cfg_, a, f);
    add_to_stream(be, cfg_, w.norm, w.out_norm, h, act.normed.as<float>(), rows, [&](float* y, float beta) {
      linear(be, cfg_, down_in, {.m = rows, .w = w.down, .bias = w.b_down, .y = y, .beta = beta});
    });
  }

 private:
  const ModelConfig& cfg_;
  std::int64_t layer_;
};

// A mixture-of-experts MLP (pre-norm): the router's top-k experts per row, plus Qwen2-MoE's
// shared expert, which runs as one more expert every row is routed to with weight
// sigmoid(shared_gate . x).
class MoeMlp final : public Layer {
 public:
  MoeMlp(const ModelConfig& cfg, const policy::ModelShape& m, std::int64_t layer)
      : Layer(policy::moe_tensors(m, layer), all_expert_tensors(m, layer)), cfg_(cfg), layer_(layer) {}
  std::string name() const override { return "mlp." + std::to_string(layer_); }
  LayerWeights empty_weights() const override {
    MoeWeights w;
    w.experts.resize(static_cast<std::size_t>(cfg_.moe.experts));
    return w;
  }

  // The experts each row of the step goes to (with weights), from the router on norm(h); the
  // shared expert as expert E, weighted by sigmoid(shared_gate . x) per row.
  ExpertRouting route_experts(kernels::Backend& be, const LayerWeights& lw, const StepBatch& s,
                              Activations& act) const override {
    const auto& w = std::get<MoeWeights>(lw);
    const std::int64_t rows = s.rows(), k = cfg_.moe.top_k, E = cfg_.moe.experts;
    ExpertRouting r;
    float* x = act.normed.as<float>();
    norm(be, cfg_, w.norm, act.hidden, x, rows);
    linear(be, cfg_, {x, rows, w.router, nullptr, act.router.as<float>(), 0.0f});
    r.expert_of.resize(static_cast<std::size_t>(rows * k));
    r.weight_of.resize(r.expert_of.size());
    be.route({.logits = act.router.as<float>(), .rows = rows, .experts = E, .top_k = k, .renormalize = cfg_.moe.norm_topk,
              .expert_of = r.expert_of, .weight_of = r.weight_of});
    r.per_row = k;
    r.routed = r.expert_of;
    std::ranges::sort(r.routed);
    r.routed.erase(std::unique(r.routed.begin(), r.routed.end()), r.routed.end());
    if (cfg_.moe.shared_ffn > 0) {
      std::vector<float> gate(static_cast<std::size_t>(rows));
      linear(be, cfg_, {x, rows, w.shared_gate, nullptr, act.router.as<float>(), 0.0f});
      be.copy_to_host(gate.data(), act.router.data(), gate.size() * sizeof(float));
      std::vector<std::int32_t> e2;
      std::vector<float> w2;
      for (std::int64_t i = 0; i < rows; ++i) {
        for (std::int64_t j = 0; j < k; ++j) {
          e2.push_back(r.expert_of[static_cast<std::size_t>(i * k + j)]);
          w2.push_back(r.weight_of[static_cast<std::size_t>(i * k + j)]);
        }
        e2.push_back(static_cast<std::int32_t>(E));
        w2.push_back(1.0f / (1.0f + std::exp(-gate[static_cast<std::size_t>(i)])));
      }
      r.expert_of = std::move(e2);
      r.weight_of = std::move(w2);
      r.per_row = k + 1;
    }
    return r;
  }

  void forward_experts(kernels::Backend& be, const LayerWeights& lw, const ExpertRouting& r, Activations& act,
                       std::int64_t begin, std::int64_t end) const override {
    const auto& w = std::get<MoeWeights>(lw);
    const std::int64_t E = cfg_.moe.experts;
    // Only the chunk's routed experts are on the device when staged.
    std::vector<kernels::ExpertMatrices> experts(static_cast<std::size_t>(E));
    for (std::int64_t e = std::max<std::int64_t>(begin, 0); e < std::min(end, E); ++e)
      experts[static_cast<std::size_t>(e)] = w.experts[static_cast<std::size_t>(e)];
    if (cfg_.moe.shared_ffn > 0) {
      experts.emplace_back();
      if (begin <= E && E < end) experts.back() = w.shared;
    }
    const std::int64_t rows = static_cast<std::int64_t>(r.expert_of.size()) / r.per_row;
    be.moe_experts({.x = act.normed.as<float>(), .rows = rows, .hidden = cfg_.hidden, .top_k = r.per_row,
                    .expert_of = r.expert_of, .weight_of = r.weight_of, .experts = experts, .act = cfg_.mlp_act,
                    .compute = cfg_.compute_dtype, .y = act.hidden, .expert_begin = begin, .expert_end = end});
  }

  void forward(kernels::Backend& be, const LayerWeights& w, const StepBatch& s, Activations& act,
               const KvView*) const override {
    forward_experts(be, w, route_experts(be, w, s, act), act, 0, cfg_.moe.experts + 1);
  }

 private:
  static std::vector<std::vector<policy::TensorSpec>> all_expert_tensors(const policy::ModelShape& m, std::int64_t layer) {
    std::vector<std::vector<policy::TensorSpec>> experts;
    for (std::int64_t e = 0; e < m.experts; ++e) experts.push_back(policy::expert_tensors(m, layer, e));
    return experts;
  }

  const ModelConfig& cfg_;
  std::int64_t layer_;
};

// The head's GEMM in the run's compute dtype, except an f16 matrix under bf16 on a backend
// that holds its GEMMs' matrices in bf16 (Backend::gemm_weight_dtype): a head tied to the f16
// token table (kept as stored: it is also gathered), which that backend would convert at every
// step. It multiplies in f16 there (kernels/gemm.h): no conversion, 3 more mantissa bits.
kernels::DType head_compute(const kernels::Backend& be, const ModelConfig& cfg, kernels::DType head) {
  const kernels::DType c = cfg.compute_dtype;
  const bool converted = c == kernels::DType::BF16 && head == kernels::DType::F16 && be.gemm_weight_dtype(head, c) != head;
  return converted ? kernels::DType::F16 : c;
}

class OutputEmbed final : public Layer {
 public:
  OutputEmbed(const ModelConfig& cfg, const policy::ModelShape& m) : Layer(policy::head_tensors(m)), cfg_(cfg) {}
  std::string name() const override { return "output_embed"; }
  LayerWeights empty_weights() const override { return HeadWeights{}; }
  void forward(kernels::Backend& be, const LayerWeights& lw, const StepBatch& s, Activations& act,
               const KvView*) const override {
    const auto& w = std::get<HeadWeights>(lw);
    const std::int64_t B = s.batch(), H = cfg_.hidden;
    const float* h = act.hidden;
    float* last = act.last.as<float>();
    // The rows that predict the next tokens, packed (idle slots have none), a run of
    // consecutive rows per copy (a decode step's busy slots side by side are one run).
    auto idle = [&](std::int64_t b) { return s.kinds[static_cast<std::size_t>(b)] == SeqStep::Idle; };
    std::int64_t rows = 0;
    for (std::int64_t b = 0; b < B;) {
      if (idle(b)) {
        ++b;
        continue;
      }
      std::int64_t e = b + 1;
      while (e < B && !idle(e) && s.last_rows[e] == s.last_rows[e - 1] + 1) ++e;
      be.copy_on_device(last + rows * H, h + s.last_rows[b] * H, static_cast<std::size_t>((e - b) * H) * sizeof(float));
      rows += e - b;
      b = e;
    }
    if (rows == 0) return;
    if (cfg_.final_norm) norm(be, cfg_, w.norm, last, last, rows);
    const float* head_in = last;
    if (cfg_.embedding_width() != H) {  // back to the embedding's width (OPT-350m)
      linear(be, cfg_, {last, rows, w.project_out, nullptr, act.embed.as<float>(), 0.0f});
      head_in = act.embed.as<float>();
    }
    float* logits = act.logits.as<float>();
    be.gemm({.x = head_in, .m = rows, .w = w.head, .y = logits, .compute = head_compute(be, cfg_, w.head.dtype)});
    if (cfg_.final_softcap > 0) be.softcap(logits, rows * cfg_.vocab_size, cfg_.final_softcap);
  }

 private:
  const ModelConfig& cfg_;
};

}  // namespace

Activations::Activations(kernels::Backend& be, const ModelConfig& c, std::int64_t rows, std::int64_t batch)
    : max_rows(rows), max_batch(batch) {
  const policy::ActivationBuffers n = policy::activation_buffers(tensor_shape(c), rows, batch);
  auto fp32 = [](std::int64_t elements) { return static_cast<std::size_t>(elements) * sizeof(float); };
  normed = {be, fp32(n.normed)};
  q = {be, fp32(n.q)};
  attn = {be, fp32(n.attn)};
  k = {be, fp32(n.k)};
  v = {be, fp32(n.v)};
  ffn_a = {be, fp32(n.ffn_a)};
  ffn_b = {be, fp32(n.ffn_b)};
  router = {be, fp32(n.router)};
  embed = {be, fp32(n.embed)};
  last = {be, fp32(n.last)};
  logits = {be, fp32(n.logits)};
}

std::int64_t Activations::buffer_bytes(const ModelConfig& c, std::int64_t rows, std::int64_t batch) {
  return static_cast<std::int64_t>(sizeof(float)) * policy::activation_buffers(tensor_shape(c), rows, batch).total();
}

std::int64_t Activations::bytes(const kernels::Backend& be, const ModelConfig& c, std::int64_t rows,
                                std::int64_t batch, std::int64_t capacity, bool scores) {
  // Ops run one at a time on the step's stream, so the largest scratch of any op counts: a
  // projection of every matrix a step multiplies, held as the backend holds it (held_dtype; the
  // head's over `batch` rows; embedding tables are gathered, not multiplied) and attention.
  const policy::ModelShape m = tensor_shape(c);
  std::int64_t scratch = 0;
  auto project = [&](const std::vector<policy::TensorSpec>& unit, std::int64_t m_rows) {
    for (const policy::TensorSpec& t : unit)
      if (t.matrix && t.role != policy::WeightRole::TokEmbed && t.role != policy::WeightRole::PosEmbed)
        scratch = std::max(scratch, be.gemm_scratch_bytes(m_rows, t.cols, t.rows, held_dtype(t, c, c.dtype, be),
                                                          c.compute_dtype));
  };
  project(policy::input_embedding_tensors(m), rows);
  project(policy::attention_tensors(m, 0), rows);
  project(policy::mlp_tensors(m, 0), rows);
  if (m.experts > 0) {
    project(policy::moe_tensors(m, 0), rows);
    project(policy::expert_tensors(m, 0, 0), rows);
  }
  project(policy::head_tensors(m), batch);
  // moe_experts holds its own buffers next to its GEMMs' scratch.
  scratch += policy::moe_expert_scratch_bytes(m, rows);
  kernels::AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim, 1.0f};
  scratch = std::max(scratch, be.attention_scratch_bytes(shape, rows, batch, capacity, scores));
  return buffer_bytes(c, rows, batch) + scratch;
}

KvCache::KvCache(kernels::Backend& be, const ModelConfig& cfg, std::int64_t batch, std::int64_t capacity,
                 kernels::DType dtype) {
  const auto bytes = static_cast<std::size_t>(batch * cfg.n_kv_heads * capacity * kernels::kv_slot_bytes(dtype, cfg.head_dim));
  k = {be, bytes};
  v = {be, bytes};
  view = {capacity, dtype, {{0, batch, k.data(), v.data()}}};
}

std::vector<std::unique_ptr<Layer>> build_layers(const ModelConfig& cfg) {
  const policy::ModelShape m = tensor_shape(cfg);
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<InputEmbed>(cfg, m));
  for (std::int64_t i = 0; i < cfg.n_layers; ++i) {
    layers.push_back(std::make_unique<Attention>(cfg, m, i));
    if (cfg.moe_layer(i))
      layers.push_back(std::make_unique<MoeMlp>(cfg, m, i));
    else
      layers.push_back(std::make_unique<Mlp>(cfg, m, i));
  }
  layers.push_back(std::make_unique<OutputEmbed>(cfg, m));
  return layers;
}

LayerWeights resolve_weights(const Layer& layer, const std::function<MatrixRef(const policy::TensorSpec&)>& find) {
  LayerWeights w = layer.empty_weights();
  for (const policy::TensorSpec& t : layer.tensors()) set_weight(w, t, find(t));
  for (const auto& expert : layer.expert_tensors())
    for (const policy::TensorSpec& t : expert) set_weight(w, t, find(t));
  return w;
}

}  // namespace flexh2o::engine
