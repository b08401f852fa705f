#include "engine/serving/result_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "engine/serving/openai_results.h"
#include "engine/io/json_input.h"
#include "engine/serving/out_lock.h"

namespace flexh2o::serving {

namespace {

// Result lines nest two deep ({"tokens": [...]}); deeper text is no result line, and is
// rejected before the parser (or an error message) walks it.
bool nests_deeper_than(const std::string& text, int limit) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

bool is_simple_result_line(const std::string& line, std::string* id_json) {
  if (nests_deeper_than(line, 2)) return false;
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("id") || !j.contains("text") || !j.contains("tokens")) return false;
  if (!(j["id"].is_string() || j["id"].is_number_integer()) || !j["text"].is_string() || !j["tokens"].is_array())
    return false;
  *id_json = j["id"].dump();
  return true;
}

bool is_result_line(ResultFormat format, const std::string& line, std::string* key) {
  if (format == ResultFormat::Simple) return is_simple_result_line(line, key);
  if (nests_deeper_than(line, kOpenAiResultDepth)) return false;
  const std::optional<std::string> k = openai_result_key(line);
  if (k) *key = *k;
  return k.has_value();
}

// An unfinished last line (a write cut short by a kill) starts as every result line does.
bool starts_like_a_result(const std::string& tail) {
  std::string compact;
  for (const char c : tail) {
    if (c != ' ' && c != '\t' && c != '\r') compact += c;
    if (compact.size() >= 5) break;
  }
  const std::string start = "{\"id\"";
  return compact.size() >= start.size() ? compact.starts_with(start) : start.starts_with(compact);
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot read: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw std::runtime_error(path + ": read failed");
  return text.str();
}

bool same_file(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

}  // namespace

ResultFile::ResultFile(std::string path, bool resume, const std::string& prompts_path, ResultFormat format)
    : path_(std::move(path)), resume_(resume), format_(format) {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) {
    if (errno != ENOENT) throw std::runtime_error(path_ + ": cannot open for writing: " + std::strerror(errno));
  } else {
    check_existing(st, prompts_path);
  }
  if (stream_) return;
  // Held until the run ends: a second run on this file stops here, before it reads or cuts it.
  fd_ = open_locked(path_, &created_);
  try {
    if (resume_) check_resumable(read_all(path_));
  } catch (...) {
    release();
    throw;
  }
}

void ResultFile::check_existing(const struct stat& st, const std::string& prompts_path) {
  struct stat prompts {};
  if (!prompts_path.empty() && ::stat(prompts_path.c_str(), &prompts) == 0 && same_file(st, prompts))
    throw std::invalid_argument("--out " + path_ + " is the --prompts file " + prompts_path +
                                "; the results would overwrite the prompts: give --out another file");
  stream_ = S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode);
  if (!S_ISREG(st.st_mode) && !stream_)
    throw std::invalid_argument("--out " + path_ + " is not a regular file (nor a device or pipe to stream to)");
  if (::access(path_.c_str(), W_OK) != 0)
    throw std::runtime_error(path_ + ": cannot open for writing: " + std::strerror(errno));
  if (resume_ && stream_)
    throw std::invalid_argument("--resume reads the results already in --out, but " + path_ +
                                " is not a regular file");
}

void ResultFile::check_resumable(const std::string& text) {
  const std::size_t last_newline = text.rfind('\n');
  keep_bytes_ = last_newline == std::string::npos ? 0 : static_cast<off_t>(last_newline + 1);
  const auto refuse = [&](const std::string& where) {
    throw std::runtime_error(where + ": not a result line of flexh2o, so --resume cannot continue this file (it was "
                             "left as it was); give --out the results file of the interrupted job");
  };
  std::map<std::string, std::int64_t> line_of_id;
  std::size_t begin = 0;
  for (std::int64_t lineno = 1; begin < static_cast<std::size_t>(keep_bytes_); ++lineno) {
    const std::size_t end = text.find('\n', begin);
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string id;
    if (!is_result_line(format_, line, &id)) refuse(path_ + ":" + std::to_string(lineno));
    if (const auto [first, fresh] = line_of_id.emplace(id, lineno); !fresh)
      throw std::runtime_error(path_ + ":" + std::to_string(lineno) + ": id " + engine::bounded_excerpt(id, 80) +
                               " is on line " + std::to_string(first->second) +
                               " too, so --resume cannot continue this file (it was left as it was): two runs wrote "
                               "to it at once, or it was edited; keep one line of each id, or start a new --out");
    done_ids_.insert(id);
    ++results_;
  }
  const std::string tail = text.substr(static_cast<std::size_t>(keep_bytes_));
  if (!tail.empty() && !starts_like_a_result(tail)) refuse(path_ + ": the last line");
}

ResultFile::~ResultFile() { release(); }

void ResultFile::release() {
  // A file this run created and never wrote to goes again (unlinked while still locked).
  if (created_ && !writing_) ::unlink(path_.c_str());
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string ResultFile::line(const std::string& id_json, const std::string& text, std::span<const std::int32_t> tokens,
                             const std::string& error) {
  nlohmann::json j;
  j["id"] = nlohmann::json::parse(id_json);
  // Generated bytes may stop inside a UTF-8 sequence; replace invalid bytes instead of failing.
  j["text"] = text;
  j["tokens"] = std::vector<std::int32_t>(tokens.begin(), tokens.end());
  if (!error.empty()) j["error"] = error;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

void ResultFile::start_writing() {
  writing_ = true;
  if (stream_) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd_ < 0) throw std::runtime_error(path_ + ": cannot open for writing: " + std::strerror(errno));
    return;
  }
  // A new run replaces the file; resuming drops the unfinished line a killed job left after
  // the last whole one.
  if (::ftruncate(fd_, resume_ ? keep_bytes_ : 0) != 0)
    fail(resume_ ? "cannot cut off a torn last line" : "cannot truncate", errno);
  if (::lseek(fd_, 0, SEEK_END) < 0) fail("seek failed", errno);
}

void ResultFile::fail(const char* what, int err) {
  throw std::runtime_error(path_ + ": " + what + ": " + std::strerror(err) + "; the file holds the " +
                           std::to_string(results_) + " results written before, as whole lines (rerun with --resume " +
                           "to add the rest)");
}

void ResultFile::flush() {
  if (pending_.empty()) return;
  if (!writing_) start_writing();
  const off_t whole = stream_ ? 0 : ::lseek(fd_, 0, SEEK_END);
  const char* p = pending_.data();
  std::size_t left = pending_.size();
  int err = 0;
  while (left > 0 && err == 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno != EINTR) err = errno;
    if (n > 0) {
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }
  if (err == 0 && !stream_ && ::fsync(fd_) != 0) err = errno;
  if (err != 0) {
    // Cut back to the last whole line, so that every reader sees only whole results.
    if (!stream_ && whole >= 0 && ::ftruncate(fd_, whole) != 0) fail("write failed, and cutting back failed too", err);
    fail("write failed", err);
  }
  results_ += std::count(pending_.begin(), pending_.end(), '\n');
  pending_.clear();
}

void write_results(std::optional<ResultFile>& out, std::span<const std::string> lines) {
  if (out) {
    for (const std::string& l : lines) out->add_line(l);
    out->flush();
    return;
  }
  bool ok = true;
  for (const std::string& l : lines) ok = ok && std::fwrite(l.data(), 1, l.size(), stdout) == l.size();
  if (!(ok && std::fflush(stdout) == 0))
    throw std::runtime_error(std::string("cannot write the results to stdout: ") + std::strerror(errno) +
                             (errno == EPIPE ? " (the program reading them ended); give --out FILE to keep them" : ""));
}

}  // namespace flexh2o::serving
