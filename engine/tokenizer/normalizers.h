// Normalizers: Unicode normal forms (utf8proc), Prepend, Replace, and a Sequence of them.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/stages.h"

namespace flexh2o::engine::tok {

// NFC, NFD, NFKC or NFKD. Bytes that are not UTF-8 are left as they are.
class UnicodeNormalizer final : public Normalizer {
 public:
  enum class Form { kNfc, kNfd, kNfkc, kNfkd };
  explicit UnicodeNormalizer(Form form) : form_(form) {}
  void normalize(std::string& text) const override;

 private:
  Form form_;
};

// Puts `prefix` in front of a non-empty text.
class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override;

 private:
  std::string prefix_;
};

// Replaces every match of `pattern` with `content`.
class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override;

 private:
  Regex pattern_;
  std::string content_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> stages) : stages_(std::move(stages)) {}
  void normalize(std::string& text) const override;

 private:
  std::vector<std::unique_ptr<Normalizer>> stages_;
};

// `text` with every match of `pattern` replaced by `content` (Replace normalizer and decoder).
std::string replace_all(const Regex& pattern, const std::string& text, const std::string& content);

}  // namespace flexh2o::engine::tok
