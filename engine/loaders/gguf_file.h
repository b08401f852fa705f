// GGUF, llama.cpp's model file (versions 2 and 3, little-endian):
//   "GGUF", u32 version, u64 tensor count, u64 metadata count,
//   metadata: per entry a key (string), a u32 value type and the value: a scalar, a string
//     (u64 length + bytes) or an array (u32 element type, u64 count, the elements),
//   tensor infos: per tensor its name, u32 n_dims (1..4), u64 ne[n_dims] (ne[0] varies
//     fastest), u32 ggml type, u64 offset into the data section (a multiple of the alignment),
//   padding to `general.alignment` (default 32), then the data section.
// Every length, count, offset, shape and type is checked against the file before it is
// trusted: a bad file gives one std::runtime_error naming the file and the field, never a
// crash, a hang or an allocation larger than the file justifies.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace flexh2o::engine {

enum class GgufValueType : std::uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9,
  U64 = 10, I64 = 11, F64 = 12,
};
std::string_view gguf_value_type_name(GgufValueType t);

struct GgufArray;

// A metadata value: an unsigned or signed integer, a float, a bool, a string or an array.
struct GgufValue {
  GgufValueType type = GgufValueType::U8;
  std::variant<std::uint64_t, std::int64_t, double, bool, std::string, std::shared_ptr<const GgufArray>> value;
};

// An array's elements: fixed-size scalars as stored (little-endian), strings, or arrays.
struct GgufArray {
  GgufValueType element = GgufValueType::U8;
  std::uint64_t size = 0;
  std::vector<std::byte> scalars;
  std::vector<std::string> strings;
  std::vector<GgufValue> arrays;
};

// ggml's tensor types, with their block of `block_size` values stored in `type_size` bytes.
struct GgmlTypeInfo {
  std::uint32_t id;
  std::string_view name;
  std::int64_t block_size;
  std::int64_t type_size;
};
// The type of a ggml type id, or null for an id ggml does not define.
const GgmlTypeInfo* ggml_type_info(std::uint32_t id);

struct GgufTensor {
  std::string name;
  std::vector<std::int64_t> ne;  // as stored: ne[0] is the contiguous dimension
  const GgmlTypeInfo* type = nullptr;
  std::uint64_t offset = 0;  // from the start of the data section
  std::uint64_t bytes = 0;
  // The shape in PyTorch order (ne reversed): a 2-D weight [rows, cols] with ne = [cols, rows].
  std::vector<std::int64_t> shape() const;
  std::int64_t numel() const;
};

// The parsed header of a GGUF file: metadata, tensor infos, where the data section starts.
struct GgufHeader {
  std::string source;  // the file, for messages
  std::uint32_t version = 0;
  std::uint64_t alignment = 32;
  std::uint64_t data_start = 0;  // absolute file offset of the data section
  std::uint64_t data_size = 0;   // bytes from data_start to the end of the file
  std::map<std::string, GgufValue, std::less<>> metadata;
  std::vector<GgufTensor> tensors;  // in file order
  std::map<std::string, std::size_t, std::less<>> tensor_index;  // name -> position in `tensors`

  const GgufTensor* find_tensor(std::string_view name) const;
  // Typed metadata: nullopt (null) when the key is absent; an error naming the file and key
  // when it holds another type. Integers of any width read as unsigned when non-negative.
  const GgufValue* find(std::string_view key) const;
  std::optional<std::uint64_t> get_uint(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;  // floats and integers
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  // Arrays: of strings; of numbers (any integer or float element type) as doubles / int64.
  const std::vector<std::string>* get_strings(std::string_view key) const;
  std::optional<std::vector<double>> get_floats(std::string_view key) const;
  std::optional<std::vector<std::int64_t>> get_ints(std::string_view key) const;
  [[noreturn]] void fail_key(std::string_view key, const std::string& what) const;
};

// Parses and validates the header of a GGUF file of `file_size` bytes, reading its bytes
// through `read(offset, dst, n)` (offset + n <= file_size). Errors are std::runtime_error
// starting with `source_name` and naming the field or tensor.
GgufHeader parse_gguf_header(const std::function<void(std::uint64_t, void*, std::uint64_t)>& read,
                             std::uint64_t file_size, const std::string& source_name);
// The same over bytes in memory.
GgufHeader parse_gguf_header(std::span<const std::byte> bytes, const std::string& source_name);

class GgufFile {
 public:
  // Opens and validates the file (reads the header only). Throws std::runtime_error.
  explicit GgufFile(std::string path);
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  const std::string& path() const { return path_; }
  const GgufHeader& header() const { return header_; }
  // Reads `bytes` bytes starting `offset` bytes into the tensor's data (pread, thread-safe).
  // Throws if the range leaves the tensor or the file is shorter than promised.
  void read(const GgufTensor& t, std::uint64_t offset, void* dst, std::uint64_t bytes) const;

 private:
  std::string path_;
  int fd_ = -1;
  GgufHeader header_;
};

// Whether `path` is a GGUF file: by its extension or, under any name, by its magic.
bool is_gguf_file(const std::string& path);

}  // namespace flexh2o::engine
