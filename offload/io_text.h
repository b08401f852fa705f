// Small text helpers of the disk tier's files: errno as words, and notes said once per process.
#pragma once
#include <atomic>
#include <cstdio>
#include <string>
#include <system_error>

namespace flexh2o::offload {

inline std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// Prints "flexh2o: note: text" on stderr the first time `said` is passed.
inline void note_once(std::atomic<bool>& said, const std::string& text) {
  if (!said.exchange(true)) std::fprintf(stderr, "flexh2o: note: %s\n", text.c_str());
}

}  // namespace flexh2o::offload
