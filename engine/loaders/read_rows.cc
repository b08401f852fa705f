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
  const std::size_t in_size = kernels::dtype_size(from), out_size = kernels::dtype_size(to);
  const std::uint64_t first = static_cast<std::uint64_t>(row_begin * cols);
  const std::uint64_t count = static_cast<std::uint64_t>((row_end - row_begin) * cols);
  if (from == to) {
    read(first * in_size, dst, count * in_size);
    return;
  }
  constexpr std::uint64_t kChunk = 1 << 20;  // elements per read: bounded staging memory
  std::vector<std::byte> buf(static_cast<std::size_t>(std::min(count, kChunk)) * in_size);
  for (std::uint64_t i = 0; i < count; i += kChunk) {
    const std::uint64_t n = std::min(kChunk, count - i);
    read((first + i) * in_size, buf.data(), n * in_size);
    kernels::convert(buf.data(), from, static_cast<char*>(dst) + i * out_size, to, n);
  }
}

}  // namespace flexh2o::engine
