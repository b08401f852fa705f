#include "kernels/cuda/graph_steps.h"

#include <bit>

namespace flexh2o::kernels::cuda {

// A field added to one of these structs must join its signature (a replay would otherwise
// reuse a captured launch that ignores it): these sizes (on 64-bit targets) make the build say so.
static_assert(sizeof(void*) != 8 || sizeof(GemmArgs) == 88, "GemmArgs changed: update signature(const GemmArgs&)");
static_assert(sizeof(void*) != 8 || sizeof(NormArgs) == 72, "NormArgs changed: update signature(GraphOp, const NormArgs&)");
static_assert(sizeof(void*) != 8 || sizeof(RopeArgs) == 80, "RopeArgs changed: update signature(const RopeArgs&)");
static_assert(sizeof(void*) != 8 || sizeof(BiasActArgs) == 72, "BiasActArgs changed: update signature(const BiasActArgs&)");
static_assert(sizeof(void*) != 8 || sizeof(EmbeddingArgs) == 72, "EmbeddingArgs changed: update signature(const EmbeddingArgs&)");
static_assert(sizeof(void*) != 8 || sizeof(AttentionShape) == 40, "AttentionShape changed: update signature(const AttentionDecodeArgs&)");
static_assert(sizeof(void*) != 8 || sizeof(AttentionDecodeArgs) == 216, "AttentionDecodeArgs changed: update its signature");
static_assert(sizeof(void*) != 8 || sizeof(KvWriteArgs) == 96, "KvWriteArgs changed: update signature(const KvWriteArgs&)");

OpSignature& OpSignature::add(float f) { return add(static_cast<std::int64_t>(std::bit_cast<std::uint32_t>(f))); }

namespace {

OpSignature& add_matrix(OpSignature& s, const MatrixRef& m) { return s.add(m.data).add(m.dtype).add(m.rows).add(m.cols); }

}  // namespace

OpSignature signature(const GemmArgs& a) {
  OpSignature s(GraphOp::Gemm);
  s.add(a.x).add(a.m);
  add_matrix(s, a.w);
  return s.add(a.bias).add(a.y).add(a.beta).add(a.compute).add(a.x_bf16).add(a.x_stride);
}

OpSignature signature(GraphOp norm, const NormArgs& a) {
  OpSignature s(norm);
  return s.add(a.x).add(a.y).add(a.rows).add(a.cols).add(a.weight).add(a.bias).add(a.eps).add(a.weight_offset)
      .add(a.accumulate).add(a.y_bf16);
}

OpSignature signature(const RopeArgs& a) {
  OpSignature s(GraphOp::Rope);
  return s.add(a.x).add(a.tokens).add(a.heads).add(a.head_dim).add(a.rotary_dim).add(a.positions).add(a.inv_freq)
      .add(a.attention_factor).add(static_cast<std::int64_t>(a.layout));
}

OpSignature signature(const BiasActArgs& a) {
  OpSignature s(GraphOp::BiasAct);
  return s.add(static_cast<std::int64_t>(a.act)).add(a.x).add(a.bias).add(a.up).add(a.rows).add(a.cols).add(a.out)
      .add(a.out_bf16).add(a.out_stride);
}

OpSignature signature(const EmbeddingArgs& a) {
  OpSignature s(GraphOp::Embedding);
  s.add(a.ids).add(a.offset);
  add_matrix(s, a.table);
  return s.add(a.out).add(a.accumulate).add(a.scale);
}

// Without shared_prefixes, prefix_of, prefix_cache and row_base: a call that reads them (cascade
// attention; a row_base > 0 needs it) ends the graph step before its signature is taken
// (CudaBackend::do_attention_decode).
OpSignature signature(const AttentionDecodeArgs& a) {
  OpSignature s(GraphOp::AttentionDecode);
  const AttentionShape& h = a.shape;
  s.add(h.n_heads).add(h.n_kv_heads).add(h.head_dim).add(h.scale).add(h.softcap).add(h.window);
  return s.add(a.q).add(a.k_cache).add(a.v_cache).add(a.capacity).add(a.lens).add(a.out).add(a.probs)
      .add(a.cache_dtype).add(a.slot_bias).add(a.cache_rows).add(a.compute);
}

OpSignature signature(const KvWriteArgs& a) {
  OpSignature s(GraphOp::KvWrite);
  return s.add(a.src).add(a.cache).add(a.n_kv_heads).add(a.head_dim).add(a.capacity).add(a.seq).add(a.slot)
      .add(a.head_slot).add(a.cache_dtype);
}

OpSignature signature(const ActivationCall& a) {
  OpSignature s(GraphOp::Activation);
  return s.add(static_cast<std::int64_t>(a.act)).add(a.x).add(a.n);
}

OpSignature signature(const GluCall& a) {
  OpSignature s(GraphOp::Glu);
  return s.add(static_cast<std::int64_t>(a.act)).add(a.gate).add(a.up).add(a.out).add(a.n);
}

OpSignature signature(const SoftcapCall& a) {
  OpSignature s(GraphOp::Softcap);
  return s.add(a.x).add(a.n).add(a.cap);
}

OpSignature signature(const AddCall& a) {
  OpSignature s(GraphOp::Add);
  return s.add(a.x).add(a.y).add(a.n);
}

OpSignature signature(const CopyCall& a) {
  OpSignature s(GraphOp::CopyOnDevice);
  return s.add(a.dst).add(a.src).add(static_cast<std::int64_t>(a.bytes));
}

GraphMode GraphKeys::next(std::uint64_t key) const {
  const auto it = keys_.find(key);
  if (it == keys_.end()) return keys_.size() < kMaxKeys ? GraphMode::Record : GraphMode::None;
  return it->second.next;
}

GraphMode GraphKeys::begin(std::uint64_t key) {
  const GraphMode mode = next(key);
  if (mode != GraphMode::None) keys_.try_emplace(key);
  return mode;
}

void GraphKeys::recorded(std::uint64_t key) {
  State& s = keys_[key];
  if (s.next != GraphMode::None) s.next = GraphMode::Capture;
}

void GraphKeys::captured(std::uint64_t key) {
  State& s = keys_[key];
  if (s.next == GraphMode::None) return;
  s.next = GraphMode::Replay;
  s.replayed = false;
}

void GraphKeys::replayed(std::uint64_t key) {
  State& s = keys_[key];
  s.replayed = true;
  s.misses = 0;
}

void GraphKeys::missed(std::uint64_t key) {
  State& s = keys_[key];
  if (s.next == GraphMode::None) return;
  s.misses = s.replayed ? 0 : s.misses + 1;
  s.next = s.misses >= kMaxMisses ? GraphMode::None : GraphMode::Capture;
}

void GraphKeys::give_up(std::uint64_t key) {
  State& s = keys_[key];
  s.next = ++s.failures >= kMaxFailures ? GraphMode::None : GraphMode::Record;
}

void GraphKeys::dropped_graphs() {
  for (auto& [key, s] : keys_)
    if (s.next == GraphMode::Replay) s.next = GraphMode::Capture;
}

std::size_t bump_offset(std::size_t& used, std::size_t bytes) {
  const std::size_t at = (used + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
  used = at + bytes;
  return at;
}

}  // namespace flexh2o::kernels::cuda
