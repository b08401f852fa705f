// A model's vocabulary: token string <-> id, ids possibly with gaps.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace flexh2o::engine::tok {

class Vocab {
 public:
  // Throws std::runtime_error when two tokens share an id. A token listed twice is found under
  // its lowest id.
  explicit Vocab(std::vector<std::pair<std::string, std::int32_t>> entries);
  Vocab(Vocab&&) = default;
  Vocab& operator=(Vocab&&) = default;

  std::optional<std::int32_t> find(std::string_view token) const {
    const auto it = ids_.find(token);
    if (it == ids_.end()) return std::nullopt;
    return it->second;
  }
  // nullptr for an id the vocab does not have.
  const std::string* token(std::int32_t id) const {
    if (id < 0 || id >= id_limit() || !present_[static_cast<std::size_t>(id)]) return nullptr;
    return &tokens_[static_cast<std::size_t>(id)];
  }
  std::int32_t id_limit() const { return static_cast<std::int32_t>(tokens_.size()); }
  // The number of distinct tokens.
  std::size_t size() const { return ids_.size(); }

 private:
  std::vector<std::string> tokens_;  // by id
  std::vector<bool> present_;
  std::unordered_map<std::string_view, std::int32_t> ids_;  // views into tokens_
};

}  // namespace flexh2o::engine::tok
