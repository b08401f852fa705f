#include "engine/job/file_roles.h"

#include <sys/stat.h>

#include <filesystem>
#include <optional>
#include <stdexcept>

namespace flexh2o::job {

namespace {

struct FileId {
  dev_t dev;
  ino_t ino;
  bool operator==(const FileId&) const = default;
};

std::optional<FileId> file_id(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_dev, st.st_ino};
}

std::string resolved(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

// Devices such as /dev/null and /dev/stdout may be named twice: writing one replaces nothing.
bool replaceable(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode);
}

[[noreturn]] void refuse(const FileRole& out, const FileRole& other, const char* what) {
  throw kernels::OptionError{out.option, " " + out.path + " is the ", other.option, " file " + other.path + ": " + what +
                                             "; name another file"};
}

}  // namespace

void check_files_apart(std::span<const FileRole> reads, std::span<const FileRole> writes) {
  for (std::size_t w = 0; w < writes.size(); ++w) {
    const FileRole& out = writes[w];
    if (out.path.empty()) continue;
    const std::optional<FileId> id = file_id(out.path);
    for (const FileRole& in : reads)
      if (id && !in.path.empty() && file_id(in.path) == id) refuse(out, in, "writing it would replace what the run reads");
    if (!replaceable(out.path)) continue;
    for (std::size_t v = 0; v < w; ++v) {
      const FileRole& other = writes[v];
      if (other.path.empty()) continue;
      if (resolved(other.path) == resolved(out.path) || (id && file_id(other.path) == id))
        refuse(out, other, "the run would write both into one");
    }
  }
}

void check_job_files_apart(const JobOptions& o) {
  using kernels::Option;
  const FileRole reads[] = {{Option::Prompts, o.prompts_file}, {Option::Model, o.model}, {Option::Tokenizer, o.tokenizer},
                            {Option::Policy, o.policy_file == "auto" ? "" : o.policy_file}, {Option::Hardware, o.hardware}};
  const FileRole writes[] = {{Option::Results, o.out_file}, {Option::Metrics, o.metrics_file}, {Option::Trace, o.trace_file}};
  check_files_apart(reads, writes);
}

}  // namespace flexh2o::job
