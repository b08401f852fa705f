// The files a command reads and the files it writes, kept apart: an output that is one of the
// inputs (`--metrics in.jsonl`, `--out m.gguf --model m.gguf`) or another output
// (`--out r.jsonl --metrics r.jsonl`) would replace what the user has, so it is an error before
// anything is opened.
#pragma once
#include <span>
#include <string>

#include "engine/job/job_options.h"
#include "kernels/option_error.h"

namespace flexh2o::job {

struct FileRole {
  kernels::Option option;  // the results file, the metrics file, ...
  std::string path;        // "" when not given
};

// Throws a kernels::OptionError naming both options when an output is the same file as an input
// (the same inode, whatever the path says) or as another output (the same path once resolved,
// or the same inode where it exists).
void check_files_apart(std::span<const FileRole> reads, std::span<const FileRole> writes);

// check_files_apart over a job's files: the prompts, model, tokenizer, policy and hardware
// profile it reads; the results, metrics and trace it writes.
void check_job_files_apart(const JobOptions& o);

}  // namespace flexh2o::job
