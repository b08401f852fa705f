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

namespace {

struct Family {
  std::int64_t lo = 0, hi = 0, prefix = 0;  // prompts [lo, hi) in sorted order
};

// Calls run(a, b) for each run [a, b) of at least two of the sorted prompts [lo, hi) whose
// links (links[i]: the tokens prompts i and i + 1 share) are all above `above`.
template <class Run>
void for_each_run(std::span<const std::int64_t> links, std::int64_t lo, std::int64_t hi, std::int64_t above, Run run) {
  for (std::int64_t a = lo; a < hi;) {
    std::int64_t b = a + 1;
    while (b < hi && links[static_cast<std::size_t>(b - 1)] > above) ++b;
    if (b - a >= 2) run(a, b);
    a = b;
  }
}

// The families of the sorted prompts [lo, hi), at least two, whose links are all worth
// sharing, appended to `out`; returns the prompt tokens they save. Cutting at the weakest links
// leaves runs with longer prefixes: the cut is taken where its runs save more than the whole
// run would.
std::int64_t best_families(std::span<const std::int64_t> links, std::int64_t lo, std::int64_t hi,
                           std::vector<Family>& out) {
  const std::int64_t weakest = *std::min_element(links.begin() + lo, links.begin() + hi - 1);
  const std::int64_t whole = (hi - lo - 1) * weakest;
  std::vector<Family> cut;
  std::int64_t cut_saves = 0;
  for_each_run(links, lo, hi, weakest,
               [&](std::int64_t a, std::int64_t b) { cut_saves += best_families(links, a, b, cut); });
  if (cut_saves > whole) {
    out.insert(out.end(), cut.begin(), cut.end());
    return cut_saves;
  }
  out.push_back({lo, hi, weakest});
  return whole;
}

}  // namespace

PrefixFamilies prefix_families(std::span<const std::span<const std::int32_t>> prompts, std::int64_t min_tokens) {
  min_tokens = std::max<std::int64_t>(min_tokens, 1);
  std::vector<std::size_t> order(prompts.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::ranges::stable_sort(order, [&](std::size_t a, std::size_t b) {
    return std::ranges::lexicographical_compare(prompts[a], prompts[b]);
  });
  std::vector<std::int64_t> links;
  for (std::size_t i = 0; i + 1 < order.size(); ++i) {
    const auto a = prompts[order[i]], b = prompts[order[i + 1]];
    const auto shareable = static_cast<std::int64_t>(std::min(a.size(), b.size())) - 1;
    links.push_back(std::min(common_prefix(a, b), shareable));
  }
  std::vector<Family> found;
  for_each_run(links, 0, static_cast<std::int64_t>(order.size()), min_tokens - 1,
               [&](std::int64_t a, std::int64_t b) { best_families(links, a, b, found); });
  PrefixFamilies f;
  f.family_of.assign(prompts.size(), -1);
  for (const Family& family : found) {
    for (std::int64_t i = family.lo; i < family.hi; ++i)
      f.family_of[order[static_cast<std::size_t>(i)]] = static_cast<std::int64_t>(f.prefix.size());
    f.prefix.push_back(family.prefix);
  }
  return f;
}

policy::HeldPrefixes held_prefixes(const PrefixFamilies& families, std::span<const policy::RequestLength> requests) {
  policy::HeldPrefixes held{.families = static_cast<std::int64_t>(families.prefix.size())};
  for (std::size_t b = 0; b < requests.size(); ++b) {
    const std::int64_t family = families.family_of[b];
    const std::int64_t prefix = family >= 0 ? families.prefix[static_cast<std::size_t>(family)] : 0;
    held.prefix = std::max(held.prefix, prefix);
    held.rest = std::max(held.rest, requests[b].prompt + requests[b].gen - prefix);
    held.mean_prefix += static_cast<double>(prefix);
  }
  if (!requests.empty()) held.mean_prefix /= static_cast<double>(requests.size());
  return held;
}

void add_families(const PrefixFamilies& families, std::span<policy::RequestLength> requests) {
  for (std::size_t b = 0; b < requests.size(); ++b) {
    const std::int64_t family = families.family_of[b];
    requests[b].family = family;
    if (family >= 0) requests[b].shared = families.prefix[static_cast<std::size_t>(family)];
  }
}

std::string prefix_sharing_off_reason(const ModelConfig& cfg, bool evicting) {
  if (evicting) return "a KV eviction policy keeps the slots it chose for each sequence's own tokens";
  if (rope_depends_on_length(cfg.rope) || cfg.rope.reprefill_on_long)
    return "the RoPE frequencies follow each sequence's length";
  return "";
}

}  // namespace flexh2o::engine
