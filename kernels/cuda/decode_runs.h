// Which decode queries the CUDA backend runs on tensor cores (attention_prefill_mma.cu) and
// which on the decode kernel (attention_gpu.cu): host-side, without CUDA, so that it is tested
// on every machine. A prompt continued after KV already in its cache row (a chunk of chunked
// prefill, the rows after a shared prefix) reaches attention_decode as consecutive queries on
// one cache row whose lens grow by one; under bf16 compute such a run becomes causal
// FlashAttention-2 tiles that read the row's keys once per tile of queries, where the decode
// kernel would read them once per query.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/attention.h"

namespace flexh2o::kernels::cuda {

// Shorter runs stay on the decode kernel: a run of n queries fills n of a tile's 64 rows, and
// below 8 the tile's wasted tensor-core work (64 / n times the useful) approaches what the
// decode kernel, which reads a cache row once for the whole GQA group, spends on CUDA cores.
constexpr std::int64_t kMinTensorCoreRun = 8;

// Queries [first, first + rows) of one run: they read cache row `cache_row`, the first seeing
// slots up to `position` (its lens - 1), each next query one slot more. Four int64 values, the
// layout the kernel reads from the uploaded table.
struct RunTile {
  std::int64_t first = 0, rows = 0, cache_row = 0, position = 0;
  bool operator==(const RunTile&) const = default;
};
static_assert(sizeof(RunTile) == 4 * sizeof(std::int64_t), "the kernel reads 4 values a tile");

struct DecodeQuerySplit {
  std::vector<RunTile> tiles;         // for the tensor-core kernel, in query order
  std::vector<std::int64_t> singles;  // queries left to the decode kernel, in order
};

// Runs are maximal ranges of consecutive queries with cache_rows[i + 1] == cache_rows[i] and
// lens[i + 1] == lens[i] + 1; those of at least min_run queries become tiles of at most
// tile_rows queries (the last one of a run shorter), every other query is a single. Without
// cache_rows every query reads its own row: all singles.
DecodeQuerySplit split_decode_queries(std::span<const std::int64_t> cache_rows, std::span<const std::int64_t> lens,
                                      std::int64_t min_run, std::int64_t tile_rows);

// The head dims the tensor-core attention kernel has: 64, 80, 96, 128, 256.
bool mma_head_dim(std::int64_t head_dim);

// Whether attention_decode may run a's runs on tensor cores; where not, every query stays on the
// decode kernel. The fallback cases: f32 compute; a cache that is not f16 or bf16 (f32, q8, q4
// keep the decode kernel); a head dim the kernel lacks; no cache_rows (no runs); probs or
// slot_bias asked for (per cache row, not with cache_rows anyway); q, the caches or out not
// aligned for the kernel's 16-byte loads and 8-byte stores.
bool decode_runs_on_tensor_cores(const AttentionDecodeArgs& a);

}  // namespace flexh2o::kernels::cuda
