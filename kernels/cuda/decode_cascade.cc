#include "kernels/cuda/decode_cascade.h"

#include <algorithm>
#include <cstddef>

namespace flexh2o::kernels::cuda {

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The members of every prefix, in kernel-query order: (kernel query, call query) pairs.
struct Member {
  std::int64_t kernel_query, query;
};
std::vector<std::vector<Member>> members_of(const AttentionDecodeArgs& a, std::span<const std::int64_t> queries) {
  std::vector<std::vector<Member>> members(a.shared_prefixes.size());
  const std::size_t n = queries.empty() ? a.lens.size() : queries.size();
  for (std::size_t b = 0; b < n; ++b) {
    const std::int64_t q = queries.empty() ? static_cast<std::int64_t>(b) : queries[b];
    if (prefix_member(a, q))
      members[static_cast<std::size_t>(a.prefix_of[static_cast<std::size_t>(q)])].push_back(
          {static_cast<std::int64_t>(b), q});
  }
  return members;
}

// Slots per chunk of a prefix of len slots cut into at most `most` chunks of whole units.
std::int64_t chunk_slots(std::int64_t len, std::int64_t most, std::int64_t unit) {
  const std::int64_t chunks = std::min(most, ceil_div(len, unit));
  return ceil_div(ceil_div(len, chunks), unit) * unit;
}

// The first position query q sees (its sliding window's first; 0 without one).
std::int64_t first_of(const AttentionDecodeArgs& a, std::int64_t q) {
  return first_visible(a.lens[static_cast<std::size_t>(q)] - 1, a.shape.window);
}

// The first slot of prefix p that some member's window sees (p.len: none).
std::int64_t prefix_first(const AttentionDecodeArgs& a, const SharedPrefix& p, const std::vector<Member>& members) {
  std::int64_t first = p.len;
  for (const Member& m : members) first = std::min(first, first_of(a, m.query));
  return first;
}

// Prefix p's tasks over its slots [from, p.len) and its members' refs and suffix starts; its
// partials follow `layout`'s.
void add_prefix(const AttentionDecodeArgs& a, const SharedPrefix& p, const std::vector<Member>& members,
                std::int64_t from, std::int64_t slots, std::int64_t batch_heads, CascadeLayout& layout) {
  const std::int64_t group = a.shape.n_heads / a.shape.n_kv_heads, M = static_cast<std::int64_t>(members.size());
  const std::int64_t chunks = from < p.len ? ceil_div(p.len - from, slots) : 0, base = layout.partials;
  const auto members_first = static_cast<std::int64_t>(layout.member_queries.size());
  for (std::int64_t m = 0; m < M; ++m) {
    const Member& member = members[static_cast<std::size_t>(m)];
    layout.member_queries.push_back(member.query);
    layout.member_first.push_back(first_of(a, member.query));
    if (chunks > 0)
      layout.refs[static_cast<std::size_t>(member.kernel_query)] = {base + m * group, chunks, M * group,
                                                                    chunks * M * group};
    layout.suffix_start[static_cast<std::size_t>(member.kernel_query)] = std::max(p.len, first_of(a, member.query));
  }
  for (std::int64_t g = 0; g < a.shape.n_kv_heads; ++g)
    for (std::int64_t c = 0; c < chunks; ++c)
      for (std::int64_t h0 = 0; h0 < M * group; h0 += batch_heads)
        layout.tasks.push_back({p.row, g, from + c * slots, std::min(p.len, from + (c + 1) * slots), members_first, h0,
                                std::min(batch_heads, M * group - h0), base + (g * chunks + c) * M * group + h0});
  layout.partials += a.shape.n_kv_heads * chunks * M * group;
}

}  // namespace

bool reads_in_cascade(const AttentionDecodeArgs& a) {
  if (!shared_prefix_applies(a)) return false;
  for (std::size_t q = 0; q < a.lens.size(); ++q)
    if (prefix_member(a, static_cast<std::int64_t>(q))) return true;
  return false;
}

CascadeLayout plan_cascade(const AttentionDecodeArgs& a, std::span<const std::int64_t> queries,
                           std::int64_t chunk_unit, std::int64_t batch_heads, std::int64_t target_tasks) {
  const std::size_t n = queries.empty() ? a.lens.size() : queries.size();
  CascadeLayout layout;
  layout.refs.assign(n, PrefixRef{});
  for (std::size_t b = 0; b < n; ++b)
    layout.suffix_start.push_back(first_of(a, queries.empty() ? static_cast<std::int64_t>(b) : queries[b]));
  const std::vector<std::vector<Member>> members = members_of(a, queries);
  if (std::all_of(members.begin(), members.end(), [](const std::vector<Member>& m) { return m.empty(); }))
    return layout;
  const std::int64_t group = a.shape.n_heads / a.shape.n_kv_heads;
  std::int64_t batches = 0;  // of member heads, over the prefixes and kv heads
  for (const std::vector<Member>& m : members)
    batches += a.shape.n_kv_heads * ceil_div(static_cast<std::int64_t>(m.size()) * group, batch_heads);
  const std::int64_t most = std::clamp<std::int64_t>(ceil_div(target_tasks, batches), 1, kCascadeMaxChunks);
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (members[i].empty()) continue;
    const SharedPrefix& p = a.shared_prefixes[i];
    const std::int64_t seen = prefix_first(a, p, members[i]);
    const std::int64_t from = seen < p.len ? seen / chunk_unit * chunk_unit : p.len;  // chunks of whole units
    const std::int64_t slots = from < p.len ? chunk_slots(p.len - from, most, chunk_unit) : chunk_unit;
    add_prefix(a, p, members[i], from, slots, batch_heads, layout);
  }
  return layout;
}

// Every member's query heads have at most kCascadeMaxChunks partials. Per (kv head, chunk) a
// prefix of M members has ceil(M group / batch_heads) <= M group / batch_heads + 1 batches, and
// at most `batch` prefixes have members.
std::int64_t cascade_partials_bound(const AttentionShape& s, std::int64_t batch) {
  return s.n_heads * batch * kCascadeMaxChunks;
}
std::int64_t cascade_tasks_bound(const AttentionShape& s, std::int64_t batch, std::int64_t batch_heads) {
  const std::int64_t group = s.n_heads / s.n_kv_heads;
  return s.n_kv_heads * kCascadeMaxChunks * (ceil_div(batch * group, batch_heads) + batch);
}

void keep_members_off_tiles(const AttentionDecodeArgs& a, DecodeQuerySplit& split) {
  std::vector<RunTile> tiles;
  for (const RunTile& t : split.tiles) {
    bool member = false;
    for (std::int64_t q = t.first; q < t.first + t.rows; ++q) member = member || prefix_member(a, q);
    if (!member) {
      tiles.push_back(t);
      continue;
    }
    for (std::int64_t q = t.first; q < t.first + t.rows; ++q) split.singles.push_back(q);
  }
  split.tiles = std::move(tiles);
  std::sort(split.singles.begin(), split.singles.end());
}

}  // namespace flexh2o::kernels::cuda
