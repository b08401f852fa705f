#include "engine/tokenizer/added_vocabulary.h"

#include <algorithm>

#include "engine/tokenizer/utf8.h"

namespace flexh2o::engine::tok {
namespace {

std::uint64_t edge_key(std::uint32_t node, unsigned char byte) { return (static_cast<std::uint64_t>(node) << 8) | byte; }

bool word_char_before(std::string_view text, std::size_t pos) {
  return pos > 0 && is_word_char(decode_code_point_before(text, pos).value);
}

bool word_char_at(std::string_view text, std::size_t pos) {
  return pos < text.size() && is_word_char(decode_code_point(text, pos).value);
}

// Where the whitespace that ends at `pos` begins.
std::size_t whitespace_start_before(std::string_view text, std::size_t pos) {
  while (pos > 0) {
    const CodePoint cp = decode_code_point_before(text, pos);
    if (!is_white_space(cp.value)) break;
    pos -= cp.length;
  }
  return pos;
}

// Where the whitespace that starts at `pos` ends.
std::size_t whitespace_end_after(std::string_view text, std::size_t pos) {
  while (pos < text.size()) {
    const CodePoint cp = decode_code_point(text, pos);
    if (!is_white_space(cp.value)) break;
    pos += cp.length;
  }
  return pos;
}

}  // namespace

void AddedVocabulary::Trie::add(std::string_view pattern, int token) {
  std::uint32_t node = 0;
  for (const char c : pattern) {
    const auto b = static_cast<unsigned char>(c);
    const auto [it, fresh] = edges.emplace(edge_key(node, b), static_cast<std::uint32_t>(token_at.size()));
    if (fresh) token_at.push_back(-1);
    node = it->second;
  }
  token_at[node] = token;
  first_byte[static_cast<unsigned char>(pattern[0])] = true;
}

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens, const Normalizer* normalizer)
    : tokens_(std::move(tokens)) {
  patterns_.reserve(tokens_.size());
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    std::string pattern = t.content;
    if (t.normalized && normalizer != nullptr) normalizer->normalize(pattern);
    patterns_.push_back(pattern);
    // A later token with the same content replaces the earlier one, as in a map.
    if (!pattern.empty()) (t.normalized ? normalized_ : raw_).add(pattern, static_cast<int>(i));
    index_of_id_.insert_or_assign(t.id, i);
    if (t.special) special_contents_.insert(t.content);
    id_limit_ = std::max(id_limit_, t.id + 1);
  }
}

std::vector<AddedVocabulary::Match> AddedVocabulary::find(std::string_view text, bool normalized) const {
  const Trie& trie = normalized ? normalized_ : raw_;
  std::vector<Match> matches;
  if (trie.edges.empty()) return matches;
  std::size_t pos = 0;
  std::size_t taken = 0;  // end of the last match, with its rstrip
  while (pos < text.size()) {
    // The leftmost start with a match, and the longest match there.
    int token = -1;
    std::size_t start = pos, end = pos;
    for (; start < text.size() && token < 0; ++start) {
      if (!trie.first_byte[static_cast<unsigned char>(text[start])]) continue;
      std::uint32_t node = 0;
      for (std::size_t i = start; i < text.size(); ++i) {
        const auto it = trie.edges.find(edge_key(node, static_cast<unsigned char>(text[i])));
        if (it == trie.edges.end()) break;
        node = it->second;
        if (trie.token_at[node] >= 0) {
          token = trie.token_at[node];
          end = i + 1;
        }
      }
      if (token >= 0) break;
    }
    if (token < 0) break;
    pos = end;  // the search goes on after the match, taken or not
    const AddedToken& t = tokens_[static_cast<std::size_t>(token)];
    if (t.single_word && (word_char_before(text, start) || word_char_at(text, end))) continue;
    if (t.lstrip) start = whitespace_start_before(text, start);
    if (t.rstrip) end = whitespace_end_after(text, end);
    start = std::max(start, taken);
    matches.push_back({start, end, t.id});
    taken = end;
  }
  return matches;
}

const std::string* AddedVocabulary::text_of(std::int32_t id) const {
  const auto it = index_of_id_.find(id);
  return it == index_of_id_.end() ? nullptr : &patterns_[it->second];
}

bool AddedVocabulary::is_special_text(std::string_view text) const {
  return special_contents_.contains(text);
}

}  // namespace flexh2o::engine::tok
