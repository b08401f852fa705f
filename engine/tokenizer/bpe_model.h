// BPE by merge rank, as Hugging Face tokenizers' models/bpe runs it: a piece starts as one
// symbol per character and the lowest-ranked merge applies first, leftmost on ties.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/tokenizer/stages.h"
#include "engine/tokenizer/vocab.h"

namespace flexh2o::engine::tok {

struct MergeRule {
  std::int32_t left, right, merged;
};

// The merge of tokens `a` and `b` (their concatenation); throws std::runtime_error naming the
// token missing from the vocab.
MergeRule resolve_merge(const Vocab& vocab, const std::string& a, const std::string& b);

struct BpeOptions {
  // A character missing from the vocab becomes its UTF-8 bytes as "<0xHH>" tokens, when the
  // vocab has all of them.
  bool byte_fallback = false;
  // Otherwise it becomes unk_token (which must be in the vocab), runs of them fused into one
  // when fuse_unk; without unk_token it is dropped, as Hugging Face does.
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  // A piece that is itself a vocab entry is that token, without merging (tiktoken's rule).
  bool ignore_merges = false;
};

class BpeModel final : public Model {
 public:
  // `merges` in rank order (first = applied first); a pair listed twice keeps its later rank.
  // Throws std::runtime_error when unk_token is not in the vocab.
  BpeModel(Vocab vocab, const std::vector<MergeRule>& merges, BpeOptions options);

  void tokenize(std::string_view piece, std::vector<std::int32_t>& out) const override;
  std::optional<std::int32_t> token_to_id(std::string_view token) const override { return vocab_.find(token); }
  const std::string* id_to_token(std::int32_t id) const override { return vocab_.token(id); }
  std::int32_t id_limit() const override { return vocab_.id_limit(); }

 private:
  struct Merge {
    std::int32_t rank;
    std::int32_t merged;
  };
  const Merge* find_merge(std::int32_t left, std::int32_t right) const;
  void merge_all(std::vector<std::int32_t>& symbols, std::vector<std::int32_t>& out) const;

  Vocab vocab_;
  std::unordered_map<std::uint64_t, Merge> merges_;  // keyed by (left id, right id)
  BpeOptions options_;
  std::optional<std::int32_t> unk_id_;
  std::array<std::int32_t, 256> byte_ids_{};  // "<0xHH>" tokens, -1 when missing
};

}  // namespace flexh2o::engine::tok
