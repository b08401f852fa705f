#include "engine/tokenizer/pre_tokenizers.h"

#include <algorithm>

#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/normalizers.h"

namespace flexh2o::engine::tok {
namespace {

struct Span {
  std::size_t start, end;
  bool flag;  // a match, or (after the behavior is applied) to be removed
};

// Matches and the gaps between them, covering the text (Hugging Face's Pattern::find_matches).
std::vector<Span> find_matches(const std::string& text, const Regex& pattern) {
  if (text.empty()) return {{0, 0, false}};
  std::vector<Span> spans;
  std::size_t prev = 0;
  for (const auto& [start, end] : pattern.find_all(text)) {
    if (prev != start) spans.push_back({prev, start, false});
    spans.push_back({start, end, true});
    prev = end;
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), false});
  return spans;
}

// Hugging Face's NormalizedString::split: which spans become pieces, merged how.
std::vector<Span> apply_behavior(std::vector<Span> matches, SplitBehavior behavior) {
  std::vector<Span> out;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      return matches;
    case SplitBehavior::kIsolated:
      for (Span& s : matches) s.flag = false;
      return matches;
    case SplitBehavior::kContiguous:
      for (const Span& s : matches) {
        if (s.flag == previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back({s.start, s.end, false});
        }
        previous_match = s.flag;
      }
      return out;
    case SplitBehavior::kMergedWithPrevious:
      for (const Span& s : matches) {
        if (s.flag && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back({s.start, s.end, false});
        }
        previous_match = s.flag;
      }
      return out;
    case SplitBehavior::kMergedWithNext:
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->flag && !previous_match && !out.empty()) {
          out.back().start = it->start;
        } else {
          out.push_back({it->start, it->end, false});
        }
        previous_match = it->flag;
      }
      std::reverse(out.begin(), out.end());
      return out;
  }
  return out;
}

}  // namespace

std::vector<Piece> split_piece(const Piece& piece, const Regex& pattern, SplitBehavior behavior, bool invert) {
  std::vector<Span> matches = find_matches(piece.text, pattern);
  if (invert) {
    for (Span& s : matches) s.flag = !s.flag;
  }
  std::vector<Piece> out;
  for (const Span& s : apply_behavior(std::move(matches), behavior)) {
    if (s.flag || s.start == s.end) continue;  // removed, or empty
    out.push_back({piece.text.substr(s.start, s.end - s.start), piece.at_start && s.start == 0});
  }
  return out;
}

std::vector<Piece> SplitPreTokenizer::pre_tokenize(std::vector<Piece> pieces) const {
  std::vector<Piece> out;
  for (const Piece& piece : pieces) {
    for (Piece& p : split_piece(piece, pattern_, behavior_, invert_)) out.push_back(std::move(p));
  }
  return out;
}

MetaspacePreTokenizer::MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
    : replacement_(std::move(replacement)),
      scheme_(scheme),
      split_(split),
      replacement_pattern_(replacement_, Regex::Syntax::kLiteral) {}

std::vector<Piece> MetaspacePreTokenizer::pre_tokenize(std::vector<Piece> pieces) const {
  static const Regex kSpace(" ", Regex::Syntax::kLiteral);
  std::vector<Piece> out;
  for (Piece& piece : pieces) {
    piece.text = replace_all(kSpace, piece.text, replacement_);
    const bool prepend = scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && piece.at_start);
    if (prepend && !piece.text.empty() && !piece.text.starts_with(replacement_)) piece.text = replacement_ + piece.text;
    if (split_) {
      for (Piece& p : split_piece(piece, replacement_pattern_, SplitBehavior::kMergedWithNext, false)) {
        out.push_back(std::move(p));
      }
    } else if (!piece.text.empty()) {
      out.push_back(std::move(piece));
    }
  }
  return out;
}

std::vector<Piece> ByteLevelPreTokenizer::pre_tokenize(std::vector<Piece> pieces) const {
  static const Regex kGpt2(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
                           Regex::Syntax::kRegex);
  const ByteAlphabet& alphabet = ByteAlphabet::get();
  std::vector<Piece> out;
  for (Piece& piece : pieces) {
    if (add_prefix_space_ && !piece.text.empty() && !piece.text.starts_with(' ')) piece.text = " " + piece.text;
    std::vector<Piece> parts;
    if (use_regex_) {
      parts = split_piece(piece, kGpt2, SplitBehavior::kIsolated, false);
    } else if (!piece.text.empty()) {
      parts.push_back(std::move(piece));
    }
    for (Piece& p : parts) {
      std::string mapped;
      alphabet.encode(p.text, mapped);
      out.push_back({std::move(mapped), p.at_start});
    }
  }
  return out;
}

std::vector<Piece> SequencePreTokenizer::pre_tokenize(std::vector<Piece> pieces) const {
  for (const auto& stage : stages_) pieces = stage->pre_tokenize(std::move(pieces));
  return pieces;
}

}  // namespace flexh2o::engine::tok
