#include "engine/grammar/token_trie.h"

#include <algorithm>
#include <stdexcept>

namespace flexh2o::grammar {

TokenTrie::TokenTrie(Vocabulary vocabulary) : vocabulary_(std::move(vocabulary)) {
  const std::vector<std::string>& bytes = vocabulary_.token_bytes;
  for (std::int32_t stop : vocabulary_.stop_tokens)
    if (stop < 0 || static_cast<std::size_t>(stop) >= bytes.size())
      throw std::invalid_argument("stop token " + std::to_string(stop) + " is outside the vocabulary");
  std::vector<std::int32_t> order;
  std::vector<bool> stop(bytes.size(), false);  // stop tokens are never text, whatever they spell
  for (std::int32_t id : vocabulary_.stop_tokens) stop[static_cast<std::size_t>(id)] = true;
  for (std::size_t id = 0; id < bytes.size(); ++id)
    if (!bytes[id].empty() && !stop[id]) order.push_back(static_cast<std::int32_t>(id));
  std::sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return bytes[static_cast<std::size_t>(a)] < bytes[static_cast<std::size_t>(b)];
  });
  // Sorted byte strings list the trie in preorder: each token adds the nodes past the prefix it
  // shares with the one before, and closes the subtrees deeper than that prefix.
  std::vector<std::uint32_t> path;  // node index per depth - 1
  const std::string* previous = nullptr;
  for (std::int32_t id : order) {
    const std::string& token = bytes[static_cast<std::size_t>(id)];
    std::size_t shared = 0;
    if (previous != nullptr)
      while (shared < std::min(token.size(), previous->size()) && token[shared] == (*previous)[shared]) ++shared;
    for (; path.size() > shared; path.pop_back()) subtree_end_[path.back()] = static_cast<std::uint32_t>(byte_.size());
    for (std::size_t d = shared; d < token.size(); ++d) {
      path.push_back(static_cast<std::uint32_t>(byte_.size()));
      byte_.push_back(static_cast<std::uint8_t>(token[d]));
      depth_.push_back(static_cast<std::uint32_t>(d + 1));
      subtree_end_.push_back(0);
      token_begin_.push_back(static_cast<std::uint32_t>(sorted_tokens_.size()));
    }
    sorted_tokens_.push_back(id);
    max_depth_ = std::max(max_depth_, static_cast<std::uint32_t>(token.size()));
    previous = &token;
  }
  for (; !path.empty(); path.pop_back()) subtree_end_[path.back()] = static_cast<std::uint32_t>(byte_.size());
  token_begin_.push_back(static_cast<std::uint32_t>(sorted_tokens_.size()));
}

}  // namespace flexh2o::grammar
