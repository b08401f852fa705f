// Post-processors: the special tokens a tokenizer puts around an encoded text when asked to
// (Hugging Face's TemplateProcessing, RobertaProcessing; ByteLevel only trims offsets).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/tokenizer/stages.h"

namespace flexh2o::engine::tok {

// The "single" template: special-token ids and the place of the text ($A), e.g. "<s> $A".
class TemplateProcessor final : public PostProcessor {
 public:
  struct Item {
    bool is_text;                    // $A
    std::vector<std::int32_t> ids;   // a special token's ids otherwise
  };
  explicit TemplateProcessor(std::vector<Item> single) : single_(std::move(single)) {}
  void add_special_tokens(std::vector<std::int32_t>& ids) const override;

 private:
  std::vector<Item> single_;
};

// Offsets only: the ids stay as they are.
class ByteLevelProcessor final : public PostProcessor {
 public:
  void add_special_tokens(std::vector<std::int32_t>&) const override {}
};

// RoBERTa's "<s> $A </s>".
class RobertaProcessor final : public PostProcessor {
 public:
  RobertaProcessor(std::int32_t cls_id, std::int32_t sep_id) : cls_id_(cls_id), sep_id_(sep_id) {}
  void add_special_tokens(std::vector<std::int32_t>& ids) const override;

 private:
  std::int32_t cls_id_, sep_id_;
};

class SequenceProcessor final : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> stages) : stages_(std::move(stages)) {}
  void add_special_tokens(std::vector<std::int32_t>& ids) const override;

 private:
  std::vector<std::unique_ptr<PostProcessor>> stages_;
};

}  // namespace flexh2o::engine::tok
