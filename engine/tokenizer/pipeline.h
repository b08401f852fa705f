// A tokenizer assembled from stages (stages.h), run in Hugging Face tokenizers' order. Loaders
// build the parts from tokenizer.json (hf_tokenizer.cc), vocab.json + merges.txt
// (gpt2_tokenizer.cc), llama2.c's tok*.bin (llama2c_tokenizer.cc) or GGUF's tokenizer.ggml.*
// metadata (gguf_tokenizer.cc).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/tokenizer/added_vocabulary.h"
#include "engine/tokenizer/stages.h"
#include "engine/tokenizer/tokenizer.h"

namespace flexh2o::engine::tok {

struct PipelineParts {
  std::vector<AddedToken> added_tokens;
  std::unique_ptr<Normalizer> normalizer;         // null: none
  std::unique_ptr<PreTokenizer> pre_tokenizer;    // null: each text piece goes to the model whole
  std::unique_ptr<Model> model;                   // required
  std::unique_ptr<PostProcessor> post_processor;  // null: encoding adds no special tokens
  std::unique_ptr<Decoder> decoder;               // null: token strings joined with spaces (as Hugging Face does)
};

class Pipeline {
 public:
  // `name` (the file it came from) prefixes error messages.
  Pipeline(PipelineParts parts, std::string name);

  // 1. added tokens that are not `normalized` are cut out of the text; 2. each remaining part
  // is normalized; 3. `normalized` added tokens are cut out of that; 4. the pre-tokenizer
  // splits the rest into pieces; 5. the model encodes each piece; 6. with add_special, the
  // post-processor adds its special tokens.
  std::vector<std::int32_t> encode(std::string_view text, bool add_special) const;
  // Token strings (added tokens' first) through the decoder. Throws std::runtime_error on an id
  // neither the model nor the added tokens have.
  std::string decode(std::span<const std::int32_t> ids, bool skip_special) const;

  std::int32_t vocab_size() const { return vocab_size_; }
  // What the post-processor puts before and after a text.
  std::pair<std::vector<std::int32_t>, std::vector<std::int32_t>> special_tokens_around() const;
  const std::string& name() const { return name_; }

 private:
  void encode_part(std::string_view text, bool at_start, std::vector<std::int32_t>& ids) const;
  void encode_pieces(std::string_view text, bool at_start, std::vector<std::int32_t>& ids) const;

  std::string name_;
  std::unique_ptr<Normalizer> normalizer_;
  AddedVocabulary added_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  std::int32_t vocab_size_;
};

struct TokenizerOptions {
  // See Tokenizer::decides_special_tokens.
  bool decides_special_tokens = true;
  // Default: the first id the post-processor puts before a text, the last it puts after.
  std::optional<std::int32_t> bos_id, eos_id;
};

std::unique_ptr<Tokenizer> make_tokenizer(PipelineParts parts, TokenizerOptions options, std::string name);

}  // namespace flexh2o::engine::tok
