#include "engine/tokenizer/bpe_model.h"

#include <cstdio>
#include <queue>
#include <stdexcept>

#include "engine/tokenizer/utf8.h"

namespace flexh2o::engine::tok {
namespace {

std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

}  // namespace

MergeRule resolve_merge(const Vocab& vocab, const std::string& a, const std::string& b) {
  const auto id_of = [&](const std::string& token) {
    const auto id = vocab.find(token);
    if (!id) throw std::runtime_error("merge token \"" + token + "\" is not in the vocab");
    return *id;
  };
  return {id_of(a), id_of(b), id_of(a + b)};
}

BpeModel::BpeModel(Vocab vocab, const std::vector<MergeRule>& merges, BpeOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  merges_.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const MergeRule& m = merges[rank];
    merges_.insert_or_assign(pair_key(m.left, m.right), Merge{static_cast<std::int32_t>(rank), m.merged});
  }
  if (options_.unk_token) {
    unk_id_ = vocab_.find(*options_.unk_token);
    if (!unk_id_) throw std::runtime_error("unk_token \"" + *options_.unk_token + "\" is not in the vocab");
  }
  for (unsigned b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    byte_ids_[b] = vocab_.find(name).value_or(-1);
  }
}

const BpeModel::Merge* BpeModel::find_merge(std::int32_t left, std::int32_t right) const {
  const auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::tokenize(std::string_view piece, std::vector<std::int32_t>& out) const {
  if (piece.empty()) return;
  if (options_.ignore_merges) {
    if (const auto id = vocab_.find(piece)) {
      out.push_back(*id);
      return;
    }
  }
  std::vector<std::int32_t> symbols;
  symbols.reserve(piece.size());
  std::optional<std::int32_t> pending_unk;
  for (std::size_t i = 0; i < piece.size();) {
    const std::size_t len = char_length(piece, i);
    const std::string_view c = piece.substr(i, len);
    i += len;
    if (const auto id = vocab_.find(c)) {
      if (pending_unk) symbols.push_back(*std::exchange(pending_unk, std::nullopt));
      symbols.push_back(*id);
      continue;
    }
    if (options_.byte_fallback) {
      bool all_bytes = true;
      for (const char b : c) all_bytes = all_bytes && byte_ids_[static_cast<unsigned char>(b)] >= 0;
      if (all_bytes) {
        // Like Hugging Face, a pending unk is not flushed first (it follows the bytes).
        for (const char b : c) symbols.push_back(byte_ids_[static_cast<unsigned char>(b)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk && !options_.fuse_unk) symbols.push_back(*pending_unk);
      pending_unk = unk_id_;
    }
  }
  if (pending_unk) symbols.push_back(*pending_unk);
  merge_all(symbols, out);
}

// Hugging Face's Word::merge_all: a heap of candidate merges by (rank, position) over a
// linked list of symbols, O(n log n). An entry is stale when its left symbol was merged away
// or the pair there no longer merges into the same token.
void BpeModel::merge_all(std::vector<std::int32_t>& symbols, std::vector<std::int32_t>& out) const {
  const std::size_t n = symbols.size();
  constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::vector<std::size_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (std::size_t i = 0; i < n; ++i) {
    prev[i] = i == 0 ? kNone : i - 1;
    next[i] = i + 1 == n ? kNone : i + 1;
  }
  struct Candidate {
    std::int32_t rank;
    std::size_t pos;
    std::int32_t merged;
  };
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> heap(later);
  const auto push = [&](std::size_t left) {
    if (left == kNone || next[left] == kNone) return;
    if (const Merge* m = find_merge(symbols[left], symbols[next[left]])) heap.push({m->rank, left, m->merged});
  };
  for (std::size_t i = 0; i + 1 < n; ++i) push(i);

  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    if (!alive[top.pos] || next[top.pos] == kNone) continue;
    const std::size_t right = next[top.pos];
    const Merge* m = find_merge(symbols[top.pos], symbols[right]);
    if (m == nullptr || m->merged != top.merged) continue;
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
