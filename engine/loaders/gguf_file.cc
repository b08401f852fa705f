#include "engine/loaders/gguf_file.h"

#include <string_view>

#include <fstream>

#include <filesystem>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <system_error>

#include "engine/loaders/read_rows.h"
#include "engine/loaders/regular_file.h"

namespace flexh2o::engine {

namespace {

constexpr std::array<GgmlTypeInfo, 34> kGgmlTypes{{
    {0, "F32", 1, 4},         {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},      {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},      {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 40},
    {10, "Q2_K", 256, 84},    {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66}, {17, "IQ2_XS", 256, 74},
    {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},   {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},
    {22, "IQ2_S", 256, 82},   {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},        {27, "I64", 1, 8},        {28, "F64", 1, 8},        {29, "IQ1_M", 256, 56},
    {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},   {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},
    {40, "NVFP4", 64, 36},    {41, "Q1_0", 128, 18},
}};

// A valid file nests arrays at most once (gguf-py writes arrays of arrays; llama.cpp none).
constexpr int kMaxArrayDepth = 8;
// Arrays of arrays cost far more memory than file bytes; real files have none or a handful.
constexpr std::uint64_t kMaxNestedArrays = 1u << 20;
// Reads of the header go through a window of this size.
constexpr std::uint64_t kWindow = 1u << 20;

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw std::runtime_error(source + ": " + what);
}


std::uint64_t scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::U8:
    case GgufValueType::I8:
    case GgufValueType::Bool: return 1;
    case GgufValueType::U16:
    case GgufValueType::I16: return 2;
    case GgufValueType::U32:
    case GgufValueType::I32:
    case GgufValueType::F32: return 4;
    case GgufValueType::U64:
    case GgufValueType::I64:
    case GgufValueType::F64: return 8;
    case GgufValueType::String:
    case GgufValueType::Array: return 0;
  }
  return 0;
}

// Fewest file bytes one element of type t takes (bounds counts before anything is allocated).
std::uint64_t min_element_bytes(GgufValueType t) {
  if (t == GgufValueType::String) return 8;       // u64 length
  if (t == GgufValueType::Array) return 4 + 8;    // element type + count
  return scalar_size(t);
}

// Sequential reads of the header through a window, each checked against the file's end.
class Cursor {
 public:
  Cursor(const std::function<void(std::uint64_t, void*, std::uint64_t)>& read, std::uint64_t size,
         const std::string& source)
      : read_(read), size_(size), source_(source) {}

  std::uint64_t pos() const { return pos_; }
  std::uint64_t left() const { return size_ - pos_; }
  const std::string& source() const { return source_; }

  void bytes(void* dst, std::uint64_t n, const std::string& what) {
    if (n > left())
      fail(source_, "truncated: " + what + " needs " + std::to_string(n) + " bytes at offset " + std::to_string(pos_) +
                        ", the file ends " + std::to_string(left()) + " bytes later");
    auto* out = static_cast<std::byte*>(dst);
    while (n > 0) {
      if (pos_ < win_begin_ || pos_ >= win_begin_ + window_.size()) {
        if (n >= kWindow) {  // large reads go straight to the destination
          read_(pos_, out, n);
          pos_ += n;
          return;
        }
        win_begin_ = pos_;
        window_.resize(static_cast<std::size_t>(std::min(kWindow, size_ - pos_)));
        read_(win_begin_, window_.data(), window_.size());
      }
      const std::uint64_t at = pos_ - win_begin_;
      const std::uint64_t take = std::min<std::uint64_t>(n, window_.size() - at);
      std::memcpy(out, window_.data() + at, static_cast<std::size_t>(take));
      out += take;
      pos_ += take;
      n -= take;
    }
  }

  template <class T>
  T scalar(const std::string& what) {
    T v;
    bytes(&v, sizeof v, what);
    return v;
  }

  std::string string(const std::string& what) {
    const auto n = scalar<std::uint64_t>(what + " (its length)");
    if (n > left())
      fail(source_, "truncated: " + what + " is " + std::to_string(n) + " bytes long, the file ends " +
                        std::to_string(left()) + " bytes later");
    std::string s(static_cast<std::size_t>(n), '\0');
    bytes(s.data(), n, what);
    return s;
  }

 private:
  const std::function<void(std::uint64_t, void*, std::uint64_t)>& read_;
  std::uint64_t size_;
  const std::string& source_;
  std::uint64_t pos_ = 0;
  std::uint64_t win_begin_ = 0;
  std::vector<std::byte> window_;
};

struct ValueReader {
  Cursor& in;
  std::uint64_t nested_arrays = 0;

  GgufValueType type(const std::string& what) {
    const auto t = in.scalar<std::uint32_t>(what + " (its type)");
    if (t > static_cast<std::uint32_t>(GgufValueType::F64))
      fail(in.source(), what + " has unknown value type " + std::to_string(t) + " (0..12)");
    return static_cast<GgufValueType>(t);
  }

  template <class T>
  T scalar(const std::string& what) {
    return in.scalar<T>(what);
  }

  GgufValue value(GgufValueType t, const std::string& what, int depth) {
    GgufValue v;
    v.type = t;
    switch (t) {
      case GgufValueType::U8: v.value = std::uint64_t{scalar<std::uint8_t>(what)}; break;
      case GgufValueType::U16: v.value = std::uint64_t{scalar<std::uint16_t>(what)}; break;
      case GgufValueType::U32: v.value = std::uint64_t{scalar<std::uint32_t>(what)}; break;
      case GgufValueType::U64: v.value = scalar<std::uint64_t>(what); break;
      case GgufValueType::I8: v.value = std::int64_t{scalar<std::int8_t>(what)}; break;
      case GgufValueType::I16: v.value = std::int64_t{scalar<std::int16_t>(what)}; break;
      case GgufValueType::I32: v.value = std::int64_t{scalar<std::int32_t>(what)}; break;
      case GgufValueType::I64: v.value = scalar<std::int64_t>(what); break;
      case GgufValueType::F32: v.value = double{scalar<float>(what)}; break;
      case GgufValueType::F64: v.value = scalar<double>(what); break;
      case GgufValueType::Bool: {
        const auto b = scalar<std::uint8_t>(what);
        if (b > 1) fail(in.source(), what + " is a bool stored as " + std::to_string(b) + " (0 or 1)");
        v.value = b == 1;
        break;
      }
      case GgufValueType::String: v.value = in.string(what); break;
      case GgufValueType::Array: v.value = array(what, depth); break;
    }
    return v;
  }

  std::shared_ptr<const GgufArray> array(const std::string& what, int depth) {
    if (depth >= kMaxArrayDepth)
      fail(in.source(), what + " nests arrays deeper than " + std::to_string(kMaxArrayDepth) + " levels");
    auto a = std::make_shared<GgufArray>();
    a->element = type(what + " (array element type)");
    a->size = in.scalar<std::uint64_t>(what + " (array length)");
    const std::uint64_t least = min_element_bytes(a->element);
    if (a->size > in.left() / least)
      fail(in.source(), "truncated: " + what + " is an array of " + std::to_string(a->size) + " " +
                            std::string(gguf_value_type_name(a->element)) + " elements, which needs at least " +
                            (a->size > std::numeric_limits<std::uint64_t>::max() / least
                                 ? std::string("2^64")
                                 : std::to_string(a->size * least)) +
                            " bytes; the file ends " + std::to_string(in.left()) + " bytes later");
    const auto n = static_cast<std::size_t>(a->size);
    if (a->element == GgufValueType::String) {
      a->strings.reserve(n);
      for (std::size_t i = 0; i < n; ++i) a->strings.push_back(in.string(what + "[" + std::to_string(i) + "]"));
    } else if (a->element == GgufValueType::Array) {
      nested_arrays += a->size;
      if (nested_arrays > kMaxNestedArrays)
        fail(in.source(), what + ": more than " + std::to_string(kMaxNestedArrays) +
                              " arrays inside arrays in the metadata; not a model file");
      a->arrays.reserve(n);
      for (std::size_t i = 0; i < n; ++i)
        a->arrays.push_back(value(GgufValueType::Array, what + "[" + std::to_string(i) + "]", depth + 1));
    } else {
      a->scalars.resize(n * static_cast<std::size_t>(least));
      in.bytes(a->scalars.data(), a->scalars.size(), what);
      if (a->element == GgufValueType::Bool)
        for (std::size_t i = 0; i < n; ++i)
          if (static_cast<std::uint8_t>(a->scalars[i]) > 1)
            fail(in.source(), what + "[" + std::to_string(i) + "] is a bool stored as " +
                                  std::to_string(static_cast<unsigned>(a->scalars[i])) + " (0 or 1)");
    }
    return a;
  }
};

std::string dims_str(const std::vector<std::int64_t>& ne) {
  std::string s = "[";
  for (std::size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

GgufTensor read_tensor_info(Cursor& in, std::uint64_t index, std::uint64_t count) {
  GgufTensor t;
  t.name = in.string("the name of tensor #" + std::to_string(index) + " of " + std::to_string(count));
  const std::string what = "tensor '" + t.name + "'";
  const auto n_dims = in.scalar<std::uint32_t>(what + " (n_dims)");
  if (n_dims < 1 || n_dims > 4) fail(in.source(), what + ": n_dims = " + std::to_string(n_dims) + " (1..4)");
  for (std::uint32_t d = 0; d < n_dims; ++d) {
    const auto ne = in.scalar<std::uint64_t>(what + " (ne[" + std::to_string(d) + "])");
    if (ne > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      fail(in.source(), what + ": ne[" + std::to_string(d) + "] = " + std::to_string(ne) + " is too large");
    t.ne.push_back(static_cast<std::int64_t>(ne));
  }
  const auto type = in.scalar<std::uint32_t>(what + " (type)");
  t.type = ggml_type_info(type);
  if (t.type == nullptr) fail(in.source(), what + ": unknown ggml type " + std::to_string(type));
  t.offset = in.scalar<std::uint64_t>(what + " (offset)");

  const std::string shape = "ne " + dims_str(t.ne) + " " + std::string(t.type->name);
  if (t.ne[0] % t.type->block_size != 0)
    fail(in.source(), what + ": " + shape + ": ne[0] is not a multiple of the type's block of " +
                          std::to_string(t.type->block_size) + " values");
  std::int64_t numel = 1;
  const bool empty = std::find(t.ne.begin(), t.ne.end(), 0) != t.ne.end();
  for (const std::int64_t ne : t.ne)
    if (!empty && __builtin_mul_overflow(numel, ne, &numel))
      fail(in.source(), what + ": " + shape + " has more than 2^63-1 elements");
  if (empty) numel = 0;
  std::uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<std::uint64_t>(numel / t.type->block_size),
                             static_cast<std::uint64_t>(t.type->type_size), &bytes))
    fail(in.source(), what + ": " + shape + " needs more than 2^64-1 bytes");
  t.bytes = bytes;
  return t;
}

}  // namespace

std::string_view gguf_value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::U8: return "u8";
    case GgufValueType::I8: return "i8";
    case GgufValueType::U16: return "u16";
    case GgufValueType::I16: return "i16";
    case GgufValueType::U32: return "u32";
    case GgufValueType::I32: return "i32";
    case GgufValueType::F32: return "f32";
    case GgufValueType::Bool: return "bool";
    case GgufValueType::String: return "string";
    case GgufValueType::Array: return "array";
    case GgufValueType::U64: return "u64";
    case GgufValueType::I64: return "i64";
    case GgufValueType::F64: return "f64";
  }
  return "?";
}

const GgmlTypeInfo* ggml_type_info(std::uint32_t id) {
  for (const auto& t : kGgmlTypes)
    if (t.id == id) return &t;
  return nullptr;
}

std::vector<std::int64_t> GgufTensor::shape() const { return {ne.rbegin(), ne.rend()}; }

std::int64_t GgufTensor::numel() const {
  std::int64_t n = 1;
  for (const std::int64_t d : ne) n *= d;  // checked when parsed
  return n;
}

namespace {

// general.alignment, when the file sets it: a power of two.
void read_alignment(GgufHeader& h) {
  if (const auto it = h.metadata.find("general.alignment"); it != h.metadata.end()) {
    if (it->second.type != GgufValueType::U32)
      fail(h.source, "metadata key 'general.alignment' has type " + std::string(gguf_value_type_name(it->second.type)) +
                         ", expected u32");
    const auto a = std::get<std::uint64_t>(it->second.value);
    if (a == 0 || (a & (a - 1)) != 0)
      fail(h.source, "metadata key 'general.alignment' = " + std::to_string(a) + " is not a power of two");
    h.alignment = a;
  }
}

// Each tensor's bytes lie aligned inside the data section, and no two overlap.
void check_tensor_data(const GgufHeader& h) {
  for (const GgufTensor& t : h.tensors) {
    const std::string what = "tensor '" + t.name + "'";
    if (t.offset % h.alignment != 0)
      fail(h.source, what + ": offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                         std::to_string(h.alignment));
    if (t.offset > h.data_size || t.bytes > h.data_size - t.offset)
      fail(h.source, "truncated: " + what + " needs bytes [" + std::to_string(t.offset) + ", " +
                         (t.offset > std::numeric_limits<std::uint64_t>::max() - t.bytes
                              ? std::string("2^64")
                              : std::to_string(t.offset + t.bytes)) +
                         ") of the data section, which has " + std::to_string(h.data_size));
  }
  // Sorted by offset (empty tensors first at a shared offset), neighbours must not overlap.
  std::vector<const GgufTensor*> order;
  order.reserve(h.tensors.size());
  for (const auto& t : h.tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const GgufTensor* a, const GgufTensor* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->bytes < b->bytes;
  });
  const GgufTensor* last = nullptr;
  for (const GgufTensor* t : order) {
    if (t->bytes == 0) continue;
    if (last != nullptr && last->offset + last->bytes > t->offset)
      fail(h.source, "tensors '" + last->name + "' and '" + t->name + "' overlap in the data section");
    last = t;
  }
}

}  // namespace

GgufHeader parse_gguf_header(const std::function<void(std::uint64_t, void*, std::uint64_t)>& read,
                             std::uint64_t file_size, const std::string& source_name) {
  GgufHeader h;
  h.source = source_name;
  Cursor in(read, file_size, h.source);
  char magic[4];
  in.bytes(magic, 4, "the magic 'GGUF'");
  if (std::memcmp(magic, "GGUF", 4) != 0) fail(h.source, "not a GGUF file (it does not start with 'GGUF')");
  h.version = in.scalar<std::uint32_t>("the version");
  if (h.version != 2 && h.version != 3) {
    const std::uint32_t swapped = __builtin_bswap32(h.version);
    if (swapped >= 1 && swapped <= 3)
      fail(h.source, "a big-endian GGUF file; only little-endian files are supported");
    if (h.version == 1) fail(h.source, "GGUF version 1 is not supported (versions 2 and 3 are); convert the model again");
    fail(h.source, "unknown GGUF version " + std::to_string(h.version) + " (2 and 3 are supported)");
  }
  const auto n_tensors = in.scalar<std::uint64_t>("the tensor count");
  const auto n_kv = in.scalar<std::uint64_t>("the metadata count");
  // Each entry takes some bytes of the file: counts beyond them are corruption, caught before
  // anything is sized by them.
  if (n_kv > in.left() / 13)
    fail(h.source, "truncated: the metadata count " + std::to_string(n_kv) + " cannot fit in the " +
                       std::to_string(in.left()) + " bytes after the header");

  ValueReader values{in};
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    std::string key = in.string("metadata key #" + std::to_string(i) + " of " + std::to_string(n_kv));
    const std::string what = "metadata key '" + key + "'";
    if (h.metadata.contains(key)) fail(h.source, what + " appears twice");
    const GgufValueType t = values.type(what);
    h.metadata.emplace(std::move(key), values.value(t, what, 0));
  }
  read_alignment(h);

  if (n_tensors > in.left() / 32)
    fail(h.source, "truncated: the tensor count " + std::to_string(n_tensors) + " cannot fit in the " +
                       std::to_string(in.left()) + " bytes after the metadata");
  h.tensors.reserve(static_cast<std::size_t>(n_tensors));
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t = read_tensor_info(in, i, n_tensors);
    if (!h.tensor_index.emplace(t.name, h.tensors.size()).second)
      fail(h.source, "tensor '" + t.name + "' appears twice");
    h.tensors.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment (a file of no tensor data
  // may end before it).
  h.data_start = (in.pos() + h.alignment - 1) / h.alignment * h.alignment;
  h.data_size = h.data_start <= file_size ? file_size - h.data_start : 0;
  check_tensor_data(h);
  return h;
}

GgufHeader parse_gguf_header(std::span<const std::byte> bytes, const std::string& source_name) {
  return parse_gguf_header(
      [&](std::uint64_t offset, void* dst, std::uint64_t n) {
        std::memcpy(dst, bytes.data() + offset, static_cast<std::size_t>(n));  // the cursor checked the range
      },
      bytes.size(), source_name);
}

const GgufTensor* GgufHeader::find_tensor(std::string_view name) const {
  const auto it = tensor_index.find(name);
  return it == tensor_index.end() ? nullptr : &tensors[it->second];
}

const GgufValue* GgufHeader::find(std::string_view key) const {
  const auto it = metadata.find(key);
  return it == metadata.end() ? nullptr : &it->second;
}

void GgufHeader::fail_key(std::string_view key, const std::string& what) const {
  fail(source, "metadata key '" + std::string(key) + "' " + what);
}

namespace {

bool is_unsigned(GgufValueType t) {
  return t == GgufValueType::U8 || t == GgufValueType::U16 || t == GgufValueType::U32 || t == GgufValueType::U64;
}
bool is_signed(GgufValueType t) {
  return t == GgufValueType::I8 || t == GgufValueType::I16 || t == GgufValueType::I32 || t == GgufValueType::I64;
}
bool is_float(GgufValueType t) { return t == GgufValueType::F32 || t == GgufValueType::F64; }

std::string type_text(const GgufValue& v) {
  std::string s(gguf_value_type_name(v.type));
  if (v.type == GgufValueType::Array) {
    const auto& a = *std::get<std::shared_ptr<const GgufArray>>(v.value);
    s += " of " + std::string(gguf_value_type_name(a.element));
  }
  return s;
}

// Element i of an array of fixed-size numbers, as the widest type of its kind.
template <class T>
T load_le(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
double number_at(const GgufArray& a, std::size_t i) {
  const std::byte* p = a.scalars.data() + i * scalar_size(a.element);
  switch (a.element) {
    case GgufValueType::U8: return load_le<std::uint8_t>(p);
    case GgufValueType::I8: return load_le<std::int8_t>(p);
    case GgufValueType::U16: return load_le<std::uint16_t>(p);
    case GgufValueType::I16: return load_le<std::int16_t>(p);
    case GgufValueType::U32: return load_le<std::uint32_t>(p);
    case GgufValueType::I32: return load_le<std::int32_t>(p);
    case GgufValueType::F32: return load_le<float>(p);
    case GgufValueType::U64: return static_cast<double>(load_le<std::uint64_t>(p));
    case GgufValueType::I64: return static_cast<double>(load_le<std::int64_t>(p));
    case GgufValueType::F64: return load_le<double>(p);
    default: return 0;
  }
}

}  // namespace

std::optional<std::uint64_t> GgufHeader::get_uint(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (is_unsigned(v->type)) return std::get<std::uint64_t>(v->value);
  if (is_signed(v->type)) {
    const std::int64_t i = std::get<std::int64_t>(v->value);
    if (i < 0) fail_key(key, "= " + std::to_string(i) + " is negative");
    return static_cast<std::uint64_t>(i);
  }
  fail_key(key, "has type " + type_text(*v) + ", expected an integer");
}

std::optional<double> GgufHeader::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (is_float(v->type)) return std::get<double>(v->value);
  if (is_unsigned(v->type)) return static_cast<double>(std::get<std::uint64_t>(v->value));
  if (is_signed(v->type)) return static_cast<double>(std::get<std::int64_t>(v->value));
  fail_key(key, "has type " + type_text(*v) + ", expected a number");
}

std::optional<bool> GgufHeader::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != GgufValueType::Bool) fail_key(key, "has type " + type_text(*v) + ", expected bool");
  return std::get<bool>(v->value);
}

std::optional<std::string> GgufHeader::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != GgufValueType::String) fail_key(key, "has type " + type_text(*v) + ", expected string");
  return std::get<std::string>(v->value);
}

const std::vector<std::string>* GgufHeader::get_strings(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return nullptr;
  if (v->type != GgufValueType::Array ||
      std::get<std::shared_ptr<const GgufArray>>(v->value)->element != GgufValueType::String)
    fail_key(key, "has type " + type_text(*v) + ", expected array of string");
  return &std::get<std::shared_ptr<const GgufArray>>(v->value)->strings;
}

std::optional<std::vector<double>> GgufHeader::get_floats(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  const GgufArray* a =
      v->type == GgufValueType::Array ? std::get<std::shared_ptr<const GgufArray>>(v->value).get() : nullptr;
  if (a == nullptr || !(is_unsigned(a->element) || is_signed(a->element) || is_float(a->element)))
    fail_key(key, "has type " + type_text(*v) + ", expected an array of numbers");
  std::vector<double> out(static_cast<std::size_t>(a->size));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = number_at(*a, i);
  return out;
}

std::optional<std::vector<std::int64_t>> GgufHeader::get_ints(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  const GgufArray* a =
      v->type == GgufValueType::Array ? std::get<std::shared_ptr<const GgufArray>>(v->value).get() : nullptr;
  if (a == nullptr || !(is_unsigned(a->element) || is_signed(a->element)))
    fail_key(key, "has type " + type_text(*v) + ", expected an array of integers");
  std::vector<std::int64_t> out(static_cast<std::size_t>(a->size));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::byte* p = a->scalars.data() + i * scalar_size(a->element);
    if (a->element == GgufValueType::U64) {
      const auto u = load_le<std::uint64_t>(p);
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        fail_key(key, "[" + std::to_string(i) + "] = " + std::to_string(u) + " is too large");
      out[i] = static_cast<std::int64_t>(u);
    } else if (a->element == GgufValueType::I64) {
      out[i] = load_le<std::int64_t>(p);
    } else {
      out[i] = static_cast<std::int64_t>(number_at(*a, i));  // exact: at most 32 bits
    }
  }
  return out;
}

GgufFile::GgufFile(std::string path) : path_(std::move(path)) {
  std::uint64_t size = 0;
  fd_ = open_regular_file(path_, size);
  try {
    header_ = parse_gguf_header(
        [&](std::uint64_t offset, void* dst, std::uint64_t n) { read_fully(fd_, path_, offset, dst, n); }, size, path_);
  } catch (...) {
    ::close(fd_);  // the destructor does not run for a constructor that throws
    throw;
  }
}

GgufFile::~GgufFile() {
  if (fd_ >= 0) ::close(fd_);
}

void GgufFile::read(const GgufTensor& t, std::uint64_t offset, void* dst, std::uint64_t bytes) const {
  if (offset > t.bytes || bytes > t.bytes - offset)  // written so that offset + bytes cannot wrap
    throw std::runtime_error(path_ + ": tensor '" + t.name + "': read of " + std::to_string(bytes) +
                             " bytes at offset " + std::to_string(offset) + " leaves its " + std::to_string(t.bytes) +
                             " bytes");
  read_fully(fd_, path_, header_.data_start + t.offset + offset, dst, bytes);
}

bool is_gguf_file(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::is_regular_file(path)) return false;
  if (fs::path(path).extension() == ".gguf") return true;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

}  // namespace flexh2o::engine
