// Decoders: turn token strings back into text (Hugging Face's decoders). Where Hugging Face
// replaces bytes that are not UTF-8 with U+FFFD (ByteFallback, ByteLevel), these keep the
// bytes: decoding stays prefix-consistent (a character cut at the end of the ids completes
// when the next id arrives), and valid text decodes the same.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "engine/tokenizer/pre_tokenizers.h"
#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/stages.h"

namespace flexh2o::engine::tok {

// Runs of "<0xHH>" tokens become the bytes they stand for.
class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override;
};

// Joins all tokens into one.
class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override;
};

// Removes up to `start` leading and `stop` trailing `content` characters from each token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, std::size_t start, std::size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override;

 private:
  std::string content_;  // one character
  std::size_t start_, stop_;
};

// The replacement character becomes a space, except in the first token (unless the scheme is
// "never"), where it goes: that is the prefix the pre-tokenizer added.
class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(const std::string& replacement, PrependScheme scheme)
      : replacement_(replacement, Regex::Syntax::kLiteral), scheme_(scheme) {}
  void decode_chain(std::vector<std::string>& tokens) const override;

 private:
  Regex replacement_;
  PrependScheme scheme_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override;

 private:
  Regex pattern_;
  std::string content_;
};

// Maps byte-alphabet characters back to bytes (a token with other characters stays as it is)
// and joins the tokens into one.
class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> stages) : stages_(std::move(stages)) {}
  void decode_chain(std::vector<std::string>& tokens) const override;

 private:
  std::vector<std::unique_ptr<Decoder>> stages_;
};

}  // namespace flexh2o::engine::tok
