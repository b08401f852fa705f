#include "engine/tokenizer/pipeline.h"

#include <algorithm>
#include <stdexcept>

namespace flexh2o::engine::tok {

Pipeline::Pipeline(PipelineParts parts, std::string name)
    : name_(std::move(name)),
      normalizer_(std::move(parts.normalizer)),
      added_(std::move(parts.added_tokens), normalizer_.get()),
      pre_tokenizer_(std::move(parts.pre_tokenizer)),
      model_(std::move(parts.model)),
      post_processor_(std::move(parts.post_processor)),
      decoder_(std::move(parts.decoder)) {
  if (!model_) throw std::invalid_argument(name_ + ": a tokenizer pipeline needs a model");
  vocab_size_ = std::max(model_->id_limit(), added_.id_limit());
}

void Pipeline::encode_pieces(std::string_view text, bool at_start, std::vector<std::int32_t>& ids) const {
  if (text.empty()) return;
  std::vector<Piece> pieces{{std::string(text), at_start}};
  if (pre_tokenizer_) pieces = pre_tokenizer_->pre_tokenize(std::move(pieces));
  for (const Piece& piece : pieces) model_->tokenize(piece.text, ids);
}

void Pipeline::encode_part(std::string_view text, bool at_start, std::vector<std::int32_t>& ids) const {
  if (text.empty()) return;
  std::string normalized(text);
  if (normalizer_) normalizer_->normalize(normalized);
  std::size_t from = 0;
  for (const AddedVocabulary::Match& m : added_.find(normalized, true)) {
    encode_pieces(std::string_view(normalized).substr(from, m.start - from), at_start && from == 0, ids);
    ids.push_back(m.id);
    from = m.end;
  }
  encode_pieces(std::string_view(normalized).substr(from), at_start && from == 0, ids);
}

std::vector<std::int32_t> Pipeline::encode(std::string_view text, bool add_special) const {
  std::vector<std::int32_t> ids;
  std::size_t from = 0;
  for (const AddedVocabulary::Match& m : added_.find(text, false)) {
    encode_part(text.substr(from, m.start - from), from == 0, ids);
    ids.push_back(m.id);
    from = m.end;
  }
  encode_part(text.substr(from), from == 0, ids);
  if (add_special && post_processor_) post_processor_->add_special_tokens(ids);
  return ids;
}

std::string Pipeline::decode(std::span<const std::int32_t> ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const std::int32_t id : ids) {
    const std::string* text = added_.text_of(id);
    if (text == nullptr) text = model_->id_to_token(id);
    if (text == nullptr) {
      throw std::runtime_error(name_ + ": unknown token id " + std::to_string(id) + " (the vocab has " +
                               std::to_string(vocab_size_) + " ids)");
    }
    if (skip_special && added_.is_special_text(*text)) continue;
    tokens.push_back(*text);
  }
  std::string out;
  if (decoder_) {
    decoder_->decode_chain(tokens);
    for (const std::string& t : tokens) out += t;
  } else {
    for (std::size_t i = 0; i < tokens.size(); ++i) out += (i == 0 ? "" : " ") + tokens[i];
  }
  return out;
}

std::pair<std::vector<std::int32_t>, std::vector<std::int32_t>> Pipeline::special_tokens_around() const {
  constexpr std::int32_t kText = -1;  // no token has this id
  std::vector<std::int32_t> ids{kText};
  if (post_processor_) post_processor_->add_special_tokens(ids);
  const auto text = std::find(ids.begin(), ids.end(), kText);
  return {std::vector<std::int32_t>(ids.begin(), text), std::vector<std::int32_t>(text + 1, ids.end())};
}

namespace {

class PipelineTokenizer final : public Tokenizer {
 public:
  PipelineTokenizer(PipelineParts parts, TokenizerOptions options, std::string name)
      : pipeline_(std::move(parts), std::move(name)), options_(options) {
    const auto [before, after] = pipeline_.special_tokens_around();
    if (!options_.bos_id && !before.empty()) options_.bos_id = before.front();
    if (!options_.eos_id && !after.empty()) options_.eos_id = after.back();
  }

  std::vector<std::int32_t> encode(std::string_view text, bool add_special) const override {
    return pipeline_.encode(text, add_special);
  }
  std::int32_t vocab_size() const override { return pipeline_.vocab_size(); }
  std::optional<std::int32_t> bos_id() const override { return options_.bos_id; }
  std::optional<std::int32_t> eos_id() const override { return options_.eos_id; }
  bool decides_special_tokens() const override { return options_.decides_special_tokens; }

 private:
  std::string decode_ids(std::span<const std::int32_t> ids, bool skip_special) const override {
    return pipeline_.decode(ids, skip_special);
  }

  Pipeline pipeline_;
  TokenizerOptions options_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(PipelineParts parts, TokenizerOptions options, std::string name) {
  return std::make_unique<PipelineTokenizer>(std::move(parts), options, std::move(name));
}

}  // namespace flexh2o::engine::tok
