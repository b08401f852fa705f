// Output files that are either complete or absent: written to PATH.tmp, then renamed, so a
// killed or failing run never leaves a half-written report, trace or policy behind.
#pragma once
#include <string>
#include <string_view>

namespace flexh2o::offload {

// Throws std::runtime_error naming the path and the reason.
void write_file_atomically(const std::string& path, std::string_view text);

}  // namespace flexh2o::offload
