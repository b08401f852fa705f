// Pre-tokenizers: Metaspace (SentencePiece's "▁" for spaces), Split (a regex, e.g. Llama-3's
// and Qwen2's), ByteLevel (GPT-2's regex and byte alphabet), and a Sequence of them.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/stages.h"

namespace flexh2o::engine::tok {

// What Split does with the matches (Hugging Face's SplitDelimiterBehavior). Splitting "a-b--c"
// on "-": Removed a|b|c, Isolated a|-|b|-|-|c, MergedWithPrevious a-|b-|-|c,
// MergedWithNext a|-b|-|-c, Contiguous a|-|b|--|c.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Pieces of `piece` split at the matches of `pattern` (with `invert`, at what is between them).
std::vector<Piece> split_piece(const Piece& piece, const Regex& pattern, SplitBehavior behavior, bool invert);

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  std::vector<Piece> pre_tokenize(std::vector<Piece> pieces) const override;

 private:
  Regex pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// When the "▁" (replacement) goes in front of a piece that does not start with one: always,
// never, or only in front of the piece at the start of the text.
enum class PrependScheme { kAlways, kNever, kFirst };

// Spaces become `replacement`, which is prepended per the scheme; with `split`, each piece is
// then cut in front of every replacement character.
class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split);
  std::vector<Piece> pre_tokenize(std::vector<Piece> pieces) const override;

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
  Regex replacement_pattern_;
};

// With add_prefix_space a space goes in front of each piece that does not start with one; with
// use_regex pieces are split by GPT-2's regex; then every byte becomes its alphabet character.
class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}
  std::vector<Piece> pre_tokenize(std::vector<Piece> pieces) const override;

 private:
  bool add_prefix_space_;
  bool use_regex_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> stages) : stages_(std::move(stages)) {}
  std::vector<Piece> pre_tokenize(std::vector<Piece> pieces) const override;

 private:
  std::vector<std::unique_ptr<PreTokenizer>> stages_;
};

}  // namespace flexh2o::engine::tok
