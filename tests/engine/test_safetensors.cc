#include "engine/loaders/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace flexh2o::engine {
namespace {

namespace fs = std::filesystem;
using kernels::DType;

// Message of the std::runtime_error that f throws, or "" (and a test failure) when it
// throws nothing.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a std::runtime_error";
  return "";
}

::testing::AssertionResult has_all(const std::string& msg, std::initializer_list<std::string> parts) {
  for (const auto& p : parts) {
    if (msg.find(p) == std::string::npos) {
      return ::testing::AssertionFailure() << "'" << msg << "' lacks '" << p << "'";
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<unsigned char> random_bytes(std::mt19937_64& rng, std::uint64_t n) {
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_whole(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string le64(std::uint64_t n) {
  std::string s(8, '\0');
  for (std::size_t i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

// A file with the given header text and `data_bytes` zero bytes of data.
std::string file_bytes(const std::string& header, std::uint64_t data_bytes) {
  return le64(header.size()) + header + std::string(data_bytes, '\0');
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "safetensors_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << tmpl;
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a file from a header and opens it; returns the error text.
  std::string open_error(const std::string& header, std::uint64_t data_bytes) {
    const std::string p = path("bad.safetensors");
    write_whole(p, file_bytes(header, data_bytes));
    return error_of([&] { SafetensorsFile f(p); });
  }

  fs::path dir_;
};

TEST_F(SafetensorsTest, RoundTripIsBitIdentical) {
  std::mt19937_64 rng(42);
  struct Spec {
    std::string name;
    DType dtype;
    std::vector<std::int64_t> shape;
  };
  const std::vector<Spec> specs = {
      {"layers.0.wq", DType::F32, {3, 5, 7}},
      {"layers.0.norm", DType::F16, {13}},
      {"emb", DType::BF16, {2, 3, 1, 5}},
      {"scale", DType::F32, {}},
      {"empty", DType::F16, {0, 4}},
      {"odd", DType::BF16, {1, 1, 11}},
      {"after_empty", DType::F32, {9, 1}},
  };
  std::vector<std::vector<unsigned char>> data;
  std::vector<SafetensorsTensor> tensors;
  for (const auto& s : specs) {
    std::int64_t n = 1;
    for (const auto d : s.shape) n *= d;
    data.push_back(random_bytes(rng, static_cast<std::uint64_t>(n) * kernels::dtype_size(s.dtype)));
    tensors.push_back({s.name, s.dtype, s.shape, data.back().data()});
  }
  const std::string p = path("model.safetensors");
  write_safetensors(p, tensors);
  EXPECT_FALSE(fs::exists(p + ".tmp"));

  // The data section starts 8-byte aligned.
  const std::string raw = read_whole(p);
  ASSERT_GE(raw.size(), 8u);
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(raw[i]);
  EXPECT_EQ(header_len % 8, 0u);

  const SafetensorsFile f(p);
  EXPECT_EQ(f.path(), p);
  ASSERT_EQ(f.entries().size(), specs.size());
  const char* expected_names[] = {"F32", "F16", "BF16"};
  for (std::size_t i = 0; i < specs.size(); ++i) {
    SCOPED_TRACE(specs[i].name);
    const SafetensorsEntry* e = f.find(specs[i].name);
    ASSERT_NE(e, nullptr);
    // Written in order with contiguous offsets; entries come back in order of begin
    // (the empty tensor shares its begin with the next one and sorts first).
    EXPECT_EQ(f.entries()[i].name, specs[i].name);
    EXPECT_EQ(e->dtype, specs[i].dtype);
    EXPECT_EQ(e->dtype_name, expected_names[static_cast<int>(specs[i].dtype)]);
    EXPECT_EQ(e->shape, specs[i].shape);
    EXPECT_EQ(e->end - e->begin, data[i].size());
    EXPECT_EQ(static_cast<std::uint64_t>(e->numel()) * kernels::dtype_size(specs[i].dtype), data[i].size());
    std::vector<unsigned char> back(data[i].size());
    f.read(*e, 0, back.data(), back.size());
    EXPECT_EQ(back, data[i]);
  }
  EXPECT_EQ(f.find("missing"), nullptr);
  EXPECT_EQ(f.find("scale")->numel(), 1);
  EXPECT_EQ(f.find("empty")->numel(), 0);
}

TEST_F(SafetensorsTest, ReadsPartialRangesAndRejectsReadsOutsideTheTensor) {
  std::vector<float> v(100);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.5f;
  const std::string p = path("w.safetensors");
  write_safetensors(p, {{"w", DType::F32, {10, 10}, v.data()}});
  const SafetensorsFile f(p);
  const SafetensorsEntry& e = *f.find("w");

  std::vector<float> part(7);
  f.read(e, 13 * sizeof(float), part.data(), part.size() * sizeof(float));
  EXPECT_EQ(0, std::memcmp(part.data(), v.data() + 13, part.size() * sizeof(float)));
  f.read(e, 400, part.data(), 0);  // an empty read at the very end is fine

  EXPECT_TRUE(has_all(error_of([&] { f.read(e, 397, part.data(), 4); }), {p, "tensor 'w'", "400 bytes"}));
  EXPECT_TRUE(has_all(error_of([&] { f.read(e, 401, part.data(), 0); }), {p, "tensor 'w'"}));
  // offset + bytes wraps around 2^64; must still be rejected.
  EXPECT_TRUE(has_all(error_of([&] { f.read(e, 8, part.data(), std::numeric_limits<std::uint64_t>::max() - 4); }),
                      {p, "tensor 'w'"}));
}

TEST_F(SafetensorsTest, FileTruncatedAfterOpeningFailsCleanly) {
  std::vector<std::uint16_t> v(64, 0x3c00);
  const std::string p = path("t.safetensors");
  write_safetensors(p, {{"x", DType::F16, {64}, v.data()}});
  const SafetensorsFile f(p);
  const SafetensorsEntry& e = *f.find("x");
  ASSERT_EQ(::truncate(p.c_str(), static_cast<off_t>(fs::file_size(p) - 10)), 0);
  std::vector<std::uint16_t> back(64);
  EXPECT_TRUE(has_all(error_of([&] { f.read(e, 0, back.data(), 128); }),
                      {p, "unexpected end of file reading tensor 'x'"}));
  f.read(e, 0, back.data(), 64);  // the part still on disk is readable
}

TEST_F(SafetensorsTest, MovesTransferTheFile) {
  const float v[3] = {1.0f, 2.0f, 3.0f};
  const std::string p = path("m.safetensors");
  write_safetensors(p, {{"v", DType::F32, {3}, v}});
  SafetensorsFile a(p);
  SafetensorsFile b(std::move(a));
  float back[3] = {};
  b.read(*b.find("v"), 0, back, sizeof(back));
  EXPECT_EQ(0, std::memcmp(back, v, sizeof(v)));

  const std::string q = path("n.safetensors");
  write_safetensors(q, {{"u", DType::F32, {1}, v}});
  SafetensorsFile c(q);
  c = std::move(b);
  EXPECT_EQ(c.path(), p);
  c.read(*c.find("v"), 4, back, 8);
  EXPECT_EQ(back[0], 2.0f);
}

TEST_F(SafetensorsTest, AcceptsPaddingMetadataAndEmptyHeader) {
  const std::string p = path("ok.safetensors");
  write_whole(p, file_bytes(R"({"__metadata__":{"format":"pt"},"a":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})"
                            "       ",
                            16));
  const SafetensorsFile f(p);
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(f.entries()[0].dtype_name, "I64");
  EXPECT_FALSE(f.entries()[0].dtype.has_value());

  write_whole(p, file_bytes("{}", 0));
  EXPECT_TRUE(SafetensorsFile(p).entries().empty());
}

TEST_F(SafetensorsTest, RejectsBadFilesNamingFileAndField) {
  const std::string p = path("bad.safetensors");

  write_whole(p, std::string("\x05\0\0\0\0", 5));
  EXPECT_TRUE(has_all(error_of([&] { SafetensorsFile f(p); }), {p, "truncated: 5 bytes", "8-byte header length"}));

  write_whole(p, le64(1000) + std::string(20, ' '));
  EXPECT_TRUE(has_all(error_of([&] { SafetensorsFile f(p); }), {p, "header length 1000", "20 bytes after it"}));

  // A sparse file big enough that only the 100 MiB cap rejects the length.
  write_whole(p, le64(150ull << 20));
  ASSERT_EQ(::truncate(p.c_str(), off_t{200} << 20), 0);
  EXPECT_TRUE(has_all(error_of([&] { SafetensorsFile f(p); }), {p, "100 MiB limit"}));

  EXPECT_TRUE(has_all(error_of([&] { SafetensorsFile f(path("absent.safetensors")); }),
                      {path("absent.safetensors"), "cannot open"}));
  EXPECT_TRUE(has_all(error_of([&] { SafetensorsFile f(dir_.string()); }), {dir_.string(), "not a regular file"}));
}

TEST_F(SafetensorsTest, RejectsBadHeadersNamingFileTensorAndField) {
  struct Case {
    std::string header;
    std::uint64_t data_bytes;
    std::vector<std::string> parts;
  };
  auto t = [](const std::string& body) { return R"({"w":{)" + body + "}}"; };
  const std::vector<Case> cases = {
      {R"({"w":)", 0, {"header is not valid JSON"}},
      {"", 0, {"header is not valid JSON"}},
      {R"({"w":{}} x)", 0, {"header is not valid JSON"}},
      {"[1, 2]", 0, {"header root is array"}},
      {R"({"w":5})", 0, {"tensor 'w'", "entry is number"}},
      {t(R"("shape":[1],"data_offsets":[0,4])"), 4, {"tensor 'w'", "missing dtype"}},
      {t(R"("dtype":"F32","data_offsets":[0,4])"), 4, {"tensor 'w'", "missing shape"}},
      {t(R"("dtype":"F32","shape":[1])"), 4, {"tensor 'w'", "missing data_offsets"}},
      {t(R"("dtype":32,"shape":[1],"data_offsets":[0,4])"), 4, {"tensor 'w'", "dtype is number"}},
      {t(R"("dtype":"Q4","shape":[1],"data_offsets":[0,4])"), 4, {"tensor 'w'", "unknown dtype 'Q4'"}},
      {t(R"("dtype":"F32","shape":3,"data_offsets":[0,12])"), 12, {"tensor 'w'", "shape is number"}},
      {t(R"("dtype":"F32","shape":[2,-3],"data_offsets":[0,4])"), 4, {"tensor 'w'", "shape[1] = -3", "negative"}},
      {t(R"("dtype":"F32","shape":[1.5],"data_offsets":[0,4])"), 4, {"tensor 'w'", "shape[0]", "not an integer"}},
      {t(R"("dtype":"F32","shape":["2"],"data_offsets":[0,8])"), 8, {"tensor 'w'", "shape[0] is a string"}},
      {t(R"("dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,4])"), 4,
       {"tensor 'w'", "shape[0] = 9223372036854775808", "too large"}},
      {t(R"("dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4])"), 4,
       {"tensor 'w'", "shape [4294967296, 4294967296] F32", "2^63-1 elements"}},
      {t(R"("dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,4])"), 4,
       {"tensor 'w'", "shape [4611686018427387904] F64", "2^64-1 bytes"}},
      {t(R"("dtype":"F32","shape":[1],"data_offsets":[0])"), 4, {"tensor 'w'", "data_offsets must be [begin, end]"}},
      {t(R"("dtype":"F32","shape":[1],"data_offsets":[-4,0])"), 4, {"tensor 'w'", "data_offsets must be"}},
      {t(R"("dtype":"F32","shape":[1],"data_offsets":{"a":1})"), 4, {"tensor 'w'", "data_offsets must be"}},
      {t(R"("dtype":"F32","shape":[1],"data_offsets":[8,4])"), 16,
       {"tensor 'w'", "data_offsets [8, 4]", "begin > end"}},
      {t(R"("dtype":"F32","shape":[100],"data_offsets":[0,400])"), 16,
       {"tensor 'w'", "data_offsets [0, 400]", "data section of 16 bytes"}},
      {t(R"("dtype":"F32","shape":[3],"data_offsets":[0,10])"), 16,
       {"tensor 'w'", "data_offsets [0, 10] span 10 bytes", "shape [3] F32 needs 12"}},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12, {"'a' data_offsets [0, 8]", "'b' data_offsets [4, 12]", "overlap"}},
      {R"({"a":{"dtype":"U8","shape":[10],"data_offsets":[0,10]},"z":{"dtype":"U8","shape":[0],"data_offsets":[5,5]},)"
       R"("b":{"dtype":"U8","shape":[2],"data_offsets":[8,10]}})",
       10, {"'a'", "'b'", "overlap"}},
      {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
       R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
       2, {"key 'w' twice"}},
      {R"({"__metadata__":[1]})", 0, {"__metadata__ is array"}},
      {R"({"__metadata__":{"format":1}})", 0, {"__metadata__ key 'format' is number"}},
      {R"({"w":)" + std::string(100, '[') + std::string(100, ']') + "}", 0, {"nests deeper than 64"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.header);
    const std::string msg = open_error(c.header, c.data_bytes);
    EXPECT_EQ(msg.rfind(path("bad.safetensors") + ": ", 0), 0u) << msg;
    for (const auto& part : c.parts) EXPECT_TRUE(has_all(msg, {part}));
  }
}

TEST_F(SafetensorsTest, EmptyTensorsMayShareOffsetsWithoutOverlapping) {
  const std::string header =
      R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[0],"data_offsets":[4,4]},)"
      R"("c":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})";
  const auto entries = parse_safetensors_header(header, 8, "x.safetensors");
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].name, "a");
  EXPECT_EQ(entries[1].name, "b");  // sorts before c at begin 4
  EXPECT_EQ(entries[2].name, "c");
}

TEST_F(SafetensorsTest, WriteRejectsBadTensorsAndLeavesNoFile) {
  const float v[2] = {1.0f, 2.0f};
  const std::string p = path("w.safetensors");
  EXPECT_TRUE(
      has_all(error_of([&] { write_safetensors(p, {{"a", DType::F32, {-2}, v}}); }), {p, "tensor 'a'", "shape [-2]"}));
  EXPECT_TRUE(has_all(error_of([&] { write_safetensors(p, {{"a", DType::F32, {1}, v}, {"a", DType::F32, {1}, v}}); }),
                      {p, "tensor 'a'", "twice"}));
  EXPECT_TRUE(
      has_all(error_of([&] { write_safetensors(p, {{"__metadata__", DType::F32, {1}, v}}); }), {p, "reserved"}));
  EXPECT_TRUE(has_all(error_of([&] { write_safetensors(p, {{"a", DType::F32, {1}, nullptr}}); }), {p, "data is null"}));
  EXPECT_TRUE(has_all(error_of([&] { write_safetensors(p, {{"\xff", DType::F32, {1}, v}}); }), {p, "encode"}));
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p + ".tmp"));

  const std::string q = path("no_such_dir/w.safetensors");
  EXPECT_TRUE(has_all(error_of([&] { write_safetensors(q, {{"a", DType::F32, {2}, v}}); }), {q, "No such file"}));

  // Overwriting replaces the old file whole.
  write_safetensors(p, {{"a", DType::F32, {2}, v}});
  write_safetensors(p, {{"b", DType::F32, {1}, v}});
  const SafetensorsFile f(p);
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(f.entries()[0].name, "b");
}

// Random damage to a valid header must end in success or std::runtime_error, and a
// header that parses must still satisfy every promise the parser makes.
TEST(SafetensorsParse, SurvivesRandomMutations) {
  const std::string valid =
      R"({"__metadata__":{"format":"pt"},"a.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b":{"dtype":"BF16","shape":[],"data_offsets":[24,26]},"c":{"dtype":"I8","shape":[0],"data_offsets":[26,26]},)"
      R"("d":{"dtype":"F16","shape":[5],"data_offsets":[26,36]}})";
  const std::string alphabet = "{}[]\",:-0123456789eE. \\u";
  std::mt19937_64 rng(7);
  int parsed = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string h = valid;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < edits && !h.empty(); ++k) {
      const std::size_t pos = rng() % h.size();
      const bool from_alphabet = rng() % 2 == 0;
      const char c = from_alphabet ? alphabet[rng() % alphabet.size()] : static_cast<char>(rng());
      switch (rng() % 4) {
        case 0: h[pos] = c; break;
        case 1: h.resize(pos); break;
        case 2: h.insert(h.begin() + static_cast<std::ptrdiff_t>(pos), c); break;
        default: h.erase(pos, 1); break;
      }
    }
    const std::uint64_t data_size = rng() % 48;
    try {
      const auto entries = parse_safetensors_header(h, data_size, "mut.safetensors");
      ++parsed;
      for (std::size_t i = 0; i < entries.size(); ++i) {
        const SafetensorsEntry& e = entries[i];
        ASSERT_LE(e.begin, e.end) << h;
        ASSERT_LE(e.end, data_size) << h;
        if (i > 0) {
          ASSERT_LE(entries[i - 1].begin, e.begin) << h;
        }
        if (e.begin == e.end) continue;
        for (std::size_t j = 0; j < i; ++j) {  // no two entries share a byte
          if (entries[j].begin != entries[j].end) {
            ASSERT_LE(entries[j].end, e.begin) << h;
          }
        }
      }
    } catch (const std::runtime_error& e) {
      ASSERT_EQ(std::string(e.what()).rfind("mut.safetensors: ", 0), 0u) << e.what();
    } catch (...) {
      FAIL() << "unexpected exception type for header: " << h;
    }
  }
  EXPECT_GT(parsed, 0);  // some mutations (whitespace, digits within bounds) stay valid
}

}  // namespace
}  // namespace flexh2o::engine
