#include "kernels/decode_runs.h"

#include <algorithm>
#include <cstddef>

namespace flexh2o::kernels {

namespace {

// The end of the run that starts at query i.
std::size_t run_end(std::span<const std::int64_t> cache_rows, std::span<const std::int64_t> lens, std::size_t i) {
  std::size_t j = i + 1;
  while (j < lens.size() && cache_rows[j] == cache_rows[j - 1] && lens[j] == lens[j - 1] + 1) ++j;
  return j;
}

}  // namespace

DecodeQuerySplit split_decode_queries(std::span<const std::int64_t> cache_rows, std::span<const std::int64_t> lens,
                                      std::int64_t min_run, std::int64_t tile_rows) {
  DecodeQuerySplit split;
  const bool rows = cache_rows.size() == lens.size();
  for (std::size_t i = 0; i < lens.size();) {
    const std::size_t end = rows ? run_end(cache_rows, lens, i) : i + 1;
    const auto n = static_cast<std::int64_t>(end - i);
    if (rows && n >= min_run) {
      for (std::int64_t t = 0; t < n; t += tile_rows) {
        const std::size_t first = i + static_cast<std::size_t>(t);
        split.tiles.push_back({static_cast<std::int64_t>(first), std::min(tile_rows, n - t), cache_rows[first],
                               lens[first] - 1});
      }
    } else {
      for (std::size_t q = i; q < end; ++q) split.singles.push_back(static_cast<std::int64_t>(q));
    }
    i = end;
  }
  return split;
}

}  // namespace flexh2o::kernels
