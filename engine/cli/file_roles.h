// The files a command reads and the files it writes, kept apart: an output that is one of the
// inputs (`--metrics in.jsonl`, `--out m.gguf --model m.gguf`) or another output
// (`--out r.jsonl --metrics r.jsonl`) would replace what the user has, so it is an error before
// anything is opened.
#pragma once
#include <span>
#include <string>

namespace flexh2o::cli {

struct FileRole {
  std::string flag;  // "--metrics"
  std::string path;  // "" when not given
};

// Throws std::invalid_argument naming both flags when an output is the same file as an input
// (the same inode, whatever the path says) or as another output (the same path once resolved,
// or the same inode where it exists).
void check_files_apart(std::span<const FileRole> reads, std::span<const FileRole> writes);

}  // namespace flexh2o::cli
