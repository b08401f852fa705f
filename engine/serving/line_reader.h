// Reading a JSON-lines file line by line: a regular file or a pipe, each line at most a bound
// (a device such as /dev/zero, or a pipe without newlines, is an error instead of memory that
// grows forever).
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "offload/text_file.h"

namespace flexh2o::engine {

// The lines of a regular file or a pipe, each at most `max_line_bytes` (a device such as
// /dev/zero, or a pipe without newlines, is an error instead of memory that grows forever).
class LineReader {
 public:
  LineReader(const std::string& path, std::size_t max_line_bytes) : path_(path), max_line_bytes_(max_line_bytes) {
    fd_ = offload::open_rereadable(path, max_line_bytes);
    if (fd_ < 0) throw std::runtime_error(path + ": cannot open prompts file: " + std::strerror(errno));
    try {
      offload::require_regular_or_pipe(fd_, path);
    } catch (...) {
      ::close(fd_);
      throw;
    }
  }
  ~LineReader() { ::close(fd_); }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line without its newline; false at the end of the file.
  bool next(std::string& line) {
    for (;;) {
      const std::size_t newline = buffer_.find('\n', scanned_);
      if (newline != std::string::npos) {
        line.assign(buffer_, begin_, newline - begin_);
        begin_ = scanned_ = newline + 1;
        return true;
      }
      scanned_ = buffer_.size();
      if (scanned_ - begin_ > max_line_bytes_)
        throw std::runtime_error(path_ + ":" + std::to_string(lines_ + 1) + ": a line longer than " +
                                 std::to_string(max_line_bytes_ >> 20) + " MiB; no prompt is that long");
      // The lines read so far go once per read, not once per line (that would copy the rest
      // of the buffer for every short line).
      buffer_.erase(0, begin_);
      scanned_ -= begin_;
      begin_ = 0;
      if (!fill()) {
        if (buffer_.empty()) return false;
        line = std::move(buffer_);
        buffer_.clear();
        scanned_ = 0;
        return true;
      }
    }
  }
  void count_line() { ++lines_; }

 private:
  bool fill() {
    char chunk[1 << 16];
    for (;;) {
      const ssize_t n = ::read(fd_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw std::runtime_error(path_ + ": read error: " + std::strerror(errno));
      buffer_.append(chunk, static_cast<std::size_t>(n));
      return n > 0;
    }
  }

  std::string path_;
  std::size_t max_line_bytes_;
  int fd_ = -1;
  std::string buffer_;
  std::size_t begin_ = 0;    // where the next line starts in buffer_
  std::size_t scanned_ = 0;  // buffer_ holds no newline from begin_ up to here
  std::int64_t lines_ = 0;
};

}  // namespace flexh2o::engine
