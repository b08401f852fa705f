// The vocabulary as a prefix trie in preorder: a walk over it that meets a byte the grammar
// rejects skips that node's whole subtree (every token sharing the prefix) in one jump.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace flexh2o::grammar {

// The tokens as byte strings (byte-level BPE bytes, SentencePiece pieces with "▁" as a space
// and <0xNN> as the byte). An empty string is a control token the grammar never allows; the
// stop tokens (EOS, end of turn) are allowed exactly where the output is complete, never as
// the text their bytes spell.
struct Vocabulary {
  std::vector<std::string> token_bytes;
  std::vector<std::int32_t> stop_tokens;
};

class TokenTrie {
 public:
  explicit TokenTrie(Vocabulary vocabulary);
  std::size_t node_count() const { return byte_.size(); }
  std::uint8_t byte(std::size_t node) const { return byte_[node]; }
  std::uint32_t depth(std::size_t node) const { return depth_[node]; }  // 1 for a first byte
  std::size_t subtree_end(std::size_t node) const { return subtree_end_[node]; }
  // Ids of the tokens whose bytes end at `node`.
  const std::int32_t* tokens_begin(std::size_t node) const { return sorted_tokens_.data() + token_begin_[node]; }
  const std::int32_t* tokens_end(std::size_t node) const { return sorted_tokens_.data() + token_begin_[node + 1]; }
  std::uint32_t max_depth() const { return max_depth_; }
  const Vocabulary& vocabulary() const { return vocabulary_; }
  std::size_t vocab_size() const { return vocabulary_.token_bytes.size(); }

 private:
  Vocabulary vocabulary_;
  std::vector<std::uint8_t> byte_;
  std::vector<std::uint32_t> depth_;
  std::vector<std::uint32_t> subtree_end_;
  std::vector<std::uint32_t> token_begin_;  // node_count + 1 offsets into sorted_tokens_
  std::vector<std::int32_t> sorted_tokens_;
  std::uint32_t max_depth_ = 0;
};

}  // namespace flexh2o::grammar
