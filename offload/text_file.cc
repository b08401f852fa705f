#include "offload/text_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
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

namespace {

// Pipes read so far: path -> the descriptor of the temporary file holding their bytes.
std::mutex spooled_mutex;
std::map<std::string, int> spooled;

// A temporary file holding everything `pipe` gives until its end.
int spool(int pipe, const std::string& path, std::size_t max_line_bytes) {
  const char* dir = std::getenv("TMPDIR");
  int tmp = ::open(dir && *dir ? dir : "/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (tmp < 0) tmp = ::memfd_create("flexh2o-input", MFD_CLOEXEC);
  if (tmp < 0) throw std::runtime_error(path + ": cannot make a temporary file for the pipe: " + std::strerror(errno));
  char buf[1 << 16];
  std::size_t line = 0;  // bytes since the last newline
  for (;;) {
    const ssize_t n = ::read(pipe, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    const bool ok = n >= 0 && (n == 0 || ::write(tmp, buf, static_cast<std::size_t>(n)) == n);
    if (ok && n > 0) {
      const char* last = static_cast<const char*>(::memrchr(buf, '\n', static_cast<std::size_t>(n)));
      line = last ? static_cast<std::size_t>(buf + n - last - 1) : line + static_cast<std::size_t>(n);
    }
    if (!ok || line > max_line_bytes) {
      const int err = errno;
      ::close(tmp);
      if (ok) throw std::runtime_error(path + ": a line longer than " + mib(max_line_bytes) + "; no prompt is that long");
      throw std::runtime_error(path + ": reading the pipe failed: " + std::strerror(err));
    }
    if (n == 0) return tmp;
  }
}

}  // namespace

int open_rereadable(const std::string& path, std::size_t max_line_bytes) {
  const std::lock_guard lock(spooled_mutex);
  auto it = spooled.find(path);
  if (it == spooled.end()) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) return fd;
    int tmp = -1;
    try {
      tmp = spool(fd, path, max_line_bytes);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    it = spooled.emplace(path, tmp).first;
  }
  // Its own open file, so that each reader has its own offset.
  return ::open(("/proc/self/fd/" + std::to_string(it->second)).c_str(), O_RDONLY | O_CLOEXEC);
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

namespace {

// `text` written to `path` as it is (a device or a pipe: no file to put in its place).
void write_in_place(const std::string& path, std::string_view text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0;
  int err = errno;
  if (f != nullptr && std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) throw std::runtime_error("cannot write " + path + ": " + std::strerror(err));
}

}  // namespace

void write_file_atomically(const std::string& path, std::string_view text) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return write_in_place(path, text);
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
