// The safetensors file format: u64 little-endian header length N, N bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then raw data.
// Everything read from the file is checked before it is trusted.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dtype.h"

namespace flexh2o::engine {

struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;                // as in the file, e.g. "F16", "I64"
  std::optional<kernels::DType> dtype;   // set for F32, F16, BF16
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // offsets relative to the start of the data section
  std::uint64_t end = 0;
  std::int64_t numel() const;
};

// Parses and validates a header: JSON object; every entry has a string dtype, an integer
// shape and data_offsets with begin <= end <= data_size; end - begin == numel * element
// size for known dtypes; entries do not overlap. Errors are std::runtime_error whose
// message starts with `source_name` and names the offending tensor and field.
std::vector<SafetensorsEntry> parse_safetensors_header(std::string_view header_json, std::uint64_t data_size,
                                                       const std::string& source_name);

class SafetensorsFile {
 public:
  // Opens and validates the file (reads only the header). Throws std::runtime_error.
  explicit SafetensorsFile(std::string path);
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(std::string_view name) const;
  // Reads `bytes` bytes starting `offset` bytes into the tensor's data (pread, thread-safe).
  // Throws if the range leaves the tensor or the file is shorter than promised.
  void read(const SafetensorsEntry& e, std::uint64_t offset, void* dst, std::uint64_t bytes) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
};

// Writes a safetensors file (tests, exports). Tensors are written in the given order.
struct SafetensorsTensor {
  std::string name;
  kernels::DType dtype;
  std::vector<std::int64_t> shape;
  const void* data;  // numel * dtype_size bytes
};
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors);

}  // namespace flexh2o::engine
