#include "engine/model/embedded.h"

extern "C" {
extern const char flexh2o_stories260k_model_begin[];
extern const char flexh2o_stories260k_model_end[];
extern const char flexh2o_stories260k_tok_begin[];
extern const char flexh2o_stories260k_tok_end[];
}

namespace flexh2o::engine {

namespace {
std::span<const std::byte> bytes_between(const char* begin, const char* end) {
  return {reinterpret_cast<const std::byte*>(begin), static_cast<std::size_t>(end - begin)};
}
}  // namespace

std::span<const std::byte> embedded_stories260k_model() {
  return bytes_between(flexh2o_stories260k_model_begin, flexh2o_stories260k_model_end);
}

std::span<const std::byte> embedded_stories260k_tokenizer() {
  return bytes_between(flexh2o_stories260k_tok_begin, flexh2o_stories260k_tok_end);
}

}  // namespace flexh2o::engine
