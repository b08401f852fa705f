#include "kernels/attention.h"

#include <stdexcept>
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

}  // namespace flexh2o::kernels
