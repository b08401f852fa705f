// Prefill attention on tensor cores (FlashAttention-2 tiles, attention_prefill_mma.cu): what
// CudaBackend::do_attention_prefill runs under bf16 compute for the head dims it has, and
// do_attention_decode for runs of queries on one f16/bf16 cache row (decode_runs.h).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention.h"
#include "kernels/cuda/decode_runs.h"

namespace flexh2o::kernels::cuda {

constexpr std::int64_t kMmaQueryTile = 64;  // query rows per block: 4 warps of 16

// Whether the kernel has a version for this head_dim (64, 80, 96, 128, 256: mma_head_dim).
bool mma_prefill_has(std::int64_t head_dim);
// The version for head_dim (for the shared-memory opt-in; of cache runs, for the cache's dtype)
// and the dynamic shared memory it takes, the same for both; head dims (and cache dtypes other
// than f16 and bf16) it has not throw std::invalid_argument.
const void* mma_prefill_kernel(std::int64_t head_dim);
const void* mma_cache_runs_kernel(std::int64_t head_dim, DType cache_dtype);
std::size_t mma_prefill_shared_bytes(std::int64_t head_dim);

// One launch. Device arrays: tiles holds a (first row, sequence) pair per tile of
// kMmaQueryTile rows of each sequence (the last one of a sequence may be shorter), offsets
// the seq_offsets. q, k and v 16-byte aligned, out 8-byte aligned.
struct MmaPrefillLaunch {
  AttentionShape shape;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* out = nullptr;
  const std::int64_t* tiles = nullptr;
  std::int64_t n_tiles = 0;
  const std::int64_t* offsets = nullptr;
};
void launch_mma_prefill(const MmaPrefillLaunch& l, cudaStream_t stream);

// One launch over runs of decode queries (AttentionDecodeArgs layouts): tiles holds n_tiles
// RunTile (device), whose queries read their cache row's slots in place, K and V of kv head
// h / group at ((cache_row * n_kv_heads + g) * capacity + slot) * head_dim values of
// cache_dtype (f16 or bf16). q and the caches 16-byte aligned, out 8-byte aligned.
struct MmaCacheRunsLaunch {
  AttentionShape shape;
  const float* q = nullptr;
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  DType cache_dtype = DType::F16;
  std::int64_t capacity = 0;
  float* out = nullptr;
  const std::int64_t* tiles = nullptr;
  std::int64_t n_tiles = 0;
};
void launch_mma_cache_runs(const MmaCacheRunsLaunch& l, cudaStream_t stream);

}  // namespace flexh2o::kernels::cuda
