// The attention and KV-cache ops' argument checks, shared by every device, then the device's
// implementation (kernels/cpu/attention_cpu.cc, kernels/cuda/attention_gpu.cu).
#include "kernels/attention.h"

#include "kernels/backend.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_set>

namespace flexh2o::kernels {

void check_kv_similarity(const KvSimilarityArgs& a) {
  for (const KvSimilarityQuery& q : a.queries)
    if (q.seq < 0 || q.head < 0 || q.head >= a.n_kv_heads || q.len < 0 || q.len > a.capacity || q.slot < 0 ||
        q.slot >= a.capacity)
      throw std::out_of_range("kv_similarity: slot outside the cache capacity");
}

void check_kv_merge(const KvMergeArgs& a) {
  for (const KvMerge& m : a.merges)
    if (m.from < 0 || m.from >= a.capacity || m.to < 0 || m.to >= a.capacity || m.head < 0 ||
        m.head >= a.n_kv_heads || m.seq < 0 || m.from == m.to)
      throw std::out_of_range("kv_merge: slot outside the cache capacity, or a slot merged into itself");
  // Merges are order-free (the GPU runs them at once): no slot is written twice, or read after
  // another merge wrote it.
  auto slot_of = [&](const KvMerge& m, std::int64_t s) { return (m.seq * a.n_kv_heads + m.head) * a.capacity + s; };
  std::unordered_set<std::int64_t> targets;
  for (const KvMerge& m : a.merges)
    if (!targets.insert(slot_of(m, m.to)).second)
      throw std::invalid_argument("kv_merge: two merges of one call into the same slot");
  for (const KvMerge& m : a.merges)
    if (targets.count(slot_of(m, m.from))) throw std::invalid_argument("kv_merge: a merge reads a slot another one writes");
}

namespace {

void check_shape(const AttentionShape& s) {
  if (s.n_heads <= 0 || s.n_kv_heads <= 0 || s.head_dim <= 0 || s.n_heads % s.n_kv_heads != 0)
    throw std::invalid_argument("attention: n_heads must be a positive multiple of n_kv_heads");
}

void check_prefill(const AttentionPrefillArgs& a) {
  check_shape(a.shape);
  const std::int64_t B = static_cast<std::int64_t>(a.seq_offsets.size()) - 1;
  if (B < 0) throw std::invalid_argument("attention_prefill: seq_offsets must have B + 1 entries");
  const std::int64_t T = a.seq_offsets[static_cast<std::size_t>(B)];
  if (!a.query_weights.empty() && static_cast<std::int64_t>(a.query_weights.size()) != T)
    throw std::invalid_argument("attention_prefill: query_weights needs one weight per row");
  if (a.seq_offsets[0] != 0) throw std::invalid_argument("attention_prefill: seq_offsets[0] must be 0");
  if (a.compute != DType::F32 && a.compute != DType::BF16)
    throw std::invalid_argument("attention_prefill: compute must be f32 or bf16");
  for (std::size_t b = 0; b + 1 < a.seq_offsets.size(); ++b)
    if (a.seq_offsets[b + 1] < a.seq_offsets[b])
      throw std::invalid_argument("attention_prefill: seq_offsets must be non-decreasing");
}

void check_shared_prefixes(const AttentionDecodeArgs& a) {
  if (a.prefix_cache.k != nullptr && (a.prefix_cache.v == nullptr || a.prefix_cache.capacity <= 0))
    throw std::invalid_argument("attention_decode: a prefix cache needs its values and a capacity");
  if (a.prefix_of.empty()) return;
  if (a.prefix_of.size() != a.lens.size())
    throw std::invalid_argument("attention_decode: prefix_of needs one entry per query");
  const std::int64_t prefix_capacity = a.prefix_cache.k != nullptr ? a.prefix_cache.capacity : a.capacity;
  for (const SharedPrefix& p : a.shared_prefixes)
    if (p.row < 0 || p.len < 0 || p.len > prefix_capacity)
      throw std::out_of_range("attention_decode: a shared prefix outside the cache");
  for (std::size_t b = 0; b < a.lens.size(); ++b) {
    const std::int64_t i = a.prefix_of[b];
    if (i < -1 || i >= static_cast<std::int64_t>(a.shared_prefixes.size()))
      throw std::out_of_range("attention_decode: prefix_of names no shared prefix");
    if (i >= 0 && a.shared_prefixes[static_cast<std::size_t>(i)].len > a.lens[b])
      throw std::invalid_argument("attention_decode: a shared prefix longer than a member's length");
  }
}

// A row that starts after its prefix (row_base) is readable only through that prefix.
void check_row_bases(const AttentionDecodeArgs& a) {
  if (a.row_base.empty()) return;
  if (a.row_base.size() != a.lens.size())
    throw std::invalid_argument("attention_decode: row_base needs one entry per query");
  for (std::size_t b = 0; b < a.lens.size(); ++b) {
    const std::int64_t base = a.row_base[b];
    if (base < 0) throw std::out_of_range("attention_decode: a negative row_base");
    if (base == 0) continue;
    if (!shared_prefix_applies(a))
      throw std::invalid_argument(
          "attention_decode: a row that starts after its prefix needs the prefix read apart (no probs or slot_bias)");
    const std::int64_t i = a.prefix_of[b];
    if (i < 0 || a.shared_prefixes[static_cast<std::size_t>(i)].len != base)
      throw std::invalid_argument("attention_decode: a row_base that is not its query's shared prefix's len");
  }
}

void check_decode(const AttentionDecodeArgs& a) {
  check_shape(a.shape);
  if (a.compute != DType::F32 && a.compute != DType::BF16)
    throw std::invalid_argument("attention_decode: compute must be f32 or bf16");
  check_shared_prefixes(a);
  check_row_bases(a);
  for (std::size_t b = 0; b < a.lens.size(); ++b) {
    const std::int64_t own = a.lens[b] - row_base_of(a, static_cast<std::int64_t>(b));
    if (a.lens[b] <= 0 || own > a.capacity)
      throw std::invalid_argument("attention_decode: a sequence length is outside [1, capacity] of its row");
  }
  if (a.cache_rows.empty()) return;
  if (a.cache_rows.size() != a.lens.size())
    throw std::invalid_argument("attention_decode: cache_rows needs one cache row per query");
  if (a.probs != nullptr || a.slot_bias != nullptr)
    throw std::invalid_argument("attention_decode: probs and slot_bias are per cache row, not with cache_rows");
  for (const std::int64_t row : a.cache_rows)
    if (row < 0) throw std::out_of_range("attention_decode: a negative cache row");
}

void check_kv_write(const KvWriteArgs& a) {
  const std::int64_t rows = static_cast<std::int64_t>(a.seq.size()), H = a.n_kv_heads;
  const bool per_head = !a.head_slot.empty();
  if (per_head ? static_cast<std::int64_t>(a.head_slot.size()) != rows * H
               : static_cast<std::int64_t>(a.slot.size()) != rows)
    throw std::invalid_argument("kv_write: slots do not match the rows");
  // Per-head slots may be -1: that head keeps no slot for the row (an eviction policy dropped it).
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t g = 0; g < (per_head ? H : 1); ++g) {
      const std::int64_t slot =
          per_head ? a.head_slot[static_cast<std::size_t>(r * H + g)] : a.slot[static_cast<std::size_t>(r)];
      if (slot < (per_head ? -1 : 0) || slot >= a.capacity || a.seq[static_cast<std::size_t>(r)] < 0)
        throw std::out_of_range("kv_write: slot outside the cache capacity");
    }
}

void check_kv_move(const KvMoveArgs& a) {
  for (const KvMove& m : a.moves)
    if (m.from < 0 || m.from >= a.capacity || m.to < 0 || m.to >= a.capacity || m.head < 0 ||
        m.head >= a.n_kv_heads || m.seq < 0)
      throw std::out_of_range("kv_move: slot outside the cache capacity");
}

}  // namespace

bool prefix_member(const AttentionDecodeArgs& a, std::int64_t q) {
  if (a.prefix_of.empty()) return false;
  const std::int64_t i = a.prefix_of[static_cast<std::size_t>(q)];
  return i >= 0 && a.shared_prefixes[static_cast<std::size_t>(i)].len > 0;
}

std::int64_t row_base_of(const AttentionDecodeArgs& a, std::int64_t b) {
  return a.row_base.empty() ? 0 : a.row_base[static_cast<std::size_t>(b)];
}

bool shared_prefix_applies(const AttentionDecodeArgs& a) {
  return !a.prefix_of.empty() && a.probs == nullptr && a.slot_bias == nullptr;
}

void Backend::attention_prefill(const AttentionPrefillArgs& a) {
  check_prefill(a);
  do_attention_prefill(a);
}

void Backend::attention_decode(const AttentionDecodeArgs& a) {
  check_decode(a);
  if (!reads_shared_prefixes_once() && std::any_of(a.row_base.begin(), a.row_base.end(), [](std::int64_t b) { return b > 0; }))
    throw std::invalid_argument("attention_decode: this backend reads every row whole, and a row_base > 0 starts after its prefix");
  do_attention_decode(a);
}

void Backend::kv_write(const KvWriteArgs& a) {
  check_kv_write(a);
  do_kv_write(a);
}

void Backend::kv_move(const KvMoveArgs& a) {
  check_kv_move(a);
  do_kv_move(a);
}

void Backend::kv_similarity(const KvSimilarityArgs& a) {
  check_kv_similarity(a);
  do_kv_similarity(a);
}

void Backend::kv_merge(const KvMergeArgs& a) {
  check_kv_merge(a);
  do_kv_merge(a);
}

}  // namespace flexh2o::kernels
