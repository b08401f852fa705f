#include "engine/loaders/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <system_error>
#include <unordered_set>
#include <utility>

#include "engine/io/json_input.h"
#include "engine/loaders/regular_file.h"

namespace flexh2o::engine {
namespace {

using nlohmann::json;

struct DTypeInfo {
  std::string_view name;
  std::uint64_t size;
  std::optional<kernels::DType> dtype;
};

constexpr std::array<DTypeInfo, 15> kDTypes{{
    {"F64", 8, std::nullopt},
    {"F32", 4, kernels::DType::F32},
    {"F16", 2, kernels::DType::F16},
    {"BF16", 2, kernels::DType::BF16},
    {"I64", 8, std::nullopt},
    {"I32", 4, std::nullopt},
    {"I16", 2, std::nullopt},
    {"I8", 1, std::nullopt},
    {"U8", 1, std::nullopt},
    {"BOOL", 1, std::nullopt},
    {"U16", 2, std::nullopt},
    {"U32", 4, std::nullopt},
    {"U64", 8, std::nullopt},
    {"F8_E4M3", 1, std::nullopt},
    {"F8_E5M2", 1, std::nullopt},
}};

// The format's own limit; a larger length field is corruption, not a header.
constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;
// A valid header nests three deep; the limit bounds memory and work on hostile input.
constexpr std::size_t kMaxDepth = 64;
// Linux moves at most ~2 GiB per read/write call; smaller requests keep ssize_t exact.
constexpr std::uint64_t kMaxIoChunk = 1ull << 30;

const DTypeInfo* find_dtype(std::string_view name) {
  for (const auto& d : kDTypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

std::string_view file_dtype_name(kernels::DType t) {
  for (const auto& d : kDTypes) {
    if (d.dtype == t) return d.name;
  }
  throw std::logic_error("dtype missing from the safetensors table");
}

[[noreturn]] void fail(const std::string& source, const std::string& msg) {
  throw std::runtime_error(source + ": " + msg);
}

[[noreturn]] void fail_tensor(const std::string& source, const std::string& tensor, const std::string& msg) {
  fail(source, "tensor '" + tensor + "': " + msg);
}

std::string errno_text(int err) { return std::generic_category().message(err); }

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string offsets_str(std::uint64_t begin, std::uint64_t end) {
  std::string s = "[";  // appended rather than "[" + ..., which trips GCC 12's false -Wrestrict
  s += std::to_string(begin);
  s += ", ";
  s += std::to_string(end);
  return s + "]";
}

// Element count, or nullopt for a negative dim or a count beyond int64.
std::optional<std::int64_t> checked_numel(const std::vector<std::int64_t>& shape) {
  if (std::any_of(shape.begin(), shape.end(), [](std::int64_t d) { return d < 0; })) return std::nullopt;
  // A zero dim makes the product zero however large the others are.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  std::int64_t n = 1;
  for (const std::int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return n;
}

// Builds the DOM like json::parse, but rejects duplicate keys (which json::parse would
// silently resolve to the last one) and deep nesting before it costs memory.
class HeaderSax {
 public:
  explicit HeaderSax(const std::string& source) : source_(source) {}

  bool null() { return put(nullptr); }
  bool boolean(bool v) { return put(v); }
  bool number_integer(json::number_integer_t v) { return put(v); }
  bool number_unsigned(json::number_unsigned_t v) { return put(v); }
  bool number_float(json::number_float_t v, const json::string_t&) { return put(v); }
  bool string(json::string_t& v) { return put(std::move(v)); }
  bool binary(json::binary_t& v) { return put(std::move(v)); }
  bool start_object(std::size_t) { return open(json::object()); }
  bool start_array(std::size_t) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    if (stack_.back()->contains(k)) fail(source_, "header has key '" + k + "' twice in one object");
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    fail(source_, "header is not valid JSON: " + bounded_excerpt(e.what(), 2 * kJsonExcerptChars));
  }

  json take() { return std::move(root_); }

 private:
  // Stores v in the open container (or as the root) and returns where it landed.
  json* place(json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    return &(top[key_] = std::move(v));
  }
  bool put(json v) {
    place(std::move(v));
    return true;
  }
  bool open(json v) {
    if (stack_.size() >= kMaxDepth) fail(source_, "header nests deeper than " + std::to_string(kMaxDepth) + " levels");
    stack_.push_back(place(std::move(v)));
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  const std::string& source_;
  json root_;
  std::vector<json*> stack_;  // open containers; each lives inside its parent, which is not resized meanwhile
  std::string key_;
};

void check_metadata(const json& v, const std::string& source) {
  if (!v.is_object()) fail(source, std::string("__metadata__ is ") + v.type_name() + ", expected an object of strings");
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it->is_string()) {
      fail(source, "__metadata__ key '" + it.key() + "' is " + it->type_name() + ", expected a string");
    }
  }
}

const json& field(const json& entry, const char* key, const std::string& source, const std::string& tensor) {
  const auto it = entry.find(key);
  if (it == entry.end()) fail_tensor(source, tensor, std::string("missing ") + key);
  return *it;
}

std::vector<std::int64_t> parse_shape(const json& v, const std::string& source, const std::string& tensor) {
  if (!v.is_array()) fail_tensor(source, tensor, std::string("shape is ") + v.type_name() + ", expected an array");
  std::vector<std::int64_t> shape;
  shape.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const json& d = v[i];
    const std::string where = "shape[" + std::to_string(i) + "]";
    if (d.is_number_unsigned()) {
      const auto u = d.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        fail_tensor(source, tensor, where + " = " + std::to_string(u) + " is too large");
      }
      shape.push_back(static_cast<std::int64_t>(u));
    } else if (d.is_number_integer()) {  // nlohmann stores only negative integers as signed
      fail_tensor(source, tensor, where + " = " + std::to_string(d.get<std::int64_t>()) + " is negative");
    } else {
      fail_tensor(source, tensor,
                  where + " is " + (d.is_number() ? "not an integer" : std::string("a ") + d.type_name()) +
                      ", expected a non-negative integer");
    }
  }
  return shape;
}

SafetensorsEntry parse_entry(const std::string& name, const json& v, std::uint64_t data_size,
                             const std::string& source) {
  if (!v.is_object()) fail_tensor(source, name, std::string("entry is ") + v.type_name() + ", expected an object");
  SafetensorsEntry e;
  e.name = name;

  const json& dtype = field(v, "dtype", source, name);
  if (!dtype.is_string()) {
    fail_tensor(source, name, std::string("dtype is ") + dtype.type_name() + ", expected a string");
  }
  e.dtype_name = dtype.get<std::string>();
  const DTypeInfo* info = find_dtype(e.dtype_name);
  if (info == nullptr) fail_tensor(source, name, "unknown dtype '" + e.dtype_name + "'");
  e.dtype = info->dtype;

  e.shape = parse_shape(field(v, "shape", source, name), source, name);

  const json& offsets = field(v, "data_offsets", source, name);
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    fail_tensor(source, name, "data_offsets must be [begin, end] with non-negative integers");
  }
  e.begin = offsets[0].get<std::uint64_t>();
  e.end = offsets[1].get<std::uint64_t>();
  const std::string offs = "data_offsets " + offsets_str(e.begin, e.end);
  if (e.begin > e.end) fail_tensor(source, name, offs + " have begin > end");
  if (e.end > data_size) {
    fail_tensor(source, name, offs + " end beyond the data section of " + std::to_string(data_size) + " bytes");
  }

  const std::string shape_desc = "shape " + shape_str(e.shape) + " " + e.dtype_name;
  const auto numel = checked_numel(e.shape);
  if (!numel) fail_tensor(source, name, shape_desc + " has more than 2^63-1 elements");
  std::uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<std::uint64_t>(*numel), info->size, &bytes)) {
    fail_tensor(source, name, shape_desc + " needs more than 2^64-1 bytes");
  }
  if (e.end - e.begin != bytes) {
    fail_tensor(source, name,
                offs + " span " + std::to_string(e.end - e.begin) + " bytes but " + shape_desc + " needs " +
                    std::to_string(bytes));
  }
  return e;
}

// pread until `bytes` arrived; the file ending first is an error, as is any errno.
void read_exact(int fd, void* dst, std::uint64_t bytes, std::uint64_t offset, const std::string& path,
                const std::string& what) {
  auto* p = static_cast<char*>(dst);
  std::uint64_t done = 0;
  while (done < bytes) {
    const auto chunk = static_cast<std::size_t>(std::min(bytes - done, kMaxIoChunk));
    const ssize_t n = ::pread(fd, p + done, chunk, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(path + ": cannot read " + what + ": " + errno_text(errno));
    }
    if (n == 0) throw std::runtime_error(path + ": unexpected end of file reading " + what);
    done += static_cast<std::uint64_t>(n);
  }
}

void write_all(int fd, const void* src, std::uint64_t bytes, const std::string& path, const std::string& tmp) {
  const auto* p = static_cast<const char*>(src);
  std::uint64_t done = 0;
  while (done < bytes) {
    const auto chunk = static_cast<std::size_t>(std::min(bytes - done, kMaxIoChunk));
    const ssize_t n = ::write(fd, p + done, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, "cannot write " + tmp + ": " + errno_text(errno));
    }
    done += static_cast<std::uint64_t>(n);
  }
}

}  // namespace

std::int64_t SafetensorsEntry::numel() const {
  const auto n = checked_numel(shape);
  if (!n) throw std::runtime_error("tensor '" + name + "': shape " + shape_str(shape) + " has no valid element count");
  return *n;
}

std::vector<SafetensorsEntry> parse_safetensors_header(std::string_view header_json, std::uint64_t data_size,
                                                       const std::string& source_name) {
  HeaderSax sax(source_name);
  check_json_depth(header_json, source_name + ": header");
  try {
    json::sax_parse(header_json.begin(), header_json.end(), &sax);
  } catch (const json::exception& e) {  // syntax errors come through HeaderSax; this catches the rest
    fail(source_name, "header is not valid JSON: " + bounded_excerpt(e.what(), 2 * kJsonExcerptChars));
  }
  const json root = sax.take();
  if (!root.is_object()) fail(source_name, std::string("header root is ") + root.type_name() + ", expected an object");

  std::vector<SafetensorsEntry> entries;
  entries.reserve(root.size());
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__") {
      check_metadata(*it, source_name);
    } else {
      entries.push_back(parse_entry(it.key(), *it, data_size, source_name));
    }
  }

  // Empty tensors sort first at a shared offset, so the overlap test below does not
  // depend on the order of names.
  std::stable_sort(entries.begin(), entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // Sorted by begin and disjoint so far, the last non-empty entry has the largest end.
  const SafetensorsEntry* last = nullptr;
  for (const auto& e : entries) {
    if (e.begin == e.end) continue;  // owns no bytes, so cannot clash
    if (last != nullptr && last->end > e.begin) {
      fail(source_name, "tensors '" + last->name + "' data_offsets " + offsets_str(last->begin, last->end) + " and '" +
                            e.name + "' data_offsets " + offsets_str(e.begin, e.end) + " overlap");
    }
    last = &e;
  }
  return entries;
}

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  std::uint64_t size = 0;
  fd_ = open_regular_file(path_, size);
  try {
    if (size < 8) {
      throw std::runtime_error(path_ + ": truncated: " + std::to_string(size) +
                               " bytes, a safetensors file starts with an 8-byte header length");
    }
    unsigned char len_bytes[8];
    read_exact(fd_, len_bytes, 8, 0, path_, "the header length");
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
    if (n > size - 8) {
      throw std::runtime_error(path_ + ": header length " + std::to_string(n) + " exceeds the " +
                               std::to_string(size - 8) + " bytes after it");
    }
    if (n > kMaxHeaderBytes) {
      throw std::runtime_error(path_ + ": header length " + std::to_string(n) + " exceeds the 100 MiB limit");
    }
    std::string header(n, '\0');
    read_exact(fd_, header.data(), n, 8, path_, "the header");
    data_start_ = 8 + n;
    entries_ = parse_safetensors_header(header, size - data_start_, path_);
  } catch (...) {
    ::close(fd_);  // the destructor does not run for a constructor that throws
    throw;
  }
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      data_start_(other.data_start_),
      entries_(std::move(other.entries_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    data_start_ = other.data_start_;
    entries_ = std::move(other.entries_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  for (const auto& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

void SafetensorsFile::read(const SafetensorsEntry& e, std::uint64_t offset, void* dst, std::uint64_t bytes) const {
  const std::uint64_t size = e.end - e.begin;
  if (offset > size || bytes > size - offset) {  // written so that offset + bytes cannot wrap
    fail_tensor(path_, e.name,
                "read of " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) + " leaves its " +
                    std::to_string(size) + " bytes");
  }
  read_exact(fd_, dst, bytes, data_start_ + e.begin + offset, path_, "tensor '" + e.name + "'");
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();  // keeps the given order
  std::unordered_set<std::string_view> names;
  std::vector<std::uint64_t> sizes;
  sizes.reserve(tensors.size());
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__") fail_tensor(path, t.name, "the name is reserved for metadata");
    if (!names.insert(t.name).second) fail_tensor(path, t.name, "the name appears twice");
    const auto numel = checked_numel(t.shape);
    std::uint64_t bytes = 0;
    std::uint64_t end = 0;
    if (!numel || __builtin_mul_overflow(static_cast<std::uint64_t>(*numel), kernels::dtype_size(t.dtype), &bytes) ||
        __builtin_add_overflow(offset, bytes, &end)) {
      fail_tensor(path, t.name, "shape " + shape_str(t.shape) + " has a negative dim or is too large");
    }
    if (bytes > 0 && t.data == nullptr) fail_tensor(path, t.name, "data is null");
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = file_dtype_name(t.dtype);
    entry["shape"] = t.shape;
    entry["data_offsets"] = nlohmann::ordered_json::array({offset, end});
    header[t.name] = std::move(entry);
    sizes.push_back(bytes);
    offset = end;
  }

  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {  // e.g. a name that is not UTF-8
    fail(path, std::string("cannot encode the header: ") + e.what());
  }
  // Spaces are valid JSON padding; they put the data section on an 8-byte boundary.
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len_bytes[8];
  for (std::size_t i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(text.size() >> (8 * i));

  // Written beside the target and renamed over it, so a crash never leaves a half file
  // under the real name.
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, "cannot create " + tmp + ": " + errno_text(errno));
  try {
    write_all(fd, len_bytes, 8, path, tmp);
    write_all(fd, text.data(), text.size(), path, tmp);
    for (std::size_t i = 0; i < tensors.size(); ++i) write_all(fd, tensors[i].data, sizes[i], path, tmp);
    if (::fsync(fd) != 0) fail(path, "cannot sync " + tmp + ": " + errno_text(errno));
    if (::close(std::exchange(fd, -1)) != 0) fail(path, "cannot close " + tmp + ": " + errno_text(errno));
    if (::rename(tmp.c_str(), path.c_str()) != 0) fail(path, "cannot rename " + tmp + ": " + errno_text(errno));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
}

}  // namespace flexh2o::engine
