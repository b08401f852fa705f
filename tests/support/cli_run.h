// `flexh2o run ARGS` as a child process (FLEXH2O_BINARY, set by the test target): its exit code
// (128 + the signal when killed) and what it wrote to stderr; stdout is dropped.
#pragma once
#include <sys/wait.h>

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

}  // namespace flexh2o::testing
