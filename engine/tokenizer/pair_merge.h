// Merging adjacent symbols best pair first, shared by BPE (by merge rank, Hugging Face's
// Word::merge_all) and the score model (by piece score, llama2.c / SentencePiece): a heap of
// candidate merges by (priority, position) over a linked list of symbols, O(n log n) where
// rescanning every pair per merge is O(n^2). An entry is stale when its left symbol was merged
// away or the pair there no longer merges into the same token; find_merge is asked again only
// when the pair's symbols changed since the entry was pushed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <queue>
#include <vector>

namespace flexh2o::engine::tok {

struct PairMerge {
  double priority;  // lower merges first; equal ones leftmost first
  std::int32_t merged;
};

// Appends to `out` the symbols left when no adjacent pair merges any more. find_merge(left,
// right) -> std::optional<PairMerge>: what the pair of token ids merges into, if anything.
template <class FindMerge>
void merge_pairs(std::vector<std::int32_t>& symbols, const FindMerge& find_merge, std::vector<std::int32_t>& out) {
  const std::size_t n = symbols.size();
  constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::vector<std::size_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (std::size_t i = 0; i < n; ++i) {
    prev[i] = i == 0 ? kNone : i - 1;
    next[i] = i + 1 == n ? kNone : i + 1;
  }
  struct Candidate {
    double priority;
    std::size_t pos;
    std::int32_t left, right, merged;
  };
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.priority != b.priority ? a.priority > b.priority : a.pos > b.pos;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> heap(later);
  const auto push = [&](std::size_t left) {
    if (left == kNone || next[left] == kNone) return;
    const std::int32_t a = symbols[left], b = symbols[next[left]];
    if (const std::optional<PairMerge> m = find_merge(a, b)) heap.push({m->priority, left, a, b, m->merged});
  };
  for (std::size_t i = 0; i + 1 < n; ++i) push(i);

  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    if (!alive[top.pos] || next[top.pos] == kNone) continue;
    const std::size_t right = next[top.pos];
    if (symbols[top.pos] != top.left || symbols[right] != top.right) {
      const std::optional<PairMerge> m = find_merge(symbols[top.pos], symbols[right]);
      if (!m || m->merged != top.merged) continue;
    }
    symbols[top.pos] = top.merged;
    alive[right] = false;
    next[top.pos] = next[right];
    if (next[right] != kNone) prev[next[right]] = top.pos;
    push(prev[top.pos]);
    push(top.pos);
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (alive[i]) out.push_back(symbols[i]);
  }
}

}  // namespace flexh2o::engine::tok
