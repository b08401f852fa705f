#include "engine/tokenizer/vocab.h"

#include <algorithm>
#include <stdexcept>

namespace flexh2o::engine::tok {

Vocab::Vocab(std::vector<std::pair<std::string, std::int32_t>> entries) {
  std::int32_t max_id = -1;
  for (const auto& [token, id] : entries) {
    if (id < 0) throw std::runtime_error("negative token id " + std::to_string(id) + " for \"" + token + "\"");
    max_id = std::max(max_id, id);
  }
  tokens_.resize(static_cast<std::size_t>(max_id + 1));
  present_.resize(tokens_.size(), false);
  for (auto& [token, id] : entries) {
    const auto i = static_cast<std::size_t>(id);
    if (present_[i]) {
      throw std::runtime_error("id " + std::to_string(id) + " is used by both \"" + tokens_[i] + "\" and \"" + token +
                               "\"");
    }
    tokens_[i] = std::move(token);
    present_[i] = true;
  }
  ids_.reserve(entries.size());
  // Ascending ids, so emplace keeps the lowest id of a repeated token.
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    if (present_[i]) ids_.emplace(tokens_[i], static_cast<std::int32_t>(i));
  }
}

}  // namespace flexh2o::engine::tok
