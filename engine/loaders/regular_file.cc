#include "engine/loaders/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <system_error>

namespace flexh2o::engine {

int open_regular_file(const std::string& path, std::uint64_t& size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(path + ": cannot open: " + std::generic_category().message(errno));
  struct stat st {};
  std::string error;
  if (::fstat(fd, &st) != 0)
    error = path + ": cannot stat: " + std::generic_category().message(errno);
  else if (!S_ISREG(st.st_mode))
    error = path + ": not a regular file";
  if (!error.empty()) {
    ::close(fd);
    throw std::runtime_error(error);
  }
  size = static_cast<std::uint64_t>(st.st_size);
  return fd;
}

}  // namespace flexh2o::engine
