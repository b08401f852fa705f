#include "engine/tokenizer/score_model.h"

#include <queue>
#include <stdexcept>

#include "engine/tokenizer/utf8.h"

namespace flexh2o::engine::tok {
namespace {

Vocab vocab_of(const std::vector<std::string>& pieces) {
  std::vector<std::pair<std::string, std::int32_t>> entries;
  entries.reserve(pieces.size());
  for (std::size_t id = 0; id < pieces.size(); ++id) entries.emplace_back(pieces[id], static_cast<std::int32_t>(id));
  return Vocab(std::move(entries));
}

}  // namespace

ScoreModel::ScoreModel(std::vector<std::string> pieces, std::vector<float> scores, ScoreModelOptions options)
    : vocab_(vocab_of(pieces)), scores_(std::move(scores)), options_(options) {
  if (scores_.size() != pieces.size()) throw std::runtime_error("score model: one score per piece is needed");
  for (const std::int32_t id : options_.byte_ids) {
    if (id >= 0 && vocab_.token(id) == nullptr) throw std::runtime_error("score model: byte token id " + std::to_string(id) + " is not in the vocab");
  }
  if (options_.unk_id && vocab_.token(*options_.unk_id) == nullptr) {
    throw std::runtime_error("score model: unk id " + std::to_string(*options_.unk_id) + " is not in the vocab");
  }
}

void ScoreModel::tokenize(std::string_view piece, std::vector<std::int32_t>& out) const {
  std::vector<std::int32_t> tokens;
  tokens.reserve(piece.size());
  for (std::size_t i = 0; i < piece.size();) {
    const std::size_t len = char_length(piece, i);
    const std::string_view c = piece.substr(i, len);
    i += len;
    if (const auto id = vocab_.find(c)) {
      tokens.push_back(*id);
      continue;
    }
    bool all_bytes = true;
    for (const char b : c) all_bytes = all_bytes && options_.byte_ids[static_cast<unsigned char>(b)] >= 0;
    if (all_bytes) {
      for (const char b : c) tokens.push_back(options_.byte_ids[static_cast<unsigned char>(b)]);
    } else if (options_.unk_id) {
      tokens.push_back(*options_.unk_id);
    }
  }

  // A heap ordered by (score desc, position asc) over a linked list; entries are checked for
  // staleness when popped. O(n log n) where run.c rescans all pairs per merge.
  const std::size_t n = tokens.size();
  constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::vector<std::size_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (std::size_t i = 0; i < n; ++i) {
    prev[i] = i == 0 ? kNone : i - 1;
    next[i] = i + 1 == n ? kNone : i + 1;
  }
  struct Candidate {
    float score;
    std::size_t left, right;
    std::int32_t left_id, right_id, merged_id;
  };
  const auto worse = [](const Candidate& a, const Candidate& b) {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> heap(worse);
  std::string buf;
  const auto push = [&](std::size_t left) {
    if (left == kNone || next[left] == kNone) return;
    const std::size_t right = next[left];
    buf = *vocab_.token(tokens[left]);
    buf += *vocab_.token(tokens[right]);
    const auto id = vocab_.find(buf);
    if (!id) return;
    const float score = scores_[static_cast<std::size_t>(*id)];
    if (score > options_.min_score) heap.push({score, left, right, tokens[left], tokens[right], *id});
  };
  for (std::size_t i = 0; i + 1 < n; ++i) push(i);

  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    if (!alive[c.left] || next[c.left] != c.right || tokens[c.left] != c.left_id || tokens[c.right] != c.right_id) {
      continue;  // stale: the left symbol was merged away or the pair changed
    }
    tokens[c.left] = c.merged_id;
    alive[c.right] = false;
    next[c.left] = next[c.right];
    if (next[c.right] != kNone) prev[next[c.right]] = c.left;
    push(prev[c.left]);
    push(c.left);
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (alive[i]) out.push_back(tokens[i]);
  }
}

}  // namespace flexh2o::engine::tok
