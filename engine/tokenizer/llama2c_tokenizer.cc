// llama2.c tokenizer (tok*.bin): sentencepiece-style score-greedy BPE with byte fallback,
// reproducing karpathy/llama2.c run.c's encode() and decode() token for token.
#include <bit>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <queue>
#include <stdexcept>
#include <string>
#include <unordered_map>

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

// Transparent hash so string_view lookups do not allocate.
struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

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

class Llama2cTokenizer final : public Tokenizer {
 public:
  Llama2cTokenizer(std::vector<std::string> pieces, std::vector<float> scores)
      : pieces_(std::move(pieces)), scores_(std::move(scores)) {
    texts_.reserve(pieces_.size());
    for (std::size_t id = 0; id < pieces_.size(); ++id) {
      // Equal strings: keep the lowest id (run.c's bsearch would pick an arbitrary one).
      ids_.emplace(pieces_[id], static_cast<std::int32_t>(id));
      const bool special = id == kUnkId || id == kBosId || id == kEosId;
      texts_.push_back(special ? std::string() : piece_text(pieces_[id]));
    }
  }

  std::vector<std::int32_t> encode(std::string_view text, bool add_bos) const override {
    std::vector<std::int32_t> tokens;
    if (add_bos) tokens.push_back(kBosId);
    if (text.empty()) return tokens;
    // run.c prepends the token for " " (sentencepiece's dummy prefix). Treating it as the first
    // codepoint gives the same id and byte-falls-back sanely should a vocab lack " ".
    append_codepoints(" ", tokens);
    append_codepoints(text, tokens);
    // Like run.c, BOS takes part in merging too (its piece "\n<s>\n" does not combine in practice).
    return merge(std::move(tokens));
  }

  std::string decode(std::span<const std::int32_t> tokens) const override {
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

  std::int32_t vocab_size() const override { return static_cast<std::int32_t>(pieces_.size()); }
  std::optional<std::int32_t> bos_id() const override { return kBosId; }
  std::optional<std::int32_t> eos_id() const override { return kEosId; }

 private:
  void check_id(std::int32_t id) const {
    if (id < 0 || id >= vocab_size()) {
      throw std::runtime_error("llama2.c tokenizer: token id " + std::to_string(id) + " is outside the vocab (size " +
                               std::to_string(vocab_size()) + ")");
    }
  }

  std::int32_t lookup(std::string_view s) const {
    const auto it = ids_.find(s);
    return it == ids_.end() ? -1 : it->second;
  }

  // One token per codepoint, or one byte-fallback token per byte when the codepoint is not in
  // the vocab. Like run.c, a group is a byte plus up to three following continuation bytes,
  // whether or not it is valid UTF-8. A NUL byte is an ordinary byte here (run.c stops at it).
  void append_codepoints(std::string_view text, std::vector<std::int32_t>& tokens) const {
    std::size_t i = 0;
    while (i < text.size()) {
      std::size_t len = 1;
      while (len < 4 && i + len < text.size() && (static_cast<unsigned char>(text[i + len]) & 0xC0) == 0x80) ++len;
      const std::string_view group = text.substr(i, len);
      if (const std::int32_t id = lookup(group); id >= 0) {
        tokens.push_back(id);
      } else {
        for (const char c : group) tokens.push_back(kFirstByteId + static_cast<unsigned char>(c));
      }
      i += len;
    }
  }

  // run.c repeatedly merges the adjacent pair whose concatenated piece has the highest score,
  // the leftmost on ties. A heap ordered by (score desc, position asc) over a linked list does
  // the same in O(n log n); entries are checked for staleness when popped.
  std::vector<std::int32_t> merge(std::vector<std::int32_t> tokens) const {
    const std::size_t n = tokens.size();
    std::vector<std::size_t> next(n), prev(n);
    for (std::size_t i = 0; i < n; ++i) {
      next[i] = i + 1;  // n means none
      prev[i] = i == 0 ? n : i - 1;
    }
    struct Candidate {
      float score;
      std::size_t left, right;
      std::int32_t left_id, right_id, merged_id;
    };
    const auto worse = [](const Candidate& a, const Candidate& b) {
      return a.score != b.score ? a.score < b.score : a.left > b.left;
    };
    std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> heap(worse);
    std::string buf;
    const auto push = [&](std::size_t left, std::size_t right) {
      if (left == n || right == n) return;
      buf = pieces_[static_cast<std::size_t>(tokens[left])];
      buf += pieces_[static_cast<std::size_t>(tokens[right])];
      const std::int32_t id = lookup(buf);
      if (id < 0) return;
      const float score = scores_[static_cast<std::size_t>(id)];
      if (score > kMergeScoreFloor) heap.push({score, left, right, tokens[left], tokens[right], id});
    };
    for (std::size_t i = 0; i + 1 < n; ++i) push(i, i + 1);

    std::vector<bool> alive(n, true);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      if (!alive[c.left] || next[c.left] != c.right || tokens[c.left] != c.left_id || tokens[c.right] != c.right_id) {
        continue;  // stale: the left symbol was merged away or the pair changed
      }
      tokens[c.left] = c.merged_id;
      alive[c.right] = false;
      next[c.left] = next[c.right];
      if (next[c.right] != n) prev[next[c.right]] = c.left;
      push(prev[c.left], c.left);
      push(c.left, next[c.left]);
    }

    std::vector<std::int32_t> out;
    for (std::size_t i = 0; i < n; i = next[i]) out.push_back(tokens[i]);
    return out;
  }

  std::vector<std::string> pieces_;  // vocab strings as stored in the file
  std::vector<float> scores_;
  std::vector<std::string> texts_;  // what each id prints
  std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>> ids_;
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
  return std::make_unique<Llama2cTokenizer>(std::move(pieces), std::move(scores));
}

std::unique_ptr<Tokenizer> load_llama2c_tokenizer_file(const std::string& path, std::int32_t vocab_size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open llama2.c tokenizer file");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error(path + ": error reading llama2.c tokenizer file");
  return load_llama2c_tokenizer(std::as_bytes(std::span(bytes)), vocab_size, path);
}

}  // namespace flexh2o::engine
