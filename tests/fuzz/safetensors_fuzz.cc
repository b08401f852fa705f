// libFuzzer target: the input is a whole safetensors file. The parser may reject it
// with std::runtime_error; any other exception, crash or sanitizer report is a bug, and
// so is an accepted header that breaks a promise the parser makes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string_view>

#include "engine/loaders/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 8) return 0;
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > size - 8) return 0;
  const std::uint64_t data_size = size - 8 - n;
  try {
    const auto entries = flexh2o::engine::parse_safetensors_header(
        std::string_view(reinterpret_cast<const char*>(data) + 8, n), data_size, "fuzz.safetensors");
    std::uint64_t used_end = 0;  // end of the bytes owned so far; entries come sorted by begin
    for (const auto& e : entries) {
      if (e.begin > e.end || e.end > data_size) std::abort();
      if (e.begin == e.end) continue;
      if (e.begin < used_end) std::abort();
      used_end = e.end;
    }
  } catch (const std::runtime_error&) {
    // A clean rejection; anything else escapes and stops the fuzzer.
  }
  return 0;
}
