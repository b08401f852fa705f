// libFuzzer target: the input is a prompts file (--prompts: our own format, and an OpenAI batch
// file) and, separately, an --out file of either format read back by --resume. The readers may
// reject it with std::runtime_error or std::invalid_argument (the OpenAI reader rejects nothing:
// a bad line carries its error); any other exception, crash or sanitizer report is a bug, and
// so is an accepted line that breaks what the reader promises (a string or integer id, unique).
// The bytes go through a memfd, a regular file in memory, since the readers take paths.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>

#include "engine/serving/openai_batch.h"
#include "engine/serving/result_file.h"
#include "engine/serving/prompts.h"

namespace {

// /proc/self/fd/N of a memfd holding exactly `data`.
std::string file_holding(const std::uint8_t* data, std::size_t size) {
  static const int fd = ::memfd_create("fuzz-jsonl", 0);
  if (fd < 0 || ::ftruncate(fd, 0) != 0) std::abort();
  for (std::size_t done = 0; done < size;) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (n <= 0) std::abort();
    done += static_cast<std::size_t>(n);
  }
  return "/proc/self/fd/" + std::to_string(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = file_holding(data, size);
  try {
    const auto items = flexh2o::engine::read_prompts_jsonl(path);
    std::set<std::string> ids;
    for (const auto& it : items) {
      if (it.id_json.empty() || !ids.insert(it.id_json).second) std::abort();
      if (!it.text && it.tokens.empty() && it.id_json.empty()) std::abort();
      for (const auto t : it.tokens)
        if (t < 0) std::abort();
    }
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  }
  // As an OpenAI batch file every line is read, a bad one with its error: nothing throws. Every
  // good line has a unique key, and every line a key.
  {
    std::set<std::string> keys;
    for (const auto& line : flexh2o::serving::read_openai_batch(file_holding(data, size)))
      if (line.key.empty() || !keys.insert(line.key).second || (line.error.empty() && line.n < 1)) std::abort();
  }
  for (const auto format : {flexh2o::serving::ResultFormat::Simple, flexh2o::serving::ResultFormat::OpenAi}) {
    try {
      flexh2o::serving::ResultFile resumed(file_holding(data, size), /*resume=*/true, "", format);
    } catch (const std::runtime_error&) {
    } catch (const std::invalid_argument&) {
    }
  }
  return 0;
}
