// libFuzzer target: the input is a whole GGUF file. The reader may reject it with
// std::runtime_error; any other exception, crash or sanitizer report is a bug, and so is an
// accepted header that breaks a promise the reader makes (tensor data inside the file,
// aligned, not overlapping). An accepted file then goes through the metadata -> config
// mapping and through the dequantizer (and the lossless repacking) of each tensor's first row,
// and its tokenizer.ggml.* keys into a tokenizer, which encodes and decodes a text.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "engine/loaders/gguf_blocks.h"
#include "engine/loaders/gguf_checkpoint.h"
#include "engine/loaders/gguf_file.h"
#include "engine/loaders/gguf_tokenizer_keys.h"
#include "kernels/dtype.h"

namespace {

using flexh2o::engine::GgufHeader;
using flexh2o::engine::GgufTensor;

void check_promises(const GgufHeader& h, std::size_t size) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
  for (const GgufTensor& t : h.tensors) {
    if (t.offset % h.alignment != 0) std::abort();
    if (t.bytes > 0 && (h.data_start > size || t.offset + t.bytes > size - h.data_start)) std::abort();
    if (t.bytes > 0) spans.emplace_back(t.offset, t.offset + t.bytes);
  }
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second) std::abort();
}

void decode_first_rows(const GgufHeader& h, const std::uint8_t* data) {
  for (const GgufTensor& t : h.tensors) {
    if (t.bytes == 0 || !flexh2o::engine::ggml_dequantizable(*t.type)) continue;
    const std::int64_t cols = t.ne[0];
    const std::uint8_t* row = data + h.data_start + t.offset;
    std::vector<float> values(static_cast<std::size_t>(cols));
    flexh2o::engine::dequantize_ggml(*t.type, row, cols, values.data());
    if (const auto format = flexh2o::engine::ggml_group_format(*t.type)) {
      std::vector<std::byte> packed(static_cast<std::size_t>(flexh2o::kernels::row_bytes(*format, cols)));
      try {
        flexh2o::engine::repack_ggml_row(*t.type, row, cols, packed.data());
      } catch (const std::range_error&) {
        // A scale whose minimum is beyond fp16: refused, as documented.
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const GgufHeader h =
        flexh2o::engine::parse_gguf_header(std::span(reinterpret_cast<const std::byte*>(data), size), "fuzz.gguf");
    check_promises(h, size);
    decode_first_rows(h, data);
    flexh2o::engine::gguf_model_config(h, [&](const GgufTensor& t) {
      std::vector<float> v(static_cast<std::size_t>(t.numel()));
      std::memcpy(v.data(), data + h.data_start + t.offset, static_cast<std::size_t>(t.bytes));
      return v;
    });
  } catch (const std::runtime_error&) {
    // A clean rejection; anything else escapes and stops the fuzzer.
  }
  try {
    const GgufHeader h =
        flexh2o::engine::parse_gguf_header(std::span(reinterpret_cast<const std::byte*>(data), size), "fuzz.gguf");
    if (const auto tok = flexh2o::engine::gguf_tokenizer(h)) {
      const std::vector<std::int32_t> ids = tok->encode("Hello <s> wörld 123 \xF0\x9F\x98\x8A\n", true);
      tok->decode(ids, false);
    }
  } catch (const std::runtime_error&) {
  }
  return 0;
}
