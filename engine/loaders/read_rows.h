// Shared by the checkpoint readers: read a row range of a stored tensor and convert it.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "kernels/dtype.h"

namespace flexh2o::engine {

// pread until n bytes arrived; throws naming `name` on errors or early end of file.
void read_fully(int fd, const std::string& name, std::uint64_t offset, void* dst, std::uint64_t n);

// Rows [row_begin, row_end) of a [rows, cols] tensor stored as `from`, read through
// `read(byte_offset_in_tensor, buf, n)` and written to dst as `to`, in bounded chunks.
void read_converted_rows(const std::function<void(std::uint64_t, void*, std::uint64_t)>& read, kernels::DType from,
                         std::int64_t rows, std::int64_t cols, std::int64_t row_begin, std::int64_t row_end, void* dst,
                         kernels::DType to, const std::string& what);

}  // namespace flexh2o::engine
