#include "policy/cost_model.h"

#include <glpk.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <vector>

#include "kernels/option_error.h"
#include "offload/budget.h"
#include "policy/eviction/kv_policy.h"
#include "policy/unit_weights.h"

namespace flexh2o::policy {

namespace {

// Bytes of a unit's tensors with matrices as `t`, as held in memory and as a staging slot
// places them; elements of its matrices (what a token multiplies).
std::int64_t bytes_of(const std::vector<TensorSpec>& unit, kernels::DType t) {
  std::int64_t b = 0;
  for (const TensorSpec& x : unit) b += x.bytes(t);
  return b;
}
std::int64_t slot_bytes_of(const std::vector<TensorSpec>& unit, kernels::DType t) {
  std::int64_t b = 0;
  for (const TensorSpec& x : unit) b += slot_bytes(x.bytes(t));
  return b;
}
std::int64_t matrix_elements(const std::vector<TensorSpec>& unit) {
  std::int64_t n = 0;
  for (const TensorSpec& x : unit) n += x.matrix ? x.numel() : 0;
  return n;
}

}  // namespace

// The units' tensors as policy/unit_weights lists them; per-layer sizes are the mean over the
// dense and MoE layers. MoE layers hold every expert; a staging slot holds the layer but its
// routed experts and some of them (staging_slot); a token multiplies its top_k of them, the
// router and the shared expert.
ModelSizes model_sizes(const ModelShape& m) {
  ModelSizes s;
  const kernels::DType layer_t = m.weight_dtype, embed_t = m.embedding_dtype.value_or(m.weight_dtype),
                       head_t = m.head_dtype.value_or(m.weight_dtype);
  // A pipeline stage holds the input embedding only on the first stage, the head on the last.
  const auto embed = m.input_embedding ? input_embedding_tensors(m) : std::vector<TensorSpec>{};
  const auto head = m.output_head ? head_tensors(m) : std::vector<TensorSpec>{};
  const auto attn = attention_tensors(m, 0), mlp = mlp_tensors(m, 0);
  const auto moe = moe_tensors(m, 0), expert = expert_tensors(m, 0, 0);
  const std::int64_t dense_layers = std::max<std::int64_t>(m.layers - m.moe_layers, 0), layers = std::max<std::int64_t>(m.layers, 1);
  const std::int64_t expert_bytes = bytes_of(expert, layer_t);
  s.layer_weights = bytes_of(attn, layer_t) + (dense_layers * bytes_of(mlp, layer_t) +
                                               m.moe_layers * (bytes_of(moe, layer_t) + m.experts * expert_bytes)) / layers;
  s.layer_expert_weights = m.moe_layers * m.experts * expert_bytes / layers;
  const std::int64_t moe_params = matrix_elements(moe) + m.top_k * matrix_elements(expert);
  s.layer_params = matrix_elements(attn) + (dense_layers * matrix_elements(mlp) + m.moe_layers * moe_params) / layers;
  s.head_weights = m.output_head ? m.vocab * kernels::row_bytes(head_t, m.width()) : 0;
  // A tied head reuses the input embedding where both are held; a later stage keeps a copy.
  s.embedding_weights = bytes_of(embed, embed_t) + bytes_of(head, head_t) -
                        (m.tied_embeddings && m.input_embedding ? s.head_weights : 0);
  s.total_weights = m.layers * s.layer_weights + s.embedding_weights;
  s.attention_unit = slot_bytes_of(attn, layer_t);
  s.dense_mlp_unit = dense_layers > 0 ? slot_bytes_of(mlp, layer_t) : 0;
  s.moe_unit_base = m.moe_layers > 0 ? slot_bytes_of(moe, layer_t) : 0;
  s.expert_unit = m.moe_layers > 0 ? slot_bytes_of(expert, layer_t) : 0;
  s.embedding_unit = slot_bytes_of(embed, embed_t);
  s.head_unit = slot_bytes_of(head, head_t);
  s.kv_per_token_layer = 2 * m.kv_heads * kernels::row_bytes(m.cache_dtype, m.head_dim);
  return s;
}

std::int64_t ModelSizes::staging_slot(std::int64_t expert_slots, bool sep_layer, bool embeddings_staged) const {
  const std::int64_t mlp = std::max(dense_mlp_unit, moe_unit_base > 0 ? moe_unit_base + expert_slots * expert_unit : 0);
  const std::int64_t layer = sep_layer ? std::max(attention_unit, mlp) : attention_unit + mlp;
  return embeddings_staged ? std::max({layer, embedding_unit, head_unit}) : layer;
}

ModelShape with_compression(ModelShape m, const Policy& p) {
  m.cache_dtype = p.cache_dtype(m.weight_dtype);
  if (p.compress_weight) {
    // Matrices stored in one of the engine's group formats keep it (see ModelShape::KeptFormat).
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
  return m;
}

std::int64_t kv_tokens(const ModelShape& m, const Workload& w, const KvSpec& kv) {
  const std::int64_t n = w.sequence_capacity();
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
  // this + f * other
  Linear plus(const Linear& other, double f) const {
    Linear r = *this;
    r.c0 += f * other.c0;
    for (std::size_t i = 0; i < 9; ++i) r.a[i] += f * other.a[i];
    return r;
  }
};

// Bytes one named thing takes on a tier, as a linear form of the fractions.
struct MemoryItem {
  const char* name;
  Linear bytes;
};

// The shape of one block and the engine's choices that change its cost: which buffers it
// allocates and whether transfers overlap compute.
struct Block {
  std::int64_t gbs = 1, k = 1;
  bool ccc = false;             // decode attention over cpu/disk-homed KV on the CPU
  bool weights_staged = true;   // some weights live off the gpu: two staging slots
  bool hidden_staged = true;    // some hidden states live off the gpu: the staging ring
  bool overlap = true;          // transfers run beside compute (off: one after another)
  bool sep_layer = true;        // attention and MLP are separate units (off: one, a larger slot)
  std::string expert_loading = "auto";  // MoE: the policy's expert loading and staging slots
  std::int64_t expert_slots = 0;
  bool resident_embeddings = false;  // the tensors outside the layers wholly on the gpu, never staged
  SlotStep slot_step;  // continuous batching: the job's mean slot-step over the block's slots
  // Prefixes held once (Workload::held) in pool_rows rows on pool_tier (the gpu: read in place;
  // cpu: in place with cpu_cache_compute, else staged like the rows; disk: staged); the KV rows,
  // wherever they live, sized for what follows a prefix. 0: the rows copy prefixes.
  std::int64_t pool_rows = 0;
  offload::Tier pool_tier = offload::Tier::Gpu;
  bool pool_staged() const { return pool_tier == offload::Tier::Disk || (pool_tier == offload::Tier::Cpu && !ccc); }
};

// The tier a policy's prefix_pool names (auto: the gpu, where the engine tries it first).
offload::Tier pool_tier_of(const Policy& p) {
  for (const offload::Tier t : {offload::Tier::Cpu, offload::Tier::Disk})
    if (p.prefix_pool == offload::tier_name(t)) return t;
  return offload::Tier::Gpu;
}

Block block_of(const Policy& p, const Workload& w) {
  Block b{p.gpu_batch_size, p.num_gpu_batches, p.cpu_cache_compute, p.weights.gpu < 1.0, p.activations.gpu < 1.0,
          p.overlap,        p.sep_layer,       p.expert_loading,      p.expert_slots,
          p.resident_embeddings};
  b.pool_rows = p.kv == "full" ? w.pool_rows(p.block_size(), p.gpu_batch_size) : 0;
  if (w.continuous) b.slot_step = slot_step(w, p.block_size(), p.gpu_batch_size, b.pool_rows);
  b.pool_tier = pool_tier_of(p);
  return b;
}

struct Terms {
  SlotStep slot_step;  // continuous batching: the block's mean slot-step
  // Per layer: prefill and decode transfer and compute times (seconds).
  Linear ctog_pre, gtoc_pre, dtoc_pre, ctod_pre, comp_pre;
  Linear ctog_gen, gtoc_gen, dtoc_gen, ctod_gen, comp_gen;
  Linear context_token;  // decode attention per token of context a row attends over
  bool overlap = true;
  std::array<std::vector<MemoryItem>, 3> memory_items;  // per tier: what lives or is staged there
  std::array<double, 3> capacity{};          // what a plan may use: safety x the tier's size
  std::array<std::int64_t, 3> hw_capacity{};  // the tier's size
  double safety = 1;
  bool shared_host = false;  // the gpu and cpu tiers are one host memory: the larger capacity holds both

  Linear memory(int tier) const {
    Linear sum;
    for (const MemoryItem& item : memory_items[static_cast<std::size_t>(tier)]) {
      sum.c0 += item.bytes.c0;
      for (std::size_t i = 0; i < 9; ++i) sum.a[i] += item.bytes.a[i];
    }
    return sum;
  }
};

Linear linear_form(double c0, std::initializer_list<std::pair<Var, double>> a) {
  Linear x;
  x.c0 = c0;
  for (auto [v, c] : a) x.a[static_cast<std::size_t>(v)] += c;
  return x;
}

// The staging slots' room for a MoE unit's routed experts under the block's policy.
Policy experts_policy_of(const Block& blk) {
  Policy p;
  p.gpu_batch_size = blk.gbs;
  p.num_gpu_batches = blk.k;
  p.expert_loading = blk.expert_loading;
  p.expert_slots = blk.expert_slots;
  return p;
}

// Weights moved per layer and step when `rows_per_sequence` rows of each sequence compute:
// the layer plus its share of the embeddings, a tied head's matrix again (the input embedding
// unit and the head unit each stage it); the layer alone when the embeddings are resident.
// MoE (as BlockExecutor loads them): a unit load brings the experts the block's rows are
// expected to route to, or all of them as the policy's expert loading says. When more are
// routed to than the staging slot holds, each GPU batch runs its routed experts in chunks,
// fetched again per batch: its own expected active experts, K times.
double weights_moved(const ModelShape& m, const ModelSizes& z, const Block& blk, double rows_per_sequence) {
  const double l = static_cast<double>(m.layers), g = static_cast<double>(blk.gbs), k = static_cast<double>(blk.k);
  const bool tied_twice = m.tied_embeddings && m.input_embedding && m.output_head;
  const double embeddings =
      blk.resident_embeddings ? 0.0 : static_cast<double>(z.embedding_weights + (tied_twice ? z.head_weights : 0)) / l;
  const double all = static_cast<double>(z.layer_weights) + embeddings;
  const Policy experts = experts_policy_of(blk);
  const auto rows = static_cast<std::int64_t>(g * k * rows_per_sequence);
  if (m.experts == 0 || !experts.routed_expert_loading(m.experts, m.top_k, rows)) return all;
  double active = expected_active_experts(m.experts, m.top_k, rows);
  if (active > static_cast<double>(experts.expert_slot_count(m.experts, m.top_k)))
    active = k * expected_active_experts(m.experts, m.top_k, static_cast<std::int64_t>(g * rows_per_sequence));
  return all - static_cast<double>(z.layer_expert_weights) * (1 - active / static_cast<double>(m.experts));
}

// Memory: homes, plus what the engine allocates to move and compute (see BlockExecutor):
// one GPU batch's activations (engine::Activations), two weight staging slots of the
// largest scheduling unit, rings of three slots for staged KV and hidden states. Each block
// in flight (a pipeline stage's micro-batches) has its own caches, states, scratch and rings.
// `kv_slots`: KV tokens per sequence (kv_tokens).
void add_memory_items(Terms& t, const ModelShape& m, const ModelSizes& z, const HardwareProfile& hw, const Workload& w,
                      const PlanOptions& o, const Block& blk, double kv_slots) {
  const bool evicting = o.kv.name != "full";
  const double layers = static_cast<double>(m.layers), gbs = static_cast<double>(blk.gbs);
  const double block = gbs * static_cast<double>(blk.k);
  const double act = static_cast<double>(kernels::dtype_size(hw.activation_dtype));
  const double hidden_row = static_cast<double>(m.hidden) * act, kv_token = static_cast<double>(z.kv_per_token_layer);
  const double blocks = static_cast<double>(std::max<std::int64_t>(o.blocks_in_flight, 1));
  // Resident embeddings sit on the gpu tier whatever the fractions, which then place the layers.
  const double resident = blk.resident_embeddings ? static_cast<double>(z.embedding_weights) : 0.0;
  const double w_all = static_cast<double>(z.total_weights) - resident, kv_all = blocks * kv_token * layers * block * kv_slots;
  // A GPU batch's step rows: fixed blocks prefill every prompt at once; under continuous
  // batching the other slots decode while newcomers prefill up to the budget, or one longer
  // prompt (BlockExecutor::continuous_rows).
  const std::int64_t longest = std::max<std::int64_t>(w.prompt_len, 1);
  const std::int64_t step_rows = w.continuous ? std::max(blk.gbs - 1 + std::max(w.prefill_budget, longest), blk.gbs)
                                              : blk.gbs * longest;
  const double h_all = blocks * hidden_row * static_cast<double>(blk.k * step_rows);
  // One GPU batch's activation buffers, in the profile's activation dtype, and what a MoE
  // layer's expert kernel holds beside them (engine::Activations).
  const double scratch = blocks * (act * static_cast<double>(activation_buffers(m, step_rows, blk.gbs).total()) +
                                   static_cast<double>(moe_expert_scratch_bytes(m, step_rows)));
  const std::int64_t expert_slots = experts_policy_of(blk).expert_slot_count(m.experts, m.top_k);
  const double slot = static_cast<double>(z.staging_slot(expert_slots, blk.sep_layer, !blk.resident_embeddings));
  const double staging = blk.weights_staged ? 2.0 * slot : 0.0;
  const double kv_ring = blocks * 3 * gbs * kv_token * kv_slots;  // per staged fraction
  const double h_ring = blk.hidden_staged ? blocks * 3 * hidden_row * static_cast<double>(step_rows) : 0.0;
  // The policy's bookkeeping per slot (h2o: position + score, 8 bytes; flex with merging: 16)
  const double slot_state =
      evicting ? static_cast<double>(make_kv_policy(o.kv, m.layers)->make_state(1).bytes_per_slot()) : 0.0;
  const double scores = evicting ? blocks * layers * block * static_cast<double>(m.kv_heads) * kv_slots * slot_state : 0;
  const auto lin = linear_form;
  // The pool on its tier; staged, a ring of three slots of one layer's pool on the gpu.
  const double pool_layer = blocks * kv_token * static_cast<double>(blk.pool_rows * w.held.prefix);
  const auto pool_on = [&](offload::Tier tier) { return blk.pool_tier == tier ? layers * pool_layer : 0.0; };
  t.memory_items[0] = {{"weights", lin(0, {{WG, w_all}})},
                       {"resident embeddings and head", lin(resident, {})},
                       {"KV cache", lin(0, {{CG, kv_all}})},
                       {"prefixes held once", lin(pool_on(offload::Tier::Gpu), {})},
                       {"held prefixes staging ring", lin(blk.pool_staged() ? 3 * pool_layer : 0.0, {})},
                       {"hidden states", lin(0, {{HG, h_all}})},
                       {"weight staging slots", lin(staging, {})},
                       {"activations of one GPU batch", lin(scratch, {})},
                       {"KV staging ring", lin(0, {{CC, blk.ccc ? 0 : kv_ring}, {CN, kv_ring}})},
                       {"hidden staging ring", lin(h_ring, {})}};
  t.memory_items[1] = {{"weights", lin(0, {{WC, w_all}})},
                       {"KV cache", lin(0, {{CC, kv_all}})},
                       {"prefixes held once", lin(pool_on(offload::Tier::Cpu), {})},
                       {"hidden states", lin(0, {{HC, h_all}})},
                       {"eviction scores", lin(scores, {})}};
  t.memory_items[2] = {{"weights", lin(0, {{WN, w_all}})},
                       {"KV cache", lin(0, {{CN, kv_all}})},
                       {"prefixes held once", lin(pool_on(offload::Tier::Disk), {})},
                       {"hidden states", lin(0, {{HN, h_all}})}};
  t.hw_capacity = {hw.gpu_mem, hw.cpu_mem, hw.disk_mem};
  t.safety = hw.memory_safety;
  t.shared_host = hw.gpu_is_host_memory;
  for (std::size_t i = 0; i < 3; ++i) t.capacity[i] = hw.memory_safety * static_cast<double>(t.hw_capacity[i]);
}

// What one decode step of a block computes and moves, per layer (see build_terms). Fixed
// blocks: every sequence decodes one row over the cache's mean length. Continuous batching:
// the job's mean slot-step, newcomers' prompts among the rows.
struct StepLoad {
  double rows_per_seq = 1;      // rows a sequence computes (weights moved for them: MoE)
  double gemm = 0, head = 0;    // the K GPU batches' layer GEMMs; the head's, spread over the layers
  double kv_len = 0;            // cache tokens a decode row attends over
  double kv_read = 0;           // KV bytes attended over
  double kv_moved = 0;          // of them, those of the rows (staged in, or from disk): not a held prefix's
  double pool_moved = 0;        // a staged pool's rows the GPU batches read (each its families' once)
  double kv_store = 0;          // KV bytes written back
  double kv_values_read = 0;    // cached values a step attends over (dequantization)
  double attn_flops = 0;        // decode attention
  double attn_shared_flops = 0;  // of it, over prefixes another row of the group reads (cascade attention)
  double prefill_attn = 0;      // seconds of newcomers' prefill attention
  double hidden = 0;            // hidden-state bytes in and out
  double busy = 1;              // share of the sequences holding a request (disk requests)
  double host = 0;              // seconds of the step's host work (HardwareProfile::host_row), the whole step's
};

// The model of one block, as linear forms of the fractions: what a prefill and a decode step
// compute and move per layer (StepLoad), then the transfer and compute terms they give.
class TermBuilder {
 public:
  TermBuilder(const ModelShape& m, const HardwareProfile& hw, const Workload& w, const PlanOptions& o, const Block& blk)
      : m_(m), hw_(hw), w_(w), o_(o), blk_(blk), z_(model_sizes(m)) {}
  Terms build() const;

 private:
  // A GEMM over `rows` rows costs its flops at the rate for that many rows, but no less than
  // reading its weight matrix from device memory once (each GPU batch reads it again). A
  // unit's own measured curve (a decoder layer, the head), where the profile has it, counts
  // what the engine pays around the GEMMs too.
  double rate(const RateCurve& unit, double rows, double fallback_rate) const {
    return hw_.rows_rate(unit, rows, fallback_rate);
  }
  double read_floor(double weight_bytes) const { return hw_.gpu_memory > 0 ? weight_bytes / hw_.gpu_memory : 0.0; }
  double gemm(const RateCurve& unit, double rows, double flops_per_row, double weight_bytes, double fallback_rate) const {
    return std::max(rows * flops_per_row / rate(unit, rows, fallback_rate), read_floor(weight_bytes));
  }
  // The output head runs once per GPU batch and step for the last row of every sequence
  // (spread over the layers here).
  double head_per_layer(double rows) const {
    return k_ * gemm(hw_.head_by_rows, rows, head_flops_, head_bytes_, hw_.gpu_gemm_decode) / l_;
  }
  StepLoad fixed_decode() const;
  StepLoad continuous_step() const;
  // Fixed blocks' prefill step (continuous batching has none of its own: newcomers prefill within the steps).
  void add_prefill_terms(Terms& t, double w_dequant) const;
  void add_decode_terms(Terms& t, const StepLoad& d, double w_dequant) const;

  const ModelShape& m_;
  const HardwareProfile& hw_;
  const Workload& w_;
  const PlanOptions& o_;
  const Block& blk_;
  const ModelSizes z_;
  const double l_ = static_cast<double>(m_.layers), g_ = static_cast<double>(blk_.gbs), k_ = static_cast<double>(blk_.k);
  const double bls_ = g_ * k_;
  const double s_ = static_cast<double>(w_.prompt_len), n_ = static_cast<double>(w_.gen_len);
  const double kvtok_ = static_cast<double>(kv_tokens(m_, w_, o_.kv));
  const bool evicting_ = o_.kv.name != "full";
  const double h1_ = static_cast<double>(m_.hidden);
  const double kvt_ = static_cast<double>(z_.kv_per_token_layer);
  const double hid_ = h1_ * static_cast<double>(kernels::dtype_size(hw_.activation_dtype));
  const double layer_flops_ = 2.0 * static_cast<double>(z_.layer_params);
  const double head_flops_ = m_.output_head ? 2.0 * static_cast<double>(m_.vocab) * h1_ : 0.0;
  const double layer_bytes_ = static_cast<double>(z_.layer_weights), head_bytes_ = static_cast<double>(z_.head_weights);
  // A disk-homed KV cache moves as one request per (sequence, kv head) and K/V, each a small
  // piece (a slot, or a head's rows) that pays a request time beyond its bytes.
  const double kv_requests_ = 2 * bls_ * static_cast<double>(m_.kv_heads);
};

StepLoad TermBuilder::fixed_decode() const {
  StepLoad d;
  d.kv_len = std::min(kvtok_, s_ + n_ / 2);  // average cache length during decode
  d.kv_read = d.kv_moved = kvt_ * bls_ * d.kv_len;
  d.kv_values_read = 2.0 * static_cast<double>(m_.kv_heads * m_.head_dim) * bls_ * d.kv_len;
  d.attn_flops = 4 * bls_ * d.kv_len * h1_;
  d.hidden = hid_ * bls_;
  d.gemm = k_ * gemm(hw_.layer_by_rows, g_, layer_flops_, layer_bytes_, hw_.gpu_gemm_decode);
  d.head = head_per_layer(g_);
  // Under eviction the engine writes back whole budget-sized rows of staged sequences.
  d.kv_store = evicting_ ? d.kv_read : kvt_ * bls_;
  return d;
}

// A mean slot-step: its decode rows run at the rate of a step's decode rows (one per busy
// sequence of the GPU batch), its newcomers' prompt rows at the rate of a step that also
// prefills one mean prompt; the weights are read once per GPU batch and step either way.
StepLoad TermBuilder::continuous_step() const {
  const SlotStep& ss = blk_.slot_step;
  const double mean_prompt = w_.mean_prompt_len > 0 ? w_.mean_prompt_len : s_;
  const double step_rows = std::max(g_ * ss.busy, 1.0);
  StepLoad d;
  d.busy = ss.busy;
  d.rows_per_seq = ss.rows();
  d.kv_len = ss.decode_rows > 0 ? std::min(kvtok_, ss.kv_attended / ss.decode_rows) : 0.0;
  d.kv_read = kvt_ * bls_ * ss.decode_rows * d.kv_len;
  // A held prefix is read from the pool (in place, or staged: pool_moved); the rows hold what follows it.
  const double held = blk_.pool_rows > 0 ? std::min(w_.held.mean_prefix, d.kv_len) : 0.0;
  d.kv_moved = kvt_ * bls_ * ss.decode_rows * (d.kv_len - held);
  // A staged pool: each GPU batch loads the rows of the families it holds, each prefix once.
  if (blk_.pool_rows > 0 && blk_.pool_staged())
    d.pool_moved = k_ * std::min(static_cast<double>(blk_.pool_rows), g_ * ss.busy) * kvt_ * held;
  // A group's prefix is read (and dequantized) once: the other members only compute over it.
  const double read_by_others = std::min(ss.kv_prefix_read_by_others, ss.decode_rows * d.kv_len);
  d.kv_values_read =
      2.0 * static_cast<double>(m_.kv_heads * m_.head_dim) * bls_ * (ss.decode_rows * d.kv_len - read_by_others);
  d.attn_flops = 4 * bls_ * ss.decode_rows * d.kv_len * h1_;
  d.attn_shared_flops = 4 * bls_ * read_by_others * h1_;
  d.prefill_attn = bls_ * 4 * ss.prompt_sq * h1_ / hw_.gpu_attn_prefill;
  d.hidden = hid_ * bls_ * ss.rows();
  const double compute =
      g_ * ss.decode_rows * layer_flops_ / rate(hw_.layer_by_rows, step_rows, hw_.gpu_gemm_decode) +
      g_ * ss.prefill_rows * layer_flops_ / rate(hw_.layer_by_rows, step_rows + mean_prompt, hw_.gpu_gemm_prefill);
  d.gemm = k_ * std::max(compute, read_floor(layer_bytes_));
  d.head = head_per_layer(step_rows);
  d.kv_store = evicting_ ? d.kv_read : kvt_ * bls_ * ss.rows();
  d.host = hw_.host_row * bls_ * ss.busy;  // each busy slot's token sampled and recorded on its own
  return d;
}

void TermBuilder::add_prefill_terms(Terms& t, double w_dequant) const {
  const auto lin = linear_form;
  const double cg_bw = hw_.cpu_to_gpu, gc_bw = hw_.gpu_to_cpu, dc_bw = hw_.disk_to_cpu, cd_bw = hw_.cpu_to_disk;
  const double wl = weights_moved(m_, z_, blk_, s_);
  const double hid_pre = hid_ * bls_ * s_;
  const double kv_pre = kvt_ * bls_ * std::min(s_, kvtok_);
  const double kv_disk_write_pre = kv_requests_ * hw_.disk_rows_write_request;
  const double gemm_pre =
      k_ * gemm(hw_.layer_by_rows, g_ * s_, layer_flops_, layer_bytes_, hw_.gpu_gemm_prefill) + head_per_layer(g_);
  t.ctog_pre = lin(0, {{WC, wl / cg_bw}, {WN, wl / cg_bw}, {HC, hid_pre / cg_bw}, {HN, hid_pre / cg_bw}});
  t.dtoc_pre = lin(0, {{WN, wl / dc_bw}, {HN, hid_pre / dc_bw}});
  t.gtoc_pre = lin(0, {{CC, kv_pre / gc_bw}, {CN, kv_pre / gc_bw}, {HC, hid_pre / gc_bw}, {HN, hid_pre / gc_bw}});
  t.ctod_pre = lin(0, {{CN, kv_pre / cd_bw + kv_disk_write_pre}, {HN, hid_pre / cd_bw}});
  t.comp_pre = lin(gemm_pre + bls_ * 4 * s_ * s_ * h1_ / hw_.gpu_attn_prefill + w_dequant, {});
  // Where copies take the cores that compute (the CPU backend), the part of the cpu<->gpu
  // copies that does not hide behind compute adds to it.
  const double exposed = 1 - hw_.copy_overlap;
  t.comp_pre = t.comp_pre.plus(t.ctog_pre, exposed).plus(t.gtoc_pre, exposed);
  // On one host the disk's small KV requests also take the cores that compute (add_decode_terms).
  if (hw_.gpu_is_host_memory) t.comp_pre = t.comp_pre.plus(lin(0, {{CN, kv_disk_write_pre}}), 1);
}

void TermBuilder::add_decode_terms(Terms& t, const StepLoad& d, double w_dequant) const {
  const auto lin = linear_form;
  const double cg_bw = hw_.cpu_to_gpu, gc_bw = hw_.gpu_to_cpu, dc_bw = hw_.disk_to_cpu, cd_bw = hw_.cpu_to_disk;
  const double wl_gen = weights_moved(m_, z_, blk_, d.rows_per_seq);
  const double kv_disk_write_gen =
      d.busy * kv_requests_ * (evicting_ ? hw_.disk_rows_write_request : hw_.disk_write_request);
  const double kv_disk_read = d.busy * kv_requests_ * hw_.disk_read_request;
  const double cache_in = blk_.ccc ? 0 : d.kv_moved / cg_bw;
  // A staged pool's rows come in each step (from disk through the cpu); a filled row's write
  // back, once a family's, is left out.
  const double pool_from_disk = blk_.pool_tier == offload::Tier::Disk ? d.pool_moved / dc_bw : 0.0;
  t.ctog_gen = lin(d.pool_moved / cg_bw, {{WC, wl_gen / cg_bw},
                                          {WN, wl_gen / cg_bw},
                                          {HC, d.hidden / cg_bw},
                                          {HN, d.hidden / cg_bw},
                                          {CC, cache_in},
                                          {CN, cache_in}});
  // With cpu_cache_compute the cpu-homed cache is attended in place: only the new tokens move.
  const double kv_store_cpu = blk_.ccc ? kvt_ * bls_ * d.rows_per_seq : d.kv_store;
  t.gtoc_gen =
      lin(0, {{CC, kv_store_cpu / gc_bw}, {CN, d.kv_store / gc_bw}, {HC, d.hidden / gc_bw}, {HN, d.hidden / gc_bw}});
  t.dtoc_gen = lin(pool_from_disk,
                   {{CN, d.kv_moved / dc_bw + kv_disk_read}, {HN, d.hidden / dc_bw}, {WN, wl_gen / (0.95 * dc_bw)}});
  t.ctod_gen = lin(0, {{CN, d.kv_store / cd_bw + kv_disk_write_gen}, {HN, d.hidden / cd_bw}});
  // Dequantization where the profile measures it (bytes/s of q4 = 2 values per byte): every
  // decode step expands the compressed KV it reads. Writing (quantizing) it is left out: one
  // new token per step.
  const double kv_dequant =
      kernels::is_quantized(m_.cache_dtype) && hw_.dequant > 0 ? d.kv_values_read * 0.5 / hw_.dequant : 0.0;
  // Decode attention at the rate for its cache length, less the read share of the flops over
  // prefixes another member of the group reads.
  const double gpu_attn = (d.attn_flops - hw_.gpu_attn_decode_read_share * d.attn_shared_flops) /
                              rate_at(hw_.gpu_attn_decode_by_len, d.kv_len, hw_.gpu_attn_decode) +
                          kv_dequant;
  const double cpu_attn = (d.attn_flops - hw_.cpu_attn_decode_read_share * d.attn_shared_flops) /
                              rate_at(hw_.cpu_attn_decode_by_len, d.kv_len, hw_.cpu_attn_decode) +
                          kv_dequant;
  const double gpu_token = 4 * h1_ / rate_at(hw_.gpu_attn_decode_by_len, d.kv_len, hw_.gpu_attn_decode);
  const double cpu_token = blk_.ccc ? 4 * h1_ / rate_at(hw_.cpu_attn_decode_by_len, d.kv_len, hw_.cpu_attn_decode) : gpu_token;
  t.context_token = lin(0, {{CG, gpu_token}, {CC, cpu_token}, {CN, cpu_token}});
  t.comp_gen = lin(d.gemm + d.head + w_dequant + d.prefill_attn + d.host / l_,
                   {{CG, gpu_attn}, {CC, blk_.ccc ? cpu_attn : gpu_attn}, {CN, blk_.ccc ? cpu_attn : gpu_attn}});
  // Copies that take the cores that compute (the CPU backend): the gpu->cpu part that does not
  // hide (at decode the copy in already precedes the compute).
  t.comp_gen = t.comp_gen.plus(t.gtoc_gen, 1 - hw_.copy_overlap);
  // On one host the small requests of a disk-homed KV also take the cores that compute: the
  // kernel spends them pinning pages and completing O_DIRECT requests (measured: a KV on disk
  // adds ~1.4 s of system time to a 4 s run, and a prefill takes its compute plus the head-row
  // writes). Their bytes still stream beside the compute.
  if (hw_.gpu_is_host_memory) t.comp_gen = t.comp_gen.plus(lin(0, {{CN, kv_disk_read + kv_disk_write_gen}}), 1);
}

Terms TermBuilder::build() const {
  // Dequantization where the profile measures it: every GEMM call (once per GPU batch)
  // expands its weight matrices, the head's included (embedding lookups only gather rows).
  const double w_dequant = kernels::is_quantized(m_.weight_dtype) && hw_.dequant > 0
                               ? k_ * (static_cast<double>(z_.layer_params) + head_flops_ / 2 / l_) * 0.5 / hw_.dequant
                               : 0.0;
  Terms t;
  t.overlap = blk_.overlap;
  t.slot_step = blk_.slot_step;
  if (!w_.continuous) add_prefill_terms(t, w_dequant);
  add_decode_terms(t, w_.continuous ? continuous_step() : fixed_decode(), w_dequant);
  // Held prefixes: rows sized for what follows a prefix (the pool is a memory item of its own);
  // the decodes still attend over every token.
  add_memory_items(t, m_, z_, hw_, w_, o_, blk_, blk_.pool_rows > 0 ? static_cast<double>(w_.held.rest) : kvtok_);
  return t;
}

Terms build_terms(const ModelShape& m, const HardwareProfile& hw, const Workload& w, const PlanOptions& o,
                  const Block& blk) {
  return TermBuilder(m, hw, w, o, blk).build();
}

struct Solved {
  Fractions x{};
};

// Per-layer step times. Overlapped: FlexGen's max over concurrent transfers and compute (the
// cpu->gpu copy of a decode step gates its compute); without overlap everything runs in line.
// On one host (gpu_is_host_memory: the CPU backend) the disk's reads and writes share its queue
// and the cores that issue them, so they add up instead of overlapping (measured: a disk-homed
// KV's reads and slot writes do not hide behind each other there).
double step_time_pre(const Terms& t, const Fractions& x) {
  const double ctog = t.ctog_pre.at(x), dtoc = t.dtoc_pre.at(x), gtoc = t.gtoc_pre.at(x), ctod = t.ctod_pre.at(x),
               comp = t.comp_pre.at(x);
  if (!t.overlap) return ctog + dtoc + gtoc + ctod + comp;
  if (t.shared_host) return std::max({ctog + dtoc, gtoc + ctod, dtoc + ctod, comp});
  return std::max({ctog + dtoc, gtoc + ctod, comp});
}
double step_time_gen(const Terms& t, const Fractions& x) {
  const double ctog = t.ctog_gen.at(x), dtoc = t.dtoc_gen.at(x), gtoc = t.gtoc_gen.at(x), ctod = t.ctod_gen.at(x),
               comp = t.comp_gen.at(x);
  if (!t.overlap) return ctog + dtoc + gtoc + ctod + comp;
  if (t.shared_host) return ctog + std::max({gtoc, dtoc + ctod, comp});
  return ctog + std::max({gtoc, dtoc, ctod, comp});
}

// Steps of one block in the objective: fixed blocks, a prefill and gen_len - 1 decode steps;
// continuous batching, the mean steps alone (the job's count does not depend on placement).
std::pair<double, double> steps_of(const Workload& w) {
  if (w.continuous) return {0.0, 1.0};
  return {1.0, std::max(static_cast<double>(w.gen_len) - 1, 0.0)};
}

// A block's linear program over the nine fractions and the two step times (Var), its rows
// added one by one: sums of linear forms plus a step time against a bound.
class Lp {
 public:
  Lp() : lp_(glp_create_prob(), glp_delete_prob) {
    glp_set_obj_dir(lp_.get(), GLP_MIN);
    glp_add_cols(lp_.get(), kVars);
    for (int v = 0; v < kVars; ++v) glp_set_col_bnds(lp_.get(), v + 1, v < 9 ? GLP_DB : GLP_LO, 0.0, v < 9 ? 1.0 : 0.0);
  }
  void fix(Var v, double value) { glp_set_col_bnds(lp_.get(), v + 1, GLP_FX, value, value); }
  void objective(Var v, double coef) { glp_set_obj_coef(lp_.get(), v + 1, coef); }
  // sum of `forms` + tcoef x T (>=, <= or = by `type`) bound.
  void add(std::initializer_list<const Linear*> forms, Var tvar, double tcoef, int type, double bound) {
    glp_add_rows(lp_.get(), 1);
    ++row_;
    Fractions a{};
    double c0 = 0;
    for (const Linear* f : forms) {
      c0 += f->c0;
      for (std::size_t i = 0; i < 9; ++i) a[i] += f->a[i];
    }
    for (std::size_t i = 0; i < 9; ++i)
      if (a[i] != 0) entry(static_cast<int>(i), a[i]);
    if (tcoef != 0) entry(tvar, tcoef);
    const double lo = type == GLP_UP ? 0.0 : bound - c0, hi = type == GLP_LO ? 0.0 : bound - c0;
    glp_set_row_bnds(lp_.get(), row_, type, lo, hi);
  }
  // T >= the sum of `forms`, i.e. T - (a.x) >= c0.
  void time_row(std::initializer_list<const Linear*> forms, Var tvar) {
    Linear neg;
    for (const Linear* f : forms) {
      neg.c0 -= f->c0;
      for (std::size_t i = 0; i < 9; ++i) neg.a[i] -= f->a[i];
    }
    add({&neg}, tvar, 1.0, GLP_LO, 0.0);
  }
  std::optional<Fractions> solve() {
    glp_load_matrix(lp_.get(), static_cast<int>(ia_.size()) - 1, ia_.data(), ja_.data(), ar_.data());
    glp_smcp parm;
    glp_init_smcp(&parm);
    parm.msg_lev = GLP_MSG_OFF;
    if (glp_simplex(lp_.get(), &parm) != 0 || glp_get_status(lp_.get()) != GLP_OPT) return std::nullopt;
    Fractions x{};
    for (int i = 0; i < 9; ++i) x[static_cast<std::size_t>(i)] = std::clamp(glp_get_col_prim(lp_.get(), i + 1), 0.0, 1.0);
    return x;
  }

 private:
  void entry(int column, double value) {
    ia_.push_back(row_);
    ja_.push_back(column + 1);
    ar_.push_back(value);
  }
  std::unique_ptr<glp_prob, decltype(&glp_delete_prob)> lp_;
  std::vector<int> ia_{0}, ja_{0};
  std::vector<double> ar_{0};
  int row_ = 0;
};

// min l * (prefill steps x Tpre + decode steps x Tgen) subject to the (overlapped) step-time
// and memory constraints.
std::optional<Solved> solve(const Terms& t, double layers, const Workload& w, bool weights_on_gpu, bool hidden_on_gpu) {
  Lp lp;
  if (weights_on_gpu) lp.fix(WG, 1.0);
  if (hidden_on_gpu) lp.fix(HG, 1.0);
  // On one host a disk-homed hidden state is a small request per GPU batch and layer that
  // queues behind the weights streaming from the same disk, and the compute waits for it
  // (measured, Llama-3.2-1B-shaped f16 model in a 1.5 GiB cgroup, gpu batch 1 x 16: 8448
  // loads and as many stores of 8 KiB took 71 s and 74 s, against 56 s for all weight loads),
  // while it frees at most a block's hidden states (MiBs) for weights: never worth it.
  if (t.shared_host) lp.fix(HN, 0.0);
  const auto [prefill_steps, decode_steps] = steps_of(w);
  lp.objective(TPRE, layers * prefill_steps);
  lp.objective(TGEN, layers * decode_steps);
  lp.time_row({&t.ctog_pre, &t.dtoc_pre}, TPRE);
  lp.time_row({&t.gtoc_pre, &t.ctod_pre}, TPRE);
  lp.time_row({&t.comp_pre}, TPRE);
  for (const Linear* other : {&t.gtoc_gen, &t.dtoc_gen, &t.ctod_gen, &t.comp_gen}) lp.time_row({&t.ctog_gen, other}, TGEN);
  if (t.shared_host) {  // one host's disk: reads and writes add up (step_time_pre/gen)
    lp.time_row({&t.dtoc_pre, &t.ctod_pre}, TPRE);
    lp.time_row({&t.ctog_gen, &t.dtoc_gen, &t.ctod_gen}, TGEN);
  }
  std::array<Linear, 3> memory;
  for (std::size_t tier = 0; tier < 3; ++tier) {
    memory[tier] = t.memory(static_cast<int>(tier));
    lp.add({&memory[tier]}, TPRE, 0.0, GLP_UP, t.capacity[tier]);
  }
  if (t.shared_host) lp.add({&memory[0], &memory[1]}, TPRE, 0.0, GLP_UP, std::max(t.capacity[0], t.capacity[1]));
  for (Var first : {WG, CG, HG}) {  // each kind's three fractions sum to one
    Linear sum;
    for (int i = 0; i < 3; ++i) sum.a[static_cast<std::size_t>(first + i)] = 1;
    lp.add({&sum}, TPRE, 0.0, GLP_FX, 1.0);
  }
  const std::optional<Fractions> x = lp.solve();
  if (!x) return std::nullopt;
  return Solved{*x};
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

// A tier's items at fractions x, largest first, the empty ones left out.
std::vector<std::pair<std::string, std::int64_t>> items_at(const Terms& t, int tier, const Fractions& x) {
  std::vector<std::pair<std::string, std::int64_t>> items;
  for (const MemoryItem& item : t.memory_items[static_cast<std::size_t>(tier)]) {
    const auto bytes = static_cast<std::int64_t>(item.bytes.at(x));
    if (bytes > 0) items.emplace_back(item.name, bytes);
  }
  std::ranges::stable_sort(items, std::greater<>{}, &std::pair<std::string, std::int64_t>::second);
  return items;
}

Estimate make_estimate(const ModelShape& m, const Workload& w, const Terms& t, const Fractions& x, Policy p) {
  Estimate e;
  p.weights = {x[WG], x[WC], x[WN]};
  p.cache = {x[CG], x[CC], x[CN]};
  p.activations = {x[HG], x[HC], x[HN]};
  e.policy = p;
  if (w.continuous) e.prefill_budget = w.prefill_budget;
  const double l = static_cast<double>(m.layers), bls = static_cast<double>(p.block_size());
  e.decode_step_seconds = l * step_time_gen(t, x);
  if (w.continuous) {
    // Every busy slot gives a token per step (a newcomer's from its prefill).
    // Requests not known: the mean request's steps.
    const SlotStep& ss = t.slot_step;
    const double mean_gen = w.mean_gen_len > 0 ? w.mean_gen_len : static_cast<double>(w.gen_len);
    const double steps = ss.steps > 0 ? ss.steps : std::max(mean_gen, 1.0);
    e.continuous = true;
    e.slot_step = ss;
    e.decode_seconds = steps * e.decode_step_seconds;
    e.decode_throughput = e.total_throughput = ss.busy * bls / e.decode_step_seconds;
    e.compute_seconds = l * steps * t.comp_gen.at(x);
    e.generated_tokens = ss.busy * bls * steps;
    e.context_token_seconds = l * t.context_token.at(x);
  } else {
    e.prefill_seconds = l * step_time_pre(t, x);
    e.decode_seconds = static_cast<double>(std::max<std::int64_t>(w.gen_len - 1, 0)) * e.decode_step_seconds;
    e.prefill_throughput = bls * static_cast<double>(w.prompt_len) / e.prefill_seconds;
    e.decode_throughput = e.decode_seconds > 0 ? bls * static_cast<double>(w.gen_len - 1) / e.decode_seconds : 0;
    e.total_throughput = bls * static_cast<double>(w.gen_len) / (e.prefill_seconds + e.decode_seconds);
    e.compute_seconds =
        l * (t.comp_pre.at(x) + static_cast<double>(std::max<std::int64_t>(w.gen_len - 1, 0)) * t.comp_gen.at(x));
    e.generated_tokens = bls * static_cast<double>(w.gen_len);
  }
  for (int tier = 0; tier < 3; ++tier) {
    e.peak_bytes[static_cast<std::size_t>(tier)] = static_cast<std::int64_t>(t.memory(tier).at(x));
    e.memory[static_cast<std::size_t>(tier)] = items_at(t, tier, x);
  }
  e.bottleneck = bottleneck_of(t, x);
  return e;
}

// Every policy the search evaluates, ranked: the plan is the first, --explain prints the top.
class Ranking {
 public:
  explicit Ranking(std::size_t keep) : keep_(keep) {}
  void add(Estimate e) {
    // The same placement at the same block (e.g. met again while bisecting K) counts once.
    for (const Estimate& r : best_)
      if (same_policy(r.policy, e.policy)) return;
    auto at = std::ranges::find_if(best_, [&](const Estimate& r) { return e.total_throughput > r.total_throughput; });
    best_.insert(at, std::move(e));
    if (best_.size() > keep_) best_.pop_back();
  }
  const std::vector<Estimate>& best() const { return best_; }
  // Fastest first, except that near_tie_pick's choice leads: e.g. one GPU batch of 16 rows
  // rather than 16 batches of one row each on a CPU.
  std::vector<Estimate> ranked(std::size_t count) const {
    std::vector<Estimate> r = best_;
    if (r.empty()) return r;
    const Estimate& pick = near_tie_pick(std::span<const Estimate>(r), [](const Estimate& e) { return e.total_throughput; },
                                         [](const Estimate& e) { return e.compute_per_token(); });
    const auto robust = r.begin() + (&pick - r.data());
    std::rotate(r.begin(), robust, robust + 1);
    r.resize(std::min(r.size(), count));
    return r;
  }

 private:
  static bool same_policy(const Policy& a, const Policy& b) {
    return a.gpu_batch_size == b.gpu_batch_size && a.num_gpu_batches == b.num_gpu_batches &&
           a.cpu_cache_compute == b.cpu_cache_compute && a.resident_embeddings == b.resident_embeddings &&
           a.percent() == b.percent() && a.prefix_pool == b.prefix_pool;
  }
  std::size_t keep_;
  std::vector<Estimate> best_;
};

// Solves the placement of one (gbs, K) for every engine variant: cpu_cache_compute or not,
// weights and hidden states wholly on the gpu (no staging buffers) or split, and split weights
// with the embeddings and head split alike or resident. Each feasible one
// goes into the ranking; true when any fits.
// The best placement of one engine variant (blk), when one fits.
std::optional<Estimate> solve_variant(const ModelShape& m, const HardwareProfile& hw, const Workload& w,
                                      const PlanOptions& o, const Block& blk) {
  const Terms t = build_terms(m, hw, w, o, blk);
  const auto sol =
      solve(t, static_cast<double>(m.layers), w, !blk.weights_staged, !blk.hidden_staged);
  if (!sol) return std::nullopt;
  Policy p;
  p.gpu_batch_size = blk.gbs;
  p.num_gpu_batches = blk.k;
  p.cpu_cache_compute = blk.ccc;
  p.resident_embeddings = blk.resident_embeddings;
  p.kv = o.kv.text.empty() ? o.kv.name : o.kv.text;
  p.compress_weight = o.compress_weight;
  p.compress_cache = o.compress_cache;
  p.compress_bits = o.compress_bits;
  p.cache_storage = o.cache_storage;
  if (blk.pool_rows > 0) p.prefix_pool = offload::tier_name(blk.pool_tier);
  return make_estimate(m, w, t, sol->x, p);
}

bool evaluate_block(const ModelShape& m, const HardwareProfile& hw, const Workload& job, const PlanOptions& o,
                    std::int64_t gbs, std::int64_t k, Ranking& ranking) {
  bool any = false;
  const Workload w = with_prefill_budget(job, hw, gbs);
  const SlotStep step = w.continuous ? slot_step(w, gbs * k, gbs) : SlotStep{};
  const std::int64_t pool_rows = o.kv.name == "full" ? w.pool_rows(gbs * k, gbs) : 0;
  // Held, a family whose row went to another computes its prefix again when it comes back.
  const SlotStep held_step = pool_rows > 0 ? slot_step(w, gbs * k, gbs, pool_rows) : step;
  for (bool ccc : {false, true}) {
    if (ccc && !o.allow_cpu_cache_compute) continue;
    for (bool weights_on_gpu : {true, false}) {
      for (bool resident_embeddings : {false, true}) {
        if (weights_on_gpu && resident_embeddings) continue;  // nothing is staged either way
        for (bool hidden_on_gpu : {true, false}) {
          Block blk{gbs, k, ccc, !weights_on_gpu, !hidden_on_gpu, true, true};
          blk.resident_embeddings = resident_embeddings;
          blk.slot_step = step;
          // Where the engine would hold the prefixes once, each placement with the pool on each
          // tier (the rows sized for what follows a prefix); where it would not, or no pool
          // fits, with the prefixes copied into the rows.
          bool fits = false;
          for (const offload::Tier tier : {offload::Tier::Gpu, offload::Tier::Cpu, offload::Tier::Disk}) {
            blk.pool_rows = pool_rows;
            blk.pool_tier = tier;
            blk.slot_step = held_step;
            if (auto e = pool_rows > 0 ? solve_variant(m, hw, w, o, blk) : std::nullopt) {
              ranking.add(std::move(*e));
              fits = true;
            }
          }
          blk.pool_rows = 0;
          blk.slot_step = step;
          if (auto e = fits ? std::nullopt : solve_variant(m, hw, w, o, blk)) {
            ranking.add(std::move(*e));
            fits = true;
          }
          any = any || fits;
        }
      }
    }
  }
  return any;
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
    s.items = items_at(t, tier, x);
    return s;
  }
  const double host = t.memory(0).at(x) + t.memory(1).at(x);
  const int larger = t.capacity[0] > t.capacity[1] ? 0 : 1;  // the host memory; the other tier's limit is its own
  if (t.shared_host && host > t.capacity[static_cast<std::size_t>(larger)] * (1 + 1e-5)) {
    Shortfall s;
    s.tier = offload::Tier::Cpu;
    s.gpu_is_host_memory = true;
    s.need = static_cast<std::int64_t>(host);
    s.available = static_cast<std::int64_t>(t.capacity[static_cast<std::size_t>(larger)]);
    s.safety = t.safety;
    s.capacity = t.hw_capacity[static_cast<std::size_t>(larger)];
    for (int tier = 0; tier < 2; ++tier)
      for (auto& [name, bytes] : items_at(t, tier, x))
        s.items.emplace_back(name + (tier == 0 ? " (gpu tier)" : " (cpu tier)"), bytes);
    std::ranges::stable_sort(s.items, std::greater<>{}, &std::pair<std::string, std::int64_t>::second);
    return s;
  }
  return std::nullopt;
}

}  // namespace

std::optional<Estimate> estimate(const ModelShape& shape, const HardwareProfile& hw, const Workload& job,
                                 const Policy& p, const PlanOptions& o) {
  const ModelShape m = with_compression(shape, p);
  const Workload w = with_prefill_budget(job, hw, p.gpu_batch_size);
  const Fractions x = fractions_of(p);
  const Terms t = build_terms(m, hw, w, o, block_of(p, w));
  if (first_shortfall(t, x)) return std::nullopt;
  return make_estimate(m, w, t, x, p);
}

std::optional<Shortfall> shortfall(const ModelShape& shape, const HardwareProfile& hw, const Workload& job,
                                   const Policy& p, const PlanOptions& o) {
  const ModelShape m = with_compression(shape, p);
  const Workload w = with_prefill_budget(job, hw, p.gpu_batch_size);
  return first_shortfall(build_terms(m, hw, w, o, block_of(p, w)), fractions_of(p));
}

std::string Shortfall::describe() const {
  std::string items_text;
  for (const auto& [name, bytes] : items)
    if (bytes > 0) items_text += (items_text.empty() ? "" : ", ") + name + " " + offload::format_bytes(bytes);
  const std::string where = gpu_is_host_memory ? "gpu and cpu tiers (one host memory) need "
                                                 : std::string(offload::tier_name(tier)) + " tier needs ";
  return where + offload::format_bytes(need) + " (" + items_text +
         ") but has " + offload::format_bytes(available) + " (" + std::to_string(static_cast<int>(safety * 100 + 0.5)) +
         "% of " + offload::format_bytes(capacity) + ")";
}

Estimate estimate_or_throw(const ModelShape& m, const HardwareProfile& hw, const Workload& w, const Policy& p,
                           const PlanOptions& o, const std::string& what) {
  if (const auto e = estimate(m, hw, w, p, o)) return *e;
  const auto s = shortfall(m, hw, w, p, o);
  std::vector<kernels::OptionText::Piece> text{what + " does not fit " + hw.name + ": " +
                                               (s ? s->describe() : "no tier is short") + "; "};
  for (auto& piece : offload::tier_hint(s ? s->tier : offload::Tier::Gpu)) text.push_back(std::move(piece));
  throw kernels::OptionError(std::move(text));
}

ModelShape with_compression(const ModelShape& shape, const PlanOptions& o) {
  Policy compression;
  compression.compress_weight = o.compress_weight;
  compression.compress_cache = o.compress_cache;
  compression.compress_bits = o.compress_bits;
  compression.cache_storage = o.cache_storage;
  return with_compression(shape, compression);
}

void search_blocks(std::int64_t max_block, const std::function<bool(std::int64_t, std::int64_t)>& fits_block) {
  for (std::int64_t gbs : {1, 2, 3, 4, 8, 12, 16, 24, 32, 40, 48, 64, 96, 128, 192, 256, 384, 512}) {
    // The largest feasible K by doubling and bisection.
    auto fits = [&](std::int64_t k) { return gbs * k <= max_block && fits_block(gbs, k); };
    if (!fits(1)) continue;
    std::int64_t lo = 1, hi = 2;
    while (fits(hi)) {
      lo = hi;
      hi *= 2;
    }
    while (hi - lo > 1) {
      const std::int64_t mid = (lo + hi) / 2;
      (fits(mid) ? lo : hi) = mid;
    }
    // Throughput need not grow with K (the KV may spill to a slower tier, the CPU's share of
    // attention grows): the K of FlexGen's published policies (3, 8, 12) and the powers of two
    // below the largest feasible one as well.
    for (std::int64_t k : {3, 6, 12, 24})
      if (k < lo) fits(k);
    for (std::int64_t k = 1; k < lo; k *= 2) fits(k);
  }
}

std::optional<Estimate> best_placement(const ModelShape& m, const HardwareProfile& hw, const Workload& w,
                                       const PlanOptions& o, std::int64_t gbs, std::int64_t k) {
  Ranking ranking(1);
  if (!evaluate_block(m, hw, w, o, gbs, k, ranking)) return std::nullopt;
  return ranking.best().front();
}

std::vector<Estimate> plan_ranked(const ModelShape& shape, const HardwareProfile& hw, const Workload& w,
                                  const PlanOptions& o, std::size_t count) {
  const ModelShape m = with_compression(shape, o);
  Ranking ranking(std::max<std::size_t>(count, 64));  // enough to hold those within kPlanNearTie of the fastest
  // Every block tried is ranked.
  search_blocks(o.max_block,
                [&](std::int64_t gbs, std::int64_t k) { return evaluate_block(m, hw, w, o, gbs, k, ranking); });
  if (!ranking.best().empty()) return ranking.ranked(std::max<std::size_t>(count, 1));
  // Nothing fits: name the smallest change, judged at the smallest block.
  const ModelSizes z = model_sizes(m);
  const double safety = hw.memory_safety;
  Block smallest{1, 1, false, true, true, true, true};
  const Workload w1 = with_prefill_budget(w, hw, 1);
  if (w.continuous) smallest.slot_step = slot_step(w1, 1, 1);
  const Terms t = build_terms(m, hw, w1, o, smallest);
  Fractions off_gpu{0, 0, 1, 0, 0, 1, 0, 0, 1};
  const double gpu_need = t.memory(0).at(off_gpu);
  using kernels::Option;
  const std::string msg = "no placement of " + m.name + " fits " + hw.name + ": ";
  if (gpu_need > t.capacity[0]) {
    throw kernels::OptionError{msg + "even with everything off the gpu it needs " +
                                   offload::format_bytes(static_cast<std::int64_t>(gpu_need / safety)) +
                                   " of GPU memory (has " + offload::format_bytes(hw.gpu_mem) +
                                   "); use a larger GPU or ",
                               Option::GpuMem};
  }
  const double need = t.memory(1).at(Fractions{0, 1, 0, 0, 1, 0, 0, 1, 0});
  const double short_by = need - t.capacity[1] - t.capacity[2];
  std::vector<kernels::OptionText::Piece> text{
      msg + "weights, KV and activations need " + offload::format_bytes(static_cast<std::int64_t>(need)) +
          " but cpu + disk allow " + offload::format_bytes(static_cast<std::int64_t>(t.capacity[1] + t.capacity[2])) +
          "; needs " + offload::format_bytes(static_cast<std::int64_t>(short_by / safety)) + " more CPU memory, or ",
      Option::DiskMem,
      " >= " + offload::format_bytes(static_cast<std::int64_t>((need - t.capacity[1]) / safety) + 1)};
  if (o.kv.name == "full" && static_cast<double>(z.total_weights) < need * 0.5)
    text.insert(text.end(), {", or ", Option::KvPolicy, " h2o:0.2"});
  throw kernels::OptionError(std::move(text));
}

Estimate plan(const ModelShape& shape, const HardwareProfile& hw, const Workload& w, const PlanOptions& o) {
  return plan_ranked(shape, hw, w, o, 1).front();
}

}  // namespace flexh2o::policy
