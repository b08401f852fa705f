// Attention on the CPU. Work is split by (sequence, kv head) so that the optional score
// outputs, which sum over the query heads of a group, are written by one task only. Prefill
// computes scores and outputs with single-threaded BLAS calls on tiles; decode reads the
// cache's slots in place for all the query heads of a group (kernels/cpu/attention_vec.h).
#include <cblas.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/attention_vec.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/vec.h"

namespace flexh2o::kernels {

namespace {

// Scaled scores -> cap * tanh(score / cap) (Gemma-2); nothing when cap is 0.
void soft_cap(float* x, std::int64_t n, float cap) {
  if (cap == 0.0f) return;
  for (std::int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

// The first key a query at position p sees under a sliding window (0 without one).
std::int64_t first_visible(std::int64_t p, std::int64_t window) { return window > 0 ? std::max<std::int64_t>(0, p - window + 1) : 0; }

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

std::int64_t cache_row(const AttentionDecodeArgs& a, std::int64_t b) { return a.cache_rows.empty() ? b : a.cache_rows[b]; }

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

// A softmax over some slots, unnormalised, to be merged with others (log-sum-exp): per query
// head, the largest score, the sum of exp(score - max), and the exp-weighted sum of the values.
struct SoftmaxState {
  float* max;  // [heads]
  float* sum;  // [heads]
  float* acc;  // [heads, D]
};

// The state of `heads` query heads (q: [heads, D]) over slots [j0, j1) of one (row, kv head).
void softmax_state(const float* q, std::int64_t heads, const HeadKv& kv, std::int64_t j0, std::int64_t j1,
                   const SlotReader& read, const AttentionShape& s, const SoftmaxState& out) {
  const std::int64_t m = j1 - j0, D = s.head_dim;
  thread_local std::vector<float> scores;
  scores.resize(static_cast<std::size_t>(heads * m));
  for (std::int64_t j = 0; j < m; j += kDecodeSlots)
    attention_vec::scores(q, heads, read(kv.k, j0 + j, std::min(kDecodeSlots, m - j)), s.scale, scores.data() + j, m);
  for (std::int64_t h = 0; h < heads; ++h) {
    float* p = scores.data() + h * m;
    soft_cap(p, m, s.softcap);
    out.max[h] = vec::max(p, m);
    out.sum[h] = vec::exp_shifted(p, m, out.max[h]);
  }
  std::fill_n(out.acc, heads * D, 0.0f);
  for (std::int64_t j = 0; j < m; j += kDecodeSlots)
    attention_vec::weighted_sum(scores.data() + j, m, heads, read(kv.v, j0 + j, std::min(kDecodeSlots, m - j)), out.acc);
}

// A shared prefix is read in chunks of this many slots, each a task of its own (the prefix of
// a few groups is otherwise a few long tasks); a multiple of kDecodeSlots.
constexpr std::int64_t kPrefixChunk = 4 * kDecodeSlots;

// The shared prefixes of a decode call, and the softmax states of their members' query heads
// over each chunk of them.
class PrefixStates {
 public:
  explicit PrefixStates(const AttentionDecodeArgs& a) : a_(a), member_(a.lens.size(), -1) {
    members_.resize(a.shared_prefixes.size());
    for (std::size_t b = 0; b < a.lens.size(); ++b) {
      const std::int64_t i = a.prefix_of[b];
      if (i < 0 || a.shared_prefixes[static_cast<std::size_t>(i)].len == 0) continue;
      auto& m = members_[static_cast<std::size_t>(i)];
      member_[b] = static_cast<std::int64_t>(m.size());
      m.push_back(static_cast<std::int64_t>(b));
    }
    const std::int64_t group = a.shape.n_heads / a.shape.n_kv_heads;
    std::int64_t states = 0;
    for (std::size_t i = 0; i < members_.size(); ++i) {
      base_.push_back(states);
      const std::int64_t chunks = this->chunks(static_cast<std::int64_t>(i));
      for (std::int64_t g = 0; g < a.shape.n_kv_heads; ++g)
        for (std::int64_t c = 0; c < chunks; ++c) tasks_.push_back({static_cast<std::int64_t>(i), g, c});
      states += a.shape.n_kv_heads * chunks * static_cast<std::int64_t>(members_[i].size()) * group;
    }
    max_.resize(static_cast<std::size_t>(states));
    sum_.resize(static_cast<std::size_t>(states));
    acc_.resize(static_cast<std::size_t>(states * a.shape.head_dim));
  }
  // Whether query b reads a shared prefix (one with slots) rather than its own row from slot 0.
  bool member(std::int64_t b) const { return member_[static_cast<std::size_t>(b)] >= 0; }
  const SharedPrefix& prefix_of(std::int64_t b) const {
    return a_.shared_prefixes[static_cast<std::size_t>(a_.prefix_of[static_cast<std::size_t>(b)])];
  }
  std::int64_t chunks(std::int64_t i) const {
    if (members_[static_cast<std::size_t>(i)].empty()) return 0;
    return (a_.shared_prefixes[static_cast<std::size_t>(i)].len + kPrefixChunk - 1) / kPrefixChunk;
  }
  // Every (prefix, kv head, chunk): its members' query heads over the chunk's slots, read once.
  void compute(const SlotReader& read) {
    tbb::parallel_for(std::size_t{0}, tasks_.size(), [&](std::size_t t) { compute_chunk(tasks_[t], read); });
  }
  // The state of member b's query head `head` of kv head g over chunk c of its prefix.
  std::int64_t state(std::int64_t b, std::int64_t g, std::int64_t c, std::int64_t head) const {
    const std::int64_t i = a_.prefix_of[static_cast<std::size_t>(b)];
    const std::int64_t group = a_.shape.n_heads / a_.shape.n_kv_heads;
    const auto members = static_cast<std::int64_t>(members_[static_cast<std::size_t>(i)].size());
    return base_[static_cast<std::size_t>(i)] + ((g * chunks(i) + c) * members + member_[static_cast<std::size_t>(b)]) * group + head;
  }
  float max(std::int64_t st) const { return max_[static_cast<std::size_t>(st)]; }
  float sum(std::int64_t st) const { return sum_[static_cast<std::size_t>(st)]; }
  const float* acc(std::int64_t st) const { return acc_.data() + st * a_.shape.head_dim; }

 private:
  struct Task {
    std::int64_t prefix, g, chunk;
  };
  void compute_chunk(const Task& t, const SlotReader& read) {
    const AttentionShape& s = a_.shape;
    const std::int64_t D = s.head_dim, group = s.n_heads / s.n_kv_heads;
    const std::vector<std::int64_t>& members = members_[static_cast<std::size_t>(t.prefix)];
    const SharedPrefix& p = a_.shared_prefixes[static_cast<std::size_t>(t.prefix)];
    // The members' query heads of kv head g side by side: each key and value of the chunk is
    // loaded once for all of them.
    thread_local std::vector<float> q;
    q.resize(static_cast<std::size_t>(static_cast<std::int64_t>(members.size()) * group * D));
    for (std::size_t m = 0; m < members.size(); ++m)
      std::copy_n(a_.q + (members[m] * s.n_heads + t.g * group) * D, group * D, q.data() + static_cast<std::int64_t>(m) * group * D);
    const std::int64_t first = state(members.front(), t.g, t.chunk, 0);
    softmax_state(q.data(), static_cast<std::int64_t>(members.size()) * group, head_kv(a_, p.row, t.g, read.slot_bytes),
                  t.chunk * kPrefixChunk, std::min(p.len, (t.chunk + 1) * kPrefixChunk), read, s,
                  {max_.data() + first, sum_.data() + first, acc_.data() + first * D});
  }

  const AttentionDecodeArgs& a_;
  std::vector<std::vector<std::int64_t>> members_;  // per prefix, its queries (with slots to share)
  std::vector<std::int64_t> member_;                // per query, its index among its prefix's members, or -1
  std::vector<std::int64_t> base_;                  // per prefix, its first state
  std::vector<Task> tasks_;
  std::vector<float> max_, sum_, acc_;
};

// Member b's kv head g: its own slots [len, lens[b]) as one more softmax state, merged with its
// prefix's chunks by their maxima: out = sum_c acc_c e^(max_c - M) / sum_c sum_c e^(max_c - M).
void decode_member_head(const AttentionDecodeArgs& a, const SlotReader& read, const PrefixStates& prefixes,
                        std::int64_t b, std::int64_t g) {
  const AttentionShape& s = a.shape;
  const std::int64_t D = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const std::int64_t P = prefixes.prefix_of(b).len, n = a.lens[b];
  const std::int64_t chunks = (P + kPrefixChunk - 1) / kPrefixChunk;
  const float* q = a.q + (b * s.n_heads + g * group) * D;
  thread_local std::vector<float> own_max, own_sum, own_acc;
  own_max.resize(static_cast<std::size_t>(group));
  own_sum.resize(static_cast<std::size_t>(group));
  own_acc.resize(static_cast<std::size_t>(group * D));
  const bool own = n > P;
  if (own)
    softmax_state(q, group, head_kv(a, cache_row(a, b), g, read.slot_bytes), P, n, read, s,
                  {own_max.data(), own_sum.data(), own_acc.data()});
  for (std::int64_t h = 0; h < group; ++h) {
    float top = own ? own_max[static_cast<std::size_t>(h)] : -std::numeric_limits<float>::infinity();
    for (std::int64_t c = 0; c < chunks; ++c) top = std::max(top, prefixes.max(prefixes.state(b, g, c, h)));
    float* out = a.out + (b * s.n_heads + g * group + h) * D;
    std::fill_n(out, D, 0.0f);
    float total = 0.0f;
    auto add = [&](float max, float sum, const float* acc) {
      const float w = std::exp(max - top);
      total += sum * w;
      for (std::int64_t d = 0; d < D; ++d) out[d] += w * acc[d];
    };
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t st = prefixes.state(b, g, c, h);
      add(prefixes.max(st), prefixes.sum(st), prefixes.acc(st));
    }
    if (own) add(own_max[static_cast<std::size_t>(h)], own_sum[static_cast<std::size_t>(h)], own_acc.data() + h * D);
    vec::scale(out, D, 1.0f / total);
  }
}

}  // namespace

// One task per (sequence, kv head) reads its slots kDecodeSlots at a time for all the group's
// query heads (kernels/cpu/attention_vec.h). With shared prefixes (cascade attention), each
// prefix's chunks are read first, once for all their members' query heads; a member's task then
// reads only its own slots after the prefix and merges.
void CpuBackend::do_attention_decode(const AttentionDecodeArgs& a) {
  const AttentionShape& s = a.shape;
  const std::int64_t B = static_cast<std::int64_t>(a.lens.size());
  const SlotReader read{a.cache_dtype, s.head_dim, kv_slot_bytes(a.cache_dtype, s.head_dim)};
  if (!shared_prefix_applies(a)) {
    tbb::parallel_for(std::int64_t{0}, B * s.n_kv_heads,
                      [&](std::int64_t task) { decode_head(a, read, task / s.n_kv_heads, task % s.n_kv_heads); });
    return;
  }
  PrefixStates prefixes(a);
  prefixes.compute(read);
  tbb::parallel_for(std::int64_t{0}, B * s.n_kv_heads, [&](std::int64_t task) {
    const std::int64_t b = task / s.n_kv_heads, g = task % s.n_kv_heads;
    if (prefixes.member(b))
      decode_member_head(a, read, prefixes, b, g);
    else
      decode_head(a, read, b, g);
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
