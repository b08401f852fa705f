// Helpers the offload tests share: scratch directories, listing them, random bytes, tier options.
#pragma once
#include <stdlib.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "offload/tiers.h"

namespace flexh2o::offload::test_util {

// A fresh directory, removed (with anything left in it) at the end of the test.
class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/flexh2o-test-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp: " + std::string(std::strerror(errno)));
    path_ = tmpl;
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, ec);  // tests may lock it
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename());
  return names;
}

inline std::vector<unsigned char> random_bytes(std::mt19937_64& rng, std::int64_t n) {
  std::vector<unsigned char> v(static_cast<std::size_t>(n));
  std::size_t i = 0;
  for (; i + 8 <= v.size(); i += 8) {
    const std::uint64_t x = rng();
    std::memcpy(v.data() + i, &x, 8);
  }
  for (; i < v.size(); ++i) v[i] = static_cast<unsigned char>(rng());
  return v;
}

inline TierOptions tier_options(const std::string& dir, bool force_threads) {
  TierOptions o;
  o.offload_dir = dir;
  o.force_disk_threads = force_threads;
  return o;
}

}  // namespace flexh2o::offload::test_util
