#include "offload/text_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace flexh2o::offload {

namespace {

std::string mib(std::uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

std::uint64_t require_regular_or_pipe(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw std::runtime_error(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode))
    throw std::runtime_error(path + ": not a regular file (" +
                             (S_ISDIR(st.st_mode)   ? std::string("a directory")
                              : S_ISCHR(st.st_mode) ? std::string("a character device")
                                                    : std::string("a device or socket")) +
                             "); give a file or a pipe");
  return S_ISREG(st.st_mode) ? static_cast<std::uint64_t>(st.st_size) : 0;
}

std::optional<std::string> read_text_file(const std::string& path, std::uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text;
  try {
    if (require_regular_or_pipe(fd, path) > max_bytes)
      throw std::runtime_error(path + ": more than " + mib(max_bytes) + ", the most read from a file of this kind");
    char buf[1 << 16];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw std::runtime_error(path + ": read failed: " + std::strerror(errno));
      if (n == 0) break;
      if (text.size() + static_cast<std::size_t>(n) > max_bytes)
        throw std::runtime_error(path + ": more than " + mib(max_bytes) + ", the most read from a file of this kind");
      text.append(buf, static_cast<std::size_t>(n));
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return text;
}

void write_file_atomically(const std::string& path, std::string_view text) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  int err = errno;
  if (f != nullptr && std::fclose(f) != 0) {
    ok = false;
    err = errno;
  }
  if (ok && std::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    throw std::runtime_error("cannot write " + path + ": " + std::strerror(err));
  }
}

}  // namespace flexh2o::offload
