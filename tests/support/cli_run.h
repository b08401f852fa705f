// `flexh2o run ARGS` as a child process (FLEXH2O_BINARY, set by the test target): its exit code
// (128 + the signal when killed) and what it wrote to stderr; stdout is dropped. And the check
// every bad-input test makes of such a run.
#pragma once
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "tests/support/test_models.h"

namespace flexh2o::testing {

struct CliOutput {
  int code;
  std::string err;
};

inline CliOutput run_cli(const std::string& args) {
  TempDir dir;
  const std::string cmd =
      std::string(FLEXH2O_BINARY) + " run " + args + " >" + dir.file("out") + " 2>" + dir.file("err") + " </dev/null";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), read_file(dir.file("err"))};
}

// A clean error: a non-zero exit that is not a signal, and one stderr line "flexh2o: error: ..."
// that mentions `mention`. R: anything with `code` and `err`.
template <class R>
void expect_clean_error(const R& r, const std::string& mention) {
  EXPECT_NE(r.code, 0);
  EXPECT_LT(r.code, 128) << "killed by a signal";
  EXPECT_THAT(r.err, ::testing::StartsWith("flexh2o: error: "));
  EXPECT_THAT(r.err, ::testing::HasSubstr(mention));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

}  // namespace flexh2o::testing
