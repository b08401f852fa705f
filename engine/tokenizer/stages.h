// The stages of a tokenizer pipeline, as Hugging Face tokenizers composes them:
//   text -> added tokens cut out -> Normalizer -> PreTokenizer -> Model -> PostProcessor -> ids
//   ids -> token strings -> Decoder -> text
// Each stage is built from code (a GGUF loader, llama2.c's tok*.bin, vocab.json + merges.txt)
// or from tokenizer.json (hf_tokenizer.cc); pipeline.h assembles them.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flexh2o::engine::tok {

// Rewrites a text before it is split (Unicode normalization, space markers).
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

// A part of the text on its way to the model.
struct Piece {
  std::string text;
  bool at_start;  // begins at offset 0 of the whole text (Metaspace's prepend_scheme "first")
};

// Splits pieces into smaller ones (words, regex matches) and may rewrite them (byte alphabet).
// Pieces that come out empty are dropped.
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual std::vector<Piece> pre_tokenize(std::vector<Piece> pieces) const = 0;
};

// Turns one piece into token ids: BPE by merge rank, or SentencePiece's merge by score.
class Model {
 public:
  virtual ~Model() = default;
  virtual void tokenize(std::string_view piece, std::vector<std::int32_t>& out) const = 0;
  virtual std::optional<std::int32_t> token_to_id(std::string_view token) const = 0;
  // The vocab string of `id`, nullptr when the model has no such id.
  virtual const std::string* id_to_token(std::int32_t id) const = 0;
  // One more than the largest id.
  virtual std::int32_t id_limit() const = 0;
};

// Adds the special tokens around an encoded text (BOS, EOS), when the caller asks for them.
class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void add_special_tokens(std::vector<std::int32_t>& ids) const = 0;
};

// Turns token strings back into text, in place; stages may join tokens into fewer.
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

}  // namespace flexh2o::engine::tok
