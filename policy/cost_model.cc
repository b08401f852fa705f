#include "policy/cost_model.h"

#include <glpk.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <vector>

#include "offload/budget.h"
#include "policy/eviction/kv_policy.h"

namespace flexh2o::policy {

ModelSizes model_sizes(const ModelShape& m) {
  ModelSizes s;
  const std::int64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  // A matrix is `rows` output rows of `cols` inputs (quantization groups run along a row).
  auto mat = [&](std::int64_t rows, std::int64_t cols, kernels::DType t) { return rows * kernels::row_bytes(t, cols); };
  const kernels::DType w = m.weight_dtype;
  const std::int64_t attn = mat(q, m.hidden, w) + mat(m.hidden, q, w) + 2 * mat(kv, m.hidden, w);
  const std::int64_t mlp = (m.gated_mlp ? 2 : 1) * mat(m.ffn, m.hidden, w) + mat(m.hidden, m.ffn, w);
  s.layer_weights = attn + mlp;
  s.layer_params = 2 * m.hidden * q + 2 * m.hidden * kv + (m.gated_mlp ? 3 : 2) * m.hidden * m.ffn;
  const std::int64_t embed = mat(m.vocab + m.extra_embedding_rows, m.hidden, m.embedding_dtype.value_or(w));
  const std::int64_t head = m.tied_embeddings ? embed : mat(m.vocab, m.hidden, m.head_dtype.value_or(w));
  s.embedding_weights = embed + (m.tied_embeddings ? 0 : head);
  s.total_weights = m.layers * s.layer_weights + s.embedding_weights;
  s.largest_unit = std::max({attn, mlp, embed, head});
  s.kv_per_token_layer = 2 * m.kv_heads * kernels::row_bytes(m.cache_dtype, m.head_dim);
  s.hidden_per_token = m.hidden * 4;
  return s;
}

ModelShape with_compression(ModelShape m, const Policy& p) {
  if (p.compress_weight) {
    const kernels::DType own = p.compressed_dtype();
    auto part = [&](const ModelShape::KeptFormat& k) {
      if (!k.widest) return own;
      if (!k.partial) return *k.widest;
      return kernels::row_bytes(*k.widest, m.hidden) > kernels::row_bytes(own, m.hidden) ? *k.widest : own;
    };
    m.weight_dtype = part(m.kept_layers);
    m.embedding_dtype = part(m.kept_embedding);
    m.head_dtype = part(m.kept_head);
  }
  m.cache_dtype = p.cache_dtype();
  return m;
}

std::int64_t kv_tokens(const ModelShape& m, const Workload& w, const KvSpec& kv) {
  const std::int64_t n = w.prompt_len + w.gen_len;
  if (kv.name == "full") return n;
  const auto policy = make_kv_policy(kv, m.layers);
  std::int64_t most = 0;
  for (std::int64_t l = 0; l < m.layers; ++l)
    most = std::max(most, kv_slot_capacity(std::min(policy->budget(l, n), n)));
  return most;
}

namespace {

// Variables of the placement LP: the nine fractions, then the two step times.
enum Var { WG, WC, WN, CG, CC, CN, HG, HC, HN, TPRE, TGEN, kVars };
using Fractions = std::array<double, 9>;

// c0 + sum a[i] * x[i] over the fractions.
struct Linear {
  double c0 = 0;
  Fractions a{};
  double at(const Fractions& x) const {
    double v = c0;
    for (int i = 0; i < 9; ++i) v += a[static_cast<std::size_t>(i)] * x[static_cast<std::size_t>(i)];
    return v;
  }
};

// Bytes one named thing takes on a tier, as a linear form of the fractions.
struct MemoryItem {
  const char* name;
  Linear bytes;
};

struct Terms {
  // Per layer: prefill and decode transfer and compute times (seconds).
  Linear ctog_pre, gtoc_pre, dtoc_pre, ctod_pre, comp_pre;
  Linear ctog_gen, gtoc_gen, dtoc_gen, ctod_gen, comp_gen;
  std::array<std::vector<MemoryItem>, 3> memory_items;  // per tier: what lives or is staged there
  std::array<double, 3> capacity{};          // what a plan may use: safety x the tier's size
  std::array<std::int64_t, 3> hw_capacity{};  // the tier's size
  double safety = 1;

  Linear memory(int tier) const {
    Linear sum;
    for (const MemoryItem& item : memory_items[static_cast<std::size_t>(tier)]) {
      sum.c0 += item.bytes.c0;
      for (std::size_t i = 0; i < 9; ++i) sum.a[i] += item.bytes.a[i];
    }
    return sum;
  }
};

// The model of one (gbs, K, cpu_cache_compute) block, as linear forms of the fractions.
Terms build_terms(const ModelShape& m, const HardwareProfile& hw, const Workload& w, const PlanOptions& o,
                  std::int64_t gbs, std::int64_t k, bool ccc, bool weights_staged) {
  const ModelSizes z = model_sizes(m);
  const double l = static_cast<double>(m.layers), bls = static_cast<double>(gbs * k);
  const double s = static_cast<double>(w.prompt_len), n = static_cast<double>(w.gen_len);
  const double kvtok = static_cast<double>(kv_tokens(m, w, o.kv));
  const bool evicting = o.kv.name != "full";
  // Weights moved per layer and step: the layer plus its share of the embeddings.
  const double wl = static_cast<double>(z.layer_weights) + static_cast<double>(z.embedding_weights) / l;
  const double kvt = static_cast<double>(z.kv_per_token_layer), hid = static_cast<double>(z.hidden_per_token);
  const double hid_pre = hid * bls * s, hid_gen = hid * bls;
  const double kv_pre = kvt * bls * std::min(s, kvtok);
  const double kv_len = std::min(kvtok, s + n / 2);  // average cache length during decode
  const double kv_read = kvt * bls * kv_len;
  // Under eviction the engine writes back whole budget-sized rows of staged sequences.
  const double kv_store = evicting ? kv_read : kvt * bls;
  const double cg_bw = hw.cpu_to_gpu, gc_bw = hw.gpu_to_cpu, dc_bw = hw.disk_to_cpu, cd_bw = hw.cpu_to_disk;
  const double gemm_flops_tok = 2.0 * static_cast<double>(z.layer_params);
  // Dequantization where the profile measures it (bytes/s of q4 = 2 values per byte): every
  // GEMM call (once per GPU batch) expands its weight matrices, the head's included (embedding
  // lookups only gather rows); every decode step expands the compressed KV it reads. Writing
  // (quantizing) the cache is left out: one new token per step.
  const double dq_per_value = hw.dequant > 0 ? 0.5 / hw.dequant : 0.0;
  const double head_values = static_cast<double>(m.vocab) * static_cast<double>(m.hidden) / l;
  const double w_dequant = kernels::is_quantized(m.weight_dtype)
                               ? static_cast<double>(k) * (static_cast<double>(z.layer_params) + head_values) * dq_per_value
                               : 0.0;
  const double kv_values_read = 2.0 * static_cast<double>(m.kv_heads * m.head_dim) * bls * kv_len;
  const double kv_dequant = kernels::is_quantized(m.cache_dtype) ? kv_values_read * dq_per_value : 0.0;
  const double h1 = static_cast<double>(m.hidden);

  Terms t;
  auto lin = [](double c0, std::initializer_list<std::pair<Var, double>> a) {
    Linear x;
    x.c0 = c0;
    for (auto [v, c] : a) x.a[static_cast<std::size_t>(v)] += c;
    return x;
  };
  t.ctog_pre = lin(0, {{WC, wl / cg_bw}, {WN, wl / cg_bw}, {HC, hid_pre / cg_bw}, {HN, hid_pre / cg_bw}});
  t.dtoc_pre = lin(0, {{WN, wl / dc_bw}, {HN, hid_pre / dc_bw}});
  t.gtoc_pre = lin(0, {{CC, kv_pre / gc_bw}, {CN, kv_pre / gc_bw}, {HC, hid_pre / gc_bw}, {HN, hid_pre / gc_bw}});
  t.ctod_pre = lin(0, {{CN, kv_pre / cd_bw}, {HN, hid_pre / cd_bw}});
  // GEMMs run per GPU batch: gbs * s rows at prefill, gbs at decode. The output head runs
  // once per step for the last row of every sequence (spread over the layers here).
  const double g = static_cast<double>(gbs);
  const double head_flops = 2.0 * bls * static_cast<double>(m.vocab) * h1 / l;
  const double rate_pre = hw.gemm_rate(g * s, hw.gpu_gemm_prefill), rate_gen = hw.gemm_rate(g, hw.gpu_gemm_decode);
  t.comp_pre = lin(bls * s * gemm_flops_tok / rate_pre + head_flops / rate_gen + bls * 4 * s * s * h1 / hw.gpu_attn_prefill +
                       w_dequant,
                   {});

  const double cache_in = ccc ? 0 : kv_read / cg_bw;
  t.ctog_gen = lin(0, {{WC, wl / cg_bw}, {WN, wl / cg_bw}, {HC, hid_gen / cg_bw}, {HN, hid_gen / cg_bw},
                       {CC, cache_in}, {CN, cache_in}});
  // With cpu_cache_compute the cpu-homed cache is attended in place: only the new token moves.
  const double kv_store_cpu = ccc ? kvt * bls : kv_store;
  t.gtoc_gen = lin(0, {{CC, kv_store_cpu / gc_bw}, {CN, kv_store / gc_bw}, {HC, hid_gen / gc_bw}, {HN, hid_gen / gc_bw}});
  t.dtoc_gen = lin(0, {{CN, kv_read / dc_bw}, {HN, hid_gen / dc_bw}, {WN, wl / (0.95 * dc_bw)}});
  t.ctod_gen = lin(0, {{CN, kv_store / cd_bw}, {HN, hid_gen / cd_bw}});
  const double attn_flops = 4 * bls * kv_len * h1;
  const double gpu_attn = attn_flops / hw.gpu_attn_decode + kv_dequant;
  const double cpu_attn = attn_flops / hw.cpu_attn_decode + kv_dequant;
  t.comp_gen = lin(bls * gemm_flops_tok / rate_gen + head_flops / rate_gen + w_dequant,
                   {{CG, gpu_attn}, {CC, ccc ? cpu_attn : gpu_attn}, {CN, ccc ? cpu_attn : gpu_attn}});

  // Memory: homes, plus what the engine allocates to move and compute (see BlockScheduler).
  const double w_all = static_cast<double>(z.total_weights), kv_all = kvt * l * bls * kvtok;
  const double h_all = hid * bls * std::max(s, 1.0);
  const double rows = static_cast<double>(gbs) * s, q = static_cast<double>(m.heads * m.head_dim);
  const double kvd = static_cast<double>(m.kv_heads * m.head_dim);
  const double scratch = 4 * (rows * (2 * h1 + 2 * q + 2 * kvd + (m.gated_mlp ? 2.0 : 1.0) * static_cast<double>(m.ffn)) +
                              static_cast<double>(gbs) * (h1 + static_cast<double>(m.vocab)));
  const double staging = weights_staged ? 2.0 * static_cast<double>(z.largest_unit) : 0.0;
  const double kv_ring = 3 * static_cast<double>(gbs) * kvt * kvtok;  // per staged fraction
  const double h_ring = 3 * hid * rows;
  const double scores = evicting ? l * bls * static_cast<double>(m.kv_heads) * kvtok * 8 : 0;  // position + score per slot
  t.memory_items[0] = {{"weights", lin(0, {{WG, w_all}})},
                       {"KV cache", lin(0, {{CG, kv_all}})},
                       {"hidden states", lin(0, {{HG, h_all}})},
                       {"weight staging slots", lin(staging, {})},
                       {"activation scratch", lin(scratch, {})},
                       {"KV staging ring", lin(0, {{CC, ccc ? 0 : kv_ring}, {CN, kv_ring}})},
                       {"hidden staging ring", lin(0, {{HC, h_ring}, {HN, h_ring}})}};
  t.memory_items[1] = {{"weights", lin(0, {{WC, w_all}})},
                       {"KV cache", lin(0, {{CC, kv_all}})},
                       {"hidden states", lin(0, {{HC, h_all}})},
                       {"eviction scores", lin(scores, {})}};
  t.memory_items[2] = {{"weights", lin(0, {{WN, w_all}})},
                       {"KV cache", lin(0, {{CN, kv_all}})},
                       {"hidden states", lin(0, {{HN, h_all}})}};
  t.hw_capacity = {hw.gpu_mem, hw.cpu_mem, hw.disk_mem};
  t.safety = o.memory_safety;
  for (std::size_t i = 0; i < 3; ++i) t.capacity[i] = o.memory_safety * static_cast<double>(t.hw_capacity[i]);
  return t;
}

struct Solved {
  Fractions x{};
  double tpre = 0, tgen = 0;
};

double step_time_pre(const Terms& t, const Fractions& x) {
  return std::max({t.ctog_pre.at(x) + t.dtoc_pre.at(x), t.gtoc_pre.at(x) + t.ctod_pre.at(x), t.comp_pre.at(x)});
}
double step_time_gen(const Terms& t, const Fractions& x) {
  const double c = t.ctog_gen.at(x);
  return c + std::max({t.gtoc_gen.at(x), t.dtoc_gen.at(x), t.ctod_gen.at(x), t.comp_gen.at(x)});
}

// min l * (Tpre + (n - 1) * Tgen) subject to the step-time and memory constraints.
std::optional<Solved> solve(const Terms& t, double layers, double gen_len, bool weights_on_gpu) {
  std::unique_ptr<glp_prob, decltype(&glp_delete_prob)> lp(glp_create_prob(), glp_delete_prob);
  glp_set_obj_dir(lp.get(), GLP_MIN);
  glp_add_cols(lp.get(), kVars);
  for (int v = 0; v < kVars; ++v) {
    if (v < 9)
      glp_set_col_bnds(lp.get(), v + 1, GLP_DB, 0.0, 1.0);
    else
      glp_set_col_bnds(lp.get(), v + 1, GLP_LO, 0.0, 0.0);
  }
  if (weights_on_gpu) glp_set_col_bnds(lp.get(), WG + 1, GLP_FX, 1.0, 1.0);
  glp_set_obj_coef(lp.get(), TPRE + 1, layers);
  glp_set_obj_coef(lp.get(), TGEN + 1, layers * std::max(gen_len - 1, 0.0));
  std::vector<int> ia{0};
  std::vector<int> ja{0};
  std::vector<double> ar{0};
  int row = 0;
  // sum of linear forms + coef_t * T  (>= or <=) bound
  auto add = [&](std::initializer_list<const Linear*> forms, Var tvar, double tcoef, int type, double bound) {
    glp_add_rows(lp.get(), 1);
    ++row;
    Fractions a{};
    double c0 = 0;
    for (const Linear* f : forms) {
      c0 += f->c0;
      for (int i = 0; i < 9; ++i) a[static_cast<std::size_t>(i)] += f->a[static_cast<std::size_t>(i)];
    }
    for (int i = 0; i < 9; ++i)
      if (a[static_cast<std::size_t>(i)] != 0) {
        ia.push_back(row);
        ja.push_back(i + 1);
        ar.push_back(a[static_cast<std::size_t>(i)]);
      }
    if (tcoef != 0) {
      ia.push_back(row);
      ja.push_back(tvar + 1);
      ar.push_back(tcoef);
    }
    glp_set_row_bnds(lp.get(), row, type, type == GLP_UP ? 0.0 : bound - c0, type == GLP_UP ? bound - c0 : 0.0);
  };
  // Step times: T - (forms) >= c0  i.e.  -(a.x) + T >= c0
  auto time_row = [&](std::initializer_list<const Linear*> forms, Var tvar) {
    Linear neg;
    for (const Linear* f : forms) {
      neg.c0 -= f->c0;
      for (int i = 0; i < 9; ++i) neg.a[static_cast<std::size_t>(i)] -= f->a[static_cast<std::size_t>(i)];
    }
    add({&neg}, tvar, 1.0, GLP_LO, 0.0);
  };
  time_row({&t.ctog_pre, &t.dtoc_pre}, TPRE);
  time_row({&t.gtoc_pre, &t.ctod_pre}, TPRE);
  time_row({&t.comp_pre}, TPRE);
  for (const Linear* other : {&t.gtoc_gen, &t.dtoc_gen, &t.ctod_gen, &t.comp_gen}) time_row({&t.ctog_gen, other}, TGEN);
  std::array<Linear, 3> memory;
  for (int tier = 0; tier < 3; ++tier) {
    memory[static_cast<std::size_t>(tier)] = t.memory(tier);
    add({&memory[static_cast<std::size_t>(tier)]}, TPRE, 0.0, GLP_UP, t.capacity[static_cast<std::size_t>(tier)]);
  }
  for (Var first : {WG, CG, HG}) {
    Linear sum;
    for (int i = 0; i < 3; ++i) sum.a[static_cast<std::size_t>(first + i)] = 1;
    add({&sum}, TPRE, 0.0, GLP_FX, 1.0);
    glp_set_row_bnds(lp.get(), row, GLP_FX, 1.0, 1.0);
  }
  glp_load_matrix(lp.get(), static_cast<int>(ia.size()) - 1, ia.data(), ja.data(), ar.data());
  glp_smcp parm;
  glp_init_smcp(&parm);
  parm.msg_lev = GLP_MSG_OFF;
  if (glp_simplex(lp.get(), &parm) != 0 || glp_get_status(lp.get()) != GLP_OPT) return std::nullopt;
  Solved out;
  for (int i = 0; i < 9; ++i) out.x[static_cast<std::size_t>(i)] = std::clamp(glp_get_col_prim(lp.get(), i + 1), 0.0, 1.0);
  out.tpre = step_time_pre(t, out.x);
  out.tgen = step_time_gen(t, out.x);
  return out;
}

Fractions fractions_of(const Policy& p) {
  return {p.weights.gpu, p.weights.cpu, p.weights.disk, p.cache.gpu, p.cache.cpu, p.cache.disk,
          p.activations.gpu, p.activations.cpu, p.activations.disk};
}

std::string bottleneck_of(const Terms& t, const Fractions& x) {
  const std::pair<const char*, double> terms[] = {
      {"cpu->gpu transfer (weights/cache in)", t.ctog_gen.at(x)}, {"gpu->cpu transfer (cache out)", t.gtoc_gen.at(x)},
      {"disk->cpu transfer", t.dtoc_gen.at(x)}, {"cpu->disk transfer", t.ctod_gen.at(x)}, {"compute", t.comp_gen.at(x)}};
  return std::max_element(std::begin(terms), std::end(terms), [](auto& a, auto& b) { return a.second < b.second; })->first;
}

Estimate make_estimate(const ModelShape& m, const Workload& w, const Terms& t, const Fractions& x, Policy p) {
  Estimate e;
  p.weights = {x[WG], x[WC], x[WN]};
  p.cache = {x[CG], x[CC], x[CN]};
  p.activations = {x[HG], x[HC], x[HN]};
  e.policy = p;
  const double l = static_cast<double>(m.layers), bls = static_cast<double>(p.block_size());
  e.prefill_seconds = l * step_time_pre(t, x);
  e.decode_seconds = l * static_cast<double>(std::max<std::int64_t>(w.gen_len - 1, 0)) * step_time_gen(t, x);
  e.prefill_throughput = bls * static_cast<double>(w.prompt_len) / e.prefill_seconds;
  e.decode_throughput = e.decode_seconds > 0 ? bls * static_cast<double>(w.gen_len - 1) / e.decode_seconds : 0;
  e.total_throughput = bls * static_cast<double>(w.gen_len) / (e.prefill_seconds + e.decode_seconds);
  for (int tier = 0; tier < 3; ++tier)
    e.peak_bytes[static_cast<std::size_t>(tier)] = static_cast<std::int64_t>(t.memory(tier).at(x));
  e.bottleneck = bottleneck_of(t, x);
  return e;
}

// The better of: weights wholly on the gpu (no staging slots) and any split.
std::optional<Estimate> best_for(const ModelShape& m, const HardwareProfile& hw, const Workload& w, const PlanOptions& o,
                                 std::int64_t gbs, std::int64_t k) {
  std::optional<Estimate> best;
  for (bool ccc : {false, true}) {
    if (ccc && !o.allow_cpu_cache_compute) continue;
    for (bool all_gpu : {true, false}) {
      const Terms t = build_terms(m, hw, w, o, gbs, k, ccc, !all_gpu);
      const auto sol = solve(t, static_cast<double>(m.layers), static_cast<double>(w.gen_len), all_gpu);
      if (!sol) continue;
      Policy p;
      p.gpu_batch_size = gbs;
      p.num_gpu_batches = k;
      p.cpu_cache_compute = ccc;
      p.kv = o.kv.text.empty() ? o.kv.name : o.kv.text;
      p.compress_weight = o.compress_weight;
      p.compress_cache = o.compress_cache;
      p.compress_bits = o.compress_bits;
      p.cache_storage = o.cache_storage;
      Estimate e = make_estimate(m, w, t, sol->x, p);
      if (!best || e.total_throughput > best->total_throughput) best = e;
    }
  }
  return best;
}

// The first tier whose memory exceeds its capacity at fractions x, with its items largest first.
std::optional<Shortfall> first_shortfall(const Terms& t, const Fractions& x) {
  for (int tier = 0; tier < 3; ++tier) {
    const double need = t.memory(tier).at(x), cap = t.capacity[static_cast<std::size_t>(tier)];
    // A planned policy read back from YAML (fractions rounded) sits on the limit: allow for that.
    if (need <= cap * (1 + 1e-5)) continue;
    Shortfall s;
    s.tier = static_cast<offload::Tier>(tier);
    s.need = static_cast<std::int64_t>(need);
    s.available = static_cast<std::int64_t>(cap);
    s.safety = t.safety;
    s.capacity = t.hw_capacity[static_cast<std::size_t>(tier)];
    for (const MemoryItem& item : t.memory_items[static_cast<std::size_t>(tier)])
      s.items.emplace_back(item.name, static_cast<std::int64_t>(item.bytes.at(x)));
    std::ranges::stable_sort(s.items, std::greater<>{}, &std::pair<std::string, std::int64_t>::second);
    return s;
  }
  return std::nullopt;
}

}  // namespace

std::optional<Estimate> estimate(const ModelShape& shape, const HardwareProfile& hw, const Workload& w,
                                 const Policy& p, const PlanOptions& o) {
  const ModelShape m = with_compression(shape, p);
  const Fractions x = fractions_of(p);
  const Terms t = build_terms(m, hw, w, o, p.gpu_batch_size, p.num_gpu_batches, p.cpu_cache_compute,
                              p.weights.gpu < 1.0);
  if (first_shortfall(t, x)) return std::nullopt;
  return make_estimate(m, w, t, x, p);
}

std::optional<Shortfall> shortfall(const ModelShape& shape, const HardwareProfile& hw, const Workload& w,
                                   const Policy& p, const PlanOptions& o) {
  const ModelShape m = with_compression(shape, p);
  const Terms t = build_terms(m, hw, w, o, p.gpu_batch_size, p.num_gpu_batches, p.cpu_cache_compute,
                              p.weights.gpu < 1.0);
  return first_shortfall(t, fractions_of(p));
}

std::string Shortfall::describe() const {
  std::string items_text;
  for (const auto& [name, bytes] : items)
    if (bytes > 0) items_text += (items_text.empty() ? "" : ", ") + name + " " + offload::format_bytes(bytes);
  return std::string(offload::tier_name(tier)) + " tier needs " + offload::format_bytes(need) + " (" + items_text +
         ") but has " + offload::format_bytes(available) + " (" + std::to_string(static_cast<int>(safety * 100 + 0.5)) +
         "% of " + offload::format_bytes(capacity) + ")";
}

Estimate estimate_or_throw(const ModelShape& m, const HardwareProfile& hw, const Workload& w, const Policy& p,
                           const PlanOptions& o, const std::string& what) {
  if (const auto e = estimate(m, hw, w, p, o)) return *e;
  const auto s = shortfall(m, hw, w, p, o);
  throw std::invalid_argument(what + " does not fit " + hw.name + ": " + (s ? s->describe() : "no tier is short") + "; " +
                              offload::tier_hint(s ? s->tier : offload::Tier::Gpu));
}

Estimate plan(const ModelShape& shape, const HardwareProfile& hw, const Workload& w, const PlanOptions& o) {
  Policy compression;
  compression.compress_weight = o.compress_weight;
  compression.compress_cache = o.compress_cache;
  compression.compress_bits = o.compress_bits;
  compression.cache_storage = o.cache_storage;
  const ModelShape m = with_compression(shape, compression);
  std::optional<Estimate> best;
  for (std::int64_t gbs : {1, 2, 3, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512}) {
    // The largest feasible K by doubling and bisection, then upward while throughput improves.
    auto at = [&](std::int64_t k) { return gbs * k <= o.max_block ? best_for(m, hw, w, o, gbs, k) : std::nullopt; };
    if (!at(1)) continue;
    std::int64_t lo = 1, hi = 2;
    while (at(hi)) {
      lo = hi;
      hi *= 2;
    }
    while (hi - lo > 1) {
      const std::int64_t mid = (lo + hi) / 2;
      (at(mid) ? lo : hi) = mid;
    }
    // Throughput need not grow with K (the KV may spill to a slower tier): try the powers of
    // two below the largest feasible K as well.
    for (std::int64_t k = 1;; k = std::min(k * 2, lo)) {
      const auto e = at(k);
      if (e && (!best || e->total_throughput > best->total_throughput)) best = e;
      if (k == lo) break;
    }
  }
  if (best) return *best;
  // Nothing fits: name the smallest change, judged at the smallest block.
  const ModelSizes z = model_sizes(m);
  const double safety = o.memory_safety;
  const Terms t = build_terms(m, hw, w, o, 1, 1, false, true);
  Fractions off_gpu{0, 0, 1, 0, 0, 1, 0, 0, 1};
  const double gpu_need = t.memory(0).at(off_gpu);
  std::string msg = "no placement of " + m.name + " fits " + hw.name + ": ";
  if (gpu_need > t.capacity[0]) {
    msg += "even with everything off the gpu it needs " + offload::format_bytes(static_cast<std::int64_t>(gpu_need / safety)) +
           " of GPU memory (has " + offload::format_bytes(hw.gpu_mem) + "); use a larger GPU or --gpu-mem";
  } else {
    const double need = t.memory(1).at(Fractions{0, 1, 0, 0, 1, 0, 0, 1, 0});
    const double short_by = need - t.capacity[1] - t.capacity[2];
    msg += "weights, KV and activations need " + offload::format_bytes(static_cast<std::int64_t>(need)) +
           " but cpu + disk allow " + offload::format_bytes(static_cast<std::int64_t>(t.capacity[1] + t.capacity[2])) +
           "; needs " + offload::format_bytes(static_cast<std::int64_t>(short_by / safety)) +
           " more CPU memory, or --disk-mem >= " +
           offload::format_bytes(static_cast<std::int64_t>((need - t.capacity[1]) / safety) + 1);
    if (o.kv.name == "full" && static_cast<double>(z.total_weights) < need * 0.5) msg += ", or --kv h2o:0.2";
  }
  throw std::invalid_argument(msg);
}

}  // namespace flexh2o::policy
