#include "engine/serving/kv_report.h"

#include <fmt/format.h>

#include <array>
#include <string_view>

#include "offload/tiers.h"

namespace flexh2o::serving {

using offload::format_bytes;

namespace {

using ByTier = std::array<std::int64_t, 3>;  // by offload::Tier
constexpr std::array kTiers{offload::Tier::Gpu, offload::Tier::Cpu, offload::Tier::Disk};

std::string tier_key(offload::Tier t) { return std::string(offload::tier_name(t)); }

// Two counts by tier as {"gpu": {a: .., b: ..}, "cpu": .., "disk": ..}, and back.
nlohmann::json pair_by_tier_json(const char* a_key, const ByTier& a, const char* b_key, const ByTier& b) {
  nlohmann::json by_tier;
  for (const offload::Tier t : kTiers) {
    const auto i = static_cast<std::size_t>(t);
    by_tier[tier_key(t)] = {{a_key, a[i]}, {b_key, b[i]}};
  }
  return by_tier;
}

void pair_by_tier_from_json(const nlohmann::json& by_tier, const char* a_key, ByTier& a, const char* b_key, ByTier& b) {
  for (const offload::Tier t : kTiers) {
    const auto i = static_cast<std::size_t>(t);
    const nlohmann::json& tier = by_tier.at(tier_key(t));
    a[i] = tier.at(a_key).get<std::int64_t>();
    b[i] = tier.at(b_key).get<std::int64_t>();
  }
}

// "gpu A read, B written | cpu ...": the tiers where either count is not 0, each as `pattern`
// of its name and the two byte counts.
std::string pair_by_tier_text(const ByTier& a, const ByTier& b, fmt::string_view pattern) {
  std::vector<std::string> tiers;
  for (const offload::Tier t : kTiers) {
    const auto i = static_cast<std::size_t>(t);
    if (a[i] > 0 || b[i] > 0)
      tiers.push_back(fmt::format(fmt::runtime(pattern), offload::tier_name(t), format_bytes(a[i]), format_bytes(b[i])));
  }
  return fmt::format("{}", fmt::join(tiers, " | "));
}

nlohmann::json copy_bytes_json(const engine::KvCopyBytes& b) {
  return {{"total", b.total()}, {"by_tier", pair_by_tier_json("read", b.read, "written", b.written)}};
}

engine::KvCopyBytes copy_bytes_from_json(const nlohmann::json& j) {
  engine::KvCopyBytes b;
  pair_by_tier_from_json(j.at("by_tier"), "read", b.read, "written", b.written);
  return b;
}

// "X for WHAT (gpu A read, B written | cpu ...)": the tiers that took part.
std::string copy_bytes_text(const engine::KvCopyBytes& b, std::string_view what) {
  const std::string tiers = pair_by_tier_text(b.read, b.written, "{} {} read, {} written");
  return fmt::format("{} for {}{}", format_bytes(b.total()), what, tiers.empty() ? "" : " (" + tiers + ")");
}

}  // namespace

nlohmann::json kv_reads_json(const engine::KvReads& r, std::int64_t steps) {
  auto per_step = [&](std::int64_t bytes) {
    return steps > 0 ? static_cast<double>(bytes) / static_cast<double>(steps) : 0.0;
  };
  nlohmann::json by_tier = pair_by_tier_json("in_place", r.in_place, "staged", r.staged);
  for (const offload::Tier t : kTiers) {
    const auto i = static_cast<std::size_t>(t);
    by_tier[tier_key(t)]["per_step"] = per_step(r.in_place[i] + r.staged[i]);
  }
  return {{"total", r.total()},
          {"steps", steps},
          {"per_step", per_step(r.total())},
          {"by_tier", std::move(by_tier)},
          {"shared_prefix_saved", r.shared_prefix_saved}};
}

engine::KvReads kv_reads_from_json(const nlohmann::json& j) {
  engine::KvReads r;
  pair_by_tier_from_json(j.at("by_tier"), "in_place", r.in_place, "staged", r.staged);
  r.shared_prefix_saved = j.at("shared_prefix_saved").get<std::int64_t>();
  return r;
}

std::string kv_reads_text(const engine::KvReads& r, std::int64_t steps) {
  const std::int64_t n = std::max<std::int64_t>(steps, 1);
  std::vector<std::string> tiers;
  for (const offload::Tier t : kTiers) {
    const auto i = static_cast<std::size_t>(t);
    const std::string_view name = offload::tier_name(t);
    if (r.in_place[i] > 0) tiers.push_back(fmt::format("{} {} in place", name, format_bytes(r.in_place[i] / n)));
    if (r.staged[i] > 0) tiers.push_back(fmt::format("{} {} staged", name, format_bytes(r.staged[i] / n)));
  }
  const std::string saved = r.shared_prefix_saved > 0
                                ? fmt::format("; {} not read (shared prefixes read once)", format_bytes(r.shared_prefix_saved))
                                : "";
  return fmt::format("KV read: {} per step{}, {} over {} steps{}\n", format_bytes(r.total() / n),
                     tiers.empty() ? "" : fmt::format(" ({})", fmt::join(tiers, " | ")), format_bytes(r.total()), steps,
                     saved);
}

nlohmann::json kv_copies_json(const engine::KvCopies& c) {
  return {{"prefixes", copy_bytes_json(c.prefixes)}, {"forks", copy_bytes_json(c.forks)}};
}

engine::KvCopies kv_copies_from_json(const nlohmann::json& j) {
  return {.prefixes = copy_bytes_from_json(j.at("prefixes")), .forks = copy_bytes_from_json(j.at("forks"))};
}

std::string kv_copies_text(const engine::KvCopies& c) {
  if (c.prefixes.total() == 0 && c.forks.total() == 0) return "";
  return fmt::format("KV copied: {}, {}\n", copy_bytes_text(c.prefixes, "shared prefixes"),
                     copy_bytes_text(c.forks, "forked prefills"));
}

nlohmann::json kv_held_json(const engine::KvHeld& h) {
  return {{"prefixes", h.prefixes},
          {"rows", h.rows},
          {"fills", h.fills},
          {"bytes", h.total()},
          {"bytes_without", h.total_without()},
          {"pools", {{"gpu", h.pools[0]}, {"cpu", h.pools[1]}, {"disk", h.pools[2]}}},
          {"by_tier", pair_by_tier_json("bytes", h.bytes, "bytes_without", h.bytes_without)}};
}

engine::KvHeld kv_held_from_json(const nlohmann::json& j) {
  engine::KvHeld h{.prefixes = j.at("prefixes").get<std::int64_t>(),
                   .rows = j.at("rows").get<std::int64_t>(),
                   .fills = j.at("fills").get<std::int64_t>()};
  for (const offload::Tier t : kTiers)
    h.pools[static_cast<std::size_t>(t)] = j.at("pools").at(tier_key(t)).get<std::int64_t>();
  pair_by_tier_from_json(j.at("by_tier"), "bytes", h.bytes, "bytes_without", h.bytes_without);
  return h;
}

// "KV held once: F prefixes in R pool rows (gpu), N fills; KV cache X instead of Y (gpu A instead of B | cpu ...)":
// the pools' tiers in parentheses.
std::string kv_held_text(const engine::KvHeld& h) {
  if (h.prefixes == 0) return "";
  auto count = [](std::int64_t n, const char* one, const char* many) { return fmt::format("{} {}", n, n == 1 ? one : many); };
  std::vector<std::string_view> pool_tiers;
  for (const offload::Tier t : kTiers)
    if (h.pools[static_cast<std::size_t>(t)] > 0) pool_tiers.push_back(offload::tier_name(t));
  return fmt::format("KV held once: {} in {} ({}), {}; KV cache {} instead of {} ({})\n",
                     count(h.prefixes, "prefix", "prefixes"), count(h.rows, "pool row", "pool rows"),
                     fmt::join(pool_tiers, ", "),
                     count(h.fills, "fill", "fills"), format_bytes(h.total()), format_bytes(h.total_without()),
                     pair_by_tier_text(h.bytes, h.bytes_without, "{} {} instead of {}"));
}

}  // namespace flexh2o::serving
