#include "engine/loaders/read_rows.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace flexh2o::engine {

void read_fully(int fd, const std::string& name, std::uint64_t offset, void* dst, std::uint64_t n) {
  auto* out = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd, out, std::min<std::uint64_t>(n, 1u << 30), static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(name + ": read failed: " + std::strerror(errno));
    }
    if (got == 0) throw std::runtime_error(name + ": unexpected end of file at byte " + std::to_string(offset));
    out += got;
    offset += static_cast<std::uint64_t>(got);
    n -= static_cast<std::uint64_t>(got);
  }
}

void read_converted_rows(const std::function<void(std::uint64_t, void*, std::uint64_t)>& read, kernels::DType from,
                         std::int64_t rows, std::int64_t cols, std::int64_t row_begin, std::int64_t row_end, void* dst,
                         kernels::DType to, const std::string& what) {
  if (row_begin < 0 || row_end < row_begin || row_end > rows)
    throw std::out_of_range(what + ": rows [" + std::to_string(row_begin) + ", " + std::to_string(row_end) +
                            ") outside the tensor's " + std::to_string(rows) + " rows");
  const std::uint64_t in_row = static_cast<std::uint64_t>(kernels::row_bytes(from, cols));
  const std::int64_t out_row = kernels::row_bytes(to, cols);
  const std::uint64_t first = static_cast<std::uint64_t>(row_begin) * in_row;
  const std::int64_t count = row_end - row_begin;
  if (from == to) {
    read(first, dst, static_cast<std::uint64_t>(count) * in_row);
    return;
  }
  // About a million elements per read, whole rows (quantization groups never cross a row).
  const std::int64_t chunk = std::max<std::int64_t>(1, (1 << 20) / std::max<std::int64_t>(cols, 1));
  std::vector<std::byte> buf(static_cast<std::size_t>(std::min(count, chunk) * static_cast<std::int64_t>(in_row)));
  for (std::int64_t r = 0; r < count; r += chunk) {
    const std::int64_t n = std::min(chunk, count - r);
    read(first + static_cast<std::uint64_t>(r) * in_row, buf.data(), static_cast<std::uint64_t>(n) * in_row);
    kernels::convert_rows(buf.data(), from, static_cast<std::byte*>(dst) + r * out_row, to, n, cols);
  }
}

}  // namespace flexh2o::engine
