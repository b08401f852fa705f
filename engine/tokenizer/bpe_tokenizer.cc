// GPT-2 style byte-level BPE: text bytes are mapped to printable codepoints (bytes_to_unicode),
// split by the GPT-2 regex, and each piece is merged by merge rank as in the reference encoder.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include "engine/tokenizer/tokenizer.h"

namespace flexh2o::engine {
namespace {

using nlohmann::json;

// Far above any real vocab (the largest are ~260k); keeps a corrupt id from allocating gigabytes.
constexpr std::int64_t kMaxVocabSize = std::int64_t{1} << 24;

// Codepoints of GPT-2's byte alphabet are all below 256 + 68.
constexpr std::size_t kAlphabetLimit = 324;

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68 bytes
// for 256, 257, ... in byte order. The result is UTF-8 per byte.
struct ByteAlphabet {
  std::array<std::string, 256> encoded;
  std::array<int, kAlphabetLimit> byte_of_codepoint;  // -1 when not in the alphabet

  ByteAlphabet() {
    byte_of_codepoint.fill(-1);
    std::uint32_t extra = 0;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const std::uint32_t cp = printable ? b : 256 + extra++;
      byte_of_codepoint[cp] = static_cast<int>(b);
      encoded[b] = cp < 0x80 ? std::string(1, static_cast<char>(cp))
                             : std::string{static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    }
  }

  // The bytes a vocab string stands for, or nullopt when it has characters outside the alphabet
  // (then it is printed as is, like Hugging Face's ByteLevel decoder does).
  std::optional<std::string> decode(std::string_view token) const {
    std::string out;
    for (std::size_t i = 0; i < token.size();) {
      const auto c0 = static_cast<unsigned char>(token[i]);
      std::uint32_t cp = c0;
      if (c0 >= 0x80) {
        if ((c0 & 0xE0) != 0xC0 || i + 1 >= token.size()) return std::nullopt;
        const auto c1 = static_cast<unsigned char>(token[i + 1]);
        if ((c1 & 0xC0) != 0x80) return std::nullopt;
        cp = ((c0 & 0x1Fu) << 6) | (c1 & 0x3Fu);
        i += 2;
      } else {
        i += 1;
      }
      if (cp >= kAlphabetLimit || byte_of_codepoint[cp] < 0) return std::nullopt;
      out.push_back(static_cast<char>(byte_of_codepoint[cp]));
    }
    return out;
  }
};

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet;
  return alphabet;
}

struct CodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

std::string pcre2_message(int code) {
  std::array<PCRE2_UCHAR, 256> buf{};
  pcre2_get_error_message(code, buf.data(), buf.size());
  return reinterpret_cast<const char*>(buf.data());
}

// GPT-2's pre-tokenizer regex, compiled once per process (matching with a compiled pattern is
// thread-safe). MATCH_INVALID_UTF makes invalid UTF-8 unmatchable instead of an error.
const pcre2_code* gpt2_regex() {
  static const std::unique_ptr<pcre2_code, CodeDeleter> code = [] {
    constexpr std::string_view pattern =
        R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
    if (c == nullptr) throw std::runtime_error("GPT-2 pre-tokenizer regex: " + pcre2_message(error));
    // The interpreter re-validates the rest of the subject on every call under MATCH_INVALID_UTF,
    // which makes long texts quadratic; JIT code checks UTF as it goes. Where JIT is unavailable
    // (the call fails) pcre2_match falls back to the interpreter, still correct.
    pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);
    return std::unique_ptr<pcre2_code, CodeDeleter>(c);
  }();
  return code.get();
}

struct AddedToken {
  std::int32_t id;
  std::string content;
  bool special;
};

struct Merge {
  std::int32_t rank;
  std::int32_t id;  // the merged token
};

std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

using Vocab = std::unordered_map<std::string, std::int32_t>;

// What a loader has parsed and checked; BpeTokenizer takes it from here.
struct BpeModel {
  Vocab vocab;
  std::unordered_map<std::uint64_t, Merge> merges;
  std::vector<AddedToken> added;
};

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(BpeModel model, const std::string& source) : merges_(std::move(model.merges)) {
    const ByteAlphabet& alphabet = byte_alphabet();
    std::int32_t max_id = -1;
    for (const auto& [token, id] : model.vocab) max_id = std::max(max_id, id);
    for (const AddedToken& t : model.added) max_id = std::max(max_id, t.id);
    vocab_size_ = max_id + 1;
    texts_.resize(static_cast<std::size_t>(vocab_size_));
    known_.resize(static_cast<std::size_t>(vocab_size_), false);

    std::vector<const std::string*> token_of_id(static_cast<std::size_t>(vocab_size_), nullptr);
    for (const auto& [token, id] : model.vocab) {
      const auto i = static_cast<std::size_t>(id);
      if (token_of_id[i] != nullptr) {
        throw std::runtime_error(source + ": id " + std::to_string(id) + " is used by both \"" + *token_of_id[i] +
                                 "\" and \"" + token + "\"");
      }
      token_of_id[i] = &token;
      texts_[i] = alphabet.decode(token).value_or(token);
      known_[i] = true;
    }
    for (std::size_t b = 0; b < 256; ++b) {
      const auto it = model.vocab.find(alphabet.encoded[b]);
      byte_ids_[b] = it == model.vocab.end() ? -1 : it->second;
    }

    // Added tokens print their content verbatim (specials print nothing), so text with a
    // non-special added token in it round-trips.
    for (AddedToken& t : model.added) {
      const auto i = static_cast<std::size_t>(t.id);
      texts_[i] = t.special ? std::string() : t.content;
      known_[i] = true;
      if (t.content == "<s>" || (t.content == "<|endoftext|>" && !bos_)) bos_ = t.id;
      if (t.content == "</s>" || (t.content == "<|endoftext|>" && !eos_)) eos_ = t.id;
      const auto first = static_cast<unsigned char>(t.content[0]);
      added_by_first_byte_[first].push_back(std::move(t));
    }
    // Longest first, so the first literal match at a position is the longest one.
    for (auto& bucket : added_by_first_byte_) {
      std::stable_sort(bucket.begin(), bucket.end(),
                       [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
    }
  }

  std::vector<std::int32_t> encode(std::string_view text, bool add_bos) const override {
    std::vector<std::int32_t> out;
    if (add_bos && bos_) out.push_back(*bos_);
    const std::unique_ptr<pcre2_match_data, MatchDataDeleter> match(
        pcre2_match_data_create_from_pattern(gpt2_regex(), nullptr));
    if (!match) throw std::bad_alloc();
    // Added tokens are matched literally first; the text between them goes through BPE.
    std::size_t segment_start = 0;
    for (std::size_t i = 0; i < text.size();) {
      const AddedToken* added = added_token_at(text, i);
      if (added == nullptr) {
        ++i;
        continue;
      }
      encode_segment(text.substr(segment_start, i - segment_start), match.get(), out);
      out.push_back(added->id);
      i += added->content.size();
      segment_start = i;
    }
    encode_segment(text.substr(segment_start), match.get(), out);
    return out;
  }

  std::string decode(std::span<const std::int32_t> tokens) const override {
    std::string out;
    for (const std::int32_t id : tokens) {
      if (id < 0 || id >= vocab_size_ || !known_[static_cast<std::size_t>(id)]) {
        throw std::runtime_error("byte-level BPE tokenizer: unknown token id " + std::to_string(id));
      }
      out += texts_[static_cast<std::size_t>(id)];
    }
    return out;
  }

  std::int32_t vocab_size() const override { return vocab_size_; }
  std::optional<std::int32_t> bos_id() const override { return bos_; }
  std::optional<std::int32_t> eos_id() const override { return eos_; }

 private:
  const AddedToken* added_token_at(std::string_view text, std::size_t pos) const {
    for (const AddedToken& t : added_by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      if (text.substr(pos).starts_with(t.content)) return &t;
    }
    return nullptr;
  }

  // Splits with the GPT-2 regex and BPE-encodes each piece. Bytes the regex cannot match
  // (invalid UTF-8) become pieces of their own so every byte string round-trips.
  void encode_segment(std::string_view segment, pcre2_match_data* match, std::vector<std::int32_t>& out) const {
    const auto subject = reinterpret_cast<PCRE2_SPTR>(segment.data());
    std::size_t pos = 0;
    while (pos < segment.size()) {
      const int rc = pcre2_match(gpt2_regex(), subject, segment.size(), pos, 0, match, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) throw std::runtime_error("GPT-2 pre-tokenizer regex: " + pcre2_message(rc));
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
      if (ovector[0] > pos) bpe(segment.substr(pos, ovector[0] - pos), out);
      // Every alternative of the regex consumes at least one character, so this advances.
      bpe(segment.substr(ovector[0], ovector[1] - ovector[0]), out);
      pos = ovector[1];
    }
    if (pos < segment.size()) bpe(segment.substr(pos), out);
  }

  // Starts from one symbol per byte and applies the lowest-rank merge, leftmost first, until
  // none applies: the same result as GPT-2's encoder (which merges all occurrences of the best
  // pair per round). A heap over a linked list keeps long pieces O(n log n).
  void bpe(std::string_view piece, std::vector<std::int32_t>& out) const {
    const std::size_t n = piece.size();
    std::vector<std::int32_t> ids(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto b = static_cast<unsigned char>(piece[i]);
      ids[i] = byte_ids_[b];
      if (ids[i] < 0) {
        throw std::runtime_error("byte-level BPE tokenizer: the vocab has no token for byte " + std::to_string(b));
      }
    }
    std::vector<std::size_t> next(n), prev(n);
    for (std::size_t i = 0; i < n; ++i) {
      next[i] = i + 1;  // n means none
      prev[i] = i == 0 ? n : i - 1;
    }
    struct Candidate {
      std::int32_t rank;
      std::size_t left, right;
      std::int32_t left_id, right_id, merged_id;
    };
    const auto worse = [](const Candidate& a, const Candidate& b) {
      return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
    };
    std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> heap(worse);
    const auto push = [&](std::size_t left, std::size_t right) {
      if (left == n || right == n) return;
      const auto it = merges_.find(pair_key(ids[left], ids[right]));
      if (it != merges_.end()) heap.push({it->second.rank, left, right, ids[left], ids[right], it->second.id});
    };
    for (std::size_t i = 0; i + 1 < n; ++i) push(i, i + 1);

    std::vector<bool> alive(n, true);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      if (!alive[c.left] || next[c.left] != c.right || ids[c.left] != c.left_id || ids[c.right] != c.right_id) {
        continue;  // stale: the left symbol was merged away or the pair changed
      }
      ids[c.left] = c.merged_id;
      alive[c.right] = false;
      next[c.left] = next[c.right];
      if (next[c.right] != n) prev[next[c.right]] = c.left;
      push(prev[c.left], c.left);
      push(c.left, next[c.left]);
    }
    for (std::size_t i = 0; i < n; i = next[i]) out.push_back(ids[i]);
  }

  std::unordered_map<std::uint64_t, Merge> merges_;  // keyed by pair_key(left id, right id)
  std::array<std::int32_t, 256> byte_ids_{};         // the single-byte tokens, -1 if missing
  std::array<std::vector<AddedToken>, 256> added_by_first_byte_;
  std::vector<std::string> texts_;  // the bytes each id prints
  std::vector<bool> known_;         // ids that exist (a vocab may have gaps)
  std::int32_t vocab_size_ = 0;
  std::optional<std::int32_t> bos_, eos_;
};

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail(path, std::string("invalid JSON: ") + e.what());
  }
}

const json& field(const json& object, const char* name, const std::string& path, const std::string& where) {
  const auto it = object.find(name);
  if (it == object.end()) fail(path, "missing field " + where + name);
  return *it;
}

std::int32_t parse_id(const json& value, const std::string& path, const std::string& where) {
  if (!value.is_number_integer() || value.get<std::int64_t>() < 0 || value.get<std::int64_t>() >= kMaxVocabSize) {
    fail(path,
         where + ": expected a token id (integer in [0, " + std::to_string(kMaxVocabSize) + ")), got " + value.dump());
  }
  return value.get<std::int32_t>();
}

Vocab parse_vocab(const json& object, const std::string& path, const std::string& where) {
  if (!object.is_object()) fail(path, where + ": expected an object of token -> id");
  Vocab vocab;
  vocab.reserve(object.size());
  for (const auto& [token, id] : object.items()) {
    vocab.emplace(token, parse_id(id, path, where + "[\"" + token + "\"]"));
  }
  return vocab;
}

// Adds merge (a, b) with the next rank; a, b and a+b must all be tokens. A repeated pair takes
// its later rank, as in GPT-2's encoder and Hugging Face's BPE.
void add_merge(BpeModel& model, const std::string& a, const std::string& b, const std::string& path,
               const std::string& where) {
  const auto id_of = [&](const std::string& token) {
    const auto it = model.vocab.find(token);
    if (it == model.vocab.end()) fail(path, where + ": merge token \"" + token + "\" is not in the vocab");
    return it->second;
  };
  const std::int32_t left = id_of(a);
  const std::int32_t right = id_of(b);
  const std::int32_t merged = id_of(a + b);
  const auto rank = static_cast<std::int32_t>(model.merges.size());
  model.merges.insert_or_assign(pair_key(left, right), Merge{rank, merged});
}

// "a b" with exactly one space between two non-empty tokens.
std::pair<std::string, std::string> split_merge(std::string_view line, const std::string& path,
                                                const std::string& where) {
  const std::size_t space = line.find(' ');
  if (space == 0 || space == std::string_view::npos || space + 1 == line.size() ||
      line.find(' ', space + 1) != std::string_view::npos) {
    fail(path, where + ": expected a merge \"a b\", got \"" + std::string(line) + "\"");
  }
  return {std::string(line.substr(0, space)), std::string(line.substr(space + 1))};
}

BpeModel parse_hf_tokenizer(const std::string& path) {
  const json root = read_json(path);
  if (!root.is_object()) fail(path, "expected a JSON object");
  const json& model_json = field(root, "model", path, "");
  if (!model_json.is_object()) fail(path, "model: expected an object");
  const json& type = field(model_json, "type", path, "model.");
  if (type != "BPE") fail(path, "model.type: only \"BPE\" is supported, got " + type.dump());
  // Byte fallback marks sentencepiece-style BPE (Llama), which is not byte-level.
  if (model_json.value("byte_fallback", false)) fail(path, "model.byte_fallback: only byte-level BPE is supported");
  if (const auto it = root.find("normalizer"); it != root.end() && !it->is_null()) {
    fail(path, "normalizer: not supported, got " + it->dump());
  }
  // Absent means byte-level (minimal files); anything else must be a plain GPT-2 ByteLevel.
  if (const auto it = root.find("pre_tokenizer"); it != root.end()) {
    if (!it->is_object() || it->value("type", json()) != "ByteLevel" || it->value("add_prefix_space", false) ||
        !it->value("use_regex", true)) {
      fail(path, "pre_tokenizer: only ByteLevel without add_prefix_space is supported, got " + it->dump());
    }
  }

  BpeModel model;
  model.vocab = parse_vocab(field(model_json, "vocab", path, "model."), path, "model.vocab");

  const json& merges = field(model_json, "merges", path, "model.");
  if (!merges.is_array()) fail(path, "model.merges: expected an array");
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const std::string where = "model.merges[" + std::to_string(i) + "]";
    const json& m = merges[i];
    if (m.is_string()) {
      const auto [a, b] = split_merge(m.get_ref<const std::string&>(), path, where);
      add_merge(model, a, b, path, where);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      add_merge(model, m[0].get<std::string>(), m[1].get<std::string>(), path, where);
    } else {
      fail(path, where + ": expected \"a b\" or [\"a\", \"b\"], got " + m.dump());
    }
  }

  if (const auto it = root.find("added_tokens"); it != root.end() && !it->is_null()) {
    if (!it->is_array()) fail(path, "added_tokens: expected an array");
    for (std::size_t i = 0; i < it->size(); ++i) {
      const std::string where = "added_tokens[" + std::to_string(i) + "].";
      const json& t = (*it)[i];
      if (!t.is_object()) fail(path, "added_tokens[" + std::to_string(i) + "]: expected an object");
      const std::int32_t id = parse_id(field(t, "id", path, where), path, where + "id");
      const json& content = field(t, "content", path, where);
      if (!content.is_string() || content.get_ref<const std::string&>().empty()) {
        fail(path, where + "content: expected a non-empty string");
      }
      const json special = t.value("special", json(false));
      if (!special.is_boolean()) fail(path, where + "special: expected a boolean");
      model.added.push_back({id, content.get<std::string>(), special.get<bool>()});
    }
  }
  return model;
}

}  // namespace

std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::string& vocab_json_path, const std::string& merges_path) {
  BpeModel model;
  model.vocab = parse_vocab(read_json(vocab_json_path), vocab_json_path, "vocab");

  std::ifstream in(merges_path, std::ios::binary);
  if (!in) fail(merges_path, "cannot open");
  std::string line;
  for (std::size_t line_no = 1; std::getline(in, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const std::string where = "line " + std::to_string(line_no);
    const auto [a, b] = split_merge(line, merges_path, where);
    add_merge(model, a, b, merges_path, where);
  }
  if (in.bad()) fail(merges_path, "read error");

  // GPT-2's only special token serves as both BOS and EOS.
  if (const auto it = model.vocab.find("<|endoftext|>"); it != model.vocab.end()) {
    model.added.push_back({it->second, it->first, true});
  }
  return std::make_unique<BpeTokenizer>(std::move(model), vocab_json_path);
}

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& tokenizer_json_path) {
  BpeModel model;
  try {
    model = parse_hf_tokenizer(tokenizer_json_path);
  } catch (const json::exception& e) {  // a field of an unexpected type
    fail(tokenizer_json_path, e.what());
  }
  return std::make_unique<BpeTokenizer>(std::move(model), tokenizer_json_path);
}

}  // namespace flexh2o::engine
