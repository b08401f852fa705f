// Runs of decode queries that are rows of one prompt: a prompt continued after KV already in its
// cache row (the rows after a shared prefix, a chunk of a prompt) reaches attention_decode as
// consecutive queries on one cache row whose lens grow by one. A backend computes such a run as
// causal prefill tiles that read the row's keys once per tile of queries, where one query at a
// time would read them once per query (the CPU's BLAS tiles, kernels/cpu/attention_cpu.cc; the
// CUDA backend's tensor cores, kernels/cuda/decode_runs.h).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace flexh2o::kernels {

// Queries [first, first + rows) of one run: they read cache row `cache_row`, the first seeing
// slots up to `position` (its lens - 1), each next query one slot more. Four int64 values, the
// layout the CUDA kernel reads from the uploaded table.
struct RunTile {
  std::int64_t first = 0, rows = 0, cache_row = 0, position = 0;
  bool operator==(const RunTile&) const = default;
};
static_assert(sizeof(RunTile) == 4 * sizeof(std::int64_t), "the kernel reads 4 values a tile");

struct DecodeQuerySplit {
  std::vector<RunTile> tiles;         // runs' queries, in query order
  std::vector<std::int64_t> singles;  // queries left to the one-query-at-a-time path, in order
};

// Runs are maximal ranges of consecutive queries with cache_rows[i + 1] == cache_rows[i] and
// lens[i + 1] == lens[i] + 1; those of at least min_run queries become tiles of at most
// tile_rows queries (the last one of a run shorter), every other query is a single. Without
// cache_rows every query reads its own row: all singles.
DecodeQuerySplit split_decode_queries(std::span<const std::int64_t> cache_rows, std::span<const std::int64_t> lens,
                                      std::int64_t min_run, std::int64_t tile_rows);

}  // namespace flexh2o::kernels
