// SentencePiece-style BPE by score, as llama2.c's run.c encodes: a piece starts as one token
// per character (or its byte tokens when the character is not in the vocab), then the adjacent
// pair whose concatenated string is a token with the highest score merges, leftmost on ties.
// (SentencePiece proper keeps a missing character as text until merging ends; the two agree
// whenever every character of a multi-character token is itself in the vocab.)
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/stages.h"
#include "engine/tokenizer/vocab.h"

namespace flexh2o::engine::tok {

struct ScoreModelOptions {
  // The token of each byte for characters missing from the vocab; -1 where there is none
  // (then the character becomes unk_id, or is dropped without one).
  std::array<std::int32_t, 256> byte_ids;
  std::optional<std::int32_t> unk_id;
  // Merges into tokens scoring at or below this never happen (run.c's -1e10 start value).
  float min_score = -1e10f;
};

class ScoreModel final : public Model {
 public:
  // pieces[id] with scores[id]; a string listed twice is found under its lowest id.
  ScoreModel(std::vector<std::string> pieces, std::vector<float> scores, ScoreModelOptions options);

  void tokenize(std::string_view piece, std::vector<std::int32_t>& out) const override;
  std::optional<std::int32_t> token_to_id(std::string_view token) const override { return vocab_.find(token); }
  const std::string* id_to_token(std::int32_t id) const override { return vocab_.token(id); }
  std::int32_t id_limit() const override { return vocab_.id_limit(); }

 private:
  Vocab vocab_;
  std::vector<float> scores_;
  ScoreModelOptions options_;
};

}  // namespace flexh2o::engine::tok
