#include "engine/tokenizer/score_model.h"

#include <stdexcept>

#include "engine/tokenizer/pair_merge.h"
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

  // The best-scoring pair first (pair_merge.h), as run.c merges but O(n log n).
  std::string buf;
  merge_pairs(
      tokens,
      [&](std::int32_t left, std::int32_t right) -> std::optional<PairMerge> {
        buf = *vocab_.token(left);
        buf += *vocab_.token(right);
        const auto id = vocab_.find(buf);
        if (!id) return std::nullopt;
        const float score = scores_[static_cast<std::size_t>(*id)];
        if (!(score > options_.min_score)) return std::nullopt;
        return PairMerge{-static_cast<double>(score), *id};
      },
      out);
}

}  // namespace flexh2o::engine::tok
