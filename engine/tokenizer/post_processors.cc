#include "engine/tokenizer/post_processors.h"

namespace flexh2o::engine::tok {

void TemplateProcessor::add_special_tokens(std::vector<std::int32_t>& ids) const {
  std::vector<std::int32_t> out;
  out.reserve(ids.size() + single_.size());
  for (const Item& item : single_) {
    if (item.is_text) {
      out.insert(out.end(), ids.begin(), ids.end());
    } else {
      out.insert(out.end(), item.ids.begin(), item.ids.end());
    }
  }
  ids = std::move(out);
}

void RobertaProcessor::add_special_tokens(std::vector<std::int32_t>& ids) const {
  ids.insert(ids.begin(), cls_id_);
  ids.push_back(sep_id_);
}

void SequenceProcessor::add_special_tokens(std::vector<std::int32_t>& ids) const {
  for (const auto& stage : stages_) stage->add_special_tokens(ids);
}

}  // namespace flexh2o::engine::tok
