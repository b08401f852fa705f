// How the CUDA decode reads shared prefixes once (cascade attention, docs/prefix-sharing.md):
// host-side, without CUDA, so that it is tested on every machine. A prefix task reads a chunk
// of one (shared prefix, kv head) from the prefix's row, for a batch of its members' query
// heads held in registers (the decode kernel's loop), and leaves a partial softmax (acc, max,
// sum) per member query head; the decode kernel reads each query's own slots after its prefix
// as partials of its splits; the combine kernel merges all partials of a query head.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cuda/decode_runs.h"

namespace flexh2o::kernels::cuda {

// A prefix is cut into at most this many chunks (tasks per kv head and batch of heads): enough
// tasks to fill the device for one group of a short prefix, and a bound on the partials' scratch.
constexpr std::int64_t kCascadeMaxChunks = 16;

// A chunk of kv head `kv_head` of a shared prefix: slots [first, end) of cache row `row`, for the
// member heads [heads_first, + heads) of the prefix, member head h being query head h % group of
// kv head kv_head of member h / group, whose query is member_queries[members_first + h / group]
// and which sees the chunk's slots from member_first[members_first + h / group] on (its sliding
// window's first). Member head heads_first + i leaves its partial at index partials + i. Eight
// int64 values, the layout the kernel reads from the uploaded table.
struct PrefixTask {
  std::int64_t row = 0, kv_head = 0, first = 0, end = 0;
  std::int64_t members_first = 0, heads_first = 0, heads = 0, partials = 0;
  bool operator==(const PrefixTask&) const = default;
};
static_assert(sizeof(PrefixTask) == 8 * sizeof(std::int64_t), "the kernel reads 8 values a task");

// Where a query's prefix partials lie: chunk c of query head r of kv head g at
// first + g * kv_stride + c * chunk_stride + r. chunks = 0: not a member (no prefix partials).
struct PrefixRef {
  std::int64_t first = 0, chunks = 0, chunk_stride = 0, kv_stride = 0;
  bool operator==(const PrefixRef&) const = default;
};
static_assert(sizeof(PrefixRef) == 4 * sizeof(std::int64_t), "the kernel reads 4 values a query");

struct CascadeLayout {
  std::vector<PrefixTask> tasks;
  std::vector<std::int64_t> member_queries;  // the call's query (of q) of each member, prefix by prefix
  std::vector<std::int64_t> member_first;    // each member's first visible position (0 without a window)
  std::vector<PrefixRef> refs;               // per kernel query
  // Per kernel query: the first position it reads from its own row (its prefix's len, or later
  // under a window; a non-member's window's first, or 0).
  std::vector<std::int64_t> suffix_start;
  std::int64_t partials = 0;                 // prefix partials in all
};

// The layout of a's shared prefixes for the kernel queries `queries` (the call's query of each;
// empty: all of them, in order). A member is a query whose prefix has slots. Each prefix with
// members is read from the first slot a member's window sees (under a sliding window; 0
// without), cut into equal chunks of whole units of chunk_unit slots, as many as fill
// target_tasks tasks over all prefixes, kv heads and batches, at most kCascadeMaxChunks, none
// empty; its member heads of each kv head into batches of batch_heads (the last one shorter). A
// prefix no member's window reaches has no chunks (its members' refs none).
CascadeLayout plan_cascade(const AttentionDecodeArgs& a, std::span<const std::int64_t> queries,
                           std::int64_t chunk_unit, std::int64_t batch_heads, std::int64_t target_tasks);

// Bounds of a layout for `batch` queries, for the scratch estimate: prefix partials and tasks.
std::int64_t cascade_partials_bound(const AttentionShape& s, std::int64_t batch);
std::int64_t cascade_tasks_bound(const AttentionShape& s, std::int64_t batch, std::int64_t batch_heads);

// Whether a is read in cascade: its shared prefixes may be read once (shared_prefix_applies)
// and some query is a member of one.
bool reads_in_cascade(const AttentionDecodeArgs& a);

// A call with shared prefixes keeps its members off the tensor cores, so that no member reads its
// prefix through its own row: tiles holding a member become singles (in query order).
void keep_members_off_tiles(const AttentionDecodeArgs& a, DecodeQuerySplit& split);

}  // namespace flexh2o::kernels::cuda
