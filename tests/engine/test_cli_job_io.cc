// What a batch job reads and writes, end to end on the embedded model (issue 66): prompts from a
// pipe lose no line; an output that is an input or another output is refused before anything
// is written; a closed stdout and a full device are errors with a message, not a kill or a
// silent exit 0; a prompts job without --out writes JSONL to stdout; the progress line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/cli_run.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Json = nlohmann::json;

struct Shell {
  int code;
  std::string out, err;
};

// `script` under bash, with $FLEX the binary; stdout and stderr kept.
Shell shell(const std::string& script, const testing::TempDir& dir) {
  const std::string cmd = "FLEX=" + std::string(FLEXH2O_BINARY) + " bash -c '" + script + "' >" + dir.file("sh.out") +
                          " 2>" + dir.file("sh.err") + " </dev/null";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), testing::read_file(dir.file("sh.out")),
          testing::read_file(dir.file("sh.err"))};
}

std::size_t lines_of(const std::string& text) { return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n')); }

const char* kOpenAiLine =
    R"({"custom_id":"a","method":"POST","url":"/v1/completions","body":{"prompt":"Tim","max_tokens":4}})";

std::string own_lines(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += R"({"id": )" + std::to_string(i) + R"(, "prompt": "Once upon", "max_tokens": 4})" "\n";
  return s;
}

TEST(CliJobIo, PromptsFromAPipeLoseNoLine) {
  testing::TempDir dir;
  testing::write_file(dir.file("one.jsonl"), std::string(kOpenAiLine) + "\n");
  testing::write_file(dir.file("own.jsonl"), own_lines(3));
  const Shell openai = shell("cat " + dir.file("one.jsonl") + " | $FLEX run --quiet --prompts /dev/stdin --out " +
                                 dir.file("a.jsonl"),
                             dir);
  ASSERT_EQ(openai.code, 0) << openai.err;
  EXPECT_EQ(lines_of(testing::read_file(dir.file("a.jsonl"))), 1u);
  // A slow writer: the first line alone in the pipe when the reader looks at it.
  const Shell slow = shell("(head -n 1 " + dir.file("own.jsonl") + "; sleep 0.3; tail -n 2 " + dir.file("own.jsonl") +
                               ") | $FLEX run --quiet --prompts /dev/stdin --out " + dir.file("b.jsonl"),
                           dir);
  ASSERT_EQ(slow.code, 0) << slow.err;
  EXPECT_EQ(lines_of(testing::read_file(dir.file("b.jsonl"))), 3u);
}

TEST(CliJobIo, AnOutputThatIsAnInputOrAnotherOutputIsRefused) {
  testing::TempDir dir;
  const std::string in = dir.file("in.jsonl"), out = dir.file("out.jsonl");
  testing::write_file(in, own_lines(2));
  testing::write_file(out, "kept\n");
  const auto r1 = testing::run_cli("--quiet --prompts " + in + " --metrics " + in);
  testing::expect_clean_error(r1, "--metrics " + in + " is the --prompts file");
  const auto r2 = testing::run_cli("--quiet --prompts " + in + " --out " + out + " --resume --metrics " + out);
  testing::expect_clean_error(r2, "is the --out file");
  std::filesystem::create_symlink(in, dir.file("link.jsonl"));  // another name of the prompts
  const auto r3 = testing::run_cli("--quiet --prompts " + in + " --out " + dir.file("link.jsonl"));
  testing::expect_clean_error(r3, "is the --prompts file");
  const auto r4 = testing::run_cli("--quiet --prompts " + in + " --trace " + dir.file("t.json") + " --metrics " +
                                   dir.file("./t.json"));
  testing::expect_clean_error(r4, "is the --metrics file");
  EXPECT_EQ(testing::read_file(in), own_lines(2));
  EXPECT_EQ(testing::read_file(out), "kept\n");
}

TEST(CliJobIo, AClosedStdoutIsAnErrorNotAKill) {
  testing::TempDir dir;
  testing::write_file(dir.file("in.jsonl"), own_lines(8));
  // The reader ends at once; the results' first write finds the pipe closed.
  const Shell r = shell("set -o pipefail; $FLEX run --quiet --prompts " + dir.file("in.jsonl") + " --offload-dir " +
                            dir.path() + " | true",
                        dir);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("cannot write the results to stdout"));
}

TEST(CliJobIo, MetricsOnAFullDeviceIsAnError) {
  struct stat before {};
  if (::stat("/dev/full", &before) != 0 || !S_ISCHR(before.st_mode)) GTEST_SKIP() << "no /dev/full";
  testing::TempDir dir;
  testing::write_file(dir.file("in.jsonl"), own_lines(2));
  const auto r = testing::run_cli("--quiet --prompts " + dir.file("in.jsonl") + " --out " + dir.file("o.jsonl") +
                                  " --metrics /dev/full");
  EXPECT_EQ(r.code, 1);  // after the run's report
  EXPECT_THAT(r.err, HasSubstr("flexh2o: error: cannot write /dev/full: No space left on device\n"));
  struct stat after {};
  ASSERT_EQ(::stat("/dev/full", &after), 0);
  EXPECT_TRUE(S_ISCHR(after.st_mode)) << "the device was replaced";
  EXPECT_EQ(lines_of(testing::read_file(dir.file("o.jsonl"))), 2u);
}

TEST(CliJobIo, APromptsJobWithoutOutWritesJsonlToStdout) {
  testing::TempDir dir;
  testing::write_file(dir.file("in.jsonl"), own_lines(3));
  const Shell r = shell("$FLEX run --quiet --prompts " + dir.file("in.jsonl"), dir);
  ASSERT_EQ(r.code, 0) << r.err;
  std::istringstream lines(r.out);
  std::set<int> ids;
  for (std::string line; std::getline(lines, line);) {
    const Json j = Json::parse(line);
    ids.insert(j.at("id").get<int>());
    EXPECT_TRUE(j.at("text").is_string());
    EXPECT_EQ(j.at("tokens").size(), 4u);
  }
  EXPECT_EQ(ids, (std::set<int>{0, 1, 2}));
}

TEST(CliJobIo, TheProgressLineInALogAndQuiet) {
  testing::TempDir dir;
  testing::write_file(dir.file("in.jsonl"), own_lines(5));
  const Shell logged = shell("$FLEX run --prompts " + dir.file("in.jsonl") + " --out " + dir.file("o.jsonl"), dir);
  ASSERT_EQ(logged.code, 0) << logged.err;
  EXPECT_THAT(logged.err, HasSubstr("requests 0/5 (0%) | prompt "));
  EXPECT_THAT(logged.err, HasSubstr("requests 5/5 (100%) | prompt "));
  EXPECT_THAT(logged.err, HasSubstr("elapsed, 00:00 left"));
  EXPECT_THAT(logged.err, Not(HasSubstr("\r")));
  const Shell quiet = shell("$FLEX run --quiet --prompts " + dir.file("in.jsonl") + " --out " + dir.file("q.jsonl"), dir);
  ASSERT_EQ(quiet.code, 0) << quiet.err;
  EXPECT_THAT(quiet.err, Not(HasSubstr("requests 5/5")));
}

}  // namespace
}  // namespace flexh2o
