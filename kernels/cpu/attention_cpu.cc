// Attention on the CPU. Work is split by (sequence, kv head) so that the optional score
// outputs, which sum over the query heads of a group, are written by one task only. Prefill
// computes scores and outputs with single-threaded BLAS calls on tiles; decode reads the
// cache's slots in place for all the query heads of a group (kernels/cpu/attention_vec.h), and
// the runs of a prompt's rows among its queries (kernels/decode_runs.h) as prefill tiles.
#include <cblas.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/attention_vec.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/vec.h"
#include "kernels/decode_runs.h"

namespace flexh2o::kernels {

namespace {

// Scaled scores -> cap * tanh(score / cap) (Gemma-2); nothing when cap is 0.
void soft_cap(float* x, std::int64_t n, float cap) {
  if (cap == 0.0f) return;
  for (std::int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

// In-place softmax of x[0, n); returns nothing, x sums to 1.
void softmax(float* x, std::int64_t n) {
  const float sum = vec::exp_shifted(x, n, vec::max(x, n));
  vec::scale(x, n, 1.0f / sum);
}

constexpr std::int64_t kQueryTile = 64;
// Decode reads the cache this many slots at a time (a compressed one dequantized into fp32): 64
// slots of head_dim 64 are 8 KiB in f16, 16 KiB in fp32, which stay in L1 while the group's
// query heads read them column block by column block.
constexpr std::int64_t kDecodeSlots = 64;

}  // namespace

void CpuBackend::do_attention_prefill(const AttentionPrefillArgs& a) {
  const AttentionShape& s = a.shape;
  const std::int64_t B = static_cast<std::int64_t>(a.seq_offsets.size()) - 1;
  const std::int64_t D = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const std::int64_t q_stride = s.n_heads * D, kv_stride = s.n_kv_heads * D;
  const bool weighted = !a.query_weights.empty();

  tbb::parallel_for(std::int64_t{0}, B * s.n_kv_heads, [&](std::int64_t task) {
    const std::int64_t b = task / s.n_kv_heads, g = task % s.n_kv_heads;
    const std::int64_t t0 = a.seq_offsets[b], n = a.seq_offsets[b + 1] - t0;
    if (n <= 0) return;
    const float* k = a.k + t0 * kv_stride + g * D;
    const float* v = a.v + t0 * kv_stride + g * D;
    float* col = a.col_sums ? a.col_sums + t0 * s.n_kv_heads + g * n : nullptr;
    if (col) std::fill_n(col, n, 0.0f);
    std::vector<float> scores(static_cast<std::size_t>(kQueryTile * n));
    for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (std::int64_t i0 = 0; i0 < n; i0 += kQueryTile) {
        const std::int64_t rows = std::min(kQueryTile, n - i0);
        const std::int64_t keys = i0 + rows;  // causal: the tile sees keys [0, i0 + rows)
        const float* q = a.q + (t0 + i0) * q_stride + h * D;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(keys),
                    static_cast<int>(D), s.scale, q, static_cast<int>(q_stride), k, static_cast<int>(kv_stride), 0.0f,
                    scores.data(), static_cast<int>(keys));
        for (std::int64_t r = 0; r < rows; ++r) {
          float* row = scores.data() + r * keys;
          // Causal, and within the window: keys [first, visible).
          const std::int64_t visible = i0 + r + 1, first = first_visible(i0 + r, s.window);
          soft_cap(row + first, visible - first, s.softcap);
          softmax(row + first, visible - first);
          std::fill(row, row + first, 0.0f);
          std::fill(row + visible, row + keys, 0.0f);
          if (col) {
            const float w = weighted ? a.query_weights[t0 + i0 + r] : 1.0f;
            for (std::int64_t j = first; j < visible; ++j) col[j] += w * row[j];
          }
        }
        float* out = a.out + (t0 + i0) * q_stride + h * D;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(D),
                    static_cast<int>(keys), 1.0f, scores.data(), static_cast<int>(keys), v,
                    static_cast<int>(kv_stride), 0.0f, out, static_cast<int>(q_stride));
      }
    }
  });
}

namespace {

// Reads slots of one (cache row, kv head) kDecodeSlots at a time: an f32, f16 or bf16 cache in
// place, widened in registers; a compressed one dequantized into a thread-local fp32 block first
// (no copy of the whole cache, each slot dequantized once per pass).
struct SlotReader {
  DType dtype;
  std::int64_t d, slot_bytes;
  // Slots [j0, j0 + count) of the head whose slot 0 is at `head`.
  attention_vec::Slots operator()(const std::byte* head, std::int64_t j0, std::int64_t count) const {
    if (!is_quantized(dtype)) return {head + j0 * slot_bytes, dtype, count, d};
    thread_local std::vector<float> block;
    block.resize(static_cast<std::size_t>(kDecodeSlots * d));
    convert_rows(head + j0 * slot_bytes, dtype, block.data(), DType::F32, count, d);
    return {block.data(), DType::F32, count, d};
  }
};

// The K and V of (cache row `row`, kv head g) of a decode call's cache.
struct HeadKv {
  const std::byte *k, *v;
};
HeadKv head_kv(const AttentionDecodeArgs& a, std::int64_t row, std::int64_t g, std::int64_t slot_bytes) {
  const std::int64_t offset = (row * a.shape.n_kv_heads + g) * a.capacity * slot_bytes;
  return {static_cast<const std::byte*>(a.k_cache) + offset, static_cast<const std::byte*>(a.v_cache) + offset};
}

// The K and V of kv head g of a shared prefix's row: in the prefix cache where there is one.
HeadKv prefix_kv(const AttentionDecodeArgs& a, std::int64_t row, std::int64_t g, std::int64_t slot_bytes) {
  const AttentionDecodeArgs::PrefixCache& c = a.prefix_cache;
  if (c.k == nullptr) return head_kv(a, row, g, slot_bytes);
  const std::int64_t offset = (row * a.shape.n_kv_heads + g) * c.capacity * slot_bytes;
  return {static_cast<const std::byte*>(c.k) + offset, static_cast<const std::byte*>(c.v) + offset};
}

std::int64_t cache_row(const AttentionDecodeArgs& a, std::int64_t b) { return a.cache_rows.empty() ? b : a.cache_rows[b]; }

// Slots [first, first + count) of one (cache row, kv head).
struct RowPiece {
  HeadKv kv;
  std::int64_t first = 0, count = 0;
};

// One query's (sequence b's) kv head g over its whole row: softmax of the scores, then the
// probability-weighted sum of the values.
void decode_head(const AttentionDecodeArgs& a, const SlotReader& read, std::int64_t b, std::int64_t g) {
  const AttentionShape& s = a.shape;
  const std::int64_t D = s.head_dim, group = s.n_heads / s.n_kv_heads, cap = a.capacity;
  const std::int64_t task = b * s.n_kv_heads + g;
  const std::int64_t n = a.lens[b];
  // Under a window the newest `window` slots (slot = position without eviction).
  const std::int64_t first = first_visible(n - 1, s.window), m = n - first;
  const HeadKv kv = head_kv(a, cache_row(a, b), g, read.slot_bytes);
  const std::byte* k_src = kv.k + first * read.slot_bytes;
  const std::byte* v_src = kv.v + first * read.slot_bytes;
  thread_local std::vector<float> scores, acc;
  scores.resize(static_cast<std::size_t>(group * m));
  acc.assign(static_cast<std::size_t>(group * D), 0.0f);
  const float* q = a.q + (b * s.n_heads + g * group) * D;
  for (std::int64_t j0 = 0; j0 < m; j0 += kDecodeSlots)
    attention_vec::scores(q, group, read(k_src, j0, std::min(kDecodeSlots, m - j0)), s.scale, scores.data() + j0, m);
  float* probs = a.probs ? a.probs + task * cap : nullptr;
  if (probs) std::fill_n(probs, n, 0.0f);
  const float* bias = a.slot_bias ? a.slot_bias + task * cap + first : nullptr;
  for (std::int64_t h = 0; h < group; ++h) {
    float* p = scores.data() + h * m;
    soft_cap(p, m, s.softcap);
    if (bias)
      for (std::int64_t j = 0; j < m; ++j) p[j] += bias[j];
    softmax(p, m);
    if (probs)
      for (std::int64_t j = 0; j < m; ++j) probs[first + j] += p[j];
  }
  for (std::int64_t j0 = 0; j0 < m; j0 += kDecodeSlots)
    attention_vec::weighted_sum(scores.data() + j0, m, group, read(v_src, j0, std::min(kDecodeSlots, m - j0)),
                                acc.data());
  std::copy(acc.begin(), acc.end(), a.out + (b * s.n_heads + g * group) * D);
}

// A shared prefix's members are read in batches of this many queries (a task each): the
// prefix's keys and values are loaded once for all their query heads.
constexpr std::int64_t kMembersPerTask = 16;

// The queries among `queries` of each shared prefix with slots (its members), in query order.
std::vector<std::vector<std::int64_t>> prefix_members(const AttentionDecodeArgs& a, std::span<const std::int64_t> queries) {
  std::vector<std::vector<std::int64_t>> members(a.shared_prefixes.size());
  for (const std::int64_t b : queries)
    if (prefix_member(a, b)) members[static_cast<std::size_t>(a.prefix_of[static_cast<std::size_t>(b)])].push_back(b);
  return members;
}

// Members `members` of shared prefix p, kv head g: each query head's scores over the slots its
// window sees (the prefix's, then its own), its softmax over them, and its weighted sum of their
// values in slot order, as decode_head over one row holding both (bit for bit: no score and no
// value's terms depend on where the blocks part, and the prefix slots before a member's window,
// which the others' windows see, weigh exactly 0); the prefix's keys and values are loaded once
// for the query heads of all the members, from the first slot any member's window sees.
void decode_members_head(const AttentionDecodeArgs& a, const SlotReader& read, const SharedPrefix& p,
                         std::span<const std::int64_t> members, std::int64_t g) {
  const AttentionShape& s = a.shape;
  const std::int64_t D = s.head_dim, group = s.n_heads / s.n_kv_heads, P = p.len;
  const auto M = static_cast<std::int64_t>(members.size()), heads = M * group;
  auto len = [&](std::int64_t m) { return a.lens[members[m]]; };
  auto first = [&](std::int64_t m) { return first_visible(len(m) - 1, s.window); };
  // Scores are kept by position: scores[h * ld + j] for position j < len.
  std::int64_t ld = P, prefix_first = P;
  for (std::int64_t m = 0; m < M; ++m) {
    ld = std::max(ld, len(m));
    prefix_first = std::min(prefix_first, first(m));
  }
  thread_local std::vector<float> q, scores, acc;
  q.resize(static_cast<std::size_t>(heads * D));
  scores.resize(static_cast<std::size_t>(heads * ld));
  acc.assign(static_cast<std::size_t>(heads * D), 0.0f);
  for (std::int64_t m = 0; m < M; ++m)
    std::copy_n(a.q + (members[m] * s.n_heads + g * group) * D, group * D, q.data() + m * group * D);
  auto own_kv = [&](std::int64_t m) {  // member m's own row and its visible positions after the prefix
    const std::int64_t b = members[m], from = std::max(P, first(m));
    return RowPiece{head_kv(a, cache_row(a, b), g, read.slot_bytes), from - row_base_of(a, b), len(m) - from};
  };
  const HeadKv prefix = prefix_kv(a, p.row, g, read.slot_bytes);
  for (std::int64_t j0 = prefix_first; j0 < P; j0 += kDecodeSlots)
    attention_vec::scores(q.data(), heads, read(prefix.k, j0, std::min(kDecodeSlots, P - j0)), s.scale,
                          scores.data() + j0, ld);
  for (std::int64_t m = 0; m < M; ++m) {
    const RowPiece own = own_kv(m);
    float* own_scores = scores.data() + m * group * ld + len(m) - own.count;
    for (std::int64_t j0 = 0; j0 < own.count; j0 += kDecodeSlots)
      attention_vec::scores(q.data() + m * group * D, group,
                            read(own.kv.k, own.first + j0, std::min(kDecodeSlots, own.count - j0)), s.scale,
                            own_scores + j0, ld);
  }
  for (std::int64_t h = 0; h < heads; ++h) {
    float* w = scores.data() + h * ld;
    const std::int64_t from = first(h / group), n = len(h / group);
    soft_cap(w + from, n - from, s.softcap);
    softmax(w + from, n - from);
    if (from > prefix_first) std::fill(w + prefix_first, w + std::min(from, P), 0.0f);
  }
  for (std::int64_t j0 = prefix_first; j0 < P; j0 += kDecodeSlots)
    attention_vec::weighted_sum(scores.data() + j0, ld, heads, read(prefix.v, j0, std::min(kDecodeSlots, P - j0)),
                                acc.data());
  for (std::int64_t m = 0; m < M; ++m) {
    const RowPiece own = own_kv(m);
    const float* own_weights = scores.data() + m * group * ld + len(m) - own.count;
    for (std::int64_t j0 = 0; j0 < own.count; j0 += kDecodeSlots)
      attention_vec::weighted_sum(own_weights + j0, ld, group,
                                  read(own.kv.v, own.first + j0, std::min(kDecodeSlots, own.count - j0)),
                                  acc.data() + m * group * D);
    std::copy_n(acc.data() + m * group * D, group * D, a.out + (members[m] * s.n_heads + g * group) * D);
  }
}

// Runs of at least this many queries (a prompt's rows after KV already in their row) are
// computed as prefill tiles of up to kQueryTile queries: BLAS over the tile's keys, read once per
// tile instead of once per query. Below it the scalar loops' per-query reading costs no more.
constexpr std::int64_t kMinRun = 8;

// Keys or values of positions [from, to) of query q's kv head g, as fp32 rows of head_dim: in
// place where its own f32 row holds them all, else read into `buffer`. Below a member's shared
// prefix's len they come from the prefix's row (a member's own row need not hold them, and one
// that starts after its prefix, row_base, does not).
const float* read_positions(const AttentionDecodeArgs& a, std::int64_t q, std::int64_t g, bool values, std::int64_t from,
                         std::int64_t to, std::vector<float>& buffer) {
  const std::int64_t D = a.shape.head_dim, slot = kv_slot_bytes(a.cache_dtype, D), base = row_base_of(a, q);
  const bool member = shared_prefix_applies(a) && prefix_member(a, q);
  const SharedPrefix prefix = member ? a.shared_prefixes[static_cast<std::size_t>(a.prefix_of[static_cast<std::size_t>(q)])]
                                     : SharedPrefix{};
  const HeadKv own = head_kv(a, cache_row(a, q), g, slot);
  const std::byte* own_row = values ? own.v : own.k;
  if (a.cache_dtype == DType::F32 && from >= prefix.len)
    return reinterpret_cast<const float*>(own_row + (from - base) * slot);
  buffer.resize(static_cast<std::size_t>((to - from) * D));
  const std::int64_t split = std::clamp(prefix.len, from, to);
  if (split > from) {
    const HeadKv p = prefix_kv(a, prefix.row, g, slot);
    convert_rows((values ? p.v : p.k) + from * slot, a.cache_dtype, buffer.data(), DType::F32, split - from, D);
  }
  if (to > split)
    convert_rows(own_row + (split - base) * slot, a.cache_dtype, buffer.data() + (split - from) * D, DType::F32,
                 to - split, D);
  return buffer.data();
}

// Tile t of a run, kv head g: its keys and values read once, then per query head the scores of
// its queries, each query's causal softmax over the positions up to its own (within its
// window), and their weighted sum, as do_attention_prefill computes a tile.
void decode_run_tile(const AttentionDecodeArgs& a, const RunTile& t, std::int64_t g) {
  const AttentionShape& s = a.shape;
  const std::int64_t D = s.head_dim, group = s.n_heads / s.n_kv_heads, q_stride = s.n_heads * D;
  const std::int64_t from = first_visible(t.position, s.window), keys = t.position + t.rows - from;
  thread_local std::vector<float> k_buffer, v_buffer, scores;
  const float* k = read_positions(a, t.first, g, false, from, from + keys, k_buffer);
  const float* v = read_positions(a, t.first, g, true, from, from + keys, v_buffer);
  scores.resize(static_cast<std::size_t>(t.rows * keys));
  for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
    const float* q = a.q + t.first * q_stride + h * D;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(t.rows), static_cast<int>(keys),
                static_cast<int>(D), s.scale, q, static_cast<int>(q_stride), k, static_cast<int>(D), 0.0f,
                scores.data(), static_cast<int>(keys));
    for (std::int64_t r = 0; r < t.rows; ++r) {
      float* row = scores.data() + r * keys;
      const std::int64_t position = t.position + r;
      const std::int64_t first = first_visible(position, s.window) - from, visible = position + 1 - from;
      soft_cap(row + first, visible - first, s.softcap);
      softmax(row + first, visible - first);
      std::fill(row, row + first, 0.0f);
      std::fill(row + visible, row + keys, 0.0f);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(t.rows), static_cast<int>(D),
                static_cast<int>(keys), 1.0f, scores.data(), static_cast<int>(keys), v, static_cast<int>(D), 0.0f,
                a.out + t.first * q_stride + h * D, static_cast<int>(q_stride));
  }
}

// The runs of a's queries as tiles, and the queries left to read one at a time. A run's queries
// read one row with one prefix (they are one sequence's rows); runs are not formed where the
// call asks for probs or slot biases (per cache row, not with cache_rows anyway).
DecodeQuerySplit split_runs(const AttentionDecodeArgs& a) {
  if (a.probs != nullptr || a.slot_bias != nullptr) return split_decode_queries({}, a.lens, kMinRun, kQueryTile);
  DecodeQuerySplit split = split_decode_queries(a.cache_rows, a.lens, kMinRun, kQueryTile);
  const auto broken = std::erase_if(split.tiles, [&](const RunTile& t) {
    for (std::int64_t q = t.first + 1; q < t.first + t.rows; ++q) {
      const bool same = row_base_of(a, q) == row_base_of(a, t.first) &&
                        (a.prefix_of.empty() || a.prefix_of[static_cast<std::size_t>(q)] == a.prefix_of[static_cast<std::size_t>(t.first)]);
      if (same) continue;
      for (std::int64_t r = t.first; r < t.first + t.rows; ++r) split.singles.push_back(r);
      return true;
    }
    return false;
  });
  if (broken > 0) std::ranges::sort(split.singles);
  return split;
}

}  // namespace

// Runs of a prompt's rows go as prefill tiles (decode_run_tile); each other query, one task per
// (query, kv head), reads its slots kDecodeSlots at a time for all the group's
// query heads (kernels/cpu/attention_vec.h). With shared prefixes (cascade attention), a task
// per (prefix, kv head, batch of its members) loads the prefix's slots once for all their query
// heads and then reads each member's own slots after it; every such query's result is that of
// its row read whole, bit for bit (a tile's reads the same values whether or not its rows are
// members: equal too).
void CpuBackend::do_attention_decode(const AttentionDecodeArgs& a) {
  const AttentionShape& s = a.shape;
  const std::int64_t H = s.n_kv_heads;
  const SlotReader read{a.cache_dtype, s.head_dim, kv_slot_bytes(a.cache_dtype, s.head_dim)};
  const DecodeQuerySplit split = split_runs(a);
  const auto tiles = static_cast<std::int64_t>(split.tiles.size());
  tbb::parallel_for(std::int64_t{0}, tiles * H, [&](std::int64_t task) {
    decode_run_tile(a, split.tiles[static_cast<std::size_t>(task / H)], task % H);
  });
  const std::vector<std::int64_t>& singles = split.singles;
  if (!shared_prefix_applies(a)) {
    tbb::parallel_for(std::int64_t{0}, static_cast<std::int64_t>(singles.size()) * H, [&](std::int64_t task) {
      decode_head(a, read, singles[static_cast<std::size_t>(task / H)], task % H);
    });
    return;
  }
  const std::vector<std::vector<std::int64_t>> members = prefix_members(a, singles);
  struct Batch {
    std::size_t prefix;
    std::int64_t first, count;
  };
  std::vector<Batch> batches;
  for (std::size_t i = 0; i < members.size(); ++i) {
    const auto n = static_cast<std::int64_t>(members[i].size());
    for (std::int64_t first = 0; first < n; first += kMembersPerTask)
      batches.push_back({i, first, std::min(kMembersPerTask, n - first)});
  }
  std::vector<std::int64_t> others;  // queries of no prefix
  for (const std::int64_t b : singles)
    if (!prefix_member(a, b)) others.push_back(b);
  const auto grouped = static_cast<std::int64_t>(batches.size()) * H;
  tbb::parallel_for(std::int64_t{0}, grouped + static_cast<std::int64_t>(others.size()) * H, [&](std::int64_t task) {
    if (task >= grouped) {
      const std::int64_t t = task - grouped;
      return decode_head(a, read, others[static_cast<std::size_t>(t / H)], t % H);
    }
    const Batch& batch = batches[static_cast<std::size_t>(task / H)];
    const auto in_batch = std::span(members[batch.prefix]).subspan(static_cast<std::size_t>(batch.first),
                                                                   static_cast<std::size_t>(batch.count));
    decode_members_head(a, read, a.shared_prefixes[batch.prefix], in_batch, task % H);
  });
}

void CpuBackend::do_kv_write(const KvWriteArgs& a) {
  const std::int64_t rows = static_cast<std::int64_t>(a.seq.size()), H = a.n_kv_heads;
  const bool per_head = !a.head_slot.empty();
  auto slot_of = [&](std::int64_t r, std::int64_t g) { return per_head ? a.head_slot[r * H + g] : a.slot[r]; };
  const std::int64_t D = a.head_dim, slot_bytes = kv_slot_bytes(a.cache_dtype, D);
  tbb::parallel_for(std::int64_t{0}, rows, [&](std::int64_t r) {
    for (std::int64_t g = 0; g < H; ++g) {
      const std::int64_t slot = slot_of(r, g);
      if (slot < 0) continue;
      auto* dst = static_cast<std::byte*>(a.cache) + ((a.seq[r] * H + g) * a.capacity + slot) * slot_bytes;
      convert_rows(a.src + r * H * D + g * D, DType::F32, dst, a.cache_dtype, 1, D);
    }
  });
}

void CpuBackend::do_kv_move(const KvMoveArgs& a) {
  const std::int64_t slot_bytes = kv_slot_bytes(a.cache_dtype, a.head_dim);
  auto* cache = static_cast<std::byte*>(a.cache);
  for (const KvMove& m : a.moves) {
    const std::int64_t head = (m.seq * a.n_kv_heads + m.head) * a.capacity;
    std::memcpy(cache + (head + m.to) * slot_bytes, cache + (head + m.from) * slot_bytes,
                static_cast<std::size_t>(slot_bytes));
  }
}

void CpuBackend::do_kv_similarity(const KvSimilarityArgs& a) {
  const std::int64_t D = a.head_dim, slot_bytes = kv_slot_bytes(a.cache_dtype, D);
  tbb::parallel_for(std::size_t{0}, a.queries.size(), [&](std::size_t i) {
    const KvSimilarityQuery& q = a.queries[i];
    const auto* head = static_cast<const std::byte*>(a.cache) + (q.seq * a.n_kv_heads + q.head) * a.capacity * slot_bytes;
    // fp32 slots are read in place, others decoded into a buffer of one slot (as attention does).
    thread_local std::vector<float> src_buf, row_buf;
    src_buf.resize(static_cast<std::size_t>(D));
    row_buf.resize(static_cast<std::size_t>(D));
    auto read = [&](std::int64_t slot, std::vector<float>& buf) -> const float* {
      if (a.cache_dtype == DType::F32) return reinterpret_cast<const float*>(head + slot * slot_bytes);
      convert_rows(head + slot * slot_bytes, a.cache_dtype, buf.data(), DType::F32, 1, D);
      return buf.data();
    };
    const float* src = read(q.slot, src_buf);
    const float src_norm = std::sqrt(vec::dot(src, src, D));
    float* out = a.out + static_cast<std::int64_t>(i) * a.capacity;
    for (std::int64_t j = 0; j < q.len; ++j) {
      float dot = 0.0f, square = 0.0f;
      vec::dot_and_square(src, read(j, row_buf), D, dot, square);
      const float norms = src_norm * std::sqrt(square);
      out[j] = norms > 0.0f ? dot / norms : 0.0f;
    }
  });
}

void CpuBackend::do_kv_merge(const KvMergeArgs& a) {
  const std::int64_t D = a.head_dim, slot_bytes = kv_slot_bytes(a.cache_dtype, D);
  auto* cache = static_cast<std::byte*>(a.cache);
  std::vector<float> from(static_cast<std::size_t>(D)), to(static_cast<std::size_t>(D));
  for (const KvMerge& m : a.merges) {
    std::byte* head = cache + (m.seq * a.n_kv_heads + m.head) * a.capacity * slot_bytes;
    convert_rows(head + m.from * slot_bytes, a.cache_dtype, from.data(), DType::F32, 1, D);
    convert_rows(head + m.to * slot_bytes, a.cache_dtype, to.data(), DType::F32, 1, D);
    for (std::int64_t d = 0; d < D; ++d) {
      const auto u = static_cast<std::size_t>(d);
      to[u] = (1.0f - m.weight) * to[u] + m.weight * from[u];
    }
    convert_rows(to.data(), DType::F32, head + m.to * slot_bytes, a.cache_dtype, 1, D);
  }
}

}  // namespace flexh2o::kernels
