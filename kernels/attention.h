// Causal multi-head attention with grouped KV heads (GQA), for prefill and decode.
// Both passes can also report the attention mass every cached token received, which
// KV eviction policies consume (H2O's accumulated scores) without a second pass.
#pragma once
#include <cstdint>
#include <span>

#include "kernels/dtype.h"

namespace flexh2o::kernels {

// A KV cache is laid out [B, n_kv_heads, capacity, slot], a slot holding one token's key (or
// value) of one head: head_dim values in the cache's dtype (f32, f16, or q4/q8 grouped along
// head_dim, kernels/quantize.h). Writes convert into it; attention reads convert back.
inline std::int64_t kv_slot_bytes(DType cache_dtype, std::int64_t head_dim) { return row_bytes(cache_dtype, head_dim); }

struct AttentionShape {
  std::int64_t n_heads = 0;     // query heads
  std::int64_t n_kv_heads = 0;  // divides n_heads; query head h reads kv head h / (n_heads / n_kv_heads)
  std::int64_t head_dim = 0;
  float scale = 1.0f;  // usually 1/sqrt(head_dim)
  // Scaled scores become softcap * tanh(score / softcap) before the softmax (Gemma-2); 0: off.
  float softcap = 0.0f;
  // Sliding window: a query at position p sees keys at positions > p - window; 0: all. In a
  // decode cache this needs slot s to hold position s (no eviction): the last `window` slots.
  std::int64_t window = 0;
};

// The first key position a query at position p sees under a sliding window (0 without one).
constexpr std::int64_t first_visible(std::int64_t p, std::int64_t window) {
  return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
}

// Prefill of a ragged batch: the prompt rows of all sequences, concatenated.
// Sequence b owns rows [seq_offsets[b], seq_offsets[b+1]) and attends causally within them.
struct AttentionPrefillArgs {
  AttentionShape shape;
  const float* q = nullptr;  // [T, n_heads * head_dim]
  const float* k = nullptr;  // [T, n_kv_heads * head_dim]
  const float* v = nullptr;  // [T, n_kv_heads * head_dim]
  float* out = nullptr;      // [T, n_heads * head_dim]
  std::span<const std::int64_t> seq_offsets;  // host, [B + 1], seq_offsets[0] == 0
  // Optional column sums: for sequence b (length n), kv head h, key j:
  // col_sums[seq_offsets[b] * n_kv_heads + h * n + j] = sum over the group's query heads
  // and all queries i >= j of w_i * p(i, j).  Size [T * n_kv_heads].
  float* col_sums = nullptr;
  // host, [T]: w_i of each query row (an eviction policy's observers, e.g. SnapKV's last
  // window); empty means 1 for every row.
  std::span<const float> query_weights;
  // F32 or BF16 (the run's compute dtype, as GemmArgs::compute). Under BF16 a device with bf16
  // matrix units may round q, k, v and the unnormalised probabilities to bf16 and accumulate
  // their products in fp32 (the CUDA backend's tensor-core kernel, docs/backends.md); the CPU
  // computes in fp32 either way, and so does every device when col_sums are requested.
  DType compute = DType::F32;
};

// A shared prefix of some queries of one decode call (cascade attention, docs/prefix-sharing.md):
// the first `len` slots of cache row `row` (a row of the call's cache, as cache_rows names them)
// hold, byte for byte, what the first `len` slots of every member's cache row hold (a prompt
// prefix copied from one row into the others).
struct SharedPrefix {
  std::int64_t row = 0;
  std::int64_t len = 0;
};

// One new query per sequence against its cache (or per row of cache_rows). Slots [0, lens[b]) of sequence b are valid
// (the new token's K/V already written); slot order does not matter, so evicted slots can
// be reused by later tokens. A compressed cache is dequantized as it is read.
struct AttentionDecodeArgs {
  AttentionShape shape;
  const float* q = nullptr;       // [B, n_heads * head_dim]
  const void* k_cache = nullptr;  // [B, n_kv_heads, capacity, slot]
  const void* v_cache = nullptr;  // same layout
  std::int64_t capacity = 0;
  std::span<const std::int64_t> lens;  // host, [B]
  float* out = nullptr;                // [B, n_heads * head_dim]
  // Optional: probs[(b * n_kv_heads + h) * capacity + s] = sum over the group's query
  // heads of the probability slot s received; slots >= lens[b] are left untouched.
  float* probs = nullptr;
  DType cache_dtype = DType::F32;
  // Optional, [B, n_kv_heads, capacity]: added to the (soft-capped) score of every query head
  // of the group for slot s before the softmax; a slot that stands for several merged tokens
  // weighs as their attention mass (KV eviction with merging). Slots >= lens[b] are not read.
  const float* slot_bias = nullptr;
  // Optional, host, [B]: query b reads cache row cache_rows[b] instead of row b, so several
  // queries may read one row with their own lens (a prompt's rows appended to a cached prefix,
  // each seeing the slots before it). Not with probs or slot_bias, which are per cache row.
  std::span<const std::int64_t> cache_rows;
  // F32 or BF16, as AttentionPrefillArgs::compute. Under BF16 a device may run runs of queries
  // on one cache row whose lens grow by one (a chunk of one prompt) on bf16 matrix units: q and
  // the unnormalised probabilities rounded to bf16, a 16-bit cache's keys and values read as
  // bf16 (docs/backends.md); the CPU computes in fp32 either way.
  DType compute = DType::F32;
  // Optional, host: shared prefixes of the call's queries. Query b with prefix_of[b] = i >= 0
  // ([B] entries, -1: none) is a member of shared_prefixes[i], whose len is at most lens[b].
  // Where shared_prefix_applies holds and the backend reads_shared_prefixes_once, the prefix's
  // K/V are read once for all its members' query heads (under a sliding window from the first
  // slot some member's window sees, each member masking the slots before its own window's
  // first), then each member's own slots [len, lens[b]) within its window, and a member's own
  // row below len is not read; the result equals the per-query reading (on the CPU bit for bit;
  // on CUDA, whose partial softmaxes merge by their maxima, up to fp32 summation order).
  // Elsewhere every query reads its own row whole, which holds the same bytes.
  std::span<const SharedPrefix> shared_prefixes;
  std::span<const std::int64_t> prefix_of;
  // Optional: where the shared prefixes' rows are, when not in the call's cache (a prefix held
  // once for the queries of many calls): K and V laid out as k_cache, in the call's cache dtype,
  // with their own capacity. Null k: the prefixes' rows are rows of the call's cache.
  struct PrefixCache {
    const void* k = nullptr;
    const void* v = nullptr;
    std::int64_t capacity = 0;
  } prefix_cache;
  // Optional, host, [B]: query b's own row holds its positions from row_base[b] on (slot s holds
  // position row_base[b] + s; slots [0, lens[b] - row_base[b]) valid), a row that starts after
  // its shared prefix: positions below row_base[b] > 0 are read from the prefix, whose len must be
  // row_base[b]. Empty: every row starts at position 0. Needs shared_prefix_applies and a backend
  // that reads_shared_prefixes_once (nothing else can read such a row whole).
  std::span<const std::int64_t> row_base;
};

// Whether a's shared prefixes can be read once: there are some, and no feature makes a query's
// view of its prefix its own (probs and slot_bias are per cache row; under a sliding window each
// member sees the prefix from its own window's first slot, which the reading once masks).
// Otherwise the call reads every query's row whole.
bool shared_prefix_applies(const AttentionDecodeArgs& a);

// Whether query q of a is a member of a shared prefix with slots.
bool prefix_member(const AttentionDecodeArgs& a, std::int64_t q);

// The position slot 0 of query b's row holds (AttentionDecodeArgs::row_base; 0 when empty).
std::int64_t row_base_of(const AttentionDecodeArgs& a, std::int64_t b);

// Writes rows of new keys or values into a cache laid out like AttentionDecodeArgs::k_cache:
// row r of src goes to sequence seq[r], slot slot[r], for every kv head (converted to the
// cache's dtype).
struct KvWriteArgs {
  const float* src = nullptr;  // [rows, n_kv_heads * head_dim]
  void* cache = nullptr;       // [B, n_kv_heads, capacity, slot]
  std::int64_t n_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t capacity = 0;
  std::span<const std::int64_t> seq;   // host, [rows]
  std::span<const std::int64_t> slot;  // host, [rows]
  // host, [rows * n_kv_heads]: when given, the slot of each (row, kv head) instead of `slot`;
  // -1 drops that head's key/value (evicted at prefill).
  std::span<const std::int64_t> head_slot;
  DType cache_dtype = DType::F32;
};

// Moves cached tokens of one (sequence, kv head) between slots, e.g. to close the holes a
// multi-token eviction left, so every head keeps its tokens in slots [0, len). Sources and
// destinations of one call must be pairwise distinct.
struct KvMove {
  std::int64_t seq = 0, head = 0, from = 0, to = 0;
};
struct KvMoveArgs {
  void* cache = nullptr;  // [B, n_kv_heads, capacity, slot]
  std::int64_t n_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t capacity = 0;
  std::span<const KvMove> moves;  // host
  DType cache_dtype = DType::F32;
};

// Cosine similarity of one cached key to the others of its (sequence, kv head), for a KV
// policy that merges an evicted token into the most similar kept one:
// out[i * capacity + j] = k_s . k_j / (|k_s| |k_j|) for j < len of query i = (seq, head, slot,
// len), 0 where either key is zero; out[i * capacity + j] for j >= len is left untouched.
struct KvSimilarityQuery {
  std::int64_t seq = 0, head = 0, slot = 0, len = 0;
};
struct KvSimilarityArgs {
  const void* cache = nullptr;  // [B, n_kv_heads, capacity, slot]
  std::int64_t n_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t capacity = 0;
  std::span<const KvSimilarityQuery> queries;  // host
  float* out = nullptr;                        // [queries, capacity]
  DType cache_dtype = DType::F32;
};

// Blends a cached row of one (sequence, kv head) into another: row[to] = (1 - weight) *
// row[to] + weight * row[from], in fp32 and stored back in the cache's dtype (row[from] is
// unchanged). The `to` slots of one call are pairwise distinct and no `from` is a `to`.
struct KvMerge {
  std::int64_t seq = 0, head = 0, from = 0, to = 0;
  float weight = 0.0f;
};
struct KvMergeArgs {
  void* cache = nullptr;  // [B, n_kv_heads, capacity, slot]
  std::int64_t n_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t capacity = 0;
  std::span<const KvMerge> merges;  // host
  DType cache_dtype = DType::F32;
};

// The checks every backend runs before touching the cache: std::out_of_range for a slot,
// head or length outside it (or a slot merged into itself), std::invalid_argument for two
// merges into one slot or a merge reading a slot another one writes.
void check_kv_similarity(const KvSimilarityArgs& a);
void check_kv_merge(const KvMergeArgs& a);

}  // namespace flexh2o::kernels
