// llama2.c tokenizer (tok*.bin): sentencepiece-style score-greedy BPE with byte fallback,
// reproducing karpathy/llama2.c run.c's encode() and decode() token for token.
#include <bit>
#include <cstring>
#include <stdexcept>
#include <string>

#include "engine/tokenizer/normalizers.h"
#include "engine/tokenizer/pipeline.h"
#include "engine/tokenizer/post_processors.h"
#include "engine/tokenizer/score_model.h"
#include "offload/text_file.h"
#include "engine/tokenizer/tokenizer.h"

namespace flexh2o::engine {
namespace {

constexpr std::int32_t kUnkId = 0;
constexpr std::int32_t kBosId = 1;
constexpr std::int32_t kEosId = 2;
constexpr std::int32_t kFirstByteId = 3;  // ids 3..258 are "<0x00>".."<0xFF>"
constexpr std::int32_t kMinVocabSize = kFirstByteId + 256;

// run.c starts its best-merge search at this score with a strict '>', so merges scoring at or
// below it (or NaN) never happen.
constexpr float kMergeScoreFloor = -1e10f;

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The text a vocab piece prints: "<0xNN>" stands for the raw byte NN (run.c's sscanf).
std::string piece_text(const std::string& piece) {
  if (piece.size() == 6 && piece.starts_with("<0x") && piece[5] == '>') {
    const int hi = hex_value(piece[3]);
    const int lo = hex_value(piece[4]);
    if (hi >= 0 && lo >= 0) return std::string(1, static_cast<char>(hi * 16 + lo));
  }
  return piece;
}

// Encoding is the pipeline Prepend(" ") -> score merges with byte fallback -> "<s> $A";
// decoding keeps run.c's rule, which no Hugging Face decoder has: the leading space of the
// piece right after a BOS goes.
class Llama2cTokenizer final : public Tokenizer {
 public:
  Llama2cTokenizer(std::vector<std::string> pieces, std::vector<float> scores, const std::string& name)
      : pieces_(pieces), encoder_(encoder_parts(std::move(pieces), std::move(scores)), name), name_(name) {
    texts_.reserve(pieces_.size());
    for (std::size_t id = 0; id < pieces_.size(); ++id) {
      const bool special = id == kUnkId || id == kBosId || id == kEosId;
      texts_.push_back(special ? std::string() : piece_text(pieces_[id]));
    }
  }

  std::vector<std::int32_t> encode(std::string_view text, bool add_special) const override {
    return encoder_.encode(text, add_special);
  }

  std::int32_t vocab_size() const override { return static_cast<std::int32_t>(pieces_.size()); }
  std::optional<std::int32_t> bos_id() const override { return kBosId; }
  std::optional<std::int32_t> eos_id() const override { return kEosId; }
  bool decides_special_tokens() const override { return true; }

 private:
  static tok::PipelineParts encoder_parts(std::vector<std::string> pieces, std::vector<float> scores) {
    tok::ScoreModelOptions options;
    for (int b = 0; b < 256; ++b) options.byte_ids[static_cast<std::size_t>(b)] = kFirstByteId + b;
    options.min_score = kMergeScoreFloor;
    tok::PipelineParts parts;
    // run.c puts the token for " " (sentencepiece's dummy prefix) first. Making it the first
    // character gives the same id and byte-falls-back sanely should a vocab lack " ".
    parts.normalizer = std::make_unique<tok::PrependNormalizer>(" ");
    // run.c lets BOS take part in merging too; its piece "\n<s>\n" combines with nothing.
    parts.model = std::make_unique<tok::ScoreModel>(std::move(pieces), std::move(scores), options);
    parts.post_processor = std::make_unique<tok::TemplateProcessor>(
        std::vector<tok::TemplateProcessor::Item>{{false, {kBosId}}, {true, {}}});
    return parts;
  }

  // Specials (unk, BOS, EOS) print nothing whether skipped or not, as in run.c.
  std::string decode_ids(std::span<const std::int32_t> tokens, bool) const override {
    std::string out;
    std::int32_t prev = -1;
    for (const std::int32_t id : tokens) {
      check_id(id);
      std::string_view text = texts_[static_cast<std::size_t>(id)];
      // sentencepiece drops the dummy-prefix space of the first piece after BOS. run.c checks
      // the vocab piece, so a "<0x20>" byte token keeps its space.
      if (prev == kBosId && pieces_[static_cast<std::size_t>(id)].starts_with(' ')) text.remove_prefix(1);
      out.append(text);
      prev = id;
    }
    return out;
  }

  void check_id(std::int32_t id) const {
    if (id < 0 || id >= vocab_size()) {
      throw std::runtime_error(name_ + ": token id " + std::to_string(id) + " is outside the vocab (size " +
                               std::to_string(vocab_size()) + ")");
    }
  }

  std::vector<std::string> pieces_;  // vocab strings as stored in the file
  std::vector<std::string> texts_;   // what each id prints
  tok::Pipeline encoder_;
  std::string name_;
};

// Little-endian reader over the file bytes that refuses to run past the end.
class Reader {
 public:
  Reader(std::span<const std::byte> data, const std::string& source) : data_(data), source_(source) {}

  std::size_t left() const { return data_.size() - pos_; }

  void read(void* dst, std::size_t n, const std::string& what) {
    if (n > left()) {
      throw std::runtime_error(source_ + ": truncated at " + what + " (need " + std::to_string(n) + " bytes, " +
                               std::to_string(left()) + " left)");
    }
    std::memcpy(dst, data_.data() + pos_, n);
    pos_ += n;
  }

 private:
  std::span<const std::byte> data_;
  const std::string& source_;
  std::size_t pos_ = 0;
};

static_assert(std::endian::native == std::endian::little, "tok*.bin is little-endian");

}  // namespace

std::unique_ptr<Tokenizer> load_llama2c_tokenizer(std::span<const std::byte> data, std::int32_t vocab_size,
                                                  const std::string& source_name) {
  if (vocab_size < kMinVocabSize) {
    throw std::runtime_error(source_name + ": vocab_size " + std::to_string(vocab_size) +
                             " is too small for <unk>, <s>, </s> and 256 byte tokens (need at least " +
                             std::to_string(kMinVocabSize) + ")");
  }
  Reader reader(data, source_name);
  std::int32_t max_token_length = 0;
  reader.read(&max_token_length, sizeof max_token_length, "max_token_length");
  if (max_token_length < 0) {
    throw std::runtime_error(source_name + ": negative max_token_length " + std::to_string(max_token_length));
  }

  const auto n = static_cast<std::size_t>(vocab_size);
  std::vector<std::string> pieces(n);
  std::vector<float> scores(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::string where = "token " + std::to_string(i) + " of " + std::to_string(n);
    // Each token needs at least its 8-byte (score, len) header; say so before reading it.
    reader.read(&scores[i], sizeof(float), where);
    std::int32_t len = 0;
    reader.read(&len, sizeof len, where);
    if (len < 0) throw std::runtime_error(source_name + ": negative length " + std::to_string(len) + " at " + where);
    pieces[i].resize(static_cast<std::size_t>(len));
    reader.read(pieces[i].data(), pieces[i].size(), where);
  }
  return std::make_unique<Llama2cTokenizer>(std::move(pieces), std::move(scores), source_name);
}

std::unique_ptr<Tokenizer> load_llama2c_tokenizer_file(const std::string& path, std::int32_t vocab_size) {
  const auto bytes = offload::read_text_file(path, offload::kMaxTokenizerFileBytes);
  if (!bytes) throw std::runtime_error(path + ": cannot open llama2.c tokenizer file");
  return load_llama2c_tokenizer(std::as_bytes(std::span(*bytes)), vocab_size, path);
}

}  // namespace flexh2o::engine
