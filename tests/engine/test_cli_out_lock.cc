// One --out file, one run at a time (issue 47), end to end on the embedded model: a second run
// on a held file stops with one error line naming the holder and leaves the file as it was;
// a killed run's lock is free, so --resume takes it over; a file holding an id twice is no
// file to resume; and a continuous-batching OpenAI job killed (SIGKILL) at random points and
// resumed each time ends with the results of the uninterrupted run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/cli_run.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using Json = nlohmann::json;
using Output = testing::CliOutput;

Output run(const std::string& args) { return testing::run_cli(args); }

// `flexh2o run args` in the background (its own pid: the shell execs it).
pid_t spawn(const std::string& args, const testing::TempDir& dir) {
  const std::string cmd = "exec " + std::string(FLEXH2O_BINARY) + " run " + args + " >" + dir.file("spawn.out") +
                          " 2>" + dir.file("spawn.err") + " </dev/null";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

// Whole lines in the file (0 when it is not there).
std::size_t lines_in(const std::string& path) {
  if (!std::filesystem::exists(path)) return 0;
  const std::string text = testing::read_file(path);
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}

// Waits until the file holds more than `lines` whole lines or the process ends; false if it ended.
bool wait_for_lines(const std::string& path, std::size_t lines, pid_t pid) {
  while (lines_in(path) <= lines) {
    if (::waitpid(pid, nullptr, WNOHANG) == pid) return false;
    ::usleep(2000);
  }
  return true;
}

// A job of `lines` OpenAI completion requests mixing greedy, seeded and unseeded sampling, and
// n = 2, so that a resumed job must reproduce every kind of draw.
std::string batch_file(int lines) {
  const char* starts[] = {"Once upon a time", "The dog", "Lily and Tom", "One day", "The sun", "A little bird"};
  std::string file;
  for (int i = 0; i < lines; ++i) {
    Json body = {{"prompt", std::string(starts[i % 6]) + " " + std::to_string(i)}, {"max_tokens", 24 + i % 40}};
    if (i % 4 == 1) body["temperature"] = 0.0;
    if (i % 4 == 2) body["seed"] = 1000 + i;
    if (i % 5 == 3) body["n"] = 2;
    std::string id = "r";
    id += std::to_string(i);
    const Json request = {{"custom_id", id}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", body}};
    file += request.dump();
    file += '\n';
  }
  return file;
}

// The result lines of a file by custom_id, without their time stamp; each id once.
std::map<std::string, Json> results(const std::string& path) {
  std::map<std::string, Json> by_id;
  std::istringstream lines(testing::read_file(path));
  for (std::string line; std::getline(lines, line);) {
    Json j = Json::parse(line);
    if (j["response"].is_object()) j["response"]["body"].erase("created");
    const std::string id = j["custom_id"].get<std::string>();
    EXPECT_FALSE(by_id.count(id)) << "custom_id " << id << " twice";
    by_id[id] = j;
  }
  return by_id;
}

TEST(CliOutLock, ASecondRunOnAHeldOutStopsWithOneLineAndLeavesTheFile) {
  testing::TempDir dir;
  testing::write_file(dir.file("in.jsonl"), batch_file(200));
  const std::string out = dir.file("out.jsonl");
  const std::string job = "--prompts " + dir.file("in.jsonl") + " --out " + out;
  const pid_t holder = spawn(job, dir);
  ASSERT_TRUE(wait_for_lines(out, 0, holder)) << testing::read_file(dir.file("spawn.err"));
  ::kill(holder, SIGSTOP);  // holds its lock, writes nothing while the others try
  const std::string before = testing::read_file(out);
  std::filesystem::create_symlink(out, dir.file("alias.jsonl"));
  for (const std::string& second : {job, job + " --resume", "--prompts " + dir.file("in.jsonl") + " --out " +
                                                               dir.file("alias.jsonl")}) {
    SCOPED_TRACE(second);
    testing::expect_clean_error(run(second), "is in use by another run (pid " + std::to_string(holder) + " on host ");
    EXPECT_EQ(testing::read_file(out), before);
  }
  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
}

TEST(CliOutLock, ResumeRefusesAFileHoldingAnIdTwice) {
  testing::TempDir dir;
  testing::write_file(dir.file("in.jsonl"), batch_file(6));
  const std::string out = dir.file("out.jsonl");
  const std::string job = "--prompts " + dir.file("in.jsonl") + " --out " + out;
  ASSERT_EQ(run(job).code, 0);
  std::istringstream lines(testing::read_file(out));
  std::string first, second;
  std::getline(lines, first);
  std::getline(lines, second);
  // Two runs at once wrote the file: a result line is on lines 1 and 3.
  const std::string doubled = first + "\n" + second + "\n" + first + "\n";
  testing::write_file(out, doubled);
  testing::expect_clean_error(run(job + " --resume"), out + ":3: id \"" + Json::parse(first)["custom_id"].get<std::string>() +
                                                    "\" is on line 1 too");
  EXPECT_EQ(testing::read_file(out), doubled);
}

// Five SIGKILLs at random points of a continuous-batching job (each after some results, a
// random few ms later), each run after the first a --resume that takes over the killed run's
// lock; a last --resume finishes. The seed of the kill times is printed on failure.
TEST(CliOutLock, KilledRunsResumeToTheUninterruptedResult) {
  testing::TempDir dir;
  testing::write_file(dir.file("in.jsonl"), batch_file(200));
  const std::string job = "--prompts " + dir.file("in.jsonl") + " --batching continuous --seed 5 --out ";
  ASSERT_EQ(run(job + dir.file("full.jsonl")).code, 0);
  const std::map<std::string, Json> full = results(dir.file("full.jsonl"));
  ASSERT_EQ(full.size(), 200u);

  const unsigned seed = static_cast<unsigned>(std::chrono::system_clock::now().time_since_epoch().count());
  SCOPED_TRACE("kill times seeded with " + std::to_string(seed));
  std::mt19937 rng(seed);
  const std::string out = dir.file("out.jsonl");
  for (int kill = 0; kill < 5; ++kill) {
    const std::size_t had = lines_in(out);
    const pid_t pid = spawn(job + out + (kill > 0 ? " --resume" : ""), dir);
    const bool running = wait_for_lines(out, had, pid);
    if (!running) {  // ended before writing a line: only a refused lock or an error would
      ADD_FAILURE() << "run " << kill << " ended early: " << testing::read_file(dir.file("spawn.err"));
      break;
    }
    ::usleep(std::uniform_int_distribution<unsigned>(0, 25000)(rng));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "run " << kill << " ended before its kill";
  }
  EXPECT_LT(lines_in(out), full.size()) << "the last --resume has requests left to run";
  const Output last = run(job + out + " --resume");
  ASSERT_EQ(last.code, 0) << last.err;
  EXPECT_THAT(last.err, HasSubstr("resuming:"));
  EXPECT_EQ(results(out), full);
}

}  // namespace
}  // namespace flexh2o
