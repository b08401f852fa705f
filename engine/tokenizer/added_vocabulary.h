// Added tokens (special or not): literal strings cut out of the text before the model sees it,
// as Hugging Face's tokenizer/added_vocabulary.rs does.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/tokenizer/stages.h"

namespace flexh2o::engine::tok {

struct AddedToken {
  std::int32_t id = 0;
  std::string content;
  bool special = false;      // skipped when decoding with skip_special
  bool normalized = false;   // matched in the normalized text (content normalized too), else in the raw text
  bool lstrip = false;       // takes the whitespace before it
  bool rstrip = false;       // takes the whitespace after it
  bool single_word = false;  // matches only where no word character touches it
};

class AddedVocabulary {
 public:
  // `normalizer` (may be null) is the pipeline's: the content of a normalized token is matched
  // and decoded in its normalized form.
  AddedVocabulary(std::vector<AddedToken> tokens, const Normalizer* normalizer);

  struct Match {
    std::size_t start, end;  // with the whitespace lstrip/rstrip took
    std::int32_t id;
  };
  // The tokens found in `text`, in order: those with `normalized` as given, leftmost-longest,
  // non-overlapping.
  std::vector<Match> find(std::string_view text, bool normalized) const;

  // The text `id` decodes to, nullptr when `id` is not an added token.
  const std::string* text_of(std::int32_t id) const;
  // Whether decoding with skip_special drops a token with this text (Hugging Face checks the
  // text against the special tokens' contents).
  bool is_special_text(std::string_view text) const;
  // One more than the largest added id (0 when none).
  std::int32_t id_limit() const { return id_limit_; }

 private:
  // A byte trie over the patterns of one kind (raw or normalized).
  struct Trie {
    std::unordered_map<std::uint64_t, std::uint32_t> edges;  // (node << 8 | byte) -> child
    std::vector<int> token_at;                               // node -> index in tokens_, -1 if none
    std::array<bool, 256> first_byte{};
    Trie() : token_at(1, -1) {}
    void add(std::string_view pattern, int token);
  };

  std::vector<AddedToken> tokens_;
  std::vector<std::string> patterns_;  // by index in tokens_: what is matched and decoded
  Trie raw_, normalized_;
  std::unordered_map<std::int32_t, std::size_t> index_of_id_;
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_set<std::string, StringHash, std::equal_to<>> special_contents_;
  std::int32_t id_limit_ = 0;
};

}  // namespace flexh2o::engine::tok
