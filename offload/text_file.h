// Whole text files: read at once, and written so that they are either complete or absent.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace flexh2o::offload {

// Limits on what read_text_file reads, far above any real file of the kind, so that a wrong
// path (a device, a pipe that never ends) is an error instead of memory that grows forever.
constexpr std::uint64_t kMaxConfigFileBytes = std::uint64_t{64} << 20;      // YAML, config.json
constexpr std::uint64_t kMaxTokenizerFileBytes = std::uint64_t{1} << 30;    // tokenizer.json: ~20 MB
constexpr std::uint64_t kMaxInputFileBytes = std::uint64_t{4} << 30;        // prompts, texts

// The file's bytes, or nullopt when it cannot be opened (callers say what the file was for).
// Reads regular files and pipes only (a device such as /dev/zero, a directory or a socket is
// refused), and at most `max_bytes`: both throw std::runtime_error naming the path and limit.
std::optional<std::string> read_text_file(const std::string& path, std::uint64_t max_bytes = kMaxConfigFileBytes);
// Throws std::runtime_error naming `path` unless `fd` is a regular file or a pipe. Returns a
// regular file's size (0 for a pipe).
std::uint64_t require_regular_or_pipe(int fd, const std::string& path);
// A descriptor reading `path` from its start (-1 and errno when it cannot be opened). A pipe
// (`--prompts /dev/stdin`, a FIFO) is read to its end at the first open and kept in an unnamed
// temporary file; every open of the same path reads that again from its start, so a reader that
// looks at the first line first (which format?) takes nothing from the next one. A pipe with a
// line longer than `max_line_bytes` is an error (one that never ends fills no disk).
int open_rereadable(const std::string& path, std::size_t max_line_bytes);

// Written to PATH.tmp, then renamed, so a killed or failing run never leaves a half-written
// report, trace or policy behind. A path that is not a regular file (/dev/stdout, a pipe) is
// written in place: renaming over a device would replace it.
// Throws std::runtime_error naming the path and the reason (a full device's included).
void write_file_atomically(const std::string& path, std::string_view text);

}  // namespace flexh2o::offload
