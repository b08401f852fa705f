// Whole text files: read at once, and written so that they are either complete or absent.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace flexh2o::offload {

// The file's bytes, or nullopt when it cannot be opened (callers say what the file was for).
std::optional<std::string> read_text_file(const std::string& path);

// Written to PATH.tmp, then renamed, so a killed or failing run never leaves a half-written
// report, trace or policy behind.
// Throws std::runtime_error naming the path and the reason.
void write_file_atomically(const std::string& path, std::string_view text);

}  // namespace flexh2o::offload
