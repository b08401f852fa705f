// Attention on the GPU, written for clarity first: one block per (query row, query head) at
// prefill and per (sequence, kv head) at decode, an online softmax over tiles of keys,
// fp32 throughout, and no atomics, so every output is deterministic.
//
// attend() is the core: a block computes softmax(scale * q . k_j) . v_j over n keys with a
// running maximum and sum, one tile of kTile scores at a time in shared memory; warps
// compute scores (lanes split head_dim), then every thread owns output elements d.
//
// The score outputs need each probability p(i, j) after the softmax is complete, so they
// are a second pass that recomputes scores from the saved (max, sum) of every query:
//   prefill col_sums: a block per (key row, kv head) sums w_i * p(i, j) over the group's
//                     query heads and queries i >= j;
//   decode probs:     after the block's heads are done, a thread per slot sums p over them.
// Each output element is written by exactly one thread, in a fixed order.
#include <algorithm>
#include <stdexcept>
#include <unordered_set>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_common.cuh"

namespace flexh2o::kernels::cuda {

namespace {

constexpr int kAttnThreads = 128;  // 4 warps
constexpr int kTile = 64;          // keys per tile
constexpr std::size_t kMaxShared = 48 * 1024;  // without opting in to more

// Keys and values of one (sequence, kv head) at prefill: fp32 rows of the k/v projections.
struct RowsKv {
  const float* k;  // key j at k + j * stride
  const float* v;
  std::int64_t stride;
  __device__ float key(std::int64_t j, std::int64_t d) const { return k[j * stride + d]; }
  __device__ float value(std::int64_t j, std::int64_t d) const { return v[j * stride + d]; }
};

// Keys and values of one (sequence, kv head) in a cache: slots of slot_bytes in any dtype.
struct CacheKv {
  const std::uint8_t* k;  // slot j at k + j * slot_bytes
  const std::uint8_t* v;
  std::int64_t slot_bytes;
  std::int64_t head_dim;
  DType dtype;
  __device__ float key(std::int64_t j, std::int64_t d) const { return load_elem(k + j * slot_bytes, dtype, head_dim, d); }
  __device__ float value(std::int64_t j, std::int64_t d) const {
    return load_elem(v + j * slot_bytes, dtype, head_dim, d);
  }
};

// A scaled score after Gemma-2's soft-cap (none when cap is 0), as attention_cpu.cc.
__device__ float capped(float s, float cap) { return cap == 0.0f ? s : cap * tanhf(s / cap); }

// The first key a query at position p sees under a sliding window (0 without one).
__device__ std::int64_t first_visible(std::int64_t p, std::int64_t window) {
  return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
}

// Block-wide attention of the query in q_sh[D] (shared, loaded by the caller and
// synchronised) over keys [first, n), n > first. Writes out[d] (global) and returns the softmax's
// maximum m and normaliser l (every thread gets the same values): p_j = exp(s_j - m) / l.
// acc_sh[D] and tile_sh[kTile] are shared scratch.
template <class Kv>
__device__ void attend(const Kv& kv, std::int64_t first, std::int64_t n, std::int64_t D, float scale, float softcap,
                       const float* q_sh, float* acc_sh, float* tile_sh, float* out, float& m_out, float& l_out) {
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  for (std::int64_t d = tid; d < D; d += blockDim.x) acc_sh[d] = 0.0f;
  float m_run = -INFINITY, l_run = 0.0f;  // identical in every thread
  for (std::int64_t j0 = first; j0 < n; j0 += kTile) {
    const int cnt = static_cast<int>(n - j0 < kTile ? n - j0 : kTile);
    // Scores of this tile: warp w takes keys w, w + warps, ...
    for (int jj = warp; jj < cnt; jj += warps) {
      float dot = 0.0f;
      for (std::int64_t d = lane; d < D; d += 32) dot += q_sh[d] * kv.key(j0 + jj, d);
      dot = warp_sum(dot);
      if (lane == 0) tile_sh[jj] = capped(scale * dot, softcap);
    }
    __syncthreads();
    float tile_max = -INFINITY;
    for (int jj = 0; jj < cnt; ++jj) tile_max = fmaxf(tile_max, tile_sh[jj]);
    const float m_new = fmaxf(m_run, tile_max);
    const float alpha = expf(m_run - m_new);  // 0 on the first tile (m_run = -inf)
    __syncthreads();                          // all have read the scores before they become weights
    for (int jj = tid; jj < cnt; jj += blockDim.x) tile_sh[jj] = expf(tile_sh[jj] - m_new);
    __syncthreads();
    float tile_sum = 0.0f;
    for (int jj = 0; jj < cnt; ++jj) tile_sum += tile_sh[jj];
    l_run = l_run * alpha + tile_sum;
    m_run = m_new;
    for (std::int64_t d = tid; d < D; d += blockDim.x) {
      float acc = acc_sh[d] * alpha;
      for (int jj = 0; jj < cnt; ++jj) acc += tile_sh[jj] * kv.value(j0 + jj, d);
      acc_sh[d] = acc;
    }
    __syncthreads();  // the weights are read before the next tile overwrites them
  }
  const float inv = 1.0f / l_run;
  for (std::int64_t d = tid; d < D; d += blockDim.x) out[d] = acc_sh[d] * inv;
  m_out = m_run;
  l_out = l_run;
}

// Block per (query row t, query head h). stats[2 * (t * H + h) + {0, 1}] = (max, sum) when
// stats is not null.
__global__ void prefill_kernel(const float* q, const float* k, const float* v, float* out, float* stats,
                               const std::int64_t* row_seq, const std::int64_t* offsets, std::int64_t T,
                               std::int64_t H, std::int64_t Hkv, std::int64_t D, float scale, float softcap,
                               std::int64_t window) {
  extern __shared__ float sh[];
  float* q_sh = sh;
  float* acc_sh = sh + D;
  float* tile_sh = sh + 2 * D;
  const std::int64_t group = H / Hkv, q_stride = H * D, kv_stride = Hkv * D;
  for (std::int64_t task = blockIdx.x; task < T * H; task += gridDim.x) {
    const std::int64_t t = task / H, h = task % H, g = h / group;
    const std::int64_t t0 = offsets[row_seq[t]], i = t - t0;
    __syncthreads();  // the previous task is done with q_sh
    for (std::int64_t d = threadIdx.x; d < D; d += blockDim.x) q_sh[d] = q[t * q_stride + h * D + d];
    __syncthreads();
    const RowsKv kv{k + t0 * kv_stride + g * D, v + t0 * kv_stride + g * D, kv_stride};
    float m = 0.0f, l = 0.0f;
    attend(kv, first_visible(i, window), i + 1, D, scale, softcap, q_sh, acc_sh, tile_sh, out + t * q_stride + h * D,
           m, l);
    if (stats != nullptr && threadIdx.x == 0) {
      stats[2 * task] = m;
      stats[2 * task + 1] = l;
    }
  }
}

// Block per (key row t, kv head g): col_sums[t0 * Hkv + g * n + j] = sum over the group's
// heads h and queries i >= j of w_i * p_h(i, j), with p recomputed from the saved stats.
__global__ void col_sums_kernel(const float* q, const float* k, const float* stats, const std::int64_t* row_seq,
                                const std::int64_t* offsets, const float* query_weights, float* col_sums,
                                std::int64_t T, std::int64_t H, std::int64_t Hkv, std::int64_t D, float scale,
                                float softcap, std::int64_t window) {
  __shared__ float scratch[32];
  const std::int64_t group = H / Hkv, q_stride = H * D, kv_stride = Hkv * D;
  for (std::int64_t task = blockIdx.x; task < T * Hkv; task += gridDim.x) {
    const std::int64_t t = task / Hkv, g = task % Hkv;
    const std::int64_t b = row_seq[t], t0 = offsets[b], n = offsets[b + 1] - t0, j = t - t0;
    const float* key = k + t * kv_stride + g * D;
    // Queries i in [j, n) that see key j: all, or those within the window.
    const std::int64_t queries = window > 0 && n - j > window ? window : n - j;
    float acc = 0.0f;
    for (std::int64_t p = threadIdx.x; p < group * queries; p += blockDim.x) {
      const std::int64_t h = g * group + p / queries, row = t0 + j + p % queries;
      const float* qr = q + row * q_stride + h * D;
      float dot = 0.0f;
      for (std::int64_t d = 0; d < D; ++d) dot += qr[d] * key[d];
      const float m = stats[2 * (row * H + h)], l = stats[2 * (row * H + h) + 1];
      const float w = query_weights != nullptr ? query_weights[row] : 1.0f;
      acc += w * (expf(capped(scale * dot, softcap) - m) / l);
    }
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) col_sums[t0 * Hkv + g * n + j] = acc;
  }
}

// Block per (sequence b, kv head g) = task, over the group's query heads; probs (optional)
// for slots [0, lens[b]) of the task's row.
__global__ void decode_kernel(const float* q, const std::uint8_t* k_cache, const std::uint8_t* v_cache, float* out,
                              float* probs, const std::int64_t* lens, std::int64_t B, std::int64_t H, std::int64_t Hkv,
                              std::int64_t D, std::int64_t capacity, std::int64_t slot_bytes, DType dtype,
                              float scale, float softcap, std::int64_t window) {
  extern __shared__ float sh[];
  float* q_sh = sh;
  float* acc_sh = sh + D;
  float* tile_sh = sh + 2 * D;
  float* ml_sh = sh + 2 * D + kTile;  // (max, sum) per head of the group
  const std::int64_t group = H / Hkv;
  for (std::int64_t task = blockIdx.x; task < B * Hkv; task += gridDim.x) {
    const std::int64_t b = task / Hkv, g = task % Hkv, n = lens[b], first = first_visible(n - 1, window);
    const CacheKv kv{k_cache + task * capacity * slot_bytes, v_cache + task * capacity * slot_bytes, slot_bytes, D,
                     dtype};
    for (std::int64_t hh = 0; hh < group; ++hh) {
      const std::int64_t h = g * group + hh;
      __syncthreads();  // the previous head (or task) is done with q_sh and ml_sh
      for (std::int64_t d = threadIdx.x; d < D; d += blockDim.x) q_sh[d] = q[(b * H + h) * D + d];
      __syncthreads();
      float m = 0.0f, l = 0.0f;
      attend(kv, first, n, D, scale, softcap, q_sh, acc_sh, tile_sh, out + (b * H + h) * D, m, l);
      if (threadIdx.x == 0) {
        ml_sh[2 * hh] = m;
        ml_sh[2 * hh + 1] = l;
      }
    }
    if (probs != nullptr) {
      __syncthreads();  // ml_sh complete
      for (std::int64_t s = threadIdx.x; s < n; s += blockDim.x) {
        if (s < first) {  // outside the window: no attention
          probs[task * capacity + s] = 0.0f;
          continue;
        }
        float total = 0.0f;
        for (std::int64_t hh = 0; hh < group; ++hh) {
          const float* qr = q + (b * H + g * group + hh) * D;
          float dot = 0.0f;
          for (std::int64_t d = 0; d < D; ++d) dot += qr[d] * kv.key(s, d);
          total += expf(capped(scale * dot, softcap) - ml_sh[2 * hh]) / ml_sh[2 * hh + 1];
        }
        probs[task * capacity + s] = total;
      }
    }
  }
}

// Float caches: one thread per (row, kv head, element).
__global__ void kv_write_float_kernel(const float* src, std::uint8_t* cache, std::int64_t rows, std::int64_t Hkv,
                                      std::int64_t D, std::int64_t capacity, std::int64_t slot_bytes,
                                      const std::int64_t* seq, const std::int64_t* slot, const std::int64_t* head_slot,
                                      DType dtype) {
  const std::int64_t total = rows * Hkv * D;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = e / (Hkv * D), g = (e / D) % Hkv, d = e % D;
    const std::int64_t s = head_slot != nullptr ? head_slot[r * Hkv + g] : slot[r];
    if (s < 0) continue;
    std::uint8_t* dst = cache + ((seq[r] * Hkv + g) * capacity + s) * slot_bytes;
    store_float_elem(dst, dtype, d, src[e]);  // src[e] = src[r * Hkv * D + g * D + d]
  }
}

// Quantized caches: a block of kQuantThreads per (row, kv head, group).
__global__ void kv_write_quant_kernel(const float* src, std::uint8_t* cache, std::int64_t rows, std::int64_t Hkv,
                                      std::int64_t D, std::int64_t capacity, std::int64_t slot_bytes,
                                      const std::int64_t* seq, const std::int64_t* slot, const std::int64_t* head_slot,
                                      bool q4) {
  __shared__ float xs[kQuantGroupSize];
  __shared__ int qs[kQuantGroupSize];
  __shared__ float params[2];
  const std::int64_t groups = (D + kQuantGroupSize - 1) / kQuantGroupSize;
  for (std::int64_t task = blockIdx.x; task < rows * Hkv * groups; task += gridDim.x) {
    const std::int64_t r = task / (Hkv * groups), g = (task / groups) % Hkv, grp = task % groups;
    const std::int64_t s = head_slot != nullptr ? head_slot[r * Hkv + g] : slot[r];
    if (s < 0) continue;  // uniform across the block
    std::uint8_t* dst = cache + ((seq[r] * Hkv + g) * capacity + s) * slot_bytes;
    quantize_group(src + (r * Hkv + g) * D, D, q4, grp, dst, xs, qs, params);
  }
}

// Block per move: byte copy of one slot. Moves of one launch touch distinct slots.
__global__ void kv_move_kernel(std::uint8_t* cache, const std::int64_t* from, const std::int64_t* to,
                               std::int64_t count, std::int64_t slot_bytes) {
  for (std::int64_t mv = blockIdx.x; mv < count; mv += gridDim.x) {
    const std::uint8_t* s = cache + from[mv] * slot_bytes;
    std::uint8_t* d = cache + to[mv] * slot_bytes;
    for (std::int64_t i = threadIdx.x; i < slot_bytes; i += blockDim.x) d[i] = s[i];
  }
}

void check_shape(const AttentionShape& s) {
  if (s.n_heads <= 0 || s.n_kv_heads <= 0 || s.head_dim <= 0 || s.n_heads % s.n_kv_heads != 0)
    throw std::invalid_argument("attention: n_heads must be a positive multiple of n_kv_heads");
}

std::size_t shared_bytes(const char* op, std::int64_t floats) {
  const std::size_t bytes = static_cast<std::size_t>(floats) * sizeof(float);
  if (bytes > kMaxShared)
    throw std::invalid_argument(std::string(op) + ": head_dim too large for the CUDA kernel's shared memory");
  return bytes;
}

}  // namespace

void CudaBackend::attention_prefill(const AttentionPrefillArgs& a) {
  const AttentionShape& s = a.shape;
  check_shape(s);
  const std::int64_t B = static_cast<std::int64_t>(a.seq_offsets.size()) - 1;
  if (B < 0) throw std::invalid_argument("attention_prefill: seq_offsets must have B + 1 entries");
  const std::int64_t T = a.seq_offsets[static_cast<std::size_t>(B)];
  const bool weighted = !a.query_weights.empty();
  if (weighted && static_cast<std::int64_t>(a.query_weights.size()) != T)
    throw std::invalid_argument("attention_prefill: query_weights needs one weight per row");
  if (a.seq_offsets[0] != 0) throw std::invalid_argument("attention_prefill: seq_offsets[0] must be 0");
  std::vector<std::int64_t> row_seq(static_cast<std::size_t>(std::max<std::int64_t>(T, 0)));
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t lo = a.seq_offsets[static_cast<std::size_t>(b)], hi = a.seq_offsets[static_cast<std::size_t>(b + 1)];
    if (hi < lo || hi > T) throw std::invalid_argument("attention_prefill: seq_offsets must be non-decreasing");
    std::fill(row_seq.begin() + lo, row_seq.begin() + hi, b);
  }
  if (T <= 0) return;
  const std::int64_t H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim;
  const std::size_t shared = shared_bytes("attention_prefill", 2 * D + kTile);
  const DeviceBuffer offsets = upload(a.seq_offsets);
  const DeviceBuffer rows = upload(std::span<const std::int64_t>(row_seq));
  DeviceBuffer stats;
  if (a.col_sums != nullptr) stats = DeviceBuffer(*this, static_cast<std::size_t>(T * H) * 2 * sizeof(float));
  prefill_kernel<<<blocks_for(T * H, 1), kAttnThreads, shared, stream_>>>(
      a.q, a.k, a.v, a.out, stats.as<float>(), rows.as<std::int64_t>(), offsets.as<std::int64_t>(), T, H, Hkv, D,
      s.scale, s.softcap, s.window);
  FLEXH2O_CUDA_CHECK_LAUNCH();
  if (a.col_sums != nullptr) {
    DeviceBuffer weights;
    if (weighted) weights = upload(a.query_weights);
    col_sums_kernel<<<blocks_for(T * Hkv, 1), kAttnThreads, 0, stream_>>>(
        a.q, a.k, stats.as<float>(), rows.as<std::int64_t>(), offsets.as<std::int64_t>(),
        weighted ? weights.as<float>() : nullptr, a.col_sums, T, H, Hkv, D, s.scale, s.softcap, s.window);
    FLEXH2O_CUDA_CHECK_LAUNCH();
  }
}

void CudaBackend::attention_decode(const AttentionDecodeArgs& a) {
  const AttentionShape& s = a.shape;
  check_shape(s);
  const std::int64_t B = static_cast<std::int64_t>(a.lens.size());
  for (std::int64_t b = 0; b < B; ++b)
    if (a.lens[static_cast<std::size_t>(b)] <= 0 || a.lens[static_cast<std::size_t>(b)] > a.capacity)
      throw std::invalid_argument("attention_decode: a sequence length is outside [1, capacity]");
  if (B == 0) return;
  const std::int64_t H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim, group = H / Hkv;
  const std::size_t shared = shared_bytes("attention_decode", 2 * D + kTile + 2 * group);
  const DeviceBuffer lens = upload(a.lens);
  decode_kernel<<<blocks_for(B * Hkv, 1), kAttnThreads, shared, stream_>>>(
      a.q, static_cast<const std::uint8_t*>(a.k_cache), static_cast<const std::uint8_t*>(a.v_cache), a.out, a.probs,
      lens.as<std::int64_t>(), B, H, Hkv, D, a.capacity, kv_slot_bytes(a.cache_dtype, D), a.cache_dtype, s.scale,
      s.softcap, s.window);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

void CudaBackend::kv_write(const KvWriteArgs& a) {
  const std::int64_t rows = static_cast<std::int64_t>(a.seq.size()), H = a.n_kv_heads;
  const bool per_head = !a.head_slot.empty();
  if (per_head ? static_cast<std::int64_t>(a.head_slot.size()) != rows * H
               : static_cast<std::int64_t>(a.slot.size()) != rows)
    throw std::invalid_argument("kv_write: slots do not match the rows");
  auto slot_of = [&](std::int64_t r, std::int64_t g) {
    return per_head ? a.head_slot[static_cast<std::size_t>(r * H + g)] : a.slot[static_cast<std::size_t>(r)];
  };
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t g = 0; g < (per_head ? H : 1); ++g)
      if (slot_of(r, g) < (per_head ? -1 : 0) || slot_of(r, g) >= a.capacity || a.seq[static_cast<std::size_t>(r)] < 0)
        throw std::out_of_range("kv_write: slot outside the cache capacity");
  const std::int64_t D = a.head_dim;
  if (rows == 0 || H <= 0 || D <= 0) return;
  const std::int64_t slot_bytes = kv_slot_bytes(a.cache_dtype, D);
  const DeviceBuffer seq = upload(a.seq);
  const DeviceBuffer slots = per_head ? upload(a.head_slot) : upload(a.slot);
  const std::int64_t* slot_ptr = per_head ? nullptr : slots.as<std::int64_t>();
  const std::int64_t* head_slot_ptr = per_head ? slots.as<std::int64_t>() : nullptr;
  auto* cache = static_cast<std::uint8_t*>(a.cache);
  if (is_quantized(a.cache_dtype)) {
    const std::int64_t groups = (D + kQuantGroupSize - 1) / kQuantGroupSize;
    kv_write_quant_kernel<<<blocks_for(rows * H * groups, 1), kQuantThreads, 0, stream_>>>(
        a.src, cache, rows, H, D, a.capacity, slot_bytes, seq.as<std::int64_t>(), slot_ptr, head_slot_ptr,
        a.cache_dtype == DType::Q4);
  } else {
    kv_write_float_kernel<<<blocks_for(rows * H * D), kThreads, 0, stream_>>>(
        a.src, cache, rows, H, D, a.capacity, slot_bytes, seq.as<std::int64_t>(), slot_ptr, head_slot_ptr,
        a.cache_dtype);
  }
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

void CudaBackend::kv_move(const KvMoveArgs& a) {
  const std::int64_t slot_bytes = kv_slot_bytes(a.cache_dtype, a.head_dim);
  // Slot indices in the cache; moves that depend on an earlier move of the same call (read
  // or overwrite a slot it touched) start a new launch, so the result is that of applying
  // the moves in order, as the CPU backend does.
  std::vector<std::int64_t> from, to;
  std::vector<std::size_t> launch_starts;
  std::unordered_set<std::int64_t> read, written;
  for (const KvMove& m : a.moves) {
    if (m.from < 0 || m.from >= a.capacity || m.to < 0 || m.to >= a.capacity || m.head < 0 ||
        m.head >= a.n_kv_heads || m.seq < 0)
      throw std::out_of_range("kv_move: slot outside the cache capacity");
    const std::int64_t head = (m.seq * a.n_kv_heads + m.head) * a.capacity;
    const std::int64_t f = head + m.from, t = head + m.to;
    if (f == t) continue;
    if (from.empty() || written.count(f) || read.count(t) || written.count(t)) {
      launch_starts.push_back(from.size());
      read.clear();
      written.clear();
    }
    read.insert(f);
    written.insert(t);
    from.push_back(f);
    to.push_back(t);
  }
  if (from.empty() || slot_bytes <= 0) return;
  launch_starts.push_back(from.size());
  const DeviceBuffer from_d = upload(std::span<const std::int64_t>(from));
  const DeviceBuffer to_d = upload(std::span<const std::int64_t>(to));
  for (std::size_t i = 0; i + 1 < launch_starts.size(); ++i) {
    const std::int64_t first = static_cast<std::int64_t>(launch_starts[i]);
    const std::int64_t count = static_cast<std::int64_t>(launch_starts[i + 1]) - first;
    kv_move_kernel<<<blocks_for(count, 1), kAttnThreads, 0, stream_>>>(static_cast<std::uint8_t*>(a.cache),
                                                                         from_d.as<std::int64_t>() + first,
                                                                         to_d.as<std::int64_t>() + first, count,
                                                                         slot_bytes);
    FLEXH2O_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace flexh2o::kernels::cuda
