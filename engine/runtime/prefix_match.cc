#include "engine/runtime/prefix_match.h"

#include <algorithm>

#include "engine/model/rope_scaling.h"

namespace flexh2o::engine {

std::int64_t common_prefix(std::span<const std::int32_t> a, std::span<const std::int32_t> b) {
  const auto n = std::min(a.size(), b.size());
  std::size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return static_cast<std::int64_t>(i);
}

PrefixMatch longest_prefix(std::span<const std::int32_t> prompt, std::span<const std::span<const std::int32_t>> held,
                           std::int64_t prefer, std::int64_t min_tokens) {
  PrefixMatch best;
  if (prompt.size() < 2) return best;
  min_tokens = std::max<std::int64_t>(min_tokens, 1);
  const std::span<const std::int32_t> shareable = prompt.first(prompt.size() - 1);
  for (std::size_t s = 0; s < held.size(); ++s) {
    const std::int64_t n = common_prefix(shareable, held[s]);
    const bool preferred = static_cast<std::int64_t>(s) == prefer;
    if (n >= min_tokens && (n > best.tokens || (n == best.tokens && preferred)))
      best = {static_cast<std::int64_t>(s), n};
  }
  return best;
}

std::string prefix_sharing_off_reason(const ModelConfig& cfg, bool evicting) {
  if (evicting) return "a KV eviction policy keeps the slots it chose for each sequence's own tokens";
  if (rope_depends_on_length(cfg.rope) || cfg.rope.reprefill_on_long)
    return "the RoPE frequencies follow each sequence's length";
  return "";
}

}  // namespace flexh2o::engine
