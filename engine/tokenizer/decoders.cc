#include "engine/tokenizer/decoders.h"

#include <optional>

#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/normalizers.h"
#include "engine/tokenizer/utf8.h"

namespace flexh2o::engine::tok {
namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The byte a "<0xHH>" token stands for.
std::optional<char> fallback_byte(const std::string& token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return std::nullopt;
  const int hi = hex_value(token[3]);
  const int lo = hex_value(token[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<char>(hi * 16 + lo);
}

}  // namespace

void ByteFallbackDecoder::decode_chain(std::vector<std::string>& tokens) const {
  std::vector<std::string> out;
  out.reserve(tokens.size());
  std::string bytes;
  bool in_run = false;
  for (std::string& token : tokens) {
    if (const auto b = fallback_byte(token)) {
      bytes.push_back(*b);
      in_run = true;
      continue;
    }
    if (in_run) {
      out.push_back(std::move(bytes));
      bytes.clear();
      in_run = false;
    }
    out.push_back(std::move(token));
  }
  if (in_run) out.push_back(std::move(bytes));
  tokens = std::move(out);
}

void FuseDecoder::decode_chain(std::vector<std::string>& tokens) const {
  std::string joined;
  for (const std::string& token : tokens) joined += token;
  tokens.assign(1, std::move(joined));
}

void StripDecoder::decode_chain(std::vector<std::string>& tokens) const {
  if (content_.empty()) return;
  for (std::string& token : tokens) {
    std::string_view view = token;
    for (std::size_t i = 0; i < start_ && view.starts_with(content_); ++i) view.remove_prefix(content_.size());
    for (std::size_t i = 0; i < stop_ && view.ends_with(content_); ++i) view.remove_suffix(content_.size());
    token = std::string(view);
  }
}

void MetaspaceDecoder::decode_chain(std::vector<std::string>& tokens) const {
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const bool drop = i == 0 && scheme_ != PrependScheme::kNever;
    tokens[i] = replace_all(replacement_, tokens[i], drop ? std::string() : std::string(" "));
  }
}

void ReplaceDecoder::decode_chain(std::vector<std::string>& tokens) const {
  for (std::string& token : tokens) token = replace_all(pattern_, token, content_);
}

void ByteLevelDecoder::decode_chain(std::vector<std::string>& tokens) const {
  const ByteAlphabet& alphabet = ByteAlphabet::get();
  std::string bytes;
  for (const std::string& token : tokens) {
    if (const auto decoded = alphabet.decode(token)) {
      bytes += *decoded;
    } else {
      bytes += token;
    }
  }
  tokens.assign(1, std::move(bytes));
}

void SequenceDecoder::decode_chain(std::vector<std::string>& tokens) const {
  for (const auto& stage : stages_) stage->decode_chain(tokens);
}

}  // namespace flexh2o::engine::tok
