#include "engine/tokenizer/bpe_model.h"

#include <cstdio>
#include <stdexcept>

#include "engine/tokenizer/pair_merge.h"
#include "engine/tokenizer/utf8.h"

namespace flexh2o::engine::tok {
namespace {

std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

}  // namespace

MergeRule resolve_merge(const Vocab& vocab, const std::string& a, const std::string& b) {
  const auto id_of = [&](const std::string& token) {
    const auto id = vocab.find(token);
    if (!id) throw std::runtime_error("merge token \"" + token + "\" is not in the vocab");
    return *id;
  };
  return {id_of(a), id_of(b), id_of(a + b)};
}

BpeModel::BpeModel(Vocab vocab, const std::vector<MergeRule>& merges, BpeOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  merges_.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const MergeRule& m = merges[rank];
    merges_.insert_or_assign(pair_key(m.left, m.right), Merge{static_cast<std::int32_t>(rank), m.merged});
  }
  if (options_.unk_token) {
    unk_id_ = vocab_.find(*options_.unk_token);
    if (!unk_id_) throw std::runtime_error("unk_token \"" + *options_.unk_token + "\" is not in the vocab");
  }
  for (unsigned b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    byte_ids_[b] = vocab_.find(name).value_or(-1);
  }
}

const BpeModel::Merge* BpeModel::find_merge(std::int32_t left, std::int32_t right) const {
  const auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::tokenize(std::string_view piece, std::vector<std::int32_t>& out) const {
  if (piece.empty()) return;
  if (options_.ignore_merges) {
    if (const auto id = vocab_.find(piece)) {
      out.push_back(*id);
      return;
    }
  }
  std::vector<std::int32_t> symbols;
  symbols.reserve(piece.size());
  std::optional<std::int32_t> pending_unk;
  for (std::size_t i = 0; i < piece.size();) {
    const std::size_t len = char_length(piece, i);
    const std::string_view c = piece.substr(i, len);
    i += len;
    if (const auto id = vocab_.find(c)) {
      if (pending_unk) symbols.push_back(*std::exchange(pending_unk, std::nullopt));
      symbols.push_back(*id);
      continue;
    }
    if (options_.byte_fallback) {
      bool all_bytes = true;
      for (const char b : c) all_bytes = all_bytes && byte_ids_[static_cast<unsigned char>(b)] >= 0;
      if (all_bytes) {
        // Like Hugging Face, a pending unk is not flushed first (it follows the bytes).
        for (const char b : c) symbols.push_back(byte_ids_[static_cast<unsigned char>(b)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk && !options_.fuse_unk) symbols.push_back(*pending_unk);
      pending_unk = unk_id_;
    }
  }
  if (pending_unk) symbols.push_back(*pending_unk);
  merge_all(symbols, out);
}

void BpeModel::merge_all(std::vector<std::int32_t>& symbols, std::vector<std::int32_t>& out) const {
  merge_pairs(
      symbols,
      [this](std::int32_t left, std::int32_t right) -> std::optional<PairMerge> {
        const Merge* m = find_merge(left, right);
        if (m == nullptr) return std::nullopt;
        return PairMerge{static_cast<double>(m->rank), m->merged};
      },
      out);
}

}  // namespace flexh2o::engine::tok
