// Opening a checkpoint file, shared by the readers (safetensors, GGUF).
#pragma once
#include <cstdint>
#include <string>

namespace flexh2o::engine {

// Opens `path` read-only; throws naming it unless it is a regular file. Returns the descriptor
// (the caller closes it) and sets `size` to the file's bytes.
int open_regular_file(const std::string& path, std::uint64_t& size);

}  // namespace flexh2o::engine
